"""A sampled round's sibling tests (round_graph step 4, children drawn from q): verify.sibling_tests + the final row's
index_select (torch, one batch of [T, V] passes per sibling rank) against sampled_kernels.sibling_tests +
final_residual (K + 2 kernels, each over grid [T, cdiv(V, chunk)] or V's blocks, + a memset), on a dynamic-like
tree.

The tree: --rows nodes, a root with --top-k children, the rest spread over depths 2..--depth (each depth's nodes
hang under the first nodes of the depth above, at most --top-k children each, as EAGLE-2's selection keeps the
likeliest). p [T, V]: softmaxes of random logits (std 3); q [T, V]: softmaxes over a random --draft-vocab subset
(zero elsewhere: a draft vocab mapped to the target's); every node's children drawn from its q without replacement,
all live. `best`: a fixed node (a depth-1 node with children, read on the device).

GPU: us per call, --reps calls captured in one CUDA graph, the median of --replays replays (gemm_check's
graph_replay_ms), for each path, and the max abs difference of r_at / q_at (live nodes) and of the final row (at
best, and the worst over every node) against the torch path. --sweep also times the kernel path over
sibling_tests' chunk (elements of a row per program) x num_warps.

    PYTHONPATH=src python bench/sibling_check.py [--rows 61] [--vocab 49152] [--top-k 10] [--sweep] [--json OUT]
        [--fit-json FIT [--budget B]]

--fit-json times a fitted static tree's layout (e.g. session 30's 60-node depth-3 tree, 12 children at the root)
instead of the dynamic-like one. (Sessions 30-31 also timed each rank launch rebuilding its parents' states against
carrying them from the launch before; the carried states won and are the only path since: bench/RESULTS.md.)

CPU smoke test (Triton's interpreter, set by the script; eager timing of one call, not meaningful):

    PYTHONPATH=src python bench/sibling_check.py --device cpu --vocab 300
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time

import torch

SWEEP = {"chunk": (512, 1024, 2048, 4096, 8192), "num_warps": (2, 4, 8)}


def dynamic_parents(rows: int, top_k: int, depth: int, gen: torch.Generator) -> list[int]:
    """A 7/10/60-like tree: the root's top_k children, then the other rows spread over depths 2..depth, each under a
    node of the depth above (the first ones likelier), at most top_k children per node. Host list, -1 at the root."""
    parents, level = [-1], [0]
    counts = [0] * rows
    per = [min(top_k, rows - 1)]
    rest = rows - 1 - per[0]
    for d in range(depth - 1):
        per.append(rest // (depth - 1) + (d < rest % (depth - 1)))
    for n in per:
        nxt = []
        for _ in range(n):
            open_ = [p for p in level if counts[p] < top_k] or [len(parents) - 1]
            weights = torch.tensor([1.0 / (1 + i) for i in range(len(open_))])
            par = open_[int(torch.multinomial(weights, 1, generator=gen))]
            counts[par] += 1
            parents.append(par)
            nxt.append(len(parents) - 1)
        level = nxt or level
    return parents


def static_parents(path: str, budget: int | None) -> list[int]:
    """The parents of a fitted static tree's first `budget` paths (round_timeline.fitted_spec), laid out as the
    engine lays them out (tree.static_layout); -1 at the root."""
    from round_timeline import fitted_spec  # bench/ is the script's own directory: on sys.path

    from eaglespec.tree.core import static_layout

    return list(static_layout(fitted_spec(path, budget).static_choices()).parents)


def inputs(rows: int, vocab: int, top_k: int, depth: int, draft_vocab: int, dev: str, seed: int = 0,
           parents: list[int] | None = None) -> dict:
    """tokens [T], kids / live [T, K], p / q [T, V] fp32, best [1] on `dev`; the tree: `parents` when given
    (rows and top_k must match it: main sets them from it), else dynamic_parents."""
    from eaglespec.verify import sibling_table_of

    gen = torch.Generator().manual_seed(seed)
    if parents is None:
        parents = dynamic_parents(rows, top_k, depth, gen)
    kids = sibling_table_of(torch.tensor(parents), top_k)
    p = torch.softmax(torch.randn(rows, vocab, generator=gen) * 3, -1)
    sub = torch.randperm(vocab, generator=gen)[:draft_vocab]
    q = torch.zeros(rows, vocab)
    q[:, sub] = torch.softmax(torch.randn(rows, draft_vocab, generator=gen) * 3, -1)
    tokens = torch.zeros(rows, dtype=torch.long)
    for a in range(rows):
        n = int((kids[a] > 0).sum())
        if n:
            tokens[kids[a, :n]] = torch.multinomial(q[a], n, replacement=False, generator=gen)
    with_kids = [j for j in range(1, rows) if parents[j] == 0 and j in parents] or [0]
    return {"tokens": tokens.to(dev), "kids": kids.to(dev), "live": (kids > 0).to(dev), "p": p.to(dev),
            "q": q.to(dev), "best": torch.tensor([with_kids[0]], device=dev), "parents": parents}


def torch_path(x: dict):
    from eaglespec.verify import sibling_tests

    def call():
        r_at, q_at, res = sibling_tests(x["tokens"], x["kids"], x["p"], x["q"], x["live"])
        return r_at, q_at, res.index_select(0, x["best"])
    return call


def kernel_path(x: dict, **cfg):
    from eaglespec.kernels import sampled as SK

    def call():
        r_at, q_at, state = SK.sibling_tests(x["tokens"], x["kids"], x["p"], x["q"], x["live"], **cfg)
        return r_at, q_at, SK.final_residual(x["p"], x["q"], state, x["best"])
    return call


def errors(x: dict, **cfg) -> dict:
    """Max abs differences of the kernels against the torch path: r_at / q_at on live nodes, the final row at best
    and at every node (each node's row normalised as the torch path's is)."""
    from eaglespec.kernels import sampled as SK
    from eaglespec.verify import sibling_tests

    r_ref, q_ref, res = sibling_tests(x["tokens"], x["kids"], x["p"], x["q"], x["live"])
    r_at, q_at, state = SK.sibling_tests(x["tokens"], x["kids"], x["p"], x["q"], x["live"], **cfg)
    on = x["kids"][x["live"]]
    rows = [SK.final_residual(x["p"], x["q"], state, torch.tensor([b], device=x["p"].device))[0]
            for b in range(res.shape[0])]
    every = max(float((row - res[b]).abs().max()) for b, row in enumerate(rows))
    best = int(x["best"])
    return {"r_at": float((r_at[on] - r_ref[on]).abs().max()), "q_at": float((q_at[on] - q_ref[on]).abs().max()),
            "final_at_best": float((rows[best] - res[best]).abs().max()), "final_every_node": every}


def per_call_us(fn, cuda: bool, reps: int, replays: int) -> float:
    """us per call: a CUDA graph of `reps` calls, the median of `replays` replays; on CPU one eager call."""
    if cuda:
        from gemm_check import graph_replay_ms  # bench/ is the script's own directory: on sys.path

        return round(statistics.median(t * 1000 for t in graph_replay_ms(fn, reps, replays)), 2)
    fn()
    t0 = time.perf_counter()
    fn()
    return round((time.perf_counter() - t0) * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: Triton's interpreter, eager timing (a smoke test; use a small --vocab)")
    ap.add_argument("--rows", type=int, default=61, help="tree rows T")
    ap.add_argument("--vocab", type=int, default=49152, help="target vocab V")
    ap.add_argument("--top-k", type=int, default=10, help="children per node at most (sibling ranks K)")
    ap.add_argument("--depth", type=int, default=7, help="tree depth")
    ap.add_argument("--draft-vocab", type=int, default=12000, help="q's support (at most vocab / 4)")
    ap.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--replays", type=int, default=20, help="graph replays (the median is reported)")
    ap.add_argument("--sweep", action="store_true", help="also time sibling_tests' chunk x num_warps: "
                    + ", ".join(f"{k} {v}" for k, v in SWEEP.items()))
    ap.add_argument("--fit-json", default=None, metavar="FIT",
                    help="the tree: a fitted static tree's first --budget paths (bench/fit_sampled_tree.py --json) "
                         "instead of a dynamic-like one (--rows, --top-k and --depth then follow from it)")
    ap.add_argument("--budget", type=int, default=None, help="with --fit-json: its first BUDGET paths (default all)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are jitted
    elif not torch.cuda.is_available():
        ap.error("no CUDA device: run the CPU smoke test with --device cpu --vocab 300")
    import triton

    from eaglespec.kernels import sampled as SK

    parents = static_parents(a.fit_json, a.budget) if a.fit_json else None
    if parents is not None:  # the fitted tree's rows and widest node (checked by fits below)
        a.rows, a.top_k = len(parents), max(parents.count(j) for j in range(len(parents)))
    if not SK.fits(a.vocab, a.top_k):
        ap.error(f"sampled_kernels do not take --vocab {a.vocab} --top-k {a.top_k} (at most {SK.MAX_K} ranks)")
    x = inputs(a.rows, a.vocab, a.top_k, a.depth, min(a.draft_vocab, max(a.vocab // 4, 2 * a.top_k)), a.device,
               parents=parents)
    kids = x["kids"].cpu()
    live = int((kids > 0).sum())
    report: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu (TRITON_INTERPRET=1)",
                    "torch": torch.__version__, "triton": triton.__version__, "rows": a.rows, "vocab": a.vocab,
                    "top_k": a.top_k, "depth": a.depth, "live_children": live,
                    "parents_with_children": int((kids > 0).any(1).sum()), "root_children": int((kids[0] > 0).sum()),
                    "timing": f"graph of {a.reps} calls, median of {a.replays} replays" if cuda else "one eager call"}
    report["tree"] = f"{a.fit_json}, first {a.budget or 'all'} paths" if a.fit_json else "dynamic-like"
    report["us"] = {"torch": per_call_us(torch_path(x), cuda, a.reps, a.replays),
                    "kernels": per_call_us(kernel_path(x), cuda, a.reps, a.replays)}
    report["max_abs_diff"] = errors(x)
    if a.sweep:
        report["sweep"] = []
        for chunk, warps in itertools.product(*SWEEP.values()):
            if chunk > 32 * 32 * warps:  # more than 32 elements per thread and array: spills
                continue
            us = per_call_us(kernel_path(x, chunk=chunk, num_warps=warps), cuda, a.reps, a.replays)
            report["sweep"].append({"chunk": chunk, "num_warps": warps, "us": us})
    print(f"# sibling_check: {report['device']}, torch {report['torch']}, triton {report['triton']}; T={a.rows} "
          f"V={a.vocab} K={a.top_k}: {live} live children under {report['parents_with_children']} parents "
          f"({report['root_children']} at the root); us per call ({report['timing']})")
    d = report["max_abs_diff"]
    print("| path | us per call | max abs diff r_at / q_at / final at best / final, every node |")
    print("| --- | --- | --- |")
    print(f"| torch (verify.sibling_tests + index_select) | {report['us']['torch']} | reference |")
    print(f"| kernels (sibling_tests + final_residual) | {report['us']['kernels']} | {d['r_at']:.2g} / {d['q_at']:.2g}"
          f" / {d['final_at_best']:.2g} / {d['final_every_node']:.2g} |")
    for row in report.get("sweep", []):
        print(f"| kernels, chunk {row['chunk']}, {row['num_warps']} warps | {row['us']} | |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
