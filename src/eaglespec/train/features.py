"""Target features for training: online (frozen target under torch.no_grad, contract 8) and an
offline cache (safetensors shards + a manifest that must match the target).

A feature id j is the hidden state ENTERING decoder layer j (contract 3); id L is the last layer's
output before the final norm (EAGLE-1's feature). Soft labels come from the target's final hidden
state through its lm_head, computed only for the rows that are supervised, in row chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglespec.backends.capture import FeatureCapture, decoder_layers
from eaglespec.checkpoint.manifest import manifest_mismatches
from eaglespec.draft.layers import additive_mask
from eaglespec.errors import EagleSpecError
from eaglespec.train.data import Packed


@dataclass
class TargetBatch:
    features: torch.Tensor  # [N, n_ids * H] concatenated states at the feature layer ids
    hidden: torch.Tensor  # [N, H] final hidden state (after the final norm): the input of lm_head


def packed_visible(packed: Packed) -> torch.Tensor:
    """[N, N] bool: causal within a segment among valid tokens; padding rows see only themselves."""
    seg, valid = packed.segment, packed.valid
    n = seg.shape[0]
    idx = torch.arange(n, device=seg.device)
    vis = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None]) & valid[None, :] & valid[:, None]
    return vis | torch.eye(n, dtype=torch.bool, device=seg.device)


class TargetFeatures:
    """Online feature extraction from a frozen HF causal LM."""

    def __init__(self, model: torch.nn.Module, layer_ids: tuple[int, ...]):
        self.model = model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.layers = decoder_layers(model)
        self.layer_ids = tuple(int(j) for j in layer_ids)
        try:
            self.capture = FeatureCapture(self.layers, self.layer_ids)
        except ValueError as exc:
            raise EagleSpecError(str(exc)) from None
        self.lm_head = model.get_output_embeddings()
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.vocab_size = self.lm_head.weight.shape[0]

    def close(self) -> None:
        self.capture.close()

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.no_grad()
    def __call__(self, packed: Packed) -> TargetBatch:
        dev = self.device
        packed = packed.to(dev)
        dtype = self.lm_head.weight.dtype
        mask = additive_mask(packed_visible(packed), dtype)[None, None]  # [1, 1, N, N]
        self.capture.clear()
        out = self.model.get_decoder()(input_ids=packed.tokens[None], position_ids=packed.position[None],
                                       attention_mask=mask, use_cache=False)
        hidden = out.last_hidden_state[0] if hasattr(out, "last_hidden_state") else out[0][0]
        return TargetBatch(features=self.capture.take()[0], hidden=hidden)

    @torch.no_grad()
    def batch(self, packs: list[Packed]) -> list[TargetBatch]:
        """Several packs in ONE target forward ([P, L] padded, per-pack 4-D masks)."""
        if len(packs) == 1:
            return [self(packs[0])]
        dev = self.device
        dtype = self.lm_head.weight.dtype
        lens = [p.tokens.numel() for p in packs]
        width = max(lens)
        tokens = torch.zeros(len(packs), width, dtype=torch.long, device=dev)
        position = torch.zeros_like(tokens)
        vis = torch.eye(width, dtype=torch.bool, device=dev).repeat(len(packs), 1, 1)  # padding sees itself
        for i, p in enumerate(packs):
            p = p.to(dev)
            tokens[i, : lens[i]] = p.tokens
            position[i, : lens[i]] = p.position
            vis[i, : lens[i], : lens[i]] = packed_visible(p)
        self.capture.clear()
        out = self.model.get_decoder()(input_ids=tokens, position_ids=position,
                                       attention_mask=additive_mask(vis, dtype)[:, None], use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        feats = self.capture.take()
        return [TargetBatch(features=feats[i, :n], hidden=hidden[i, :n]) for i, n in enumerate(lens)]

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, V] fp32 target logits for final hidden rows."""
        out = self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()
        if self.softcap:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out


@torch.no_grad()
def soft_labels(extractor: TargetFeatures, hidden: torch.Tensor, draft_ids: torch.Tensor | None,
                chunk_rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target distributions for supervised rows only, in row chunks (a full [N, V] never exists).

    Returns (probs [n, Vd] fp32 over the draft vocabulary (softmax of the restricted logits),
    in_vocab [n] bool (the full-vocab argmax is a draft token), argmax [n] long in draft ids).
    draft_ids None = the full vocabulary.
    """
    probs, in_vocab, argmax = [], [], []
    t2d = None
    if draft_ids is not None:
        t2d = torch.zeros(extractor.vocab_size, dtype=torch.bool, device=hidden.device)
        t2d[draft_ids] = True
    for start in range(0, hidden.shape[0], chunk_rows):
        logits = extractor.logits(hidden[start:start + chunk_rows])  # [c, V] fp32
        if draft_ids is None:
            probs.append(torch.softmax(logits, -1))
            in_vocab.append(torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device))
            argmax.append(logits.argmax(-1))
        else:
            restricted = logits[:, draft_ids]
            probs.append(torch.softmax(restricted, -1))
            in_vocab.append(t2d[logits.argmax(-1)])
            argmax.append(restricted.argmax(-1))
    if not probs:
        v = extractor.vocab_size if draft_ids is None else draft_ids.numel()
        return (hidden.new_zeros(0, v, dtype=torch.float32), torch.zeros(0, dtype=torch.bool, device=hidden.device),
                torch.zeros(0, dtype=torch.long, device=hidden.device))
    return torch.cat(probs), torch.cat(in_vocab), torch.cat(argmax)


# -- offline cache ------------------------------------------------------------------------------
CACHE_MANIFEST = "features_manifest.json"


def write_feature_cache(extractor: TargetFeatures, samples, out_dir: str | Path, manifest: dict,
                        samples_per_shard: int = 64, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write features + final hidden states of every sample to safetensors shards with a manifest."""
    from safetensors.torch import save_file

    from eaglespec.train.data import pack

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = []
    for first in range(0, len(samples), samples_per_shard):
        tensors = {}
        for i, s in enumerate(samples[first:first + samples_per_shard], start=first):
            tb = extractor(pack([s]))
            tensors[f"{i}.ids"] = s.ids.contiguous()
            tensors[f"{i}.loss_mask"] = s.loss_mask.to(torch.uint8).contiguous()
            tensors[f"{i}.features"] = tb.features.to("cpu", dtype).contiguous()
            tensors[f"{i}.hidden"] = tb.hidden.to("cpu", dtype).contiguous()
        name = f"features-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / (name + ".tmp")))
        (out / (name + ".tmp")).replace(out / name)
        shards.append(name)
    meta = dict(manifest, shards=shards, num_samples=len(samples), cache_dtype=str(dtype).replace("torch.", ""))
    (out / CACHE_MANIFEST).write_text(json.dumps(meta, indent=2) + "\n")
    return out


def open_feature_cache(cache_dir: str | Path, model, tokenizer=None, layer_ids=None) -> list[dict[str, torch.Tensor]]:
    """Load a cache written by write_feature_cache; refuse it when its manifest does not match."""
    from safetensors.torch import load_file

    cache_dir = Path(cache_dir)
    mpath = cache_dir / CACHE_MANIFEST
    if not mpath.is_file():
        raise EagleSpecError(f"{cache_dir}: not a feature cache ({CACHE_MANIFEST} missing)")
    meta = json.loads(mpath.read_text())
    bad = manifest_mismatches(meta, model, tokenizer)
    if layer_ids is not None and list(layer_ids) != list(meta.get("feature_layer_ids", [])):
        bad.append(f"feature_layer_ids {meta.get('feature_layer_ids')} != {list(layer_ids)}")
    if bad:
        raise EagleSpecError(f"{mpath}: the feature cache was made for a different target: {'; '.join(bad)}")
    items: dict[int, dict[str, torch.Tensor]] = {}
    for shard in meta["shards"]:
        for key, t in load_file(str(cache_dir / shard)).items():
            i, field = key.split(".", 1)
            items.setdefault(int(i), {})[field] = t
    return [items[i] for i in sorted(items)]


def attach_feature_cache(cache_dir: str | Path, model, tokenizer, samples: list, layer_ids: tuple[int, ...],
                         *, rank: int = 0) -> list:
    """Offline training: write the cache for `samples` when `cache_dir` has none (rank 0), then read it
    back (its manifest checked against this target and these layer ids) into each sample."""
    from eaglespec.checkpoint.manifest import build_manifest
    from eaglespec.train.data import Sample

    cache_dir = Path(cache_dir)
    if not (cache_dir / CACHE_MANIFEST).is_file() and rank == 0:
        extractor = TargetFeatures(model, layer_ids)
        manifest = build_manifest(model, tokenizer, method="features", feature_layer_ids=layer_ids)
        write_feature_cache(extractor, samples, cache_dir, manifest)
        extractor.close()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    items = open_feature_cache(cache_dir, model, tokenizer, layer_ids)
    if len(items) != len(samples) or any(not torch.equal(it["ids"], s.ids) for it, s in zip(items, samples)):
        raise EagleSpecError(f"{cache_dir}: the feature cache holds other samples than --data (use another directory)")
    return [Sample(s.ids, s.loss_mask, it["features"], it["hidden"]) for s, it in zip(samples, items)]
