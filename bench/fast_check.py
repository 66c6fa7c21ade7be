"""GPU check of the fast backend on the default target: correctness vs HF and eager, and forward cost.

    python bench/fast_check.py [--compile] [--json OUT]

1. correctness: CUDA-graph replay == the same step run eagerly (exact), and fast vs HFTarget
   logits/features on a prompt + a tree verify + a non-prefix commit, in fp32 (TF32 off) and bf16;
2. cost of one target forward (ms, median of CUDA-event timings) at 1, 8 and 64 rows: HFTarget,
   fast eager, fast graph (and fast compiled+graph with --compile), with the span (cache slots attended) of
   each fast step and the graph / compiled outputs' difference from the eager step on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from eaglespec.backends.fast import FastTarget, smallest_bucket
from eaglespec.backends.hf import HFTarget
from eaglespec.backends.loading import load_target
from eaglespec.tree.core import ancestry

IDS = (2, 15, 27)


def tree(n: int, gen: torch.Generator, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    depths = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    order = torch.argsort(depths * n + torch.arange(n), stable=True)  # depth order, parents first
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n)
    parents = torch.where(parents[order] >= 0, inv[parents[order].clamp(min=0)], -1)
    return parents.to(dev), depths[order].to(dev), ancestry(parents).to(dev)


def compare(model, dtype_name: str) -> dict:
    dev = model.device
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (200,), generator=gen).to(dev)
    ref, fast, eager = HFTarget(model, IDS), FastTarget(model, IDS, max_len=512), None
    eager = FastTarget(model, IDS, max_len=512, cuda_graphs=False)
    out: dict = {"dtype": dtype_name}
    errs, graph_errs = [], []
    for b in (ref, fast, eager):
        b.forward(prompt)
        b.commit(torch.arange(200, device=dev))
    for n in (1, 6, 61, 61):
        _, depths, vis = tree(n, gen, dev)
        toks = torch.randint(100, 40000, (n,), generator=gen).to(dev)
        r, f, e = (b.forward(toks, depths, vis) for b in (ref, fast, eager))
        errs.append(((r.logits.float() - f.logits.float()).abs().max().item(),
                     (r.features.float() - f.features.float()).abs().max().item(),
                     (r.logits.argmax(-1) == f.logits.argmax(-1)).float().mean().item()))
        graph_errs.append(max((f.logits.float() - e.logits.float()).abs().max().item(),
                              (f.features.float() - e.features.float()).abs().max().item()))
        keep = vis[-1].nonzero().flatten()  # a root-to-leaf path: non-prefix when the tree branches
        for b in (ref, fast, eager):
            b.commit(keep)
    out["fast_vs_hf"] = [{"max_abs_logit": a, "max_abs_feature": b, "argmax_agree": c} for a, b, c in errs]
    out["graph_vs_eager_max_abs"] = graph_errs
    return out


def timings(model, use_compile: bool) -> dict:
    """Median forward ms per backend and row count, the span each fast step attends over, and (the same inputs
    in the same order for every backend) the last outputs' max abs difference from the eager fast step."""
    dev = model.device
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(100, 40000, (300,), generator=gen).to(dev)
    inputs = {}
    for n in (1, 8, 64):
        _, depths, vis = tree(n, gen, dev)
        inputs[n] = (torch.randint(100, 40000, (n,), generator=gen).to(dev), depths, vis)
    backends = {"hf": HFTarget(model, IDS), "fast_eager": FastTarget(model, IDS, max_len=1024, cuda_graphs=False),
                "fast_graph": FastTarget(model, IDS, max_len=1024)}
    if use_compile:
        backends["fast_compiled_graph"] = FastTarget(model, IDS, max_len=1024, compile=True)
    res: dict = {"ms": {}, "span": {}, "vs_eager_max_abs": {}, "vs_eager_argmax_agree": {}}
    last: dict = {}
    for name, b in backends.items():
        b.forward(prompt)
        b.commit(torch.arange(300, device=dev))
        for n, (toks, depths, vis) in inputs.items():
            for _ in range(3):
                b.forward(toks, depths, vis)
            times = []
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                out = b.forward(toks, depths, vis)
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            key = f"{name}/{n}"
            last[key] = out.logits.float()
            res["ms"][key] = round(statistics.median(times), 3)
            span = None
            if isinstance(b, FastTarget):  # the attended slots of this step's bucket (of max_len)
                span = b.span(b.committed_len + smallest_bucket(b.buckets, n))
                res["span"][key] = span
            print(f"forward ms {key}: {res['ms'][key]} (span {span})", flush=True)
            b.commit(torch.tensor([0], device=dev))
    for key, logits in last.items():
        if key.startswith(("fast_graph", "fast_compiled")):
            ref = last["fast_eager/" + key.split("/")[1]]
            res["vs_eager_max_abs"][key] = (logits - ref).abs().max().item()
            res["vs_eager_argmax_agree"][key] = (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    m32, _ = load_target(None, "cuda", "float32")
    report["fp32"] = compare(m32, "float32")
    del m32
    m16, _ = load_target(None, "cuda", "bfloat16")
    report["bf16"] = compare(m16, "bfloat16")
    report["forward_bf16"] = timings(m16, a.compile)
    print(json.dumps(report, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
