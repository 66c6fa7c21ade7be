"""Compile the sampled round's sibling-test kernels (sampled_kernels.py) and a greedy round's children, argmax_keys
and accept_path kernels (tree_kernels.py) for an H100/H200 (sm_90) on a machine with no GPU: Triton's real compiler
front end, its LLVM and ptxas, down to a cubin. The tests run these kernels under Triton's interpreter, which takes
code the compiler refuses; this catches that before a GPU lease does. It also prints what kernel executes per
program: PTX instructions, barriers (bar.sync) and warp shuffles (straight-line code; a runtime loop counts once).

    PYTHONPATH=src python bench/aot_check.py [--arch 90] [--json OUT]

Session 30 used it to drop a merge "by rank" for tree_kernels' top-k merges: at the block sizes the drafter uses
(128-256 keys) it compiled to more barriers than the K max passes it was to replace (35 vs 19 at 128 keys, 139 vs
47 at 256), so it was not worth a GPU lease.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

P, L, U8 = "*fp32", "*i64", "*u8"
RANK_SIG = dict(R="i32", tok_ptr=L, kids_ptr=L, live_ptr=U8, p_ptr=P, q_ptr=P, rq_ptr=P, ps_ptr=P, pm_ptr=P, st_ptr=P,
                rm_ptr=L, V="i32", T="i32", S="i32", p_stride="i32", q_stride="i32")
FINAL_SIG = dict(best_ptr=L, tok_ptr=L, kids_ptr=L, live_ptr=U8, p_ptr=P, q_ptr=P, ps_ptr=P, pm_ptr=P, st_ptr=P,
                 rm_ptr=L, out_ptr=P, V="i32", T="i32", S="i32", p_stride="i32", q_stride="i32")
LEFT_SIG = dict(live_ptr=U8, q_ptr=P, ps_ptr=P, V="i32", S="i32", q_stride="i32")
ARGMAX_SIG = dict(x_ptr="*bf16", key_ptr=L, x_row_stride="i32", V="i32", S="i32")  # argmax_keys over bf16 logits
CHUNK_SIG = dict(x_ptr="*bf16", key_ptr=L, stat_ptr=P, x_row_stride="i32", V="i32", S="i32")  # children's chunks
MERGE_SIG = dict(key_ptr=L, stat_ptr=P, conf_ptr=P, tok_ptr=L, logc_ptr=P, base_ptr=P, par_ptr=L, parent_ptr=L,
                 S="i32", floor="fp32")
ACCEPT_SIG = dict(tok_ptr=L, par_ptr=L, dep_ptr=L, vis_ptr=U8, next_ptr=L, best_ptr=L, bonus_ptr=L, m_ptr=L,
                  order_ptr=L, T="i32", P="i32", S="i32")


def compile_stats(fn, sig: dict, consts: dict, arch: int) -> dict:
    """fn (a triton.jit function) compiled for cuda:arch with these argument types and constexprs -> counts."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    full = {n: sig[n] for n in names if n in sig} | dict.fromkeys(consts, "constexpr")
    missing = [n for n in names if n not in full]
    if missing:
        raise SystemExit(f"aot_check: {fn.__name__}: no type for {missing}")
    src = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in consts.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    ptx = kernel.asm["ptx"]
    body = [ln for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith(("//", ".", "$", "{", "}"))]
    return {"ptx_instructions": len(body), "bar_sync": ptx.count("bar.sync"), "shfl": ptx.count("shfl.sync"),
            "cubin_bytes": len(kernel.asm.get("cubin", b""))}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100/H200)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("aot_check: unset TRITON_INTERPRET (the interpreter's kernels cannot be compiled)")
    from eaglespec.kernels import sampled as SK
    from eaglespec.kernels import tree as TK

    SK._load()
    TK._load()
    rows = []
    rows.append({"kernel": "_argmax_chunk_kernel", "K": 1, **compile_stats(
        TK._argmax_chunk_kernel, ARGMAX_SIG, dict(CHUNK=2048, USE_GDC=False), args.arch)})
    for chunk in (1024, 256):  # children's two kernels at a 12,000-id draft vocabulary: 12 or 47 chunks a row
        rows.append({"kernel": f"_chunk_top_kernel ({chunk})", "K": 10, **compile_stats(
            TK._chunk_top_kernel, CHUNK_SIG, dict(K=10, CHUNK=chunk, USE_GDC=False), args.arch)})
        rows.append({"kernel": f"_merge_top_kernel ({chunk})", "K": 10, **compile_stats(
            TK._merge_top_kernel, MERGE_SIG, dict(K=10, KB=16, SP=16 if chunk == 1024 else 64, BASE=True, PARENTS=2,
                                                  USE_GDC=False), args.arch)})
    for keys in (False, True):  # the target's argmax given, or merged from 24 chunks' keys (49,152 / 2048)
        rows.append({"kernel": "_accept_path_kernel" + (" (keys)" if keys else ""), "K": 24 if keys else 1,
                     **compile_stats(TK._accept_path_kernel, ACCEPT_SIG,
                                     dict(TB=64, KEYS=keys, SB=32 if keys else 1, USE_GDC=False), args.arch)})
    for k, kp in ((4, 4), (12, 16)):
        shape = dict(K=k, KP=kp, SB=32, USE_GDC=False)
        rows.append({"kernel": "_left_kernel", "K": k, **compile_stats(
            SK._left_kernel, LEFT_SIG, dict(K=k, KP=kp, CHUNK=2048, USE_GDC=False), args.arch)})
        for name, sig, extra in (("_rank_kernel", RANK_SIG, {"CHUNK": 2048}),
                                 ("_final_kernel", FINAL_SIG, {"BLOCK": 1024})):
            rows.append({"kernel": name, "K": k, **compile_stats(getattr(SK, name), sig, shape | extra, args.arch)})
    print(f"| kernel (sm_{args.arch}) | K | PTX instructions | bar.sync | shfl | cubin bytes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['K']} | {r['ptx_instructions']} | {r['bar_sync']} | {r['shfl']} | "
              f"{r['cubin_bytes']} |")
    report = {"arch": args.arch, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
