"""The drafter trainer: EAGLE-3 (training-time test), HASS and EAGLE-1, one pipeline.

One optimizer step = `grad_accum` micro-batches on each of `world` ranks; micro-batch k of the run
is a pack of `batch_size` samples taken from a seeded per-epoch permutation, so the data position
is a pure function of the step (resume and data parallelism need nothing else). Per step:

    1. targets  (no grad): pack -> frozen target -> features + final hidden -> soft labels of the
                supervised rows only (contract 8: the target never builds a graph)
    2. counts   supervised rows per TTT step, summed over micro-batches and ranks: the loss is a
                masked mean over the GLOBAL batch, so accumulation and DDP equal one big batch
    3. drafter  forward/backward per micro-batch through the SAME Eagle3Drafter.forward that
                decodes (TTT steps stack their keys in its KV cache; masks.step_visible)
    4. update   all-reduce grads, clip 0.5, AdamW(0.9, 0.95), warmup + cosine; a step with zero
                supervised rows is skipped entirely (no weight decay either)

A checkpoint is the drafter (save_drafter) plus the training state (train/state.py: JSON + safetensors shards of
at most cfg.state_shard_bytes): step and schedule length, config, optimizer, RNG states and the data position.
The learning rate and the data order are pure functions of the step, so `resume` continues the same run bit for
bit (fp32): N paused and resumed invocations train the drafter one uninterrupted run trains.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from eaglespec.checkpoint.config import DraftConfig, default_aux_layer_ids
from eaglespec.checkpoint.drafter import MANIFEST, build_drafter, load_drafter, save_drafter
from eaglespec.checkpoint.io import replace_dir
from eaglespec.checkpoint.manifest import build_manifest, manifest_mismatches
from eaglespec.checkpoint.rope import resolve_rope_theta
from eaglespec.draft.layers import MLP, StepVisible
from eaglespec.errors import CheckpointError, EagleSpecError
from eaglespec.kernels import eager_attention
from eaglespec.train import losses
from eaglespec.train.data import Packed, Sample, group_for_packing, pack, samples_digest, split_eval
from eaglespec.train.features import TargetBatch, TargetFeatures, soft_labels
from eaglespec.train.masks import prefix_visible, step_visible
from eaglespec.train.rows import RowPlan, compile_rows
from eaglespec.train.state import (
    DEFAULT_SHARD_BYTES,
    MIN_SHARD_BYTES,
    STATE_JSON,
    pack_optimizer,
    read_state,
    unpack_optimizer,
    write_state,
)
from eaglespec.train.vocab import grown_draft_ids, select_draft_vocab, token_counts, vocab_maps

STATE_FILE = STATE_JSON  # with its safetensors shards (train/state.py)
LEGACY_STATE_FILE = "training_state.pt"  # the pickled layout: never read
LOG_FILE = "train_log.jsonl"
GROW_RIDGE = 1e-3  # grow_draft_vocab: the ridge of the embedding-to-lm_head least-squares map


@dataclass
class TrainConfig:
    method: str = "eagle3"  # eagle3 | hass | eagle1
    steps: int | None = None  # optimizer steps (None: from epochs)
    epochs: float = 1.0
    batch_size: int = 4  # samples packed into one micro-batch row
    grad_accum: int = 1
    max_length: int = 2048
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int | None = None  # None: 5% of the steps
    min_lr_ratio: float = 0.0
    clip: float = 0.5
    ttt_steps: int = 7  # EAGLE-3 training-time test steps
    ttt_decay: float = 0.8
    ttt_attention: str = "dense"  # dense | factored: how a TTT / HASS step attends (draft/layers.StepVisible)
    hass_steps: int = 3  # HASS alignment steps (EAGLE-1: 1)
    hass_decay: float = 1.0
    topk: int = 10  # HASS top-K distillation
    w_reg: float = losses.EAGLE1_W_REG
    w_cls: float = losses.EAGLE1_W_CLS
    w_topk: float = 1.0
    noise: str = "uniform"  # uniform | length-scaled | none (EAGLE-1 / HASS feature noise)
    noise_scale: float | None = None  # None: 0.1 (uniform) / 0.2 (length-scaled)
    draft_vocab: int | None = None  # None: 32000 capped at the target vocabulary
    init_from: str | None = None  # a drafter checkpoint to start from (its weights and draft vocabulary)
    intermediate_size: int | None = None  # the drafter's MLP width (None: the target's; with init_from: widened to it)
    seed: int = 0
    eval_fraction: float = 0.02
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 8
    save_every: int = 0  # 0: only at the end
    state_shard_bytes: int = DEFAULT_SHARD_BYTES  # largest file of the saved training state (15 MB)
    log_every: int = 10
    label_chunk_rows: int = 2048
    pack_tokens: int | None = None  # tokens per packed row (None: max_length); a micro-batch makes several
    time_budget_s: float | None = None  # fit the schedule (cosine included) into this many seconds of steps
    device: str = "cpu"
    autocast: bool | None = None  # None: bf16 autocast on CUDA
    progress: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TTT_ATTENTION = ("dense", "factored")


@dataclass
class TrainResult:
    drafter: nn.Module
    steps: int
    history: list[dict[str, Any]] = field(default_factory=list)
    eval: dict[str, Any] = field(default_factory=dict)
    out: Path | None = None


# -- distributed helpers ------------------------------------------------------------------------
def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def world_rank() -> tuple[int, int]:
    d = _dist()
    return (d.get_world_size(), d.get_rank()) if d else (1, 0)


def init_distributed(device: str) -> str:
    """Under torchrun: init the process group (NCCL on CUDA, gloo on CPU); return this rank's device."""
    import torch.distributed as dist

    if "RANK" not in os.environ or dist.is_initialized():
        return device
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        return f"cuda:{local}"
    dist.init_process_group("gloo")
    return device


def _unpin_process_group(pg) -> int:
    """Drop the references to `pg` that torch.distributed modules froze as default arguments at import time
    (`def broadcast(..., group=group.WORLD)` in torch.distributed.nn.functional, ZeroRedundancyOptimizer's
    `_broadcast_object`): a module imported after init_process_group (transformers' model classes import
    torch.distributed.checkpoint -> _shard -> nn.functional) keeps the default group alive after
    destroy_process_group. Replaced by None (= the default group). Returns how many functions changed."""
    import inspect

    changed = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("torch.distributed") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            fns = [obj] if inspect.isfunction(obj) else (
                [f for f in vars(obj).values() if inspect.isfunction(f)] if isinstance(obj, type) else [])
            for fn in fns:
                if fn.__defaults__ and any(d is pg for d in fn.__defaults__):
                    fn.__defaults__ = tuple(None if d is pg else d for d in fn.__defaults__)
                    changed += 1
                if fn.__kwdefaults__ and any(v is pg for v in fn.__kwdefaults__.values()):
                    fn.__kwdefaults__ = {k: None if v is pg else v for k, v in fn.__kwdefaults__.items()}
                    changed += 1
    return changed


def finish_distributed() -> None:
    """Under torchrun, at the end: wait for every rank (rank 0 may still be writing the checkpoint), then tear the
    process group down, for real, before the interpreter exits.

    Why: in torch 2.11-2.13, destroy_process_group() does not stop a gloo group (ProcessGroupGloo has no
    shutdown()); its worker threads (pt_gloo_runloop) and transport thread (gloo_tcp_loop) are joined only by
    its destructor, i.e. when the last reference goes. torch.distributed.nn.functional's import-time
    `group=group.WORLD` defaults (imported when the HF target is built after init) hold another reference, so
    without this the threads outlive destroy_process_group and a rank can abort at interpreter exit
    ("terminate called without an active exception", pytorch/pytorch#65231 and #65513: the gloo group must be
    destroyed before exit, not left to the GC at finalization). Here those references are dropped and ours
    released, so the destructor joins the threads."""
    dist = _dist()
    if dist is None:
        return
    dist.barrier()
    pg = dist.group.WORLD
    dist.destroy_process_group()
    _unpin_process_group(pg)
    del pg  # the last reference: ~ProcessGroupGloo joins its threads here, in this call


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    d = _dist()
    if d:
        d.all_reduce(t)
    return t


# -- drafter construction -----------------------------------------------------------------------
def _text_config(model):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def drafter_config(model, method: str, draft_vocab_size: int, intermediate_size: int | None = None) -> DraftConfig:
    """A one-layer drafter shaped like the target's decoder layer (its MLP `intermediate_size` wide when given)."""
    c = _text_config(model)
    heads = c.num_attention_heads
    layers = c.num_hidden_layers
    vocab = model.get_output_embeddings().weight.shape[0]
    if method == "eagle3":
        ids = default_aux_layer_ids(layers) if layers >= 6 else (2, max(2, layers // 2), max(2, layers - 1))
        ids = tuple(min(i, layers) for i in ids)
    else:
        ids = (layers,)
    return DraftConfig(
        method="eagle3" if method == "eagle3" else "eagle1",
        hidden_size=c.hidden_size, intermediate_size=intermediate_size or c.intermediate_size, num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, vocab_size=vocab,
        draft_vocab_size=draft_vocab_size if method == "eagle3" else vocab, target_hidden_size=c.hidden_size,
        aux_layer_ids=ids, rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
        rope_theta=resolve_rope_theta(c.to_dict()),  # 5.x keeps it under rope_parameters
        max_position_embeddings=getattr(c, "max_position_embeddings", 8192))


def new_drafter(model, method: str, draft_ids: torch.Tensor | None, seed: int,
                intermediate_size: int | None = None) -> nn.Module:
    vocab = model.get_output_embeddings().weight.shape[0]
    vd = vocab if draft_ids is None else draft_ids.numel()
    cfg = drafter_config(model, method, vd, intermediate_size)
    torch.manual_seed(seed)
    drafter = build_drafter(cfg)
    if method == "eagle3" and draft_ids is not None:
        d2t, t2d = vocab_maps(draft_ids, vocab)
        drafter.d2t.copy_(d2t)
        drafter.t2d.copy_(t2d)
    return attach_target(drafter, model)


def attach_target(drafter: nn.Module, model) -> nn.Module:
    """Wire the frozen target's embedding (EAGLE-1 / HASS: also its final norm and lm_head) into `drafter`."""
    drafter.set_target_embedding(model.get_input_embeddings())
    if hasattr(drafter, "set_target_head"):
        from eaglespec.draft.eagle1 import target_head

        norm, head = target_head(SimpleNamespace(model=model))  # it takes a backend holding `.model`
        drafter.set_target_head(norm, head, _text_config(model).num_hidden_layers)
    return drafter


def init_drafter(path: str | Path, model, cfg: TrainConfig, tokenizer=None) -> nn.Module:
    """The drafter saved at `path` (any layout load_drafter reads) in fp32, to train on (`--init`).

    It must fit the target and `cfg`: method, hidden size, aux layer ids, vocabulary, the draft
    vocabulary (it comes from the checkpoint) and, when it carries a manifest, the target fingerprint;
    every refusal is one line naming the file and the field.
    """
    path = Path(path)
    c = _text_config(model)
    vocab = model.get_output_embeddings().weight.shape[0]
    # range of the aux ids, target_hidden_size and vocab_size are checked by load_drafter
    drafter = load_drafter(path, target_num_layers=c.num_hidden_layers, target_hidden_size=c.hidden_size,
                           target_vocab_size=vocab, dtype=torch.float32)
    dc, cfile = drafter.cfg, path / "config.json"
    want = "eagle3" if cfg.method == "eagle3" else "eagle1"  # HASS trains the EAGLE-1 architecture
    if dc.method != want:
        raise CheckpointError(cfile, f"method {dc.method} does not match --method {cfg.method}")
    if drafter.embed_tokens is None and dc.hidden_size != c.hidden_size:
        raise CheckpointError(cfile, f"hidden_size {dc.hidden_size} does not match the target's {c.hidden_size}")
    if dc.method == "eagle3" and min(dc.aux_layer_ids) < 2:
        raise CheckpointError(cfile, f"aux layer ids {list(dc.aux_layer_ids)} start below 2: the trainer writes "
                                     "entering-layer ids >= 2")
    if dc.method == "eagle3" and cfg.draft_vocab is not None and min(cfg.draft_vocab, vocab) < dc.draft_vocab_size:
        raise CheckpointError(cfile, f"draft_vocab_size {dc.draft_vocab_size} is above --draft-vocab "
                                     f"{cfg.draft_vocab}: --init grows a drafter's draft vocabulary, never shrinks it")
    bad = manifest_mismatches(drafter.manifest, model, tokenizer)
    if bad:
        raise CheckpointError(path / MANIFEST, f"the drafter was trained against another target ({'; '.join(bad)}): "
                                               "--init refuses it")
    if cfg.intermediate_size is not None and cfg.intermediate_size != dc.intermediate_size:
        if cfg.intermediate_size < dc.intermediate_size:
            raise CheckpointError(cfile, f"intermediate_size {dc.intermediate_size} is above --intermediate-size "
                                         f"{cfg.intermediate_size}: --init widens a drafter's MLP, never narrows it")
        widen_mlp(drafter, cfg.intermediate_size, cfg.seed)
    if drafter.embed_tokens is not None:  # a copy of the target's embedding (EAGLE-1 files): frozen, like it
        drafter.embed_tokens.requires_grad_(False)
    return attach_target(drafter, model)


@torch.no_grad()
def widen_mlp(drafter: nn.Module, size: int, seed: int) -> None:
    """Widen every MLP of `drafter` to `size` hidden units in place, keeping its function: the new gate/up rows are
    drawn as nn.Linear initialises them (uniform, bound 1/sqrt(fan_in), seeded), the new down_proj columns are zero,
    so the new units add silu(g) * u * 0 = 0 until training moves them (and the gradient reaches their gate/up rows
    once their down columns are nonzero). drafter.cfg.intermediate_size becomes `size`."""
    gen = torch.Generator().manual_seed(seed)
    for mlp in (m for m in drafter.modules() if isinstance(m, MLP)):
        extra = size - mlp.down_proj.in_features
        for name in ("gate_proj", "up_proj"):  # weight [old, hidden] -> [size, hidden]
            lin: nn.Linear = getattr(mlp, name)
            bound = 1.0 / math.sqrt(lin.in_features)
            new = torch.empty(extra, lin.in_features).uniform_(-bound, bound, generator=gen).to(lin.weight)
            bias = None if lin.bias is None else torch.cat([lin.bias, lin.bias.new_zeros(extra)])
            setattr(mlp, name, _linear_of(torch.cat([lin.weight, new]), bias))
        down = mlp.down_proj  # weight [hidden, old] -> [hidden, size]
        mlp.down_proj = _linear_of(torch.cat([down.weight, down.weight.new_zeros(down.out_features, extra)], 1),
                                   down.bias)
    drafter.cfg = replace(drafter.cfg, intermediate_size=size)


@torch.no_grad()
def grow_draft_vocab(drafter: nn.Module, model, counts: torch.Tensor, size: int) -> torch.Tensor:
    """Grow an EAGLE-3 drafter's draft vocabulary to `size` ids in place (`--init` with a larger --draft-vocab).

    The drafter's draft ids stay; the most frequent other target ids by `counts` [V] join them (ties: the lower
    id), and the new draft ids are the union sorted by id (contract 5: d2t / t2d rebuilt). A kept id's lm_head row
    is copied. A new id's row is the target's output embedding of that id through the linear map (with a constant
    term) that best takes the kept ids' target embeddings to their rows (least squares, ridge GROW_RIDGE): the new
    rows start on the drafter's own logit scale rather than at zero, where tens of thousands of new tokens would
    take a share of every distribution. drafter.cfg.draft_vocab_size becomes the new size. Returns the draft ids.
    """
    vocab = counts.numel()
    head = drafter.lm_head.weight  # [Vd, H]
    old = drafter.to_target_ids(torch.arange(head.shape[0], device=drafter.d2t.device)).cpu()  # [Vd]
    ids = grown_draft_ids(old, counts, size)  # [size] sorted, a superset of old
    emb = model.get_output_embeddings().weight.detach().to(head.device, torch.float32)  # [V, Ht]
    x = torch.cat([emb, emb.new_ones(vocab, 1)], 1)  # [V, Ht + 1]
    xo = x[old.to(head.device)]
    ridge = GROW_RIDGE * torch.eye(x.shape[1], device=head.device)
    fit = torch.linalg.solve(xo.T @ xo + ridge, xo.T @ head.float())  # [Ht + 1, H]
    rows = x[ids.to(head.device)] @ fit  # [size, H]
    rows[torch.searchsorted(ids, old).to(head.device)] = head.float()  # the kept rows (both id lists sorted)
    drafter.lm_head = _linear_of(rows.to(head.dtype), None)
    d2t, t2d = vocab_maps(ids, vocab)
    drafter.d2t, drafter.t2d = d2t.to(drafter.d2t.device), t2d.to(drafter.t2d.device)
    drafter.cfg = replace(drafter.cfg, draft_vocab_size=ids.numel())
    return ids


def _linear_of(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A new nn.Linear holding copies of `weight` [out, in] and `bias` [out]."""
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


# -- schedule / data order ----------------------------------------------------------------------
def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr."""
    warm = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, int(0.05 * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class MicroBatches:
    """Micro-batch k -> the samples of the k-th pack of a seeded per-epoch permutation."""

    def __init__(self, samples: list[Sample], batch_size: int, seed: int):
        if not samples:
            raise EagleSpecError("no training samples (every conversation was empty or had no assistant tokens)")
        self.samples, self.batch_size, self.seed = samples, batch_size, seed
        self.per_epoch = math.ceil(len(samples) / batch_size)
        self._perm: tuple[int, list[int]] | None = None

    def __call__(self, k: int) -> list[Sample]:
        epoch, j = divmod(k, self.per_epoch)
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1000003 + epoch)
            self._perm = (epoch, torch.randperm(len(self.samples), generator=g).tolist())
        idx = self._perm[1][j * self.batch_size:(j + 1) * self.batch_size]
        return [self.samples[i] for i in idx]


# -- one micro-batch ----------------------------------------------------------------------------
# Training attention has masks whose shapes change every step: it runs under kernels.eager_attention (no cuDNN).


@dataclass
class Prepared:
    """Everything computed without gradients for one micro-batch."""

    packed: Packed
    plan: RowPlan
    target: TargetBatch
    sup: torch.Tensor  # [R, M] bool: final supervision (incl. in-draft-vocab)
    label_row: torch.Tensor  # [R, M] long: row of `probs` holding q for (s, r) (0 where unsupervised)
    probs: torch.Tensor  # [n_need, Vd] fp32
    argmax: torch.Tensor  # [n_need] long (draft ids)
    seconds: float = 0.0


NUM_STATS = 5  # per TTT/alignment step: loss sum, top-1 correct, rows, state norm | feature error, top-K hits
RECALL_K = 10  # the default tree width: the target's token must be among the drafter's K best to be drafted


def topk_hits(logits: torch.Tensor, target_ids: torch.Tensor, k: int = RECALL_K) -> torch.Tensor:
    """How many rows have the target's argmax among the drafter's top-k (target top-1 recall@k)."""
    k = min(k, logits.shape[-1])
    return (logits.topk(k, dim=-1).indices == target_ids[:, None]).any(-1).sum()


@dataclass
class PackBatch:
    """Several packs' row plans padded to one [P, M] batch (padding rows see only themselves)."""

    features: torch.Tensor  # [P, M, F] target features f_t of each row's source
    tokens: torch.Tensor  # [R, P, M] x_{t+1+s}
    position: torch.Tensor  # [P, M]
    segment: torch.Tensor  # [P, M]: padding gets unique negative ids
    src: torch.Tensor  # [P, M]
    sup: torch.Tensor  # [R, P, M] bool
    label_row: torch.Tensor  # [R, P, M] rows of `probs` (offset per pack)
    probs: torch.Tensor  # [sum n_need, Vd]
    argmax: torch.Tensor  # [sum n_need]


def _stack(preps: list[Prepared], steps: int) -> PackBatch:
    p_count, m = len(preps), max(p.plan.num_rows for p in preps)
    dev = preps[0].plan.src.device
    feat_dim = preps[0].target.features.shape[-1]
    b = PackBatch(
        features=preps[0].target.features.new_zeros(p_count, m, feat_dim),
        tokens=torch.zeros(steps, p_count, m, dtype=torch.long, device=dev),
        position=torch.zeros(p_count, m, dtype=torch.long, device=dev),
        segment=-1 - torch.arange(m, device=dev).repeat(p_count, 1),
        src=torch.zeros(p_count, m, dtype=torch.long, device=dev),
        sup=torch.zeros(steps, p_count, m, dtype=torch.bool, device=dev),
        label_row=torch.zeros(steps, p_count, m, dtype=torch.long, device=dev),
        probs=torch.cat([p.probs for p in preps]),
        argmax=torch.cat([p.argmax for p in preps]),
    )
    offset = 0
    for i, p in enumerate(preps):
        n, plan = p.plan.num_rows, p.plan
        b.features[i, :n] = p.target.features[plan.src]
        b.tokens[:, i, :n] = p.packed.tokens[plan.next_index]
        b.position[i, :n] = plan.position
        b.segment[i, :n] = plan.segment
        b.src[i, :n] = plan.src
        b.sup[:, i, :n] = p.sup
        b.label_row[:, i, :n] = p.label_row + offset
        offset += p.probs.shape[0]
    return b


class Trainer:
    def __init__(self, model: nn.Module, drafter: nn.Module, cfg: TrainConfig, tokenizer=None):
        self.model, self.drafter, self.cfg, self.tokenizer = model, drafter, cfg, tokenizer
        self.method = cfg.method
        self.device = torch.device(cfg.device)
        self.extractor = TargetFeatures(model, tuple(drafter.feature_layer_ids))
        self.steps_per_row = cfg.ttt_steps if cfg.method == "eagle3" else (cfg.hass_steps if cfg.method == "hass" else 1)
        decay = cfg.ttt_decay if cfg.method == "eagle3" else cfg.hass_decay
        self.weights = losses.step_weights(self.steps_per_row, decay)
        if cfg.method == "eagle3" and drafter.cfg.draft_vocab_size != drafter.cfg.vocab_size:
            self.draft_ids = (torch.arange(drafter.d2t.numel(), device=drafter.d2t.device) + drafter.d2t).to(self.device)
        else:
            self.draft_ids = None
        use_ac = cfg.autocast if cfg.autocast is not None else self.device.type == "cuda"
        self.autocast_dtype = torch.bfloat16 if use_ac else None
        params = [p for p in drafter.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.noise_gen = torch.Generator(device=self.device).manual_seed(cfg.seed + 17)

    # -- targets ----------------------------------------------------------------------------------
    @torch.no_grad()
    def prepare_many(self, groups: list[list[Sample]]) -> list[Prepared]:
        """Pack each group, run the target ONCE over all packs, then build each pack's labels."""
        t0 = time.perf_counter()
        packs = [pack(g).to(self.device) for g in groups]
        if groups and all(smp.features is not None for g in groups for smp in g):  # offline: cached features
            targets = [TargetBatch(features=torch.cat([smp.features for smp in g]).to(self.device),
                                   hidden=torch.cat([smp.hidden for smp in g]).to(self.device)) for g in groups]
        else:
            with eager_attention():
                targets = self.extractor.batch(packs) if packs else []
        preps = [self._labels(p, tb) for p, tb in zip(packs, targets)]
        for p in preps:
            p.seconds = (time.perf_counter() - t0) / len(preps)
        return preps

    def prepare(self, samples: list[Sample]) -> Prepared:
        return self.prepare_many([samples])[0]

    @torch.no_grad()
    def _labels(self, packed: Packed, tb: TargetBatch) -> Prepared:
        plan = compile_rows(packed.valid, packed.segment, packed.loss_mask, packed.position, self.steps_per_row)
        n = packed.tokens.numel()
        need = torch.zeros(n, dtype=torch.bool, device=self.device)
        need[plan.next_index[plan.supervised]] = True
        rows = need.nonzero().squeeze(1)
        inv = torch.zeros(n, dtype=torch.long, device=self.device)
        inv[rows] = torch.arange(rows.numel(), device=self.device)
        probs, in_vocab, argmax = soft_labels(self.extractor, tb.hidden[rows], self.draft_ids, self.cfg.label_chunk_rows)
        label_row = inv[plan.next_index]  # [R, M]
        sup = plan.supervised & in_vocab[label_row] if rows.numel() else plan.supervised
        return Prepared(packed, plan, tb, sup, label_row, probs, argmax)

    # -- drafter ----------------------------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _visible(self, segment: torch.Tensor, src: torch.Tensor, step: int, prefix: torch.Tensor):
        """Step `step`'s keys as a dense mask [(P,) M, (step+1) M], or factored (cfg.ttt_attention="factored":
        the same attention, M + step keys scored per query)."""
        if self.cfg.ttt_attention == "factored":
            return StepVisible(prefix, step)
        return step_visible(segment, src, step, prefix)

    def micro_loss(self, preps: Prepared | list[Prepared], counts: torch.Tensor, training: bool = True):
        """Weighted sum of per-step masked sums / global counts; and metric sums [R, 4].

        EAGLE-3 runs all packs in one batched drafter call per TTT step (the drafter takes a leading
        batch dim); EAGLE-1/HASS go pack by pack.
        """
        preps = [preps] if isinstance(preps, Prepared) else preps
        with eager_attention():
            if self.method == "eagle3":
                return self._eagle3(preps, counts)
            total = torch.zeros((), device=self.device)
            stats = torch.zeros(self.steps_per_row, NUM_STATS, device=self.device)
            for prep in preps:
                loss, st = self._eagle1_hass(prep, counts, training)
                total, stats = total + loss, stats + st
            return total, stats

    def _eagle3(self, preps: list[Prepared], counts: torch.Tensor):
        d = self.drafter
        stats = torch.zeros(self.steps_per_row, NUM_STATS, device=self.device)  # loss sum, correct, count, state norm
        total = torch.zeros((), device=self.device)
        preps = [p for p in preps if p.plan.num_rows]
        if not preps:
            return total, stats
        b = _stack(preps, self.steps_per_row)
        prefix = prefix_visible(b.segment, b.src)  # [P, M, M]
        cache = d.new_cache()
        with self._autocast():
            state = d.project(b.features)  # [P, M, H]
            for s in range(self.steps_per_row):
                visible = self._visible(b.segment, b.src, s, prefix)  # [P, M, (s+1) M]
                logits, state = d(state, b.tokens[s], b.position + s, cache, visible)
                rows = b.sup[s].reshape(-1).nonzero().squeeze(1)  # flattened (pack, row) indices
                if rows.numel():
                    flat_logits = logits.reshape(-1, logits.shape[-1])[rows]
                    lab = b.label_row[s].reshape(-1)[rows]
                    ce = losses.soft_ce_sum(flat_logits, b.probs[lab])
                    total = total + self.weights[s] * ce / counts[s].clamp(min=1)
                    with torch.no_grad():
                        stats[s, 0] = ce.detach()
                        stats[s, 1] = (flat_logits.argmax(-1) == b.argmax[lab]).sum()
                        stats[s, 2] = rows.numel()
                        flat_state = state.reshape(-1, state.shape[-1])[rows]
                        stats[s, 3] = flat_state.detach().float().norm(dim=-1).sum()
                        stats[s, 4] = topk_hits(flat_logits, b.argmax[lab])
        return total, stats

    def _eagle1_hass(self, prep: Prepared, counts: torch.Tensor, training: bool):
        """EAGLE-1 (1 step) / HASS (n alignment steps): later steps read the draft's own features."""
        plan, d, cfg = prep.plan, self.drafter, self.cfg
        stats = torch.zeros(self.steps_per_row, NUM_STATS, device=self.device)  # loss, correct, count, feature err
        total = torch.zeros((), device=self.device)
        if plan.num_rows == 0:
            return total, stats
        # the feature is target_norm(h_L): the drafter's project() of captured id L on the input side,
        # the target's own final hidden state (the same tensor) as the regression target
        feats, goal = prep.target.features, prep.target.hidden
        noise = losses.NOISE[cfg.noise]
        prefix = prefix_visible(plan.segment, plan.src)
        cache = d.new_cache()
        with self._autocast():
            state = d.project(feats[plan.src])
            if training and noise is not None:
                scale = cfg.noise_scale if cfg.noise_scale is not None else (0.1 if cfg.noise == "uniform" else 0.2)
                seg_len = torch.bincount(prep.packed.segment[prep.packed.valid])[plan.segment]
                state = noise(state, self.noise_gen, scale, seg_len)
            for s in range(self.steps_per_row):
                # step s > 0 (HASS) reads the draft-produced feature of step s-1, as at decode time
                tokens = prep.packed.tokens[plan.next_index[s]]
                visible = self._visible(plan.segment, plan.src, s, prefix)
                logits, state = d(state, tokens, plan.position + s, cache, visible)
                rows = prep.sup[s].nonzero().squeeze(1)
                if rows.numel():
                    lab = prep.label_row[s, rows]
                    tgt_feat = goal[plan.next_index[s, rows]]
                    reg = losses.smooth_l1_sum(state[rows], tgt_feat)
                    ce = losses.soft_ce_sum(logits[rows], prep.probs[lab])
                    term = losses.eagle1_combine(reg, ce, cfg.w_reg, cfg.w_cls)
                    if self.method == "hass":
                        term = term + cfg.w_topk * losses.topk_distill_sum(logits[rows], prep.probs[lab], cfg.topk)
                    total = total + self.weights[s] * term / counts[s].clamp(min=1)
                    with torch.no_grad():
                        stats[s, 0] = term.detach()
                        stats[s, 1] = (logits[rows].argmax(-1) == prep.argmax[lab]).sum()
                        stats[s, 2] = rows.numel()
                        stats[s, 3] = (state[rows].float() - tgt_feat.float()).norm(dim=-1).sum()
                        stats[s, 4] = topk_hits(logits[rows], prep.argmax[lab])
        return total, stats

    # -- steps ------------------------------------------------------------------------------------
    def train_step(self, micro: list[list[Sample]], lr: float) -> dict[str, Any] | None:
        """One optimizer step over this rank's micro-batches; None when skipped (zero supervised rows)."""
        budget = self.cfg.pack_tokens or self.cfg.max_length
        preps = self.prepare_many([g for m in micro for g in group_for_packing(m, budget)])
        counts = torch.stack([p.sup.sum(1) for p in preps]).sum(0).float()  # [R]
        _all_reduce(counts)
        tokens = torch.tensor([float(sum(p.packed.valid.sum().item() for p in preps))], device=self.device)
        _all_reduce(tokens)
        if counts[0].item() == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.drafter.train()
        stats = torch.zeros(self.steps_per_row, NUM_STATS, device=self.device)
        extract_s = sum(p.seconds for p in preps)
        loss, stats = self.micro_loss(preps, counts)
        if loss.requires_grad:
            loss.backward()
        self._reduce_grads()
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        _all_reduce(stats)
        return self._metrics(stats, counts) | {"grad_norm": float(grad_norm), "lr": lr,
                                              "tokens": int(tokens.item()), "extract_s": extract_s}

    def _reduce_grads(self) -> None:
        d = _dist()
        if not d:
            return
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        for p in params:  # a rank without supervised rows has no grads: it still joins with zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        d.all_reduce(flat)  # every rank's loss is already normalised by the GLOBAL count: sum, not mean
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def _metrics(self, stats: torch.Tensor, counts: torch.Tensor) -> dict[str, Any]:
        s = stats.cpu()
        n = s[:, 2].clamp(min=1)
        per_loss = (s[:, 0] / n).tolist()
        per_acc = (s[:, 1] / n).tolist()
        loss = sum(w * v for w, v in zip(self.weights, per_loss))
        out = {"loss": loss, "loss_by_step": per_loss, "acc_by_step": per_acc, "rows_by_step": s[:, 2].tolist()}
        key = "state_norm" if self.method == "eagle3" else "feature_err_by_step"
        out[f"top{RECALL_K}_recall_by_step"] = (s[:, 4] / n).tolist()
        vals = (s[:, 3] / n).tolist()
        out[key] = vals[0] if self.method == "eagle3" else vals
        return out

    @torch.no_grad()
    def evaluate(self, batches: list[list[Sample]]) -> dict[str, Any]:
        """Loss and top-1 per step on held-out packs (sharded over ranks, reduced)."""
        world, rank = world_rank()
        self.drafter.eval()
        stats = torch.zeros(self.steps_per_row, NUM_STATS, device=self.device)
        counts = torch.zeros(self.steps_per_row, device=self.device)
        budget = self.cfg.pack_tokens or self.cfg.max_length
        mine = self.prepare_many([g for i, b in enumerate(batches) if i % world == rank
                                  for g in group_for_packing(b, budget)])
        for p in mine:
            counts += p.sup.sum(1).float()
        _all_reduce(counts)
        if mine:
            _, stats = self.micro_loss(mine, counts, training=False)
        _all_reduce(stats)
        return self._metrics(stats, counts)


# -- checkpoints --------------------------------------------------------------------------------
# TrainConfig fields that belong to one invocation: a resume takes these from its own call and every other field
# from the saved run, so the schedule, data order and objective stay the run's. grad_accum may change with the
# number of GPUs as long as the global micro-batches per step (GPUs x grad_accum) stay the same.
INVOCATION_FIELDS = ("device", "autocast", "progress", "eval_every", "eval_batches", "save_every", "log_every",
                     "grad_accum", "label_chunk_rows", "state_shard_bytes")


def _rng_state(trainer: Trainer) -> dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "python": random.getstate(), "noise": trainer.noise_gen.get_state(),
          "noise_device": trainer.noise_gen.device.type}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(trainer: Trainer, st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if st.get("noise_device", trainer.noise_gen.device.type) == trainer.noise_gen.device.type:
        trainer.noise_gen.set_state(st["noise"])  # else (a CUDA run resumed on CPU) it stays seeded from cfg.seed
    if "cuda" in st and torch.cuda.is_available():  # saved on a machine with more GPUs: keep the ones here
        for i, state in enumerate(st["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, i)


def _pack_rng(st: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """RNG states -> (JSON: Python's Mersenne Twister state and counts, uint8 tensors: torch CPU, CUDA, noise)."""
    version, internal, gauss = st["python"]
    cuda = list(st.get("cuda", []))
    tensors = {"rng.torch": st["torch"], "rng.noise": st["noise"]} | {f"rng.cuda.{i}": s for i, s in enumerate(cuda)}
    return {"python": [version, list(internal), gauss], "cuda_devices": len(cuda),
            "noise_device": st["noise_device"]}, tensors


def _unpack_rng(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    version, internal, gauss = meta["python"]
    st = {"torch": tensors["rng.torch"], "python": (version, tuple(internal), gauss), "noise": tensors["rng.noise"],
          "noise_device": meta["noise_device"]}
    if meta["cuda_devices"]:
        st["cuda"] = [tensors[f"rng.cuda.{i}"] for i in range(meta["cuda_devices"])]
    return st


def data_position(step: int, per_step: int, cfg: TrainConfig, train_s: list[Sample], digest: str) -> dict[str, Any]:
    """Where the run is in its data: the next global micro-batch (MicroBatches index; the order is a pure function
    of it, cfg.seed and cfg.batch_size) and what it indexes (the training samples' count and fingerprint)."""
    return {"next_micro_batch": step * per_step, "micro_batches_per_step": per_step, "batch_size": cfg.batch_size,
            "seed": cfg.seed, "train_samples": len(train_s), "samples_sha256": digest}


def write_checkpoint(out: Path, trainer: Trainer, step: int, total: int, manifest: dict[str, Any],
                     run: dict[str, Any] | None = None) -> None:
    """Atomic: the drafter (save_drafter: native layout + manifest) and the training state (train/state.py: JSON +
    safetensors shards of at most cfg.state_shard_bytes) in a temp dir, then swapped in. `run`: further JSON fields
    of the state (the data position, the totals)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.ckpt-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_drafter(trainer.drafter, tmp, manifest=dict(manifest, trained_steps=step))
    opt_meta, opt_tensors = pack_optimizer(trainer.optimizer.state_dict())
    rng_meta, rng_tensors = _pack_rng(_rng_state(trainer))
    drafter = {f"drafter.{k}": v for k, v in trainer.drafter.state_dict().items()}
    meta = {"step": step, "total_steps": total, "config": trainer.cfg.to_dict(), **(run or {}),
            "optimizer": opt_meta, "rng": rng_meta}
    write_state(tmp, meta, drafter | opt_tensors | rng_tensors, trainer.cfg.state_shard_bytes)
    if (out / LOG_FILE).is_file():
        shutil.copy2(out / LOG_FILE, tmp / LOG_FILE)
    replace_dir(tmp, out)


def read_training_state(out: Path) -> dict[str, Any]:
    """The state write_checkpoint saved in `out`: its JSON fields, and "drafter" (a state_dict), "optimizer" (a
    state_dict) and "rng" rebuilt from the shards. No pickle is read."""
    out = Path(out)
    where = out
    if not (out / STATE_FILE).is_file():
        backup = out.with_name(f".{out.name}.old")  # killed between the two renames of replace_dir
        if (backup / STATE_FILE).is_file():
            where = backup
        elif (out / LEGACY_STATE_FILE).is_file():
            raise EagleSpecError(f"{out}: holds a {LEGACY_STATE_FILE} (the pickled layout, not read); --resume reads "
                                 f"{STATE_FILE} and its safetensors shards: start the run again, or --init {out} to "
                                 "continue from its drafter with a fresh optimizer")
        else:
            raise EagleSpecError(f"{out}: --resume given but no {STATE_FILE} found there")
    doc, tensors = read_state(where)
    missing = [k for k in ("step", "total_steps", "config", "data", "totals", "optimizer", "rng") if k not in doc]
    if missing:
        raise CheckpointError(where / STATE_FILE, f"malformed training state (no field {missing[0]!r})")
    try:
        drafter = {k.removeprefix("drafter."): v for k, v in tensors.items() if k.startswith("drafter.")}
        return doc | {"drafter": drafter, "optimizer": unpack_optimizer(doc["optimizer"], tensors),
                      "rng": _unpack_rng(doc["rng"], tensors)}
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(where / STATE_FILE, f"malformed training state (field {exc})") from None


def check_data_position(out: Path, saved: dict[str, Any], per_step: int, train_s: list[Sample], digest: str) -> None:
    """A resume must index the same training samples with the same global micro-batches per step (one line
    naming what differs otherwise)."""
    if saved["micro_batches_per_step"] != per_step:
        raise EagleSpecError(f"{out}: the saved run takes {saved['micro_batches_per_step']} micro-batches per step "
                             f"(GPUs x --grad-accum), this one {per_step}: keep the global batch")
    if saved["train_samples"] != len(train_s) or saved["samples_sha256"] != digest:
        raise EagleSpecError(f"{out}: the training samples differ from the saved run's ({len(train_s)} here, "
                             f"{saved['train_samples']} there, or other tokens): resume with the same --data, "
                             "--limit, --max-length and --exclude")


def _saved_run(cfg: TrainConfig, saved: dict[str, Any]) -> tuple[TrainConfig, list[str]]:
    """`cfg` with the saved run's fields (all but INVOCATION_FIELDS); and the ones that differed, as 'name=saved'."""
    known = {k: v for k, v in saved.items() if k in TrainConfig.__dataclass_fields__ and k not in INVOCATION_FIELDS}
    diff = [f"{k}={v!r}" for k, v in known.items() if getattr(cfg, k) != v]
    return replace(cfg, **known), diff


# -- the run ------------------------------------------------------------------------------------
def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fmt(m: dict[str, Any]) -> str:
    acc = " ".join(f"{a:.2f}" for a in m["acc_by_step"])
    recall = " ".join(f"{a:.2f}" for a in m[f"top{RECALL_K}_recall_by_step"])
    return f"loss {m['loss']:.4f} | top-1 by step [{acc}] | top-{RECALL_K} recall by step [{recall}]"


def total_steps(cfg: TrainConfig, n_train: int, world: int) -> int:
    if cfg.steps is not None:
        return cfg.steps
    per_step = cfg.batch_size * cfg.grad_accum * world
    return max(1, math.ceil(cfg.epochs * n_train / per_step))


FIT_SKIP, FIT_STEPS = 2, 8  # a time budget times steps FIT_SKIP.. (after the warm-up) to fix the schedule


def _rank0(value: int, device: torch.device) -> int:
    """Rank 0's `value` on every rank (each rank calls this at the same step)."""
    if not _dist():
        return value
    t = torch.tensor([value], device=device)
    _dist().broadcast(t, 0)
    return int(t.item())


def fitted_total(step: int, total: int, elapsed_s: float, budget_s: float, per_step_s: float) -> int:
    """The schedule length that ends the run within `budget_s` (of which `elapsed_s` are spent) at
    `per_step_s` per step: never longer than `total`, never shorter than the steps taken plus one."""
    return max(step + 1, min(total, step + int((budget_s - elapsed_s) / max(per_step_s, 1e-9))))


def check_start(init_from: str | None, resume: bool) -> None:
    """A run starts new, from a checkpoint (--init), or where a saved run stopped (--resume): one of them."""
    if init_from is not None and resume:
        raise EagleSpecError("--init and --resume together: --resume continues the run saved in --out, "
                             "which remembers its --init")


def _init_record(cfg: TrainConfig, drafter: nn.Module) -> dict[str, Any] | None:
    """Manifest entry of a run started from a checkpoint: its path, its steps and its own init (lineage)."""
    if cfg.init_from is None:
        return None
    prev = getattr(drafter, "manifest", None) or {}
    return {"init": {"path": str(cfg.init_from), "trained_steps": prev.get("trained_steps"),
                     "init": prev.get("init")}}


def train(model: nn.Module, samples: list[Sample], cfg: TrainConfig, out: str | Path | None = None, *,
          tokenizer=None, resume: bool = False, drafter: nn.Module | None = None,
          stop_after: int | None = None, pause_after: int | None = None,
          pause_after_s: float | None = None) -> TrainResult:
    """Train a drafter for the frozen `model` on tokenized samples; checkpoints go to `out` (rank 0).

    drafter: train this module (wired to the target) instead of a new one or `cfg.init_from`'s.
    stop_after: stop (as if killed) after this many steps of the run, without the final save.
    pause_after: after this many steps of this invocation, write the checkpoint and return; `resume` continues
        (for jobs with a time limit, or to move a run to another machine or number of GPUs). With a time budget
        the pause waits until the schedule is fitted, so that the saved run keeps it.
    pause_after_s: the same after the first step that ends this many seconds into this invocation's steps (rank 0's
        clock decides for every rank).
    """
    world, rank = world_rank()
    if cfg.method not in ("eagle3", "hass", "eagle1"):
        raise EagleSpecError(f"--method {cfg.method!r} is not one of eagle1, hass, eagle3")
    if cfg.ttt_attention not in TTT_ATTENTION:
        raise EagleSpecError(f"--ttt-attention {cfg.ttt_attention!r} is not one of {', '.join(TTT_ATTENTION)}")
    if cfg.state_shard_bytes < MIN_SHARD_BYTES:
        raise EagleSpecError(f"the training-state shard size must be at least {MIN_SHARD_BYTES} bytes, "
                             f"got {cfg.state_shard_bytes}")
    out = Path(out) if out is not None else None
    st = None
    if resume:
        check_start(cfg.init_from, resume)
        if out is None:
            raise EagleSpecError("--resume needs --out")
        st = read_training_state(out)
        # the saved run's schedule, data order, objective and drafter shape (its --init checkpoint included)
        cfg, differ = _saved_run(cfg, st["config"])
        if differ and rank == 0:
            _log(f"eaglespec train: --resume keeps the saved run's settings: {', '.join(differ)}")
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    train_s, eval_s = split_eval(samples, cfg.eval_fraction, cfg.seed)
    digest = samples_digest(train_s)
    per_step = world * cfg.grad_accum  # global micro-batches per optimizer step
    vocab = model.get_output_embeddings().weight.shape[0]
    if drafter is None and cfg.init_from is not None:
        drafter = init_drafter(cfg.init_from, model, cfg, tokenizer)
    if cfg.init_from is not None and rank == 0 and not resume:
        _log(f"eaglespec train: starting from {cfg.init_from} (draft vocab {drafter.cfg.draft_vocab_size}, "
             f"{(getattr(drafter, 'manifest', None) or {}).get('trained_steps', '?')} steps trained there)")
    if (drafter is not None and cfg.method == "eagle3" and cfg.draft_vocab is not None
            and drafter.cfg.draft_vocab_size < min(cfg.draft_vocab, vocab)):
        before = drafter.cfg.draft_vocab_size
        grow_draft_vocab(drafter, model, token_counts(((s.ids, s.loss_mask) for s in train_s), vocab), cfg.draft_vocab)
        if rank == 0 and not resume:
            _log(f"eaglespec train: draft vocabulary grown {before} -> {drafter.cfg.draft_vocab_size} (the most "
                 "frequent answer tokens; new lm_head rows mapped from the target's embeddings)")
    if drafter is None:
        draft_ids = None
        if cfg.method == "eagle3":
            counts = token_counts(((s.ids, s.loss_mask) for s in train_s), vocab)
            draft_ids = select_draft_vocab(counts, cfg.draft_vocab)
            if draft_ids.numel() == vocab:
                draft_ids = None
        drafter = new_drafter(model, cfg.method, draft_ids, cfg.seed, cfg.intermediate_size)
    drafter.to(cfg.device)
    trainer = Trainer(model, drafter, cfg, tokenizer)
    total = total_steps(cfg, len(train_s), world)
    start, totals = 0, {"tokens": 0, "seconds": 0.0}
    if st is not None:
        if cfg.time_budget_s is not None:  # the saved run already fitted its schedule to its budget
            total = st["total_steps"]
        if st["total_steps"] != total:
            raise EagleSpecError(f"{out}: the saved run has {st['total_steps']} steps, this one {total}: "
                                 "resume with the same data and flags")
        check_data_position(out, st["data"], per_step, train_s, digest)
        totals = st["totals"]
        drafter.load_state_dict({k: v.to(cfg.device) for k, v in st["drafter"].items()})
        trainer.optimizer.load_state_dict(st["optimizer"])
        _set_rng_state(trainer, st["rng"])
        start = st["step"]
        if rank == 0:
            _log(f"eaglespec train: resuming {out} at step {start}/{total}")
    manifest = build_manifest(model, tokenizer, method=cfg.method, feature_layer_ids=drafter.feature_layer_ids,
                              normalisation="none", dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
                              hyperparameters=cfg.to_dict() | {"world_size": world}, extra=_init_record(cfg, drafter))
    batches = MicroBatches(train_s, cfg.batch_size, cfg.seed)
    eval_batches = [eval_s[i:i + cfg.batch_size] for i in range(0, len(eval_s), cfg.batch_size)][: cfg.eval_batches]
    history: list[dict[str, Any]] = []

    def run_fields(step: int) -> dict[str, Any]:
        """The data position and the run's totals over all its invocations, for the saved state."""
        return {"data": data_position(step, per_step, cfg, train_s, digest),
                "totals": {"tokens": totals["tokens"] + tokens_seen,
                           "seconds": round(totals["seconds"] + time.perf_counter() - t_start, 3)}}

    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, desc=f"train {cfg.method}", disable=not (cfg.progress and rank == 0),
               dynamic_ncols=True, file=sys.stderr)
    t_start, tokens_seen = time.perf_counter(), 0
    fit_from = start + FIT_SKIP if cfg.time_budget_s is not None and not resume else None
    t_fit = t_start
    step = start
    while step < total:
        if step == fit_from:
            t_fit = time.perf_counter()
        if fit_from is not None and step == fit_from + FIT_STEPS:
            now = time.perf_counter()
            total = _rank0(fitted_total(step, total, now - t_start, cfg.time_budget_s, (now - t_fit) / FIT_STEPS),
                           trainer.device)  # every rank runs rank 0's schedule
            bar.total = total
            bar.refresh()
            if rank == 0:
                bar.write(f"eaglespec train: {cfg.time_budget_s:.0f} s budget -> {total} steps")
        micro = [batches(step * per_step + a * world + rank) for a in range(cfg.grad_accum)]
        m = trainer.train_step(micro, lr_at(step, total, cfg))
        bar.update(1)
        if m is not None:
            tokens_seen += m["tokens"]
            m["step"] = step + 1
            elapsed = time.perf_counter() - t_start
            m["elapsed_s"] = round(elapsed, 3)
            m["run_tokens"] = totals["tokens"] + tokens_seen  # over every invocation of the run
            m["run_s"] = round(totals["seconds"] + elapsed, 3)
            history.append(m)
            rate = tokens_seen / max(1e-9, elapsed)
            bar.set_postfix_str(f"loss {m['loss']:.3f} acc0 {m['acc_by_step'][0]:.2f} {rate:,.0f} tok/s")
            if rank == 0 and out is not None and cfg.log_every and (step + 1) % cfg.log_every == 0:
                out.mkdir(parents=True, exist_ok=True)
                with open(out / LOG_FILE, "a") as f:
                    f.write(json.dumps(m) + "\n")
        if cfg.eval_every and eval_batches and (step + 1) % cfg.eval_every == 0 and step + 1 < total:
            ev = trainer.evaluate(eval_batches)
            if rank == 0:
                bar.write(f"eval @ {step + 1}: {_fmt(ev)}")
        if stop_after is not None and step + 1 - start >= stop_after:
            bar.close()
            return TrainResult(drafter, step + 1, history, {}, out)
        fitted_yet = fit_from is None or step + 1 > fit_from + FIT_STEPS
        pause = pause_after is not None and step + 1 - start >= pause_after
        if pause_after_s is not None:
            pause = bool(_rank0(int(time.perf_counter() - t_start >= pause_after_s), trainer.device)) or pause
        if pause and step + 1 < total and fitted_yet:
            bar.close()
            if rank == 0 and out is not None:
                write_checkpoint(out, trainer, step + 1, total, manifest, run_fields(step + 1))
                _log(f"eaglespec train: paused at step {step + 1}/{total}; continue with --resume --out {out}")
            if _dist():
                _dist().barrier()
            return TrainResult(drafter, step + 1, history, {}, out)
        if cfg.save_every and out is not None and (step + 1) % cfg.save_every == 0 and step + 1 < total and rank == 0:
            write_checkpoint(out, trainer, step + 1, total, manifest, run_fields(step + 1))
        if cfg.save_every and _dist():
            _dist().barrier()
        step += 1
    bar.close()
    ev = trainer.evaluate(eval_batches) if eval_batches else {}
    if rank == 0:
        if ev:
            _log(f"eaglespec train: eval after {total} steps: {_fmt(ev)}")
        if out is not None:
            write_checkpoint(out, trainer, total, total, dict(manifest, eval=ev), run_fields(total))
            _log(f"eaglespec train: wrote {out}")
    return TrainResult(drafter, total, history, ev, out)
