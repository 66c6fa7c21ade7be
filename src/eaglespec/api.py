"""The Python API: load a target + drafter pair once, then generate or stream.

    from eaglespec import EagleSpec
    es = EagleSpec.from_pretrained()                  # default SmolLM2 target + shipped drafter
    out = es.generate("Write a haiku about the sea.", max_new_tokens=64)
    print(out.text, out.stats)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .checkpoint.config import DraftConfig, default_aux_layer_ids
from .checkpoint.drafter import build_drafter, load_drafter
from .engine import GenerationResult, SpeculativeEngine
from .errors import EagleSpecError
from .target.fast import make_target
from .target.loading import DEFAULT_TARGET, load_target
from .tree import TreeSpec

REPO_MODELS = Path(__file__).resolve().parents[2] / "models"
DEFAULT_DRAFT = REPO_MODELS / "smollm2-135m-instruct-eagle3"


@dataclass
class Output:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    stats: dict[str, Any]
    result: GenerationResult


def random_drafter(model, seed: int = 0) -> torch.nn.Module:
    """An untrained EAGLE-3 drafter shaped for `model` (for plumbing and baselines only)."""
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = c.num_attention_heads
    cfg = DraftConfig(method="eagle3", hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_attention_heads=heads, num_key_value_heads=getattr(c, "num_key_value_heads", heads),
                      head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
                      vocab_size=model.get_output_embeddings().weight.shape[0],
                      draft_vocab_size=model.get_output_embeddings().weight.shape[0],
                      target_hidden_size=c.hidden_size,
                      aux_layer_ids=default_aux_layer_ids(c.num_hidden_layers),
                      rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6))
    torch.manual_seed(seed)
    return build_drafter(cfg)


def tree_spec(tree: str = "chain", k: int | None = None, top_k: int | None = None, depth: int | None = None,
              budget: int | None = None) -> TreeSpec:
    """CLI/API knobs -> TreeSpec. Defaults: chain k=5; dynamic budget 60, depth 8, top-k 10."""
    if tree == "chain":
        return TreeSpec("chain", depth=5 if k is None else k)
    if tree in ("dynamic", "static"):
        return TreeSpec(tree, depth=8 if depth is None else depth, top_k=10 if top_k is None else top_k,
                        budget=60 if budget is None else budget)
    raise EagleSpecError(f"--tree {tree!r} is not one of chain, static, dynamic")


class EagleSpec:
    """A loaded target + drafter pair."""

    def __init__(self, model, tokenizer, drafter, spec: TreeSpec | None = None, draft_note: str = "",
                 backend: str = "auto"):
        self.model, self.tokenizer, self.drafter = model, tokenizer, drafter
        self.target = make_target(model, backend)  # "auto": the fast backend on CUDA when supported
        self.spec = spec or TreeSpec()
        self.draft_note = draft_note
        self.engine = SpeculativeEngine(self.target, drafter, self.spec)

    @classmethod
    def from_pretrained(cls, target: str | None = None, draft: str | None = None, device: str | None = None,
                        dtype: str | torch.dtype | None = None, spec: TreeSpec | None = None,
                        aux_rule: str = "auto", backend: str = "auto") -> EagleSpec:
        model, tok = load_target(target, device=device, dtype=dtype)
        c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        note = ""
        if draft is None and target in (None, DEFAULT_TARGET) and DEFAULT_DRAFT.is_dir():
            draft = str(DEFAULT_DRAFT)
        if draft is None:
            drafter = random_drafter(model)
            note = "no trained drafter given: using a RANDOMLY INITIALISED drafter (expect tau ~ 1)"
        else:
            drafter = load_drafter(draft, target_num_layers=c.num_hidden_layers, target_hidden_size=c.hidden_size,
                                   target_vocab_size=model.get_output_embeddings().weight.shape[0], aux_rule=aux_rule)
            note = f"drafter {draft} ({drafter.cfg.method}, aux ids {list(drafter.cfg.aux_layer_ids)}: {drafter.cfg.aux_rule})"
        drafter.to(device=model.device, dtype=model.dtype)
        return cls(model, tok, drafter, spec, note, backend)

    # -- prompts ----------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[dict] | Sequence[int], raw: bool = False) -> list[int]:
        """Token ids for a string (chat template unless raw), chat messages, or ids as given."""
        if isinstance(prompt, str):
            if raw or not getattr(self.tokenizer, "chat_template", None):
                return self.tokenizer.encode(prompt)
            prompt = [{"role": "user", "content": prompt}]
        if prompt and isinstance(prompt[0], dict):
            enc = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
            return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        return [int(t) for t in prompt]

    def eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

    # -- generation -------------------------------------------------------------------------------
    def generate(self, prompt, max_new_tokens: int = 128, raw: bool = False) -> Output:
        ids = self.encode(prompt, raw)
        result = self.engine.generate(ids, max_new_tokens, self.eos_ids())
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        return Output(text, result.token_ids, ids, result.stats(), result)

    def stream(self, prompt, max_new_tokens: int = 128, raw: bool = False) -> Iterator[str]:
        """Yield text pieces as rounds are accepted (multi-byte characters are never split)."""
        ids = self.encode(prompt, raw)
        new: list[int] = []
        sent = ""
        for tokens in self.engine.stream(ids, max_new_tokens, self.eos_ids()):
            new.extend(tokens)
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            if text.endswith("\ufffd"):
                continue  # an incomplete UTF-8 sequence: wait for the next round
            if len(text) > len(sent):
                yield text[len(sent):]
                sent = text
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        if len(text) > len(sent):
            yield text[len(sent):]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
