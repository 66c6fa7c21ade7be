"""The one place that turns an EngineConfig into a target backend and an engine.

    target = build_target(model, config, drafter.feature_layer_ids)
    engine = build_engine(target, drafter, spec, config)
    batched = build_batch_engine(model, drafter, spec, config)   # many sequences at once (engine/batch.py)

build_batch_target picks the batched target: FastBatchTarget (the fused layers) where the architecture allows it,
else HFBatchTarget (the model's own forward), as config.backend says.

build_engine picks the drafter's runner (a StaticDraftRunner with CUDA graphs, or eager rows), the round graphs
and the loop's switches from `config.resolve(device, fast)`; the engine is complete when it returns.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from eaglespec.backends.base import TargetBackend
from eaglespec.backends.fast import FastTarget, free_device_memory, make_target
from eaglespec.backends.fast_batch import FastBatchTarget, batch_unsupported_reason
from eaglespec.backends.hf_batch import HFBatchTarget
from eaglespec.config import EngineConfig
from eaglespec.draft.fast import StaticDraftRunner
from eaglespec.engine.batch import BatchEngine
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.sampling import SamplingConfig
from eaglespec.tree.core import TreeSpec

DEFAULT_MAX_BATCH = 8  # the batched engine's rows when the config does not size it
DEFAULT_DRAFT_MAX_LEN = 4096  # static drafter KV rows when neither the config nor the caller sizes it
KV_MEMORY = 0.9  # the share of the free GPU memory the batched engine's KV may take when the config does not say


def build_target(model: nn.Module, config: EngineConfig, feature_layer_ids: tuple[int, ...] = (),
                 max_len: int | None = None, compile: bool = False) -> TargetBackend:
    """The target backend for `model` (already on its device and dtype): config.backend ("auto": the fast backend
    where the architecture is supported), with the Triton kernels where config.kernels resolves on."""
    device = next(model.parameters()).device
    kw: dict = {"compile": compile} if compile else {}
    if max_len is not None:
        kw["max_len"] = max_len
    if config.backend != "hf":
        kw["fused_kernels"] = config.resolve(device, fast=True).kernels and not compile
    return make_target(model, config.backend, tuple(feature_layer_ids), **kw)


def build_engine(target: TargetBackend, drafter: nn.Module | None, spec: TreeSpec | None,
                 config: EngineConfig | None = None, draft_max_len: int | None = None,
                 sampling: SamplingConfig | None = None) -> SpeculativeEngine:
    """An engine over `target` drafting with `drafter` (None: plain decoding) and tree `spec`, as `config` says."""
    config = config or EngineConfig()
    spec = spec or TreeSpec()
    inner = getattr(target, "inner", target)  # a wrapper (e.g. bench's synchronizing proxy) exposes `inner`
    device = getattr(inner, "device", torch.device("cpu"))
    fast = isinstance(inner, FastTarget)
    switches = config.resolve(device, fast)
    runner = None
    if drafter is not None and switches.draft_graphs:
        runner = partial(StaticDraftRunner, max_len=config.draft_max_len or draft_max_len or DEFAULT_DRAFT_MAX_LEN,
                         kernels=switches.kernels)
    return SpeculativeEngine(target, drafter, spec, sampling, draft_runner=runner, round_graphs=switches.round_graphs,
                             kernels=switches.kernels, adaptive=bool(config.adaptive), overlap=switches.overlap,
                             chunked_prefill=switches.chunked_prefill)


def build_batch_target(model: nn.Module, config: EngineConfig, feature_layer_ids: tuple[int, ...] = ()
                       ) -> HFBatchTarget:
    """The batched target for `model`: config.backend "hf" -> HFBatchTarget; "fast" -> FastBatchTarget (a one-line
    error where the model cannot have one); "auto" -> FastBatchTarget where batch_unsupported_reason allows it."""
    reason = batch_unsupported_reason(model) if config.backend != "hf" else "backend 'hf'"
    if reason is not None:
        if config.backend == "fast":
            raise EagleSpecError(f"the fast batched backend cannot run this target: {reason} (use backend='hf')")
        return HFBatchTarget(model, feature_layer_ids)
    kernels = config.resolve(next(model.parameters()).device, fast=True).kernels
    return FastBatchTarget(model, feature_layer_ids, kernels=kernels)


def build_batch_engine(model: nn.Module, drafter: nn.Module | None, spec: TreeSpec | None,
                       config: EngineConfig | None = None, draft_max_len: int | None = None) -> BatchEngine:
    """The batched engine over `model` (build_batch_target) drafting with `drafter`: config.max_batch rows (default
    8); the rows with their own proposer (dynamic trees, sampled rows) on StaticDraftRunners where config's
    draft_graphs resolve on (the fast batched target on CUDA), of config.draft_max_len or `draft_max_len` rows; its KV
    within config.kv_memory of the GPU memory free now (on CUDA); with config.adaptive not False, its depth plan
    calibrated (BatchEngine.calibrate)."""
    config = config or EngineConfig()
    ids = tuple(drafter.feature_layer_ids) if drafter is not None else ()
    target = build_batch_target(model, config, ids)
    switches = config.resolve(target.device, fast=isinstance(target, FastBatchTarget))
    runner = None
    if drafter is not None and switches.draft_graphs:
        runner = partial(StaticDraftRunner, max_len=config.draft_max_len or draft_max_len or DEFAULT_DRAFT_MAX_LEN,
                         kernels=switches.kernels)
    free = free_device_memory(target.device)  # None on a CPU: no bound
    budget = None if free is None else int((config.kv_memory or KV_MEMORY) * free)
    engine = BatchEngine(target, drafter, spec, max_batch=config.max_batch or DEFAULT_MAX_BATCH,
                         prefill_chunk=config.prefill_chunk, speculate_up_to=config.speculate_up_to,
                         adaptive=config.adaptive, max_tokens=config.max_batch_tokens, kernels=switches.kernels,
                         draft_runner=runner, kv_budget=budget)
    if config.adaptive is not False and drafter is not None and engine.spec.speculates:
        engine.calibrate()  # the depth per batch size (engine/plan.py)
    return engine
