"""Fast target backend for Llama-family models: static KV cache, fixed shapes, CUDA graphs.

Same contract as HFTarget (backends/base.py), built from the HF model's own weights (Llama/SmolLM2,
Qwen2 with q/k/v bias, Qwen3 with q_norm/k_norm, Mistral without an active sliding window):

    cache      [L, 2, Hkv, S, D] preallocated; slots 0..committed-1 hold the committed prefix
    forward    T rows -> slots committed..committed+T-1, padded to a bucket B (1, 2, 4, ..., 128);
               positions = committed + depth; attention over the first `span` slots only (committed + B
               rounded up to a multiple of span_step): mask [B, span] = prefix slots + the ancestry block
               (padding rows and unused slots masked); logits and aux features in one pass
    commit     index copy of the kept rows' KV into committed..committed+m-1 (all layers at once)

On CUDA each (bucket, span) step is captured once in a CUDA graph over static input buffers (optionally
torch.compile'd first, the span a dynamic dimension); prefill (T > largest bucket) and the CPU path run the same
step eagerly, which is what the CPU tests compare against HFTarget. Rope comes from the model's own rotary module,
tabulated once per slot position (_rope_table). GQA without repeating the KV: the G query heads of kv head j (HF
head j*G + r) become G query rows per token (row t*G + r), so each token's attention output is contiguous in
(r, j, d) order and feeds o_proj with no copy, its weight columns permuted once to that order (_grouped_o_weight).
fused_kernels=True (make_target's default on CUDA where triton imports) runs RMSNorm, rope + KV write and silu * up
as Triton kernels (kernels/step.py, the same rounding), the attention as kernels.attention.masked_attention, which
stops at base + B, and few-row projections through kernels/skinny.py where it applies; it needs triton and a CUDA
target (or TRITON_INTERPRET=1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from eaglespec.backends.base import TargetOutput
from eaglespec.backends.capture import decoder_layers
from eaglespec.errors import EagleSpecError
from eaglespec.kernels import available, eager_attention, on_by_default, onednn, skinny
from eaglespec.kernels.step import block_mask_ref

__all__ = ["FastTarget", "fused_by_default", "make_target", "unsupported_reason"]

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "mistral")
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
SPAN_STEP = 256  # attention spans are multiples of this many cache slots
T = TypeVar("T")


def smallest_bucket(buckets: tuple[int, ...], n: int) -> int | None:
    """The first (ascending) bucket that holds n rows, or None when n exceeds them all."""
    return next((b for b in buckets if b >= n), None)


def round_span(n: int, step: int, cap: int) -> int:
    """Static-cache slots a step writing slots below n attends over: n rounded up to `step`, at most `cap`."""
    return min(cap, -(-n // step) * step)


def free_device_memory(device: torch.device) -> int | None:
    """Bytes a new allocation on a CUDA `device` can take: the driver's free memory (torch.cuda.mem_get_info) plus
    what torch's caching allocator holds unused; None on other devices (not checked)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free) + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def check_fits(what: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, extra: int = 0) -> None:
    """Refuse, in one line naming the shape, the bytes needed and the bytes free, a tensor of `shape` and `dtype`
    (plus `extra` bytes allocated with it) that does not fit in the device's free memory (free_device_memory)."""
    free = free_device_memory(device)
    need = extra + dtype.itemsize * int(torch.Size(shape).numel())
    if free is not None and need > free:
        raise EagleSpecError(f"{what} {list(shape)} in {str(dtype).removeprefix('torch.')} needs {need} bytes "
                             f"({need / 2**30:.2f} GiB) but {device} has {free} bytes ({free / 2**30:.2f} GiB) free: "
                             "use a shorter context or free device memory")


def capture_graph(fn: Callable[[], T], device: torch.device, pool) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm `fn` up twice on a side stream (it must write only scratch state: pending cache slots), then
    capture it into one CUDA graph on `pool`. Returns (graph, the captured call's outputs: static tensors,
    rewritten by every replay)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def _text_config(model: nn.Module):
    c = model.config
    return c.get_text_config() if hasattr(c, "get_text_config") else c


def _sliding_window(cfg) -> int | None:
    """The window of any sliding-attention layer, else None."""
    window = getattr(cfg, "sliding_window", None)
    if window is None:
        return None
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        return window if "sliding_attention" in types else None
    if getattr(cfg, "use_sliding_window", True) is False:
        return None
    return window


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the fast backend cannot run `model` (None = it can)."""
    cfg = _text_config(model)
    mtype = getattr(cfg, "model_type", "?")
    if mtype not in SUPPORTED_TYPES:
        return f"model type {mtype!r} is not one of {', '.join(SUPPORTED_TYPES)}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rtype = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rtype in ("dynamic", "longrope"):
        return f"rope type {rtype!r} depends on the sequence length"
    inner = getattr(model, "model", None)
    if getattr(inner, "rotary_emb", None) is None or not hasattr(inner, "embed_tokens"):
        return "the model has no model.rotary_emb / model.embed_tokens"
    return None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm's rounding: normalised in fp32, cast back, then scaled in the model's dtype. F.rms_norm
    without a weight does the first two in one fused kernel on CUDA (statistics and product in fp32 for bf16/fp16
    inputs; bitwise equal to HF's x.float() * rsqrt(...) -> .to(dtype) on CPU) instead of float/pow/mean/add/rsqrt/
    mul/cast."""
    return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)


def _rope_table(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[..., D] cos and sin -> [..., 2, 2, D/2] = [[cos_1, -sin_1], [sin_2, cos_2]] (halves 1 and 2) for _rope."""
    half = cos.shape[-1] // 2
    c1, c2, s1, s2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]
    return torch.stack([torch.stack([c1, -s1], dim=-2), torch.stack([s2, c2], dim=-2)], dim=-3)


def _rope(x: torch.Tensor, table: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin in 2 kernels, into `out` [..., D] when given (contiguous: dynamo
    refuses a strided out=). With table = _rope_table(cos, sin), output half i = x_1 * table[i, 0] + x_2 *
    table[i, 1]: one broadcast product (HF's products: a sign flip is exact) and a sum over the pair (two addends,
    one rounding: HF's add), with no copy of a strided x (torch.roll, HF's rotate_half, copies one on CUDA)."""
    d = x.shape[-1]
    pairs = x.unflatten(-1, (1, 2, d // 2)) * table  # [..., 2 (output half), 2 (input half), D/2]
    halves = None if out is None else out.unflatten(-1, (2, d // 2))
    return torch.sum(pairs, dim=-2, out=halves).flatten(-2)


def _is_silu(act: nn.Module) -> bool:
    """HF's "silu" activation (transformers' SiLUActivation, or torch's SiLU for "swish" and older versions)."""
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _unpacked(weight: torch.Tensor) -> torch.Tensor:
    """A weight kept in its own layout (FastTarget._pack where oneDNN's packed layout does not apply)."""
    return weight


def _add_linear(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                inplace: bool = False, kernels: bool = True) -> torch.Tensor:
    """The residual h + x @ weight.T (+ bias). Without a bias one addmm (one GEMM kernel, the add in its epilogue)
    instead of a GEMM then an add: the same in exact arithmetic; in bf16/fp16 the sum is rounded once instead of
    twice (HF rounds the projection to the model dtype, then the sum), a last-bit difference that contract 1
    allows (bf16 near-ties); fp32 differs by accumulation order only. `inplace`: accumulate into h (addmm_), for an
    h nothing else holds; an out-of-place addmm first copies h into its result (a device copy per call on CUDA).
    On CPU in fp32 the projection goes through oneDNN
    (eaglespec.kernels.onednn), then one add; with `kernels`, few-row CUDA ones through kernels/skinny.py."""
    if onednn.applies(x, weight, bias):
        y = onednn.project(x, weight, bias)
        return h.add_(y) if inplace else h + y
    if bias is None and kernels and skinny.applies(x, weight):  # the add in the skinny GEMM's epilogue, as addmm's
        return skinny.linear(x, weight, residual=h, inplace=inplace)
    if bias is None:
        return h.addmm_(x, weight.t()) if inplace else torch.addmm(h, x, weight.t())
    return h + F.linear(x, weight, bias)


def _grouped_o_weight(w: torch.Tensor, n_kv: int, head_dim: int) -> torch.Tensor:
    """o_proj's weight [H, Hq*D] with its input columns reordered from HF's head order (head h = j*G + r: kv head j,
    group member r) to the grouped attention output's (r, j): column (r*Hkv + j)*D + i holds HF's column
    (j*G + r)*D + i. A contiguous copy when G > 1 and Hkv > 1; otherwise the orders agree and it is a view of the
    weight. Detached."""
    out, width = w.shape
    g = width // (n_kv * head_dim)
    return w.detach().view(out, n_kv, g, head_dim).transpose(1, 2).reshape(out, width)


def _grouped_queries(q: torch.Tensor) -> torch.Tensor:
    """q [B, G, Hkv, D] (token t, group member r, kv head j; contiguous) -> the SDPA query [1, Hkv, B*G, D], row
    t*G + r of kv head j = HF head j*G + r of token t: a transposed view (BMHK memory)."""
    b, g, hk, d = q.shape
    return q.reshape(1, b * g, hk, d).transpose(1, 2)


def _grouped_output(o: torch.Tensor, b: int) -> torch.Tensor:
    """The SDPA output [1, Hkv, B*G, D] of _grouped_queries' rows -> [B, G*Hkv*D], columns in (r, j, d) order (the
    order of _grouped_o_weight's columns). A view where o is in BMHK memory: CUDA's memory-efficient kernel
    always returns it so; its flash and cuDNN kernels and CPU's follow the query's layout, BMHK here. Else a copy."""
    return o.transpose(1, 2).reshape(b, -1)


def _grouped_mask(allowed: torch.Tensor, g: int, open_: torch.Tensor, shut: torch.Tensor) -> torch.Tensor:
    """allowed [B, span] bool -> the additive mask [1, 1, B*G, span] of the grouped query rows (row t*G + r:
    token t's), `open_` where allowed, else `shut` (0-dim tensors in the model dtype)."""
    b, span = allowed.shape
    return torch.where(allowed[:, None, :].expand(b, g, span), open_, shut).view(1, 1, b * g, span)


def _cat_bias(*mods: nn.Linear) -> torch.Tensor | None:
    if all(m.bias is None for m in mods):
        return None
    return torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.weight.shape[0]) for m in mods])


@dataclass
class _Layer:
    """One decoder layer's weights, q/k/v and gate/up fused (fewer kernels per step)."""

    in_norm: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    qk_norm: torch.Tensor | None  # [Hq + Hkv, D]: Qwen3's q_norm weight per q head, then k_norm's per k head
    o_w: torch.Tensor  # [H, Hq*D]: o_proj's weight, columns in the grouped (r, j) head order (_grouped_o_weight)
    o_b: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None
    act: nn.Module


def weight_packers(model: nn.Module, compile: bool = False) -> tuple[Callable, Callable]:
    """(pack, pack_copy) for fuse_layer. On CPU in fp32 the projections go in oneDNN's packed layout
    (eaglespec.kernels.onednn.pack), not for the GEMM kernels or torch.compile, which read the weights themselves.
    qkv and gate/up (and o where GQA reorders its columns) are new tensors anyway (`pack`); lm_head and down are
    the model's own weights, so packing them adds copies (~40% of SmolLM2's weights): `pack_copy` packs only where
    half the available memory holds them."""
    w = model.get_output_embeddings().weight
    if compile or w.device.type != "cpu" or w.dtype != torch.float32 or not onednn.packing_available():
        return _unpacked, _unpacked
    copies = w.nbytes + sum(layer.mlp.down_proj.weight.nbytes for layer in decoder_layers(model))
    return onednn.pack, onednn.pack if onednn.affordable(copies) else _unpacked


def fuse_layer(layer: nn.Module, n_heads: int, n_kv: int, head_dim: int,
               pack: Callable[[torch.Tensor], torch.Tensor] = _unpacked,
               pack_copy: Callable[[torch.Tensor], torch.Tensor] = _unpacked) -> _Layer:
    """A HF decoder layer's weights as _Layer: q/k/v and gate/up concatenated (`pack`ed: oneDNN's layout on CPU),
    o_proj's columns in the grouped head order, down_proj `pack_copy`ed (the model's own tensor when not packed)."""
    at, mlp = layer.self_attn, layer.mlp
    qn, kn = getattr(at, "q_norm", None), getattr(at, "k_norm", None)
    return _Layer(
        in_norm=layer.input_layernorm.weight,
        qkv_w=pack(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])),
        qkv_b=_cat_bias(at.q_proj, at.k_proj, at.v_proj),
        qk_norm=None if qn is None else torch.cat([qn.weight.expand(n_heads, -1), kn.weight.expand(n_kv, -1)]),
        o_w=pack(_grouped_o_weight(at.o_proj.weight, n_kv, head_dim)), o_b=at.o_proj.bias,
        post_norm=layer.post_attention_layernorm.weight,
        gate_up_w=pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
        gate_up_b=_cat_bias(mlp.gate_proj, mlp.up_proj),
        down_w=pack_copy(mlp.down_proj.weight), down_b=mlp.down_proj.bias,
        act=mlp.act_fn,
    )


def rope_table_for(rotary: nn.Module, slots: int, head_dim: int, dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """The model's rotary module tabulated at positions 0..slots-1: [slots, 2, 2, D/2] (_rope_table), cos and sin
    cast to the model dtype as HF casts them."""
    pos = torch.arange(slots, device=device)[None]
    probe = torch.zeros(1, device=device, dtype=torch.float32)
    cos, sin = rotary(probe, pos)  # fp32 [1, S, rot]
    if cos.shape[-1] != head_dim:
        raise EagleSpecError(f"partial rotary ({cos.shape[-1]} of {head_dim}) is not supported by the fast backend")
    return _rope_table(cos[0].to(dtype), sin[0].to(dtype))


@dataclass
class _Graph:
    tokens: torch.Tensor  # [B] long
    positions: torch.Tensor  # [B] long: a view of pos_base
    visible: torch.Tensor  # [B, B] bool
    base: torch.Tensor  # [] long: committed length (a view of pos_base)
    pos_base: torch.Tensor  # [B + 1] long: positions, then base (one add stages both)
    offsets: torch.Tensor  # [B + 1] long: 0..B-1, then 0 (causal positions relative to base)
    eye: torch.Tensor  # [B, B] bool: padding rows see themselves only
    causal: dict  # t -> [B, B] bool: the causal block of t rows, padding rows on the diagonal
    visible_t: int  # t of the causal pattern `visible` holds now (0 = another pattern)
    cols: torch.Tensor  # [span] long: self.cols[:span], its length marked dynamic for torch.compile
    logits: torch.Tensor  # [B, V]
    features: torch.Tensor  # [B, F]
    graph: object | None  # torch.cuda.CUDAGraph (None on CPU: the step runs eagerly)


class FastTarget:
    """Static-cache target backend (see module docstring)."""

    name = "fast"

    def __init__(self, model: nn.Module, feature_layer_ids: tuple[int, ...] = (), max_len: int = 2048,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, cuda_graphs: bool | None = None,
                 compile: bool = False, span_step: int = SPAN_STEP, fused_kernels: bool = False):
        reason = unsupported_reason(model)
        if reason is not None:
            raise EagleSpecError(f"the fast backend cannot run this target: {reason} (use backend='hf')")
        self.model = model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        cfg = _text_config(model)
        self.cfg = cfg
        layers = decoder_layers(model)
        a0 = layers[0].self_attn
        self.num_layers = len(layers)
        self.hidden_size = cfg.hidden_size
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(a0, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scaling = getattr(a0, "scaling", self.head_dim ** -0.5)
        self.eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.window = _sliding_window(cfg)
        inner = model.model
        self.embed_w = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        head = model.get_output_embeddings()
        self.lm_w, self.lm_b = head.weight, getattr(head, "bias", None)
        self.vocab_size = head.weight.shape[0]
        self._rotary = inner.rotary_emb
        # the attention mask's values (0-dim tensors: a Python scalar in torch.where makes a tensor per step)
        self._open = torch.zeros((), device=self.device, dtype=self.dtype)
        self._shut = torch.full((), torch.finfo(self.dtype).min, device=self.device, dtype=self.dtype)
        self.buckets = tuple(sorted(buckets))
        self.use_graphs = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise EagleSpecError("cuda_graphs=True needs the target on a CUDA device")
        if span_step < 1:
            raise EagleSpecError(f"span_step must be >= 1, got {span_step}")
        self.span_step = span_step
        self._kernels = None  # kernels/step.py when fused_kernels
        if fused_kernels:
            from eaglespec.kernels import step as kernels

            if not available(self.device):
                raise EagleSpecError("fused_kernels=True needs triton and the target on CUDA (or TRITON_INTERPRET=1)")
            if compile:
                raise EagleSpecError("fused_kernels=True cannot be combined with compile=True")
            self._kernels = kernels
        # kernels/attention.py with the fused kernels: the masked attention in one kernel, the mask never expanded
        self._attn = None
        if fused_kernels:
            from eaglespec.kernels import attention as attn_kernels

            self._attn = attn_kernels
        self._pack, self._pack_copy = weight_packers(model, compile)
        self.lm_w = self._pack_copy(self.lm_w)
        self.layers = [fuse_layer(layer, self.n_heads, self.n_kv, self.head_dim, self._pack, self._pack_copy)
                       for layer in layers]
        self.compiled = compile
        # the bucket is static (one compile each), the span dynamic (cols' length); a torch without
        # maybe_mark_dynamic would recompile per span: its compiled steps attend over the whole cache
        self._whole_cache = compile and not hasattr(torch._dynamo, "maybe_mark_dynamic")
        if compile:  # one compile per bucket (8 by default) plus one per cache growth: past dynamo's default
            # limit of 8 per code object, which fullgraph=True turns into an error; only ever raised here
            cfg = torch._dynamo.config
            name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, name, max(getattr(cfg, name), 64))
        self._step_fn = torch.compile(self.step, fullgraph=True, dynamic=False) if compile else self.step
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = None
        self.feature_layer_ids: tuple[int, ...] = ()
        # the cache grows up to the model's context length and one verify forward's rows past it (not beyond,
        # unless a forward needs it)
        context = getattr(cfg, "max_position_embeddings", None)
        self.max_slots = None if not context else int(context) + self.buckets[-1]
        self.max_len = 0
        self._allocate(max_len if self.max_slots is None else min(max_len, self.max_slots))
        self.set_feature_layers(feature_layer_ids)
        self.reset()

    # -- setup ----------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.embed_w.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_w.dtype

    def embedding(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def _allocate(self, max_len: int) -> None:
        """(Re)allocate the static cache and the rope table for `max_len` slots, keeping the prefix."""
        if self.window is not None and max_len > self.window:
            if self.max_len >= self.window:
                raise EagleSpecError(f"context of {max_len} tokens exceeds the sliding window ({self.window}); "
                                     "use backend='hf'")
            max_len = self.window
        max_len = -(-max_len // 64) * 64
        old = getattr(self, "cache", None)
        # one spare slot: no [Hkv, span, D] view is contiguous, even span == max_len, so a compiled step keeps
        # the span dynamic (view contiguity is a shape guard: span == max_len would recompile)
        shape = (self.num_layers, 2, self.n_kv, max_len + 1, self.head_dim)
        # with it: the rope table [S, 2, 2, D/2] and its fp32 cos / sin
        check_fits("the fast backend's static KV cache", shape, self.dtype, self.device,
                   extra=max_len * self.head_dim * (2 * self.dtype.itemsize + 8))
        self.cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
        if old is not None and self.committed_len:
            self.cache[:, :, :, : self.committed_len] = old[:, :, :, : self.committed_len]
        self.rope_table = rope_table_for(self._rotary, max_len, self.head_dim, self.dtype, self.device)  # [S, 2, 2, D/2]
        self.cols = torch.arange(max_len, device=self.device)
        self.max_len = max_len
        self._drop_graphs()

    def span(self, n: int) -> int:
        """Cache slots a step over slots 0..n-1 attends over: n rounded up to span_step, capped at the cache."""
        if self._whole_cache:
            return self.max_len
        return round_span(n, self.span_step, self.max_len)

    def reserve(self, n: int) -> None:
        """Make room for n slots (doubling, up to max_slots unless n needs more; drops captured graphs when it
        grows; a cache that does not fit the device is a one-line EagleSpecError: check_fits)."""
        if n > self.max_len:
            grown = 2 * self.max_len if self.max_slots is None else min(2 * self.max_len, self.max_slots)
            self._allocate(max(n, grown))

    def set_feature_layers(self, ids: tuple[int, ...]) -> None:
        """Return the states entering layers `ids` (contract 3: id L = the last layer's output)."""
        for j in ids:
            if not 0 <= j <= self.num_layers:
                raise ValueError(f"feature layer id {j} out of range 0..{self.num_layers}")
        if tuple(ids) != self.feature_layer_ids:
            self._drop_graphs()
        self.feature_layer_ids = tuple(ids)

    def reset(self) -> None:
        self.committed_len = 0
        self._pending = 0  # rows of the last forward, not committed yet

    def _drop_graphs(self) -> None:
        """Forget the captured steps and their memory pool: once its last graph is freed, a pool cannot take
        another capture (torch asserts use_count > 0), so the next capture starts a new one."""
        self._graphs.clear()
        self._pool = None

    # -- the step (graph-captured on CUDA) ------------------------------------------------------
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
              base: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens/positions [B], visible [B, B] bool, base [] long, cols [span] = 0..span-1 (self.cols[:span])
        -> (logits [B, V], features [B, F]), attending over cache slots 0..span-1 (span >= base + B: the
        caller's contract). The span is cols' length: a dynamic dimension when compiled."""
        b, span = tokens.shape[0], cols.shape[0]
        hq, hk, d = self.n_heads, self.n_kv, self.head_dim
        g = hq // hk
        fused, attn = self._kernels, self._attn  # None: the torch code
        use_triton = fused is not None  # the skinny GEMM too, where it applies
        # [B, span]: the prefix, visible rows; one kernel with the kernels
        mask_of = fused.block_mask if fused is not None else block_mask_ref
        allowed = mask_of(visible, base, cols)
        if attn is None:
            mask = _grouped_mask(allowed, g, self._open, self._shut)  # [1, 1, B*G, span]: the grouped query rows
        else:
            kv_len = (base + b).reshape(1)  # the slots past base + B are never read (the span is rounded up)
        norm = _rms if fused is None else fused.rms_norm_weight

        def norm_linear(x: torch.Tensor, norm_w: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
            """F.linear(norm(x), weight, bias)."""
            return onednn.linear(norm(x, norm_w, self.eps), weight, bias, kernels=use_triton)  # F.linear; oneDNN on CPU
        if fused is None:
            slots = base + cols[:b]  # [B]: this step's cache slots (cols[:b] = 0..b-1)
            rope = self.rope_table[positions][None]  # [1, B, 2, 2, D/2]: broadcast over head-major [heads, B, D]

        h = F.embedding(tokens, self.embed_w)  # [B, H]
        feats: dict[int, torch.Tensor] = {}
        wanted = set(self.feature_layer_ids)
        for i, w in enumerate(self.layers):
            if i in wanted:
                feats[i] = h
            qkv = norm_linear(h, w.in_norm, w.qkv_w, w.qkv_b)  # [B, (Hq + 2 Hkv) D]
            qk, v = qkv.view(b, hq + 2 * hk, d).split([hq + hk, hk], dim=1)
            if w.qk_norm is not None:  # q_norm and k_norm at once (per head: the same values as one by one)
                qk = _rms(qk, w.qk_norm, self.eps)
            kc, vc = self.cache[i, 0].narrow(1, 0, span), self.cache[i, 1].narrow(1, 0, span)  # [Hkv, span, D]
            if fused is None:
                # rope of q and k at once (element-wise: the same values as one by one), written head-major so
                # that k's cache rows are views; q then copied into the grouped layout (kernels.rope_qk_kv_write_ref)
                qk_heads = qk.new_empty(hq + hk, b, d)
                _rope(qk.transpose(0, 1), rope, out=qk_heads)  # [Hq + Hkv, B, D]
                kc.index_copy_(1, slots, qk_heads[hq:])
                vc.index_copy_(1, slots, v.transpose(0, 1))
                q = qk_heads[:hq].unflatten(0, (hk, g)).permute(2, 1, 0, 3).contiguous()  # [B, G, Hkv, D]
            else:  # the same in one kernel: q [B, G, Hkv, D], k and v written at slots base..base+B-1
                q = fused.rope_qk_kv_write(qk, v, self.rope_table, positions, base, kc, vc)
            # GQA without repeating the cache: head j*G + r of token t is row t*G + r of kv head j
            if attn is None:
                o = F.scaled_dot_product_attention(_grouped_queries(q), kc[None], vc[None], attn_mask=mask,
                                                   scale=self.scaling)  # [1, Hkv, B*G, D]
            else:
                o = attn.masked_attention(_grouped_queries(q), kc[None], vc[None], allowed, self.scaling, kv_len)
            o = _grouped_output(o, b)  # [B, Hq*D], columns (r, j, d): a view of BMHK memory
            # residuals accumulate in place, except into the h that feats[i] holds (the layer's input)
            h = _add_linear(h, o, w.o_w, w.o_b, inplace=i not in wanted, kernels=use_triton)
            gate_up = norm_linear(h, w.post_norm, w.gate_up_w, w.gate_up_b)  # [B, 2I]
            if fused is not None and _is_silu(w.act):
                act = fused.silu_mul(gate_up)  # [B, I]
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                act = w.act(gate) * up
            h = _add_linear(h, act, w.down_w, w.down_b, inplace=True, kernels=use_triton)
        if self.num_layers in wanted:
            feats[self.num_layers] = h
        logits = norm_linear(h, self.final_norm, self.lm_w, self.lm_b)  # [B, V]
        if self.feature_layer_ids:
            features = torch.cat([feats[j] for j in self.feature_layer_ids], dim=-1)
        else:
            features = h.new_empty(b, 0)
        return logits, features

    def _runner(self, b: int, span: int) -> _Graph:
        """Static buffers for bucket b attending over `span` slots, with its CUDA graph captured on first use."""
        run = self._graphs.get((b, span))
        if run is not None:
            return run
        dev = self.device
        tokens = torch.zeros(b, dtype=torch.long, device=dev)
        pos_base = torch.full((b + 1,), self.committed_len, dtype=torch.long, device=dev)
        positions, base = pos_base[:b], pos_base[b]
        visible = torch.eye(b, dtype=torch.bool, device=dev)
        cols = self.cols[:span]
        if self.compiled and not self._whole_cache:
            torch._dynamo.maybe_mark_dynamic(cols, 0)  # every span of this bucket shares one compile
        graph = None
        if self.use_graphs:  # the warm-up writes only pending slots
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph, (logits, features) = capture_graph(lambda: self._step_fn(tokens, positions, visible, base, cols),
                                                      dev, self._pool)
        else:
            logits, features = tokens.new_empty(0), tokens.new_empty(0)
        offsets = torch.cat([torch.arange(b, device=dev), torch.zeros(1, dtype=torch.long, device=dev)])
        run = _Graph(tokens, positions, visible, base, pos_base, offsets, visible.clone(), {}, 0, cols,
                     logits, features, graph)
        self._graphs[(b, span)] = run
        return run

    def _stage(self, run: _Graph, tokens: torch.Tensor, depths: torch.Tensor | None,
               visible: torch.Tensor | None) -> None:
        """Write one forward's t rows into bucket B's static buffers: a causal step (depths and visible
        None, as in plain decoding) is 2 small kernels, a tree 3-4.

        Padding rows (t..B-1) keep whatever valid ids they held and see only themselves: real rows
        never see them and their outputs and KV slots are never read.
        """
        t, b = tokens.shape[0], run.tokens.shape[0]
        (run.tokens if t == b else run.tokens[:t]).copy_(tokens)
        torch.add(run.offsets, self.committed_len, out=run.pos_base)  # causal positions and the base
        if depths is not None:
            torch.add(depths, self.committed_len, out=run.positions[:t])
        if visible is None:
            if run.visible_t != t:  # unchanged from the last causal step of t rows: nothing to copy
                mask = run.causal.get(t)
                if mask is None:
                    mask = run.causal[t] = run.eye.clone()
                    mask[:t, :t] = torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
                run.visible.copy_(mask)
                run.visible_t = t
            return
        if t < b:
            run.visible.copy_(run.eye)
        run.visible[:t, :t].copy_(visible)
        run.visible_t = 0

    # -- the contract ---------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, depths: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> TargetOutput:
        t, base, dev = tokens.shape[0], self.committed_len, self.device
        self._pending = t
        b = smallest_bucket(self.buckets, t)
        if b is None:  # prefill or an oversized tree: one eager pass at its exact size
            self.reserve(base + t)
            tokens = tokens.to(dev)
            depths = torch.arange(t, device=dev) if depths is None else depths.to(dev)
            visible = torch.ones(t, t, dtype=torch.bool, device=dev).tril() if visible is None else visible.to(dev)
            base_t = torch.tensor(base, dtype=torch.long, device=dev)
            with eager_attention():  # a new shape: no cuDNN attention plan built for it
                logits, features = self.step(tokens, base + depths, visible, base_t, self.cols[: base + t])
            return TargetOutput(logits=logits, features=features)
        self.reserve(base + b)
        run = self._runner(b, self.span(base + b))
        self._stage(run, tokens, depths, visible)
        if run.graph is None:  # eager: fresh outputs
            logits, features = self._step_fn(run.tokens, run.positions, run.visible, run.base, run.cols)
        else:  # the static outputs are overwritten by the next replay: hand out copies
            run.graph.replay()
            logits, features = run.logits.clone(), run.features.clone()
        if t < b:
            logits, features = logits[:t], features[:t]
        return TargetOutput(logits=logits, features=features)

    @torch.no_grad()
    def commit(self, keep: torch.Tensor) -> None:
        """Move the kept pending rows' KV to slots committed..committed+m-1 (one gather + one copy).

        Keeping every pending row (m == rows forwarded: plain decoding, prefill, a fully accepted
        chain) moves nothing: the rows are distinct and in order, so keep is 0..m-1, already in place.
        """
        base, m = self.committed_len, keep.shape[0]
        if m and m != self._pending:
            src = self.cache.narrow(3, base, self.max_len - base).index_select(3, keep.to(self.device))
            self.cache.narrow(3, base, m).copy_(src)  # src: [L, 2, Hkv, m, D]
        self.committed_len = base + m
        self._pending = 0

    def set_committed(self, length: int) -> None:
        """Mark rows 0..length-1 committed after a caller moved the accepted rows' KV into place itself (the round
        graph's tail does it inside its CUDA graph); nothing is pending afterwards."""
        self.committed_len = length
        self._pending = 0


def fused_by_default(device: torch.device, compile: bool = False) -> bool:
    """make_target's fused_kernels: on CUDA where triton imports (kernels.on_by_default), but not when compiling
    (torch.compile makes its own kernels; FastTarget refuses the pair)."""
    return not compile and on_by_default(device)


def make_target(model: nn.Module, backend: str = "auto", feature_layer_ids: tuple[int, ...] = (), **fast_kw):
    """The target backend for `model`: "fast" (static cache + CUDA graphs), "hf", or "auto" (fast when the
    architecture is supported, on CUDA and on CPU, where its projections run through oneDNN; else the generic HF
    backend). A fast backend gets fused_kernels from fused_by_default unless fast_kw names it."""
    from eaglespec.backends.hf import HFTarget

    if backend not in ("auto", "fast", "hf"):
        raise EagleSpecError(f"backend {backend!r} is not one of auto, fast, hf")
    if backend == "auto":
        device = next(model.parameters()).device.type
        backend = "fast" if device in ("cuda", "cpu") and unsupported_reason(model) is None else "hf"
    if backend == "fast":
        if "fused_kernels" not in fast_kw:
            fast_kw["fused_kernels"] = fused_by_default(next(model.parameters()).device, fast_kw.get("compile", False))
        return FastTarget(model, feature_layer_ids, **fast_kw)
    return HFTarget(model, feature_layer_ids)
