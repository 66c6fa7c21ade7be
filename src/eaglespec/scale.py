"""Scale benchmark: random-weight targets of published shapes, measured against the memory-bandwidth floor.

A shape (SHAPES) is a transformers config built on the device with random weights (no download) and a random
EAGLE-3 drafter shaped for it. measure_shape() times, on one device:

    plain      ms per token of plain decoding on the fast backend at a `context`-token prefix (the target's step:
               forward of one row + argmax + commit, back to back), against the floor = weight bytes read per
               token / memory bandwidth; the final norm + lm_head alone (`head_ms`) and per decoder layer
    verify     ms of one target forward over R rows with a chain-shaped ancestry mask (FastTarget.forward), the
               rows then discarded (commit of none), at each verify context; ratio to R = 1
    draft      ms of one step of the drafter's row runner (build_engine's proposer) over n rows after a
               `context`-row drafter KV
    rounds     ms per round of SpeculativeEngine.generate (build_engine, EngineConfig as given) for each policy in
               POLICIES and for plain decoding through the same engine (depth 0): elapsed time after the first
               round / the rounds after it; ratio of each policy's round to the engine's plain step
    speedup    implied speedup of a policy for an acceptance profile: tau / (round ms / plain step ms)
    batched    (given batch sizes) ms per step of the batched engine (engine/batch.py, the model's own forward) with
               B live rows of `context`-token prompts: plain batched steps and the chain policy's rounds; ratio of
               the round to the plain step, and its implied aggregate speedup at the chain's tau
    memory     peak allocated device memory while measuring, the built weights and caches included (CUDA)

A random drafter accepts almost nothing, so each round catches the drafter up on one row and emits one token: the
round costs are those of drafting and verifying the policy's full tree, which acceptance does not change beyond
the catch-up rows. Timings on CUDA use CUDA events around blocks of back-to-back calls (median over samples);
on CPU perf_counter.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from eaglespec.config import EngineConfig
from eaglespec.engine.timing import (
    median,
    random_tokens,
    sync,
    time_draft_steps,
    time_plain_steps,
    time_rounds,
    time_verify_curve,
    timed_ms,
)
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192}
LLAMA32_ROPE = {**LLAMA3_ROPE, "factor": 32.0}


@dataclass(frozen=True)
class Shape:
    """A decoder-only target shape (Llama or Qwen3 family): enough to build its transformers config.

    full_layers: the published model's depth when `num_layers` is cut to fit a device (per-layer numbers then
    extrapolate to it); None when the shape is the whole model.
    """

    name: str
    family: str  # "llama" | "qwen3"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    rope_theta: float = 500000.0
    rope_scaling: dict | None = None
    max_positions: int = 131072
    full_layers: int | None = None

    def config(self, init_std: float = 0.02):
        """The transformers config of this shape (LlamaConfig or Qwen3Config)."""
        import transformers as tf

        common = dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
                      num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                      head_dim=self.head_dim, intermediate_size=self.intermediate_size,
                      tie_word_embeddings=self.tie_embeddings, rope_theta=self.rope_theta,
                      max_position_embeddings=self.max_positions, initializer_range=init_std,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
        if self.family == "llama":
            if self.rope_scaling is not None:
                common["rope_scaling"] = dict(self.rope_scaling)
            return tf.LlamaConfig(**common)
        if self.family == "qwen3":
            return tf.Qwen3Config(**common)
        raise EagleSpecError(f"shape {self.name}: family {self.family!r} is not one of llama, qwen3")


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("tiny", "llama", hidden_size=64, num_layers=8, num_heads=4, num_kv_heads=2, head_dim=16,
          intermediate_size=128, vocab_size=512, max_positions=8192),
    Shape("smollm2-135m", "llama", hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
          intermediate_size=1536, vocab_size=49152, tie_embeddings=True, rope_theta=100000.0, max_positions=8192),
    Shape("llama-3.2-1b", "llama", hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
          intermediate_size=8192, vocab_size=128256, tie_embeddings=True, rope_scaling=LLAMA32_ROPE),
    Shape("llama-3.1-8b", "llama", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
          intermediate_size=14336, vocab_size=128256, rope_scaling=LLAMA3_ROPE),
    Shape("qwen3-8b", "qwen3", hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
          intermediate_size=12288, vocab_size=151936, rope_theta=1000000.0, max_positions=40960),
    Shape("llama-3.1-70b-8layers", "llama", hidden_size=8192, num_layers=8, num_heads=64, num_kv_heads=8,
          head_dim=128, intermediate_size=28672, vocab_size=128256, rope_scaling=LLAMA3_ROPE, full_layers=80),
)}
DEFAULT_SHAPES = ("llama-3.2-1b", "llama-3.1-8b")

# the policies whose rounds are timed: chain k=5, EAGLE-1's 25-node static tree, EAGLE-2 dynamic depth/width/budget
POLICIES: dict[str, TreeSpec] = {
    "chain": TreeSpec(kind="chain", depth=5),
    "static": TreeSpec(kind="static", depth=5, budget=25),
    "dynamic": TreeSpec(kind="dynamic", depth=7, top_k=10, budget=60),
}
PLAIN = TreeSpec(kind="chain", depth=0)  # plain decoding through the same engine
# tau of the shipped SmolLM2-135M-Instruct drafter on MT-bench per policy (bench/RESULTS.md)
DEFAULT_TAU: dict[str, float] = {"chain": 2.95, "static": 3.55, "dynamic": 4.62}
DEFAULT_BANDWIDTH_GBS = 4800.0  # H200 HBM3e


def get_shapes(names: str | Sequence[str]) -> list[Shape]:
    """Shapes by name ("a,b" or a sequence); an unknown name is an EagleSpecError listing the known ones."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise EagleSpecError("no shapes named")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise EagleSpecError(f"unknown shape {unknown[0]!r}: known shapes are {', '.join(SHAPES)}")
    return [SHAPES[n] for n in names]


# -- parameter counts and the bandwidth floor ---------------------------------------------------------------
@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a target. `lm_head` is 0 when it is tied to the embedding."""

    embedding: int
    per_layer: int  # one decoder layer
    num_layers: int
    final_norm: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.embedding + self.num_layers * self.per_layer + self.final_norm + self.lm_head

    @property
    def read_per_token(self) -> int:
        """Parameters one decode step reads: every layer, the final norm and the output head (the embedding
        table once when tied; an untied input embedding contributes one row, counted as nothing)."""
        head = self.lm_head or self.embedding
        return self.num_layers * self.per_layer + self.final_norm + head


def param_counts(shape: Shape) -> ParamCounts:
    """ParamCounts of `shape` by arithmetic (no model built): bias-free q/k/v/o and gate/up/down projections,
    two RMSNorms per layer (and Qwen3's per-head q/k norms)."""
    h, d = shape.hidden_size, shape.head_dim
    attn = h * shape.num_heads * d + 2 * h * shape.num_kv_heads * d + shape.num_heads * d * h
    mlp = 3 * h * shape.intermediate_size
    norms = 2 * h + (2 * d if shape.family == "qwen3" else 0)
    emb = shape.vocab_size * h
    return ParamCounts(embedding=emb, per_layer=attn + mlp + norms, num_layers=shape.num_layers, final_norm=h,
                       lm_head=0 if shape.tie_embeddings else emb)


def model_param_counts(model: nn.Module) -> ParamCounts:
    """ParamCounts of a built transformers causal LM, counted from its parameters."""
    inner = model.model
    emb = inner.embed_tokens.weight
    head = model.get_output_embeddings().weight
    layers = inner.layers
    per_layer = sum(p.numel() for p in layers[0].parameters())
    return ParamCounts(embedding=emb.numel(), per_layer=per_layer, num_layers=len(layers),
                       final_norm=inner.norm.weight.numel(), lm_head=0 if head is emb else head.numel())


def floor_ms(nbytes: float, bandwidth_gbs: float) -> float:
    """Milliseconds to read `nbytes` at `bandwidth_gbs` GB/s (1 GB = 1e9 bytes)."""
    if bandwidth_gbs <= 0:
        raise EagleSpecError(f"bandwidth must be > 0 GB/s, got {bandwidth_gbs}")
    return nbytes / (bandwidth_gbs * 1e9) * 1e3


def implied_speedup(tau: float, round_ms: float, plain_ms: float) -> float:
    """Speedup over plain decoding of a policy emitting `tau` tokens per round of `round_ms`, a plain step costing
    `plain_ms`: tau / (round_ms / plain_ms)."""
    if tau <= 0 or round_ms <= 0 or plain_ms <= 0:
        raise EagleSpecError(f"tau, round ms and plain ms must be > 0, got {tau}, {round_ms}, {plain_ms}")
    return tau / (round_ms / plain_ms)


def parse_tau(text: str | None) -> dict[str, float]:
    """"chain=3.0,static=3.5,dynamic=4.6" -> {policy: tau}, missing policies from DEFAULT_TAU."""
    out = dict(DEFAULT_TAU)
    if not text:
        return out
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in POLICIES:
            raise EagleSpecError(f"--tau: {part.strip()!r} is not POLICY=TAU with POLICY one of {', '.join(POLICIES)}")
        try:
            tau = float(value)
        except ValueError:
            raise EagleSpecError(f"--tau: {name}={value.strip()!r} is not a number") from None
        if not math.isfinite(tau) or tau <= 0:
            raise EagleSpecError(f"--tau: {name} must be a positive number, got {value.strip()}")
        out[name] = tau
    return out


# -- builders ---------------------------------------------------------------------------------------------
@torch.no_grad()
def init_weights(model: nn.Module, std: float = 0.02, seed: int = 0) -> None:
    """Seeded random weights: matrices ~ N(0, std), RMSNorm weights 1, other vectors 0."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            p.normal_(0.0, std, generator=gen)
        elif "norm" in name:
            p.fill_(1.0)
        else:
            p.zero_()


def build_model(shape: Shape, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
                init_std: float = 0.02) -> nn.Module:
    """The shape's causal LM built directly on `device` in `dtype` with init_weights' random weights, eval mode."""
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    cfg = shape.config(init_std)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if next(model.parameters()).device != device:
        model = model.to(device)
    init_weights(model, init_std, seed)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def build_drafter_for(model: nn.Module, seed: int = 0, draft_vocab: int | None = None) -> nn.Module:
    """A random EAGLE-3 drafter shaped for `model` (checkpoint.drafter.random_drafter), on the model's device and dtype.
    draft_vocab: a draft vocabulary of the first `draft_vocab` target ids (d2t offsets 0), as published EAGLE-3
    drafters cut theirs; None keeps the full target vocabulary."""
    from eaglespec.checkpoint.drafter import build_drafter, random_drafter

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    if draft_vocab is None:
        with torch.device(device):
            drafter = random_drafter(model, seed)
    else:
        with torch.device("meta"):
            cfg = random_drafter(model, seed).cfg
        if not 1 <= draft_vocab <= cfg.vocab_size:
            raise EagleSpecError(f"draft vocabulary {draft_vocab} must be within 1..{cfg.vocab_size}")
        torch.manual_seed(seed)
        with torch.device(device):
            drafter = build_drafter(replace(cfg, draft_vocab_size=draft_vocab))
            drafter.t2d[:draft_vocab] = True
    for p in drafter.parameters():
        p.requires_grad_(False)
    return drafter.to(dtype=dtype).eval()


def release(device: torch.device) -> None:
    """Collect garbage and return cached device memory (call after deleting a shape's objects)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def time_head(model: nn.Module, device: torch.device, samples: int) -> list[float]:
    """ms of the final norm + lm_head on one row (the model's own modules)."""
    h = torch.randn(1, model.config.hidden_size, device=device, dtype=next(model.parameters()).dtype)
    norm, head = model.model.norm, model.get_output_embeddings()

    @torch.no_grad()
    def step() -> None:
        head(norm(h))

    return timed_ms(step, device, samples, calls=10)


def time_batched_steps(model: nn.Module, drafter: nn.Module | None, spec: TreeSpec, batch: int, context: int,
                       steps: int, gen: torch.Generator, backend: str = "auto") -> dict[str, Any]:
    """ms per step of the batched engine with `batch` live rows (random prompts of `context` tokens, joined whole):
    the median over `steps` steps after `steps` // 4 + 1 untimed ones. drafter None: plain batched steps; `backend`
    the batched target's (engine.build.build_batch_target). Returns {ms, samples, tokens_per_step}."""
    from eaglespec.engine.batch import BatchRequest
    from eaglespec.engine.build import build_batch_engine

    dev = next(model.parameters()).device
    engine = build_batch_engine(model, drafter, spec, EngineConfig(backend=backend, max_batch=batch,
                                                                  prefill_chunk=context, adaptive=False))
    warmup = steps // 4 + 1
    room = (warmup + steps + 2) * (spec.depth + 1)  # no row finishes while timed (joining steps also decode)
    vocab = model.config.vocab_size
    for _ in range(batch):
        engine.submit(BatchRequest(random_tokens(context, vocab, gen, torch.device("cpu")).tolist(), room))
    try:
        while len(engine.live) < batch:
            engine.step()
        for _ in range(warmup):
            engine.step()
        samples, emitted = [], 0
        for _ in range(steps):
            sync(dev)
            t0 = time.perf_counter()
            emitted += sum(len(tokens) for _, tokens in engine.step())
            sync(dev)
            samples.append((time.perf_counter() - t0) * 1e3)
    finally:
        engine.abort()
    return {"ms": median(samples), "samples": samples, "tokens_per_step": emitted / steps}


# -- one shape, end to end ------------------------------------------------------------------------------
@dataclass
class Settings:
    """What measure_shape runs (sizes and repeats)."""

    context: int = 1024  # prefix of the plain steps, draft steps and engine prompts
    decode_steps: int = 64  # plain steps per timed sample
    samples: int = 5  # timed samples per measurement (plain, head, verify, draft)
    verify_contexts: tuple[int, ...] = (512, 4096)
    verify_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    draft_rows: tuple[int, ...] = (1, 10)
    round_tokens: int = 48  # new tokens per engine run
    round_repeats: int = 3  # timed engine runs per policy (after one untimed)
    bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS
    tau: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TAU))
    draft_vocab: int | None = None
    batches: tuple[int, ...] = ()  # batch sizes of the batched engine's step costs (empty: not measured)
    batch_steps: int = 32  # timed batched steps per batch size
    predict: bool = False  # fit --tree auto's cost model and check its round costs against measured rounds
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("context", "decode_steps", "samples", "round_repeats", "batch_steps"):
            if getattr(self, name) < 1:
                raise EagleSpecError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.round_tokens < 3:
            raise EagleSpecError(f"round_tokens must be >= 3, got {self.round_tokens}")
        for name in ("verify_contexts", "verify_rows", "draft_rows"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise EagleSpecError(f"{name} must be a non-empty list of integers >= 1, got {list(values)}")
        if self.batches and min(self.batches) < 1:
            raise EagleSpecError(f"batches must be integers >= 1, got {list(self.batches)}")
        floor_ms(1, self.bandwidth_gbs)  # validates the bandwidth

    def quick(self) -> Settings:
        """Fewer samples, steps and engine runs (the same measurements)."""
        return replace(self, decode_steps=min(self.decode_steps, 16), samples=min(self.samples, 2),
                       round_tokens=min(self.round_tokens, 24), round_repeats=1, batch_steps=min(self.batch_steps, 8))

    def target_len(self) -> int:
        """Static KV slots the target needs: the longest verify context + its rows, or the engine's runs."""
        return max(max(self.verify_contexts) + max(self.verify_rows), self.context + self.round_tokens + 256,
                   self.context + self.decode_steps * 2)


@torch.no_grad()
def measure_shape(shape: Shape, settings: Settings, device: torch.device | str, dtype: torch.dtype,
                  config: EngineConfig | None = None, log: Callable[[str], None] = lambda s: None
                  ) -> dict[str, Any]:
    """Build `shape` (target + random drafter) on `device`, run every measurement (module docstring) and free it.
    Returns the numbers as a JSON-ready dict."""
    from eaglespec.backends.fast import FastTarget
    from eaglespec.engine.build import build_engine, build_target

    device = torch.device(device)
    config = config or EngineConfig()
    gen = torch.Generator().manual_seed(settings.seed)
    cuda = device.type == "cuda"
    esize = torch.finfo(dtype).bits // 8
    t0 = time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model = build_model(shape, device, dtype, settings.seed)
    drafter = build_drafter_for(model, settings.seed + 1, settings.draft_vocab)
    target = build_target(model, config, drafter.feature_layer_ids, max_len=settings.target_len())
    if not isinstance(target, FastTarget):
        raise EagleSpecError(f"shape {shape.name}: the scale benchmark needs the fast backend, got {target.name}")
    draft_len = settings.context + settings.round_tokens + 256
    engine = build_engine(target, drafter, POLICIES["chain"], config, draft_max_len=draft_len)
    counts = model_param_counts(model)
    out: dict[str, Any] = {
        "shape": shape.name, "config": {k: v for k, v in vars(shape).items() if k != "name"},
        "dtype": str(dtype).removeprefix("torch."), "backend": target.name,
        "kernels": config.resolve(device, fast=True).kernels, "cuda_graphs": target.use_graphs,
        "round_graphs": engine.graphs is not None,
        "params": counts.total, "params_read_per_token": counts.read_per_token,
        "drafter_params": sum(p.numel() for p in drafter.parameters()),
        "build_s": time.perf_counter() - t0,
    }
    if cuda:
        out["allocated_after_build_gib"] = torch.cuda.memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    try:
        # plain decoding against the floor
        read_bytes = counts.read_per_token * esize
        plain = time_plain_steps(target, settings.context, settings.decode_steps, settings.samples + 1, gen)[1:]
        head = time_head(model, device, settings.samples)
        plain_ms, head_ms = median(plain), median(head)
        floor = floor_ms(read_bytes, settings.bandwidth_gbs)
        layer_bytes = counts.per_layer * esize
        per_layer_ms = max(plain_ms - head_ms, 0.0) / counts.num_layers
        out["plain"] = {"context": settings.context, "ms": plain_ms, "samples": plain, "read_bytes": read_bytes,
                        "floor_ms": floor, "floor_pct": 100.0 * floor / plain_ms,
                        "kv_bytes_read": 2 * counts.num_layers * shape.num_kv_heads * shape.head_dim * esize
                        * settings.context}
        head_bytes = (counts.lm_head or counts.embedding) * esize + counts.final_norm * esize
        out["per_layer"] = {"weight_bytes": layer_bytes, "floor_ms": floor_ms(layer_bytes, settings.bandwidth_gbs),
                            "ms": per_layer_ms, "head_ms": head_ms, "head_samples": head,
                            "head_floor_ms": floor_ms(head_bytes, settings.bandwidth_gbs)}
        if shape.full_layers:
            full_bytes = read_bytes + (shape.full_layers - counts.num_layers) * layer_bytes
            out["per_layer"].update(full_layers=shape.full_layers,
                                    full_ms_estimate=head_ms + shape.full_layers * per_layer_ms,
                                    full_floor_ms=floor_ms(full_bytes, settings.bandwidth_gbs))
        log(f"{shape.name}: plain {plain_ms:.3f} ms/token, floor {floor:.3g} ms ({100 * floor / plain_ms:.1f}%)")

        # the verify cost curve
        curve = time_verify_curve(target, settings.verify_contexts, settings.verify_rows, settings.samples, gen)
        out["verify"] = {str(ctx): points for ctx, points in curve.items()}
        log(f"{shape.name}: verify " + "; ".join(
            f"ctx {ctx}: " + " ".join(f"{p['rows']}:{p['ms']:.2f}" for p in points) for ctx, points in curve.items()))

        # the draft step
        steps = time_draft_steps(engine.proposer, settings.context, settings.draft_rows, settings.samples, gen,
                                 shape.vocab_size)
        out["draft"] = {str(n): v for n, v in steps.items()}
        log(f"{shape.name}: draft step " + " ".join(f"{n} rows {v['ms']:.3f} ms" for n, v in steps.items()))

        # rounds through the engine
        prompt = random_tokens(settings.context, shape.vocab_size, gen, torch.device("cpu")).tolist()
        base = time_rounds(engine, prompt, PLAIN, settings.round_tokens, settings.round_repeats)
        rounds: dict[str, Any] = {"plain": base}
        log(f"{shape.name}: engine plain step {base['ms']:.3f} ms")
        for name, spec in POLICIES.items():
            r = time_rounds(engine, prompt, spec, settings.round_tokens, settings.round_repeats)
            r["ratio"] = r["ms"] / base["ms"]
            tau = settings.tau[name]
            r["tau_profile"] = tau
            r["implied_speedup"] = implied_speedup(tau, r["ms"], base["ms"])
            rounds[name] = r
            log(f"{shape.name}: {name} round {r['ms']:.3f} ms (x{r['ratio']:.2f} a plain step), "
                f"implied speedup at tau {tau}: {r['implied_speedup']:.2f}")
        out["rounds"] = rounds

        # --tree auto's cost model against rounds outside its fit
        if settings.predict:
            out["predicted"] = predicted_rounds(engine, settings, log, shape.name)

        # the batched engine (the model's own forward): plain batched steps vs chain rounds per batch size
        if settings.batches:
            engine = target = None
            release(device)
            out["batched"] = measure_batched(model, drafter, settings, settings.tau["chain"], gen, shape.name, log)
        if cuda:
            out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    finally:
        del engine, target, drafter, model
        release(device)
    out["seconds"] = time.perf_counter() - t0
    return out


def predicted_rounds(engine, settings: Settings, log: Callable[[str], None] = lambda s: None, name: str = ""
                     ) -> list[dict[str, Any]]:
    """Fit the cost model of `--tree auto` (engine.calibrate.measure_costs, greedy) on `engine`, then time the
    rounds of POLICIES and calibrate.CHECK_SPECS and set each against its predicted cost at its measured tau:
    [{spec, tau, measured_ms, predicted_ms, error_pct}] (spec as its label)."""
    from eaglespec.engine import calibrate

    costs = calibrate.measure_costs(engine, calibrate.CostSettings(context=settings.context, sampled=False), log)
    specs = tuple(POLICIES.values()) + calibrate.CHECK_SPECS
    out = calibrate.round_errors(engine, costs, specs, context=settings.context, new_tokens=settings.round_tokens,
                                 repeats=settings.round_repeats)
    for r in out:
        spec = r["spec"]
        r["spec"] = (f"chain k={spec.depth}" if spec.kind == "chain"
                     else f"{spec.kind} {spec.depth}/{spec.top_k}/{spec.budget}")
        log(f"{name}: {r['spec']}: round {r['measured_ms']:.3f} ms, predicted {r['predicted_ms']:.3f} ms "
            f"({r['error_pct']:+.1f}%)")
    return out


def measure_batched(model: nn.Module, drafter: nn.Module, settings: Settings, tau: float, gen: torch.Generator,
                    name: str = "", log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Per batch size B in settings.batches: the plain batched step and the chain policy's batched round (ms) on the
    fused layers, their ratio, the implied aggregate speedup at `tau`, and the plain step of the model's own forward
    (HFBatchTarget): {str(B): {plain, chain, ratio, implied_speedup, plain_hf}}."""
    out: dict[str, Any] = {}
    spec = POLICIES["chain"]
    for b in settings.batches:
        plain = time_batched_steps(model, None, PLAIN, b, settings.context, settings.batch_steps, gen)
        chain = time_batched_steps(model, drafter, spec, b, settings.context, settings.batch_steps, gen)
        plain_hf = time_batched_steps(model, None, PLAIN, b, settings.context, settings.batch_steps, gen, "hf")
        ratio = chain["ms"] / plain["ms"]
        out[str(b)] = {"plain": plain, "chain": chain, "ratio": ratio, "tau_profile": tau,
                       "implied_speedup": implied_speedup(tau, chain["ms"], plain["ms"]), "plain_hf": plain_hf}
        log(f"{name}: batch {b}: plain step {plain['ms']:.3f} ms (the model's own forward {plain_hf['ms']:.3f}), "
            f"chain k={spec.depth} round {chain['ms']:.3f} ms (x{ratio:.2f}), implied aggregate speedup at tau "
            f"{tau}: {out[str(b)]['implied_speedup']:.2f}")
    return out


def _out_of_memory(exc: BaseException) -> bool:
    """A device allocation failure (torch's OutOfMemoryError, or a CUDA error naming it)."""
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(exc, oom) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc))


def device_name(device: torch.device) -> str:
    """The GPU's name (torch.cuda.get_device_name), or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def run(shapes: Sequence[Shape], settings: Settings, device: torch.device | str, dtype: torch.dtype,
        config: EngineConfig | None = None, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """measure_shape for each shape in turn; a shape that runs out of device memory is logged in one line and
    recorded as {"error": ...}. Returns {device, torch, transformers, settings, shapes: {name: numbers}}."""
    import transformers

    device = torch.device(device)
    report: dict[str, Any] = {
        "device": device_name(device), "torch": torch.__version__, "transformers": transformers.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in vars(settings).items()},
        "shapes": {},
    }
    for shape in shapes:
        try:
            report["shapes"][shape.name] = measure_shape(shape, settings, device, dtype, config, log)
        except Exception as exc:
            if not _out_of_memory(exc):
                raise
            log(f"{shape.name}: does not fit on {report['device']} (out of memory); skipped")
            report["shapes"][shape.name] = {"shape": shape.name, "error": "out of memory"}
        release(device)
    return report


# -- the report as text ---------------------------------------------------------------------------------
def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _g(x: float) -> str:
    """Three significant digits (parameter counts and bytes of shapes from tiny to 70B)."""
    return f"{x:.3g}"


def format_tables(report: dict[str, Any]) -> str:
    """The report as Markdown tables: plain vs floor, per layer, the verify curve, draft steps and rounds."""
    shapes = report["shapes"]
    ok = {n: s for n, s in shapes.items() if "error" not in s}
    bw = report["settings"]["bandwidth_gbs"]
    lines = [f"device: {report['device']}; torch {report['torch']}; transformers {report['transformers']}; "
             f"{report['dtype']}; bandwidth {bw:g} GB/s", ""]
    for name, s in shapes.items():
        if "error" in s:
            lines.append(f"{name}: {s['error']}")
    lines += ["### Plain decoding vs the bandwidth floor", "",
              "| shape | params (B) | read/token (GB) | floor ms | plain ms | floor/plain % | engine plain ms "
              "| peak GiB |", "|---|---|---|---|---|---|---|---|"]
    for n, s in ok.items():
        p = s["plain"]
        lines.append(f"| {n} | {_g(s['params'] / 1e9)} | {_g(p['read_bytes'] / 1e9)} | {_g(p['floor_ms'])} | "
                     f"{_f(p['ms'])} | {p['floor_pct']:.0f} | {_f(s['rounds']['plain']['ms'])} | "
                     f"{_f(s.get('peak_gib'), 1)} |")
    lines += ["", "### Per decoder layer (plain step less the final norm + lm_head, / layers)", "",
              "| shape | layer MB | layer floor ms | layer ms | head ms | head floor ms | full-depth ms (floor) |",
              "|---|---|---|---|---|---|---|"]
    for n, s in ok.items():
        q = s["per_layer"]
        full = (f"{q['full_layers']} layers: {_f(q['full_ms_estimate'])} ({_f(q['full_floor_ms'])})"
                if "full_layers" in q else "-")
        lines.append(f"| {n} | {_g(q['weight_bytes'] / 1e6)} | {_g(q['floor_ms'])} | {_g(q['ms'])} | "
                     f"{_f(q['head_ms'])} | {_g(q['head_floor_ms'])} | {full} |")
    rows = report["settings"]["verify_rows"]
    lines += ["", "### Verify: ms of one target forward over R rows (ratio to R=1)", "",
              "| shape | context | " + " | ".join(f"R={r}" for r in rows) + " |",
              "|---|---|" + "---|" * len(rows)]
    for n, s in ok.items():
        for ctx, points in s["verify"].items():
            cells = " | ".join(f"{p['ms']:.2f} (x{p['ratio']:.2f})" for p in points)
            lines.append(f"| {n} | {ctx} | {cells} |")
    policies = list(POLICIES)
    lines += ["", "### Draft step and rounds (ms; round ratio to the engine's plain step; implied speedup at tau)",
              "", "| shape | " + " | ".join(f"draft {r} rows" for r in report["settings"]["draft_rows"]) + " | "
              + " | ".join(f"{p} round" for p in policies) + " | "
              + " | ".join(f"{p} speedup" for p in policies) + " |",
              "|---|" + "---|" * (len(report["settings"]["draft_rows"]) + 2 * len(policies))]
    for n, s in ok.items():
        draft = " | ".join(_f(v["ms"]) for v in s["draft"].values())
        rounds = " | ".join(f"{_f(s['rounds'][p]['ms'])} (x{s['rounds'][p]['ratio']:.2f})" for p in policies)
        speed = " | ".join(f"{s['rounds'][p]['implied_speedup']:.2f} (tau {s['rounds'][p]['tau_profile']:g})"
                           for p in policies)
        lines.append(f"| {n} | {draft} | {rounds} | {speed} |")
    predicted = {n: s["predicted"] for n, s in ok.items() if s.get("predicted")}
    if predicted:
        lines += ["", "### --tree auto's cost model: predicted vs measured round ms (at the measured tau)", "",
                  "| shape | round | tau | measured ms | predicted ms | error |", "|---|---|---|---|---|---|"]
        for n, rows_ in predicted.items():
            for r in rows_:
                lines.append(f"| {n} | {r['spec']} | {r['tau']:.2f} | {_f(r['measured_ms'])} | "
                             f"{_f(r['predicted_ms'])} | {r['error_pct']:+.1f}% |")
    batched = {n: s["batched"] for n, s in ok.items() if s.get("batched")}
    if batched:
        k = POLICIES["chain"].depth
        lines += ["", f"### Batched engine: ms per step, plain batched vs chain k={k} rounds (ratio; implied aggregate "
                  "speedup at tau); the plain step of the model's own forward (HF)", "",
                  "| shape | B | plain ms | plain tok/s | chain ms | ratio | implied speedup | HF plain ms |",
                  "|---|---|---|---|---|---|---|---|"]
        for n, per in batched.items():
            for b, v in per.items():
                rate = int(b) * 1e3 / v["plain"]["ms"]
                lines.append(f"| {n} | {b} | {_f(v['plain']['ms'])} | {rate:.0f} | {_f(v['chain']['ms'])} | "
                             f"x{v['ratio']:.2f} | {v['implied_speedup']:.2f} (tau {v['tau_profile']:g}) | "
                             f"{_f(v['plain_hf']['ms'])} |")
    return "\n".join(lines)
