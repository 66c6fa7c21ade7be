"""eaglespec.timeline: interval arithmetic, per-round metrics and the attribution of kernels to phases."""

from __future__ import annotations

import pytest

from eaglespec import timeline as rt


def test_union_merges_and_clips():
    assert rt.union([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert rt.union([(0, 2), (1, 3), (5, 7)], 2, 6) == [(2, 3), (5, 6)]


def test_round_metrics_busy_idle_and_phases():
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


def test_timeline_links_kernels_to_launches():
    """The CUDA path on hand-made events (the real profiler's linkage is unverified here: no GPU)."""
    from types import SimpleNamespace as NS

    import torch

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


def test_cpu_path_on_a_real_profile():
    """Without CUDA the top-level aten ops inside each labelled range stand in for kernels (torch.profiler's own
    events: two rounds of a draft and a verify range)."""
    import torch

    a = torch.randn(8, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with torch.profiler.record_function(rt.ROUND):
                with torch.profiler.record_function("rt:draft"):
                    torch.add(a, 1)
                with torch.profiler.record_function("rt:verify"):
                    torch.mm(a, a).sum()
    rounds, linkage = rt.timeline(prof.events(), cuda=False)
    assert len(rounds) == 2 and linkage["device_activities_unlinked"] == 0
    for m in rounds:
        assert m["phases"]["draft"]["activities"] >= 1 and m["phases"]["verify"]["activities"] >= 2
        assert "aten::mm" in m["kinds"] and "aten::add" in m["kinds"]
        assert 0 < m["busy_ms"] <= m["wall_ms"]
    host = [{"draft_ms": 1.0, "verify_ms": 2.0, "commit_ms": 0.5}] * 2
    s = rt.summarize(rounds, host)
    assert s["engine_host_split_ms"]["verify_ms"] == {"median": 2.0, "mean": 2.0}
    assert s["kinds"][0]["per_round"] >= 1
