"""On the GPU: target/skinny.py's session-20 variants against what they replace, value for value and call for call.

    prologue   the RMSNorm in the prefetch kernel's prologue vs kernels.rms_norm_weight then the prefetch GEMM: few
               rows (plain decoding 1, a drafter step 10)
    touch      the K-walking kernel reading one element per cache line of its weight tile before the PDL wait vs
               without, and vs cuBLAS (F.linear / addmm_): a tree verification's 60 rows

Random bf16 weights of SmolLM2's and its drafter's shapes; each variant timed as `--reps` calls in one CUDA graph
(gemm_check.graph_replay_ms: the calls chain through PDL as a step's kernels do), median us per call; values
compared bitwise (the share of equal outputs, the largest difference).

    PYTHONPATH=src python bench/prologue_check.py [--reps 100] [--replays 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gemm_check import graph_replay_ms  # bench/ is the script's own directory: on sys.path

from eaglespec.bench import environment
from eaglespec.target import kernels as K
from eaglespec.target import skinny

EPS = 1e-5
# (name, rows, N, K, kind): kind norm (the prologue) or touch (+res: with the residual, in place)
CASES = [("qkv", 1, 960, 576, "norm"), ("gate_up", 1, 3072, 576, "norm"), ("lm_head", 1, 49152, 576, "norm"),
         ("draft gate_up", 10, 9216, 576, "norm"),
         ("draft lm_head", 10, 12000, 576, "norm"), ("qkv", 60, 960, 576, "touch"), ("o", 60, 576, 576, "touch+res"),
         ("gate_up", 60, 3072, 576, "touch"), ("down", 60, 576, 1536, "touch+res")]


def _compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"equal": round((a == b).float().mean().item(), 4), "max_diff": (a.float() - b.float()).abs().max().item()}


def _us(fn, reps: int, replays: int) -> float:
    return round(1e3 * statistics.median(graph_replay_ms(fn, reps, replays)), 3)


def case(name: str, rows: int, n: int, k: int, kind: str, reps: int, replays: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows * n + k)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, generator=g, **bf) * 0.05
    out = {"case": name, "rows": rows, "n": n, "k": k, "kind": kind}
    if kind == "norm":
        x = torch.randn(rows, k, generator=g, **bf) * 3
        nw = 1 + torch.randn(k, generator=g, **bf) * 0.3

        def pair():
            return skinny.linear(K.rms_norm_weight(x, nw, EPS), w)

        def fused():
            return skinny.linear(x, w, norm=nw, eps=EPS)
        out.update(_compare(fused(), pair()), pair_us=_us(pair, reps, replays), fused_us=_us(fused, reps, replays))
        return out
    x = torch.randn(rows, k, generator=g, **bf)
    if kind == "touch+res":
        h = torch.randn(rows, n, generator=g, **bf)
        h0 = h.clone()
        ref = torch.addmm(h0, x, w.t())
        walk = skinny.linear(x, w, residual=h0, touch=False)
        got = skinny.linear(x, w, residual=h0, touch=True)

        def cublas():
            return h.addmm_(x, w.t())

        def untouched():
            return skinny.linear(x, w, residual=h, inplace=True, touch=False)

        def touched():
            return skinny.linear(x, w, residual=h, inplace=True, touch=True)
    else:
        ref, walk, got = F.linear(x, w), skinny.linear(x, w, touch=False), skinny.linear(x, w, touch=True)

        def cublas():
            return F.linear(x, w)

        def untouched():
            return skinny.linear(x, w, touch=False)

        def touched():
            return skinny.linear(x, w, touch=True)
    out.update(_compare(got, walk), vs_cublas=_compare(got, ref), cublas_us=_us(cublas, reps, replays),
               untouched_us=_us(untouched, reps, replays), touched_us=_us(touched, reps, replays))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prologue_check: needs a CUDA GPU")
    x = torch.zeros(1, device="cuda")
    print(f"PDL: {K.pdl(x)}; prefetch rows {skinny.prefetch_rows()}", flush=True)
    results = []
    for c in CASES:
        r = case(*c, args.reps, args.replays)
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(x.device), "pdl": K.pdl(x),
                                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
