"""Ahead-of-time compilation of the round's Triton kernels for a CUDA arch, on a machine without a GPU.

Triton's real front end, LLVM and ptxas compile each kernel down to a cubin, which catches code the
interpreter (TRITON_INTERPRET=1, the CPU tests' mode) accepts but the compiler refuses. Per kernel it reports
what one program executes: PTX instructions, barriers (bar.sync) and warp shuffles (shfl.sync), counted over
straight-line PTX (a runtime loop counts once), and the cubin's size. TRITON_INTERPRET must be unset.
"""

from __future__ import annotations

from eaglespec.errors import EagleSpecError
from eaglespec.kernels import interpreted

P, L, U8 = "*fp32", "*i64", "*u8"
RANK_SIG = dict(R="i32", tok_ptr=L, kids_ptr=L, live_ptr=U8, p_ptr=P, q_ptr=P, rq_ptr=P, ps_ptr=P, pm_ptr=P,
                st_ptr=P, rm_ptr=L, V="i32", T="i32", S="i32", p_stride="i32", q_stride="i32")
FINAL_SIG = dict(best_ptr=L, tok_ptr=L, kids_ptr=L, live_ptr=U8, p_ptr=P, q_ptr=P, ps_ptr=P, pm_ptr=P,
                 st_ptr=P, rm_ptr=L, out_ptr=P, V="i32", T="i32", S="i32", p_stride="i32", q_stride="i32")
LEFT_SIG = dict(live_ptr=U8, q_ptr=P, ps_ptr=P, V="i32", S="i32", q_stride="i32")
# argmax_keys over bf16 logits; the children's per-chunk top-k and their merge
ARGMAX_SIG = dict(x_ptr="*bf16", key_ptr=L, x_row_stride="i32", V="i32", S="i32")
CHUNK_SIG = dict(x_ptr="*bf16", key_ptr=L, stat_ptr=P, x_row_stride="i32", V="i32", S="i32")
MERGE_SIG = dict(key_ptr=L, stat_ptr=P, conf_ptr=P, tok_ptr=L, logc_ptr=P, base_ptr=P, par_ptr=L,
                 parent_ptr=L, S="i32", floor="fp32")
ACCEPT_SIG = dict(tok_ptr=L, par_ptr=L, dep_ptr=L, vis_ptr=U8, next_ptr=L, best_ptr=L, bonus_ptr=L, m_ptr=L,
                  order_ptr=L, T="i32", P="i32", S="i32")


def compile_stats(fn, sig: dict[str, str], consts: dict, arch: int) -> dict:
    """fn (a triton.jit function) compiled for cuda:arch with these argument types and constexprs ->
    {"ptx_instructions", "bar_sync", "shfl", "cubin_bytes"}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    full = {n: sig[n] for n in names if n in sig} | dict.fromkeys(consts, "constexpr")
    missing = [n for n in names if n not in full]
    if missing:
        raise EagleSpecError(f"{fn.__name__}: no argument type for {missing}")
    src = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in consts.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    ptx = kernel.asm["ptx"]
    lines = (ln.strip() for ln in ptx.splitlines())
    body = [ln for ln in lines if ln and not ln.startswith(("//", ".", "$", "{", "}"))]  # instructions
    return {"ptx_instructions": len(body), "bar_sync": ptx.count("bar.sync"), "shfl": ptx.count("shfl.sync"),
            "cubin_bytes": len(kernel.asm.get("cubin", b""))}


def compile_round_kernels(arch: int = 90) -> list[dict]:
    """Compile a greedy round's argmax_keys, children (chunk top-k + merge) and accept_path kernels and the
    sampled round's sibling-test kernels (left, rank, final) at the shapes the default drafter uses; one row
    per kernel: {"kernel", "K", **compile_stats}."""
    if interpreted():
        raise EagleSpecError("TRITON_INTERPRET=1 is set: the interpreter's kernels cannot be compiled")
    from eaglespec.kernels import sampled as SK
    from eaglespec.kernels import tree as TK

    SK._load()
    TK._load()
    rows = [{"kernel": "_argmax_chunk_kernel", "K": 1, **compile_stats(
        TK._argmax_chunk_kernel, ARGMAX_SIG, dict(CHUNK=2048, USE_GDC=False), arch)}]
    for chunk in (1024, 256):  # children's two kernels at a 12,000-id draft vocabulary: 12 or 47 chunks a row
        rows.append({"kernel": f"_chunk_top_kernel ({chunk})", "K": 10, **compile_stats(
            TK._chunk_top_kernel, CHUNK_SIG, dict(K=10, CHUNK=chunk, USE_GDC=False), arch)})
        merge = dict(K=10, KB=16, SP=16 if chunk == 1024 else 64, BASE=True, PARENTS=2, USE_GDC=False)
        rows.append({"kernel": f"_merge_top_kernel ({chunk})", "K": 10,
                     **compile_stats(TK._merge_top_kernel, MERGE_SIG, merge, arch)})
    for keys in (False, True):  # the target's argmax given, or merged from 24 chunks' keys (49,152 / 2048)
        rows.append({"kernel": "_accept_path_kernel" + (" (keys)" if keys else ""), "K": 24 if keys else 1,
                     **compile_stats(TK._accept_path_kernel, ACCEPT_SIG,
                                     dict(TB=64, KEYS=keys, SB=32 if keys else 1, USE_GDC=False), arch)})
    for k, kp in ((4, 4), (12, 16)):
        shape = dict(K=k, KP=kp, SB=32, USE_GDC=False)
        rows.append({"kernel": "_left_kernel", "K": k, **compile_stats(
            SK._left_kernel, LEFT_SIG, dict(K=k, KP=kp, CHUNK=2048, USE_GDC=False), arch)})
        for name, sig, extra in (("_rank_kernel", RANK_SIG, {"CHUNK": 2048}),
                                 ("_final_kernel", FINAL_SIG, {"BLOCK": 1024})):
            stats = compile_stats(getattr(SK, name), sig, shape | extra, arch)
            rows.append({"kernel": name, "K": k, **stats})
    return rows
