"""EngineConfig and engine/build.py: the defaults per device, explicit choices winning, and the engine built from
a config with no change after construction."""

from __future__ import annotations

import argparse

import pytest
import torch

from eaglespec.backends.fast import FastTarget
from eaglespec.backends.fast_batch import FastBatchTarget
from eaglespec.backends.hf import HFTarget
from eaglespec.backends.hf_batch import HFBatchTarget
from eaglespec.config import EngineConfig
from eaglespec.draft.fast import StaticDraftRunner
from eaglespec.draft.proposer import EagerRows
from eaglespec.engine.build import build_batch_target, build_engine, build_target
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec

from conftest import reference_greedy, tiny_drafter, tiny_target


def test_defaults_follow_the_device():
    cpu = EngineConfig().resolve("cpu", fast=True)
    assert not (cpu.kernels or cpu.draft_graphs or cpu.round_graphs or cpu.overlap or cpu.chunked_prefill)
    cuda = EngineConfig().resolve(torch.device("cuda", 0), fast=True)
    assert cuda.draft_graphs and cuda.round_graphs and cuda.overlap and cuda.chunked_prefill
    hf_cuda = EngineConfig().resolve("cuda", fast=False)  # the HF backend: no static drafter KV, no overlap
    assert not (hf_cuda.draft_graphs or hf_cuda.round_graphs or hf_cuda.overlap)


def test_explicit_choices_win():
    on = EngineConfig(draft_graphs=True, round_graphs=True, overlap=True, chunked_prefill=True).resolve("cpu", True)
    assert on.draft_graphs and on.round_graphs and on.overlap and on.chunked_prefill
    off = EngineConfig(round_graphs=True, draft_graphs=False).resolve("cuda", True)
    assert not off.round_graphs  # round graphs need the static draft runner
    assert not EngineConfig(kernels=False).resolve("cuda", True).kernels


@pytest.mark.parametrize("field,value,match", [("backend", "tpu", "backend 'tpu'"), ("threads", 0, "threads"),
                                               ("draft_max_len", 0, "draft_max_len"), ("kv_memory", 0.0, "kv_memory"),
                                               ("kv_memory", 1.5, r"in \(0, 1\]: got 1.5")])
def test_bad_values_are_one_line_errors(field, value, match):
    with pytest.raises(EagleSpecError, match=match):
        EngineConfig(**{field: value})


def test_from_args_keeps_defaults_for_absent_flags():
    args = argparse.Namespace(backend="hf", device="cpu", round_graphs=None, overlap=False, tree="chain")
    cfg = EngineConfig.from_args(args, threads=1)
    assert cfg == EngineConfig(backend="hf", device="cpu", overlap=False, threads=1)


def test_build_on_cpu_is_eager_and_exact():
    model, spec = tiny_target("llama", seed=3), TreeSpec("chain", depth=3)
    drafter = tiny_drafter(model, seed=4)
    target = build_target(model, EngineConfig(), drafter.feature_layer_ids, max_len=64)
    engine = build_engine(target, drafter, spec, EngineConfig())
    assert isinstance(target, FastTarget) and isinstance(engine.proposer.runner, EagerRows)
    assert engine.graphs is None and not engine.overlap and not engine.chunked_prefill
    assert engine.generate([3, 1, 4, 1, 5], 12).token_ids == reference_greedy(model, [3, 1, 4, 1, 5], 12)


def test_build_with_graphs_asked_gives_the_static_runner_and_round_graphs():
    model, spec = tiny_target("llama", seed=3), TreeSpec("chain", depth=3)
    drafter = tiny_drafter(model, seed=4)
    cfg = EngineConfig(draft_graphs=True, round_graphs=True, draft_max_len=64)
    engine = build_engine(build_target(model, cfg, drafter.feature_layer_ids, max_len=64), drafter, spec, cfg)
    assert isinstance(engine.proposer.runner, StaticDraftRunner) and engine.graphs is not None
    assert engine.generate([3, 1, 4, 1, 5], 12).token_ids == reference_greedy(model, [3, 1, 4, 1, 5], 12)
    hf = build_engine(HFTarget(model), drafter, spec, cfg)  # round graphs need the fast backend
    assert hf.graphs is None


def test_batch_target_follows_the_backend():
    """The batched engine runs the fused layers where the model allows them, the model's own forward otherwise."""
    model = tiny_target("llama", seed=3)
    assert type(build_batch_target(model, EngineConfig())) is FastBatchTarget
    assert type(build_batch_target(model, EngineConfig(backend="hf"))) is HFBatchTarget
    windowed = tiny_target("mistral", seed=3)
    windowed.config.sliding_window = 8
    assert type(build_batch_target(windowed, EngineConfig())) is HFBatchTarget
    with pytest.raises(EagleSpecError, match="sliding-window"):
        build_batch_target(windowed, EngineConfig(backend="fast"))
