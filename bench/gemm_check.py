"""The fused Triton GEMMs (target/gemm_kernels.py) against the torch code they replace, on SmolLM2-135M's shapes.

GPU (default): for qkv (rms_norm_linear, N=960, K=576), gate_up (N=3072, K=576), lm_head (final norm + lm_head,
N=49152, K=576) and down (silu_mul_linear_, N=576, I=1536), M in (1, 8, 32, 64), bf16 and fp32 (TF32 off):
1. parity of the fused kernel vs its torch reference (*_ref): share of bitwise-equal outputs, max abs diff, and
   the reference's max |value| for scale (expected: fp32 within accumulation order, ~1e-6 relative; bf16 mostly
   equal, the rest one bf16 ulp);
2. ms per call in a CUDA graph of --reps calls (the median over --replays replays / reps): the fused kernel
   (1 kernel), today's pair (kernels.rms_norm_weight + F.linear, kernels.silu_mul + addmm_: 2 kernels), and
   cuBLAS's GEMM alone (F.linear / addmm_: what the GEMM part costs without the prologue). --sweep also times
   other block sizes of the fused kernel and reports the fastest (each size compiles per M and dtype: a
   minute or two more).

Weights: random of SmolLM2-135M's shapes (std 0.02, norm weights ~1), or layer 0 / the final norm and lm_head of
a real model with --model NAME ("default": the default target). Inputs random (hidden states std 1).

    PYTHONPATH=src python bench/gemm_check.py [--model default] [--sweep] [--json OUT]

CPU smoke test (Triton's interpreter, set by the script; parity only, no timing; small random weights, or with
--model the model's, lm_head cut to its first 1024 rows):

    PYTHONPATH=src python bench/gemm_check.py --device cpu
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
from dataclasses import dataclass

import torch

ROWS = (1, 8, 32, 64)
CPU_ROWS = (1, 5)
SWEEP = ({"block_n": 32}, {"block_n": 128}, {"block_n": 64, "block_k": 128}, {"block_n": 128, "block_k": 128},
         {"block_n": 64, "num_warps": 8})


@dataclass
class Weights:
    """One layer's projections and norms, the final norm and lm_head (SmolLM2's shapes, or smaller on CPU)."""
    eps: float
    in_norm: torch.Tensor  # [H]
    qkv_w: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    post_norm: torch.Tensor  # [H]
    gate_up_w: torch.Tensor  # [2I, H]
    down_w: torch.Tensor  # [H, I]
    final_norm: torch.Tensor  # [H]
    lm_w: torch.Tensor  # [V, H]


def random_weights(hidden: int, qkv: int, inter: int, vocab: int, dtype: torch.dtype, dev: str) -> Weights:
    gen = torch.Generator().manual_seed(0)

    def lin(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen) * 0.02).to(dev, dtype)

    def norm() -> torch.Tensor:
        return (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dev, dtype)

    return Weights(1e-5, norm(), lin(qkv, hidden), norm(), lin(2 * inter, hidden), lin(hidden, inter), norm(),
                   lin(vocab, hidden))


def model_weights(name: str, dtype: torch.dtype, dev: str) -> Weights:
    from eaglespec.backends.loading import load_target

    model = load_target(None if name == "default" else name, dev, dtype)[0]
    layer = model.model.layers[0]
    att, mlp = layer.self_attn, layer.mlp
    for m in (att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        if m.bias is not None:
            raise SystemExit(f"{name}: biased projections (the check times bias-free ones)")
    cat = torch.cat
    return Weights(model.config.rms_norm_eps, layer.input_layernorm.weight,
                   cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]), layer.post_attention_layernorm.weight,
                   cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight, model.model.norm.weight,
                   model.lm_head.weight.contiguous())


def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return {"equal_share": round((a == b).float().mean().item(), 6), "max_abs": (a - b).abs().max().item(),
            "ref_max": b.abs().max().item()}


def graph_ms(fn, reps: int, replays: int) -> float:
    """ms per call of fn: a CUDA graph of `reps` calls, the median of `replays` replays (CUDA events) / reps."""
    return round(statistics.median(graph_replay_ms(fn, reps, replays)), 5)


def graph_replay_ms(fn, reps: int, replays: int) -> list[float]:
    """fn warmed up outside a capture (3 calls on a side stream), then `reps` calls captured in one CUDA graph and
    replayed `replays` times: ms per call of each replay (CUDA events). bench/attn_check.py times with it too."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles, cuBLAS workspace) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / reps)
    return times


def cases(w: Weights, m: int, gen: torch.Generator) -> dict[str, dict]:
    """{name: {"fused": fused(**blocks), "parity": the fused output, "ref": the reference's, "pair": today's two
    kernels, "gemm": cuBLAS's GEMM alone}} on fresh random inputs of m rows. The timed callables of down
    accumulate into a scratch h (its values drift: irrelevant to the timing); its parity runs on copies of h."""
    from eaglespec.kernels import gemm as G
    from eaglespec.kernels import step as K

    linear = torch.nn.functional.linear
    dev, dtype = w.qkv_w.device, w.qkv_w.dtype
    hidden, inter = w.down_w.shape
    x = torch.randn(m, hidden, generator=gen).to(dev, dtype)
    gate_up = (torch.randn(m, 2 * inter, generator=gen) * 2).to(dev, dtype)
    h = torch.randn(m, hidden, generator=gen).to(dev, dtype)
    scratch = h.clone()
    act = K.silu_mul_ref(gate_up)
    out = {}
    for name, norm, weight in (("qkv", w.in_norm, w.qkv_w), ("gate_up", w.post_norm, w.gate_up_w),
                               ("lm_head", w.final_norm, w.lm_w)):
        normed = K.rms_norm_weight_ref(x, norm, w.eps)
        fused = functools.partial(G.rms_norm_linear, x, norm, w.eps, weight)
        out[name] = {"fused": fused, "parity": fused, "ref": lambda nw=norm, wt=weight: G.rms_norm_linear_ref(
                     x, nw, w.eps, wt), "pair": lambda nw=norm, wt=weight: linear(K.rms_norm_weight(x, nw, w.eps), wt),
                     "gemm": lambda wt=weight, a=normed: linear(a, wt)}
    out["down"] = {"fused": functools.partial(G.silu_mul_linear_, scratch, gate_up, w.down_w),
                   "parity": lambda: G.silu_mul_linear_(h.clone(), gate_up, w.down_w),
                   "ref": lambda: G.silu_mul_linear_ref_(h.clone(), gate_up, w.down_w),
                   "pair": lambda: scratch.addmm_(K.silu_mul(gate_up), w.down_w.t()),
                   "gemm": lambda: scratch.addmm_(act, w.down_w.t())}
    return out


def run(w: Weights, rows: tuple[int, ...], timing: bool, sweep: bool, reps: int, replays: int) -> list[dict]:
    results = []
    gen = torch.Generator().manual_seed(1)
    for m in rows:
        for name, c in cases(w, m, gen).items():
            r = {"what": name, "rows": m, **diff(c["parity"](), c["ref"]())}
            if not timing:  # the smoke test: today's pair and the GEMM alone run too (untimed)
                c["pair"](), c["gemm"]()
            else:
                r["fused_ms"] = graph_ms(c["fused"], reps, replays)
                r["pair_ms"] = graph_ms(c["pair"], reps, replays)
                r["gemm_only_ms"] = graph_ms(c["gemm"], reps, replays)
                if sweep:
                    best = ({}, r["fused_ms"])
                    for blocks in SWEEP:
                        ms = graph_ms(functools.partial(c["fused"], **blocks), reps, replays)
                        r[f"fused_ms {blocks}"] = ms
                        best = (blocks, ms) if ms < best[1] else best
                    r["best_blocks"], r["best_ms"] = best
            results.append(r)
    return results


def print_table(report: dict) -> None:
    print(f"# gemm_check: {report['device']}, torch {report['torch']}, triton {report['triton']}, "
          f"weights: {report['weights']}")
    timing = "fused_ms" in report["results"][0]
    head = "| dtype | what | M | equal share | max abs diff | ref max abs |"
    if timing:
        head += " fused ms | pair ms | cuBLAS GEMM only ms | pair / fused |"
        if any("best_ms" in r for r in report["results"]):
            head += " best blocks | best ms |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for r in report["results"]:
        line = (f"| {r['dtype']} | {r['what']} | {r['rows']} | {r['equal_share']:.4f} | {r['max_abs']:.3g} | "
                f"{r['ref_max']:.3g} |")
        if timing:
            line += (f" {r['fused_ms']:.4f} | {r['pair_ms']:.4f} | {r['gemm_only_ms']:.4f} | "
                     f"{r['pair_ms'] / r['fused_ms']:.2f} |")
            if "best_ms" in r:
                line += f" {r['best_blocks'] or 'default'} | {r['best_ms']:.4f} |"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: Triton's interpreter, small shapes, parity only (a smoke test)")
    ap.add_argument("--model", default=None, help='a target to take the weights from ("default": the default '
                    "target); random weights of SmolLM2-135M's shapes if not given")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--reps", type=int, default=100, help="calls per CUDA graph")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="also time the fused kernels' other block sizes")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cpu = a.device == "cpu"
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are jitted
    elif not torch.cuda.is_available():
        ap.error("no CUDA device: run the CPU smoke test with --device cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import triton

    report = {"device": "cpu (TRITON_INTERPRET=1)" if cpu else torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "weights": a.model or "random", "results": []}
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    for dn in a.dtypes.split(","):
        dtype = dtypes[dn]
        if a.model:
            w = model_weights(a.model, dtype, a.device)
            if cpu:  # the interpreter takes minutes over all of lm_head
                w.lm_w = w.lm_w[:1024]
        elif cpu:
            w = random_weights(64, 96, 80, 256, dtype, "cpu")
        else:
            w = random_weights(576, 960, 1536, 49152, dtype, "cuda")
        for r in run(w, CPU_ROWS if cpu else ROWS, not cpu, a.sweep and not cpu, a.reps, a.replays):
            report["results"].append({"dtype": dn, **r})
        del w
    print_table(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
