"""The fast target's opt-in Triton kernels (FastTarget(fused_kernels=True), target/kernels.py) against its torch step.

GPU, the default target (SmolLM2-135M-Instruct), fp32 (TF32 off) and bf16:
1. each kernel against its torch reference on the model's shapes (24 rows): share of bitwise-equal outputs and
   max abs diff (expected: rope + KV write and silu * up bitwise; the RMSNorm's fp32 sum and rsqrt are not
   torch's, so fp32 may differ by an ulp and bf16 rarely by one bf16 ulp);
2. FastTarget(fused_kernels=False) vs (True) through a 200-token prefill (eager), a 24-row tree with a mask
   (graph), a non-prefix commit, a 1-row step (graph): logits max abs diff, argmax agreement, identical or not
   (fp32: not bitwise where the RMSNorm differs by an ulp; expect ~1e-5 on the logits);
3. a captured causal step of 1 and of 24 rows (bucket 32) after 200 committed tokens: graph replay ms (CUDA events,
   median of 200) and kernels per step (torch.profiler over the same step run eagerly; and over a replay, where
   the profiler sees into the graph).

    PYTHONPATH=src python bench/kernel_check.py [--json OUT]

CPU smoke test (parts 1 and 2 only, a tiny random Llama, Triton's interpreter; sets TRITON_INTERPRET=1 itself):

    PYTHONPATH=src python bench/kernel_check.py --tiny
"""

from __future__ import annotations

import argparse
import json
import os

import torch

IDS = (2, 15, 27)
TINY_IDS = (1, 2)


def tiny_llama():
    """A random Llama with GQA (4 q heads, 2 kv heads, head_dim 16), fp32, eval."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return tf.LlamaForCausalLM(cfg).eval()


def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return {"equal_share": round((a == b).float().mean().item(), 6), "max_abs": (a - b).abs().max().item()}


def kernel_parity(cfg, dtype: torch.dtype, dev: torch.device, rows: int = 24) -> dict:
    """Each kernel vs its torch reference on random inputs of the model's shapes."""
    from eaglespec.kernels import step as K
    from eaglespec.backends.fast import _rope_table

    gen = torch.Generator().manual_seed(0)
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    hq, hk = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or hidden // hq
    out = {}
    x = torch.randn(rows, hidden, generator=gen).to(dev, dtype)
    w = torch.randn(hidden, generator=gen).to(dev, dtype)
    out["rms_norm_weight"] = diff(K.rms_norm_weight(x, w, 1e-5), K.rms_norm_weight_ref(x, w, 1e-5))
    ang = torch.arange(512)[:, None] * torch.rand(d // 2, generator=gen)[None]
    emb = torch.cat([ang, ang], dim=-1)
    table = _rope_table(emb.cos().to(dev, dtype), emb.sin().to(dev, dtype))
    qkv = torch.randn(rows, (hq + 2 * hk) * d, generator=gen).to(dev, dtype)
    qk, v = qkv.view(rows, hq + 2 * hk, d).split([hq + hk, hk], dim=1)
    pos = torch.randint(0, 512, (rows,), generator=gen).to(dev)
    base = torch.tensor(100, device=dev)
    caches = [torch.zeros(2, hk, 300, d, device=dev, dtype=dtype) for _ in range(2)]
    q = K.rope_qk_kv_write(qk, v, table, pos, base, caches[0][0], caches[0][1])
    q_ref = K.rope_qk_kv_write_ref(qk, v, table, pos, base, caches[1][0], caches[1][1])
    out["rope_qk_kv_write (q)"] = diff(q, q_ref)
    out["rope_qk_kv_write (kv cache)"] = diff(caches[0], caches[1])
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 3).to(dev, dtype)
    out["silu_mul"] = diff(K.silu_mul(gate_up), K.silu_mul_ref(gate_up))
    return out


def random_tree(n: int, gen: torch.Generator, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(depths [n], visible [n, n]) of a random tree in depth order (parents first)."""
    from eaglespec.tree.core import ancestry

    parents = torch.tensor([-1] + [int(torch.randint(max(0, i - 4), i, (1,), generator=gen)) for i in range(1, n)])
    depths = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    return depths.to(dev), ancestry(parents).to(dev)


def compare_targets(model, ids, vocab: int, gen_seed: int = 0) -> tuple[dict, list]:
    """Plain vs fused FastTarget through prefill, tree, non-prefix commit, a 1-row step. Returns (results, targets
    with 200 committed tokens)."""
    from eaglespec.backends.fast import FastTarget

    dev = model.device
    gen = torch.Generator().manual_seed(gen_seed)
    plain = FastTarget(model, ids, max_len=512)
    fused = FastTarget(model, ids, max_len=512, fused_kernels=True)
    res = {}

    def both(name, *args):
        a, b = plain.forward(*args), fused.forward(*args)
        res[name] = {**diff(a.logits, b.logits), "identical": torch.equal(a.logits, b.logits) and
                     torch.equal(a.features, b.features),
                     "argmax_agree": (a.logits.argmax(-1) == b.logits.argmax(-1)).float().mean().item(),
                     "features_max_abs": (a.features.float() - b.features.float()).abs().max().item()}

    prompt = torch.randint(3, vocab, (197,), generator=gen).to(dev)
    both("prefill 197 (eager)", prompt)
    for t in (plain, fused):
        t.commit(torch.arange(197, device=dev))
    depths, vis = random_tree(24, gen, dev)
    toks = torch.randint(3, vocab, (24,), generator=gen).to(dev)
    both("tree 24 (bucket 32)", toks, depths, vis)
    keep = vis[-1].nonzero().flatten()[:2]  # root + one child: 2 rows, non-prefix when row 1 is not the child
    for t in (plain, fused):
        t.commit(keep)
    one = torch.randint(3, vocab, (1,), generator=gen).to(dev)
    both("step 1", one)
    for t in (plain, fused):
        t.commit(torch.arange(1, device=dev))  # 200 committed
    return res, [plain, fused]


def step_timings(targets, vocab: int) -> dict:
    """Causal steps of 1 and 24 rows (graph replay) on both targets, same inputs; plain vs fused logits too."""
    from step_profile import event_ms, kernel_profile  # bench/: its kernel counter and CUDA-event timer

    from eaglespec.backends.fast import smallest_bucket

    def kernels(fn) -> float:
        return kernel_profile(fn, n=3)["kernels_per_call"]

    out = {}
    gen = torch.Generator().manual_seed(5)
    for rows in (1, 24):
        toks = torch.randint(3, vocab, (rows,), generator=gen).to(targets[0].device)
        logits = []
        for name, t in zip(("plain", "fused"), targets):
            run = t._runner(smallest_bucket(t.buckets, rows), t.span(t.committed_len + rows))
            t._stage(run, toks, None, None)
            out[f"{name}/{rows}"] = {
                "ms": event_ms(run.graph.replay, n=210, warmup=10),  # the median of 200 replays
                "kernels_eager": kernels(lambda r=run, f=t: f._step(r.tokens, r.positions, r.visible, r.base,
                                                                     r.cols)),
                "kernels_replay": kernels(run.graph.replay),
            }
            run.graph.replay()
            logits.append(run.logits[:rows].clone())
        out[f"diff/{rows}"] = diff(logits[0], logits[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny random Llama (on CPU: Triton's interpreter)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:
        if not a.tiny:
            ap.error("no CUDA device: run the CPU smoke test with --tiny")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are jitted
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from eaglespec.backends.loading import load_target

    dev = torch.device("cuda" if cuda else "cpu")
    report: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu (TRITON_INTERPRET=1)",
                    "torch": torch.__version__}
    import triton

    report["triton"] = triton.__version__
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if a.tiny:
            model, ids = tiny_llama().to(dev, dtype), TINY_IDS
        else:
            model, ids = load_target(None, str(dev), dtype)[0], IDS
        cfg = model.config
        part = {"kernels": kernel_parity(cfg, dtype, dev)}
        part["targets"], targets = compare_targets(model, ids, cfg.vocab_size)
        if cuda:
            part["steps"] = step_timings(targets, cfg.vocab_size)
        report[dtype_name] = part
        del model, targets
    print_tables(report, cuda)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


def print_tables(report: dict, cuda: bool) -> None:
    print(f"# kernel_check: {report['device']}, torch {report['torch']}, triton {report['triton']}")
    print("| dtype | what | equal share | max abs diff | identical | argmax agree |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dt in ("fp32", "bf16"):
        for name, r in report[dt]["kernels"].items():
            print(f"| {dt} | kernel {name} | {r['equal_share']:.6f} | {r['max_abs']:.3g} | "
                  f"{r['equal_share'] == 1.0} | |")
        for name, r in report[dt]["targets"].items():
            print(f"| {dt} | target {name}: logits | {r['equal_share']:.6f} | {r['max_abs']:.3g} | "
                  f"{r['identical']} | {r['argmax_agree']:.4f} |")
    if not cuda:
        return
    print("\n| dtype | rows | plain ms | fused ms | plain kernels (eager / replay) | fused kernels (eager / replay) "
          "| logits max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for dt in ("fp32", "bf16"):
        s = report[dt]["steps"]
        for rows in (1, 24):
            p, f = s[f"plain/{rows}"], s[f"fused/{rows}"]
            print(f"| {dt} | {rows} | {p['ms']:.3f} | {f['ms']:.3f} | {p['kernels_eager']:.0f} / "
                  f"{p['kernels_replay']:.0f} | {f['kernels_eager']:.0f} / {f['kernels_replay']:.0f} | "
                  f"{s[f'diff/{rows}']['max_abs']:.3g} |")


if __name__ == "__main__":
    main()
