"""The Triton masked attention (target/attn_kernels.py) against F.scaled_dot_product_attention on the step's shapes.

GPU only. SmolLM2-135M's attention (3 KV heads, G = 3, head dim 64), bf16, batch 1: B query tokens (1, 8, 61, 121)
as a random tree after a prefix (fast._step's `allowed`), over span = 256 / 512 / 1024 cache slots (views of a
bigger cache, as the step's cache.narrow), kv_len = span - 100 (the tree's last slot + 1). Each variant:

    sdpa           F.scaled_dot_product_attention with fast._grouped_mask's additive mask, torch's backend choice
                   (cuDNN's on an H200: ~7.6 us + a memset kernel)
    sdpa_efficient the same forced to EFFICIENT_ATTENTION
    sdpa_flash     FLASH_ATTENTION takes no mask: only B = 1, over k[:kv_len] unmasked (the same values; a
                   lower bound that needs the length on the host)
    triton         masked_attention(q, k, v, allowed, scale)
    triton_kv_len  masked_attention(..., kv_len): the tiles past kv_len skipped

us per call: 100 calls captured in one CUDA graph, the median of 20 replays (CUDA events) / 100. kernels per call:
CUDA kernels + memsets under torch.profiler over one eager call. max abs diff against an fp64 reference (the
SDPA math on the same inputs upcast): the bf16 run and an fp32 run (TF32 off) of every variant.
--sweep [GRID] also times masked_attention per shape over BLOCK_M x BLOCK_N x splits x num_warps x num_stages x
kv_len off/on (to choose attn_kernels.default_config).

    PYTHONPATH=src python bench/attn_check.py [--json OUT] [--sweep [GRID]] [--rows 1,8] [--spans 256,512]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from gemm_check import graph_replay_ms  # bench/ is the script's own directory: on sys.path
from torch.nn.attention import SDPBackend, sdpa_kernel

HK, G, D = 3, 3, 64
CALLS = 100  # calls per captured graph


def shapes(b: int, span: int, dtype: torch.dtype, seed: int = 0) -> dict:
    """The step's inputs: q [1, Hkv, B*G, D] (the transposed view of [B, G, Hkv, D]), k / v [1, Hkv, span, D]
    (narrowed from a [2, Hkv, span + 256, D] cache), allowed [B, span] (prefix + a random tree ending at kv_len),
    kv_len [1] long, the grouped additive mask [1, 1, B*G, span]."""
    from eaglespec.backends.fast import _grouped_mask
    from eaglespec.tree.core import ancestry

    gen = torch.Generator().manual_seed(seed)
    kv_len = span - 100
    base = kv_len - b
    parents = torch.tensor([-1] + [int(torch.randint(max(0, i - 4), i, (1,), generator=gen)) for i in range(1, b)])
    rel = torch.arange(span) - base
    allowed = ((ancestry(parents)[:, rel.clamp(0, b - 1)] & (rel < b)) | (rel < 0)).cuda()
    q = torch.randn(b, G, HK, D, generator=gen).reshape(1, b * G, HK, D).transpose(1, 2)
    cache = torch.randn(2, HK, span + 256, D, generator=gen)
    q, cache = q.to("cuda", dtype), cache.to("cuda", dtype)
    open_ = torch.zeros((), device="cuda", dtype=dtype)
    shut = torch.full((), torch.finfo(dtype).min, device="cuda", dtype=dtype)
    return {"q": q, "k": cache[0].narrow(1, 0, span)[None], "v": cache[1].narrow(1, 0, span)[None],
            "allowed": allowed, "kv_len": torch.tensor([kv_len], device="cuda"),
            "mask": _grouped_mask(allowed, G, open_, shut), "n": kv_len}


def variants(x: dict, b: int) -> dict:
    """name -> a no-argument call returning o [1, Hkv, B*G, D] (None: does not apply)."""
    from eaglespec.kernels import attention as A

    q, k, v, allowed, mask, scale = x["q"], x["k"], x["v"], x["allowed"], x["mask"], D ** -0.5

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def forced(backend):
        def call():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return call

    def flash():
        n = x["n"]
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], scale=scale)

    return {"sdpa": sdpa, "sdpa_efficient": forced(SDPBackend.EFFICIENT_ATTENTION),
            "sdpa_flash": flash if b == 1 else None,
            "triton": lambda: A.masked_attention(q, k, v, allowed, scale),
            "triton_kv_len": lambda: A.masked_attention(q, k, v, allowed, scale, x["kv_len"])}


def graph_us(fn) -> float:
    """us per call: CALLS calls captured in one CUDA graph, the median of 20 replays (gemm_check's timing)."""
    return round(statistics.median(t * 1000 for t in graph_replay_ms(fn, CALLS, 20)), 3)


def kernels_per_call(fn) -> int:
    """CUDA kernels and memsets of one eager call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA)


def max_diffs(b: int, span: int) -> dict:
    """name -> {bf16, fp32}: max abs diff against the fp64 SDPA math on the same inputs (fp32: TF32 off)."""
    from eaglespec.kernels import attention as A

    out: dict = {}
    for tag, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        x = shapes(b, span, dtype)
        with sdpa_kernel([SDPBackend.MATH]):
            truth = A.masked_attention_ref(x["q"].double(), x["k"].double(), x["v"].double(), x["allowed"],
                                           D ** -0.5)
        for name, fn in variants(x, b).items():
            if fn is None:
                continue
            try:
                diff = (fn().double() - truth).abs().max().item()
            except RuntimeError as e:  # a backend refusing fp32, say
                diff = f"error: {str(e).splitlines()[0][:80]}"
            out.setdefault(name, {})[tag] = diff
    return out


SWEEP = {"bm": (16, 32, 64), "bn": (32, 64, 128), "sp": (1, 2, 4, 8), "nw": (2, 4, 8), "ns": (0,), "kv": (1,)}


def sweep_grid(text: str) -> dict:
    """'bm=16,32 ns=2,3' -> SWEEP with those keys replaced (ns 0: Triton's default stages; kv 0/1: kv_len off/on)."""
    grid = dict(SWEEP)
    for part in text.split():
        key, _, vals = part.partition("=")
        if key not in grid:
            raise SystemExit(f"--sweep: unknown key {key!r} (keys: {', '.join(grid)})")
        grid[key] = tuple(int(x) for x in vals.split(","))
    return grid


def sweep(x: dict, m: int, grid: dict) -> list[dict]:
    """masked_attention's us per call over the launch configurations of `grid` that fit M query rows."""
    from eaglespec.kernels import attention as A

    q, k, v, allowed = x["q"], x["k"], x["v"], x["allowed"]
    res = []
    for bm, bn, sp, nw, ns, kv in itertools.product(*(grid[key] for key in SWEEP)):
        if (bm > max(16, 2 * m) and len(grid["bm"]) > 1) or sp * bn > k.shape[2]:
            continue

        def call(bm=bm, bn=bn, sp=sp, nw=nw, ns=ns, kv=kv):
            return A.masked_attention(q, k, v, allowed, D ** -0.5, x["kv_len"] if kv else None, block_m=bm,
                                      block_n=bn, splits=sp, num_warps=nw, num_stages=ns or None)
        try:
            us = graph_us(call)
        except Exception as e:  # a configuration the compiler refuses (shared memory, say)
            us = f"error: {type(e).__name__}"
        res.append({"block_m": bm, "block_n": bn, "splits": sp, "num_warps": nw, "num_stages": ns, "kv_len": kv,
                    "us": us})
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--rows", default="1,8,61,121", help="query tokens B, comma-separated")
    ap.add_argument("--spans", default="256,512,1024", help="spans, comma-separated (kv_len = span - 100)")
    ap.add_argument("--sweep", nargs="?", const="", default=None, metavar="GRID",
                    help="also time masked_attention's launch configurations: GRID as 'bm=16,32 ns=2,3', keys "
                         f"{', '.join(SWEEP)} (defaults: {SWEEP})")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attn_check.py times CUDA graphs and needs a CUDA device; the CPU tests are "
                 "tests/test_attn_kernels.py (Triton's interpreter)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import triton

    from eaglespec.kernels import attention as A

    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "heads": {"kv": HK, "group": G, "head_dim": D}, "calls_per_graph": CALLS, "rows": []}
    names = ("sdpa", "sdpa_efficient", "sdpa_flash", "triton", "triton_kv_len")
    print(f"# attn_check: {report['device']}, torch {report['torch']}, triton {report['triton']}; us per call "
          f"(graph of {CALLS}), kernels per call, max abs diff vs fp64 (bf16 / fp32)")
    print("| B | span | kv_len | config | " + " | ".join(names) + " |")
    print("| --- | --- | --- | --- |" + " --- |" * len(names))
    for b, span in itertools.product(map(int, a.rows.split(",")), map(int, a.spans.split(","))):
        x = shapes(b, span, torch.bfloat16)
        row: dict = {"B": b, "span": span, "kv_len": x["n"], "config": A.default_config(b * G, span, HK), "us": {},
                     "kernels": {}}
        for name, fn in variants(x, b).items():
            if fn is not None:
                row["us"][name] = graph_us(fn)
                row["kernels"][name] = kernels_per_call(fn)
        row["max_abs_diff"] = max_diffs(b, span)
        if a.sweep is not None:
            row["sweep"] = sweep(x, b * G, sweep_grid(a.sweep))
            timed = [r for r in row["sweep"] if isinstance(r["us"], float)]
            row["best"] = min(timed, key=lambda r: r["us"]) if timed else None
        report["rows"].append(row)
        cells = []
        for name in names:
            if name not in row["us"]:
                cells.append("n/a")
                continue
            d = row["max_abs_diff"].get(name, {})
            fmt = [f"{d[t]:.2g}" if isinstance(d.get(t), float) else "err" for t in ("bf16", "fp32")]
            cells.append(f"{row['us'][name]:.2f} us, {row['kernels'][name]} k, {fmt[0]} / {fmt[1]}")
        print(f"| {b} | {span} | {x['n']} | {row['config']} | " + " | ".join(cells) + " |", flush=True)
        if a.sweep is not None and row["best"]:
            best = row["best"]
            print(f"|  |  |  | best: ({best['block_m']}, {best['block_n']}, {best['splits']}) w{best['num_warps']} "
                  f"s{best['num_stages']} kv{best['kv_len']}: {best['us']:.2f} us |" + " |" * len(names), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
