"""EngineConfig: every choice of how the engine runs, in one typed, frozen object.

A field left None means "decide for this device": `resolve(device, fast)` turns the config into concrete
booleans once, when the engine is built (engine/build.py). Nothing below reads the environment; the only
environment variables eaglespec reads are EAGLESPEC_CACHE (backends/loading.py: the conversion cache directory)
and EAGLESPEC_API_KEY (server.py: the API key when --api-key is not given).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch

from eaglespec.errors import EagleSpecError

Backend = Literal["auto", "fast", "hf"]
BACKENDS: tuple[str, ...] = ("auto", "fast", "hf")


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs. None = the default for the device (see `resolve`)."""

    backend: Backend = "auto"  # target backend: "fast" (static KV cache), "hf" (the model's forward), "auto"
    device: str | None = None  # "cpu", "cuda", "cuda:1" (None: cuda when available)
    dtype: str | None = None  # "float32" | "bfloat16" | "float16" (None: bf16 on a GPU, fp32 on CPU)
    kernels: bool | None = None  # Triton kernels on the fast path (None: on CUDA where triton imports)
    draft_graphs: bool | None = None  # static drafter KV + CUDA graphs (None: with the fast backend on CUDA)
    round_graphs: bool | None = None  # each round as one CUDA graph (None: on CUDA where the engine allows it)
    overlap: bool | None = None  # queue the next round before reading this one (None: fast backend on CUDA)
    chunked_prefill: bool | None = None  # long prompts prefilled in captured chunks (None: on CUDA)
    adaptive: bool | None = None  # per round, draft or a plain step, the cheaper per token (one sequence: timed
    # rounds, engine/gate.py; batched: the depth per batch size from round times measured at start, engine/plan.py)
    # (None: on in the batched engine for greedy rounds, where a large batch can make drafting cost more than it
    # gains; off in the one-sequence engine)
    draft_max_len: int | None = None  # rows of the static drafter KV (None: from the context length)
    threads: int | None = None  # CPU threads for torch (None: the cores free for this process)
    max_batch: int | None = None  # sequences served together (None: 8 on a CPU, 1 on a GPU; see batch_size)
    prefill_chunk: int = 512  # prompt tokens a joining sequence prefills per batched step while others decode
    speculate_up_to: int | None = None  # the batched engine drafts while at most this many rows are live (None: always)
    max_batch_tokens: int | None = None  # bound on the live rows' prompts + max_new_tokens (None: max_batch only)
    kv_memory: float | None = None  # share of the GPU memory free when the batched engine is built that its KV may
    # take (None: KV_MEMORY on CUDA; no bound on a CPU)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise EagleSpecError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.draft_max_len is not None and self.draft_max_len < 1:
            raise EagleSpecError(f"draft_max_len must be >= 1, got {self.draft_max_len}")
        if self.kv_memory is not None and not 0 < self.kv_memory <= 1:
            raise EagleSpecError(f"kv_memory is a share of the free GPU memory, in (0, 1]: got {self.kv_memory}")
        for name in ("threads", "max_batch", "prefill_chunk", "speculate_up_to", "max_batch_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise EagleSpecError(f"{name} must be >= 1, got {value}")

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def resolve(self, device: torch.device | str, fast: bool) -> Resolved:
        """The concrete switches for an engine on `device` whose target is the fast backend (`fast`)."""
        from eaglespec.kernels import on_by_default

        cuda = torch.device(device).type == "cuda"
        draft_graphs = _pick(self.draft_graphs, fast and cuda)
        return Resolved(
            kernels=_pick(self.kernels, on_by_default(device)),
            draft_graphs=draft_graphs,
            round_graphs=_pick(self.round_graphs, cuda) and draft_graphs,
            overlap=_pick(self.overlap, fast and cuda),
            chunked_prefill=_pick(self.chunked_prefill, cuda),
        )

    def batch_size(self, device: torch.device | str) -> int:
        """Sequences the server advances together: max_batch, else 8 on a CPU (the batched engine) and 1 on a
        GPU (the one-sequence fast path, whose rounds replay as whole CUDA graphs with dynamic trees)."""
        if self.max_batch is not None:
            return self.max_batch
        return 1 if torch.device(device).type == "cuda" else 8

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides) -> EngineConfig:
        """The config named by the CLI's engine flags (cli/args.py: add_model_args); absent flags keep defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class Resolved:
    """EngineConfig's switches decided for one device and backend."""

    kernels: bool
    draft_graphs: bool
    round_graphs: bool
    overlap: bool
    chunked_prefill: bool


def _pick(flag: bool | None, default: bool) -> bool:
    return default if flag is None else bool(flag)
