"""Where the GPU time of one round goes: kernel profile of the fast target step and of one drafter propose().

For the default target (SmolLM2-135M-Instruct, bf16) on the fast backend it reports
1. target step, rows 1 and 64, 2048 static cache slots, attending over the default span (200 committed + the rows,
   rounded up to 256 slots) or over the whole cache (span_step=2048, the pre-span behaviour): graph replay ms (CUDA
   events, median)
   and, from torch.profiler over the same step run eagerly, the kernels per step and the CUDA time by kernel
   family (top 12): the share of attention, matmuls, norms, rope, copies;
2. one propose() per tree kind (chain k=5, dynamic 60/8/10, dynamic 24/5/6) with the shipped drafter: eager, draft
   graphs, and draft graphs with plain torch.topk (A/B of tree.draft_topk): wall ms (synchronized, median) and,
   eager, the kernel count and the CUDA time by family.

    PYTHONPATH=src python bench/step_profile.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from eaglespec.api import EagleSpec, tree_spec
from eaglespec.draft.fast import enable_draft_graphs
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.backends.fast import FastTarget
from eaglespec.tree.core import ancestry

FAMILIES = (("attention", ("fmha", "attention", "flash", "sdpa", "softmax")), ("gemm", ("gemm", "gemv", "cutlass",
            "sm90", "nvjet", "cublas", "splitk")), ("reduce", ("reduce",)), ("index/copy", ("index", "copy", "cat",
            "scatter", "gather")), ("elementwise", ("elementwise", "vectorized", "unrolled")))


def family(name: str) -> str:
    low = name.lower()
    return next((fam for fam, keys in FAMILIES if any(k in low for k in keys)), "other")


def kernel_profile(fn, n: int = 5) -> dict:
    """Run fn n times under torch.profiler: kernels per call and CUDA us per call by family and top names."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    fams: dict[str, float] = defaultdict(float)
    names: dict[str, list] = defaultdict(lambda: [0, 0.0])
    count = 0
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        count += 1
        fams[family(ev.name)] += us / n
        names[ev.name[:90]][0] += 1
        names[ev.name[:90]][1] += us / n
    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:12]
    return {"kernels_per_call": count / n, "cuda_us_per_call": round(sum(fams.values()), 1),
            "by_family_us": {k: round(v, 1) for k, v in sorted(fams.items(), key=lambda kv: -kv[1])},
            "top": [(k, v[0] // n, round(v[1], 1)) for k, v in top]}


def event_ms(fn, n: int = 30, warmup: int = 5) -> float:
    """Median ms of fn over CUDA events, the first `warmup` of the n calls left out."""
    times = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return round(statistics.median(times[warmup:]), 4)


def target_profile(model, ids) -> dict:
    out = {}
    dev = model.device
    prompt = torch.randint(100, 40000, (200,), generator=torch.Generator().manual_seed(0)).to(dev)
    for span_step in (256, 2048):
        for rows in (1, 64):
            fast = FastTarget(model, ids, max_len=2048, span_step=span_step)
            fast.forward(prompt)
            fast.commit(torch.arange(200, device=dev))
            toks = prompt[:rows]
            parents = torch.arange(-1, rows - 1)
            depths, vis = torch.arange(rows, device=dev), ancestry(parents).to(dev)
            run = fast._runner(rows, fast.span(200 + rows))
            fast._stage(run, toks, depths, vis)
            key = f"span{run.cols.shape[0]}/rows{rows}"
            out[key] = {"graph_ms": event_ms(run.graph.replay),
                        "eager": kernel_profile(lambda r=run, f=fast: f._step(r.tokens, r.positions, r.visible, r.base,
                                                                                  r.cols))}
            print(key, json.dumps(out[key]), flush=True)
    return out


def propose_profile(es: EagleSpec) -> dict:
    """propose() per tree: eager, draft graphs, and draft graphs with plain torch.topk instead of the two-stage
    tree.draft_topk (A/B of the top-k; the graphs are captured with the setting in force)."""
    import eaglespec.tree.core as tree_mod

    out = {}
    prompt = es.encode("Write a short story about a lighthouse keeper and explain the moral.")
    specs = (("chain", tree_spec("chain", 5)), ("dynamic", tree_spec("dynamic")),
             ("dynamic_5_6_24", tree_spec("dynamic", top_k=6, depth=5, budget=24)))
    split = tree_mod.TOPK_SPLIT_DEVICES
    for kind, spec in specs:
        for mode in ("eager", "graphs", "graphs_plain_topk"):
            if mode == "graphs_plain_topk" and kind == "chain":
                continue  # a greedy chain takes no top-k
            tree_mod.TOPK_SPLIT_DEVICES = () if mode == "graphs_plain_topk" else split
            target = FastTarget(es.model, tuple(es.drafter.feature_layer_ids), max_len=2048)
            eng = SpeculativeEngine(target, es.drafter, spec)
            if mode != "eager":
                enable_draft_graphs(eng, max_len=2048)
            calls = []
            orig = eng.proposer.propose

            def grab(*a, _orig=orig, _calls=calls):
                _calls.append(a)
                return _orig(*a)

            eng.proposer.propose = grab
            eng.generate(prompt, 64, es.eos_ids())
            eng.proposer.propose = orig
            args = calls[-1]
            wall = []
            for _ in range(20):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                orig(*args)
                torch.cuda.synchronize()
                wall.append(1e3 * (time.perf_counter() - t0))
            key = f"{kind}/{mode}"
            out[key] = {"wall_ms": round(statistics.median(wall[5:]), 3)}
            if mode == "eager":
                out[key]["eager"] = kernel_profile(lambda a=args, o=orig: o(*a))
            print(key, json.dumps(out[key]), flush=True)
    tree_mod.TOPK_SPLIT_DEVICES = split
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    es = EagleSpec.from_pretrained(None, None, device="cuda", dtype="bfloat16", backend="hf")
    ids = tuple(es.drafter.feature_layer_ids)
    with torch.no_grad():
        report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "draft": es.draft_note,
                  "target": target_profile(es.model, ids), "propose": propose_profile(es)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
