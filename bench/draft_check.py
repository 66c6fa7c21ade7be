"""GPU check of the static drafter path (draft/fast.py, issue 6; first passed on an H200 in session 2, bench/RESULTS.md)
and of the whole-tree draft graph (draft/tree_graph.py: one CUDA graph per tree after catch-up):

1. correctness, fp32 (TF32 off) and bf16, default target + drafter (shipped one, else random EAGLE-3):
   a. one drafter step: CUDA-graph replay == the same static step run eagerly (max abs diff, expect 0.0)
      at buckets 1 and 16 after a 300-row catch-up;
   b. whole generations (fast target backend) for chain k=5, dynamic (depth 8, top-k 10, budget 60), static
      trees, a sampled dynamic tree, a sampled chain k=5 and a sampled static tree (T=0.7, top-p 0.9, top-k 50,
      seeded; the static tree also at T=1: children drawn without replacement over noise drawn before the
      replay, pruned outside q's support after it) with three proposers: the eager Proposer, per-step draft
      graphs (tree_graphs=False) and the whole-tree graph: trees of each pair (tokens/parents identical share,
      max |logq| diff, max |q| diff for sampled chains and static trees), emitted sequences identical, whether
      the tree graph was captured (and any capture warning);
2. cost, bf16: ms per drafter step (CUDA events, median) eager KVCache vs static eager vs graph, each static
   one with the drafter's own forward and with draft/fused.py's step (fused_*: the default on CUDA), and
   ms per propose() round (synchronized wall time, median over real rounds) eager vs per-step graphs vs
   whole-tree graph (both with the default, fused step) vs the whole-tree graph over the drafter's own forward
   (tree_module), plus the tree graph's own ms (staging + replay + output copies).

    PYTHONPATH=src python bench/draft_check.py [--draft DIR] [--json OUT] [--device cuda] [--prompts 2]
        [--max-new-tokens 64] [--kinds chain,dynamic,...] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from eaglespec.api import EagleSpec, tree_spec
from eaglespec.draft.fast import StaticDraftRunner, enable_draft_graphs
from eaglespec.draft.fused import unfusable_reason
from eaglespec.draft.proposer import EagerRows
from eaglespec.draft.tree_graph import TreeGraph
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.backends.fast import FastTarget

# (tree, k, sampling): dynamic trees take the whole-tree graph at T > 0 too (children by top-k, no RNG), and so
# do sampled chains and sampled static trees (their Exp(1) race noise drawn before the replay; a static tree's
# children outside q's support pruned after it)
T07 = SamplingConfig(SamplingParams(0.7, top_p=0.9, top_k=50), seed=0)
T1 = SamplingConfig(SamplingParams(1.0), seed=0)
SPECS = {"chain": ("chain", 5, None), "dynamic": ("dynamic", None, None), "static": ("static", None, None),
         "dynamic_t07": ("dynamic", None, T07), "chain_t07": ("chain", 5, T07), "static_t07": ("static", None, T07),
         "static_t1": ("static", None, T1)}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step_check(drafter, dev: torch.device, graphs: bool) -> dict:
    """Graph replay vs the eager static step on identical inputs, plus per-step timings."""
    h = drafter.cfg.hidden_size
    gen = torch.Generator().manual_seed(0)
    n0 = 300
    feats_state = torch.randn(n0, h, generator=gen).to(dev, next(drafter.parameters()).dtype)
    toks0 = torch.randint(100, 40000, (n0,), generator=gen).to(dev)
    fusable = unfusable_reason(drafter) is None
    runners = {"eager_kvcache": EagerRows(drafter),
               "static_eager": StaticDraftRunner(drafter, max_len=1024, cuda_graphs=False, fused=False)}
    if fusable:
        runners["fused_eager"] = StaticDraftRunner(drafter, max_len=1024, cuda_graphs=False, fused=True)
    if graphs:
        runners["static_graph"] = StaticDraftRunner(drafter, max_len=1024, cuda_graphs=True, fused=False)
        if fusable:
            runners["fused_graph"] = StaticDraftRunner(drafter, max_len=1024, cuda_graphs=True, fused=True)
    for r in runners.values():
        r.run(feats_state, toks0, torch.arange(n0, device=dev))
    out: dict = {}
    for n in (1, 10):  # 10 rows = a dynamic tree layer of width 10 (bucket 16)
        state = torch.randn(n, h, generator=gen).to(dev, feats_state.dtype)
        toks = torch.randint(100, 40000, (n,), generator=gen).to(dev)
        pos = torch.full((n,), n0, device=dev)
        vis = torch.cat([torch.ones(n, n0, dtype=torch.bool), torch.eye(n, dtype=torch.bool)], 1).to(dev)
        res = {}
        for name, r in runners.items():
            times = []
            for _ in range(25):
                s, e = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
                    if dev.type == "cuda" else (None, None)
                t0 = time.perf_counter()
                if s is not None:
                    s.record()
                logits, st = r.run(state, toks, pos, vis)
                if e is not None:
                    e.record()
                _sync(dev)
                times.append(s.elapsed_time(e) if s is not None else 1e3 * (time.perf_counter() - t0))
                r.crop(n0)
            res[name] = (logits.float(), st.float())
            out[f"step_ms/{name}/{n}"] = round(statistics.median(times[5:]), 4)
        ref_l, ref_s = res["static_eager"]
        for name in runners:
            if name != "static_eager":
                out[f"max_abs_vs_static_eager/{name}/{n}"] = max((res[name][0] - ref_l).abs().max().item(),
                                                                 (res[name][1] - ref_s).abs().max().item())
    return out


# EagerRows; StaticDraftRunner per-step graphs; + whole-tree graph (both: the default step, fused on CUDA);
# the whole-tree graph over the drafter's own forward
ENGINES = ("eager", "steps", "tree", "tree_module")


def _compare(trees_a: list, trees_b: list) -> dict:
    """Trees of two engines round by round, up to where their sequences diverge."""
    same, logq_diff, q_diff, compared = 0, 0.0, 0.0, 0
    for a, b in zip(trees_a, trees_b):
        if a.tokens.shape != b.tokens.shape:
            break  # the sequences diverged (counted separately)
        compared += 1
        same += bool(torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents))
        logq_diff = max(logq_diff, (a.logq.float() - b.logq.float()).abs().max().item())
        if a.draft_probs is not None and b.draft_probs is not None:  # sampled chains / static trees: the recorded q
            q_diff = max(q_diff, (a.draft_probs.float() - b.draft_probs.float()).abs().max().item())
    return {"rounds_compared": compared, "trees_identical": same, "max_abs_logq": logq_diff, "max_abs_q": q_diff}


def engine_check(es: EagleSpec, prompts: list[list[int]], max_new: int, graphs: bool,
                 kinds: tuple[str, ...] = tuple(SPECS)) -> dict:
    """The eager Proposer vs the per-step draft graphs vs the whole-tree graph (draft/tree_graph.py) over
    whole generations on the fast backend: trees, emitted sequences, propose() ms and the tree graph's own
    ms (TreeGraph.run: staging, one replay, output copies, the dynamic tree's one flag read)."""
    dev = es.model.device
    out: dict = {}
    for kind in kinds:
        tree, k, sampling = SPECS[kind]
        spec = tree_spec(tree, k)
        target = FastTarget(es.model, tuple(es.drafter.feature_layer_ids), max_len=2048)
        engines = {name: SpeculativeEngine(target, es.drafter, spec) for name in ENGINES}
        runners = {name: enable_draft_graphs(engines[name], max_len=2048, cuda_graphs=graphs,
                                             tree_graphs=name.startswith("tree"),
                                             fused=False if name == "tree_module" else None) for name in ENGINES[1:]}
        trees: dict[str, list] = {name: [] for name in engines}
        round_ms: dict[str, list] = {name: [] for name in engines}
        tree_ms: list[float] = []
        tokens: dict[str, list] = {name: [] for name in engines}
        run_tree = TreeGraph.run

        def timed_tree(self, *a, _ms=tree_ms, _run=run_tree):
            _sync(dev)
            t0 = time.perf_counter()
            tr = _run(self, *a)
            _sync(dev)
            _ms.append(1e3 * (time.perf_counter() - t0))
            return tr

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            TreeGraph.run = timed_tree
            try:
                for name, eng in engines.items():
                    orig = eng.proposer.propose

                    def timed(*a, _orig=orig, _name=name, _ms=round_ms, _trees=trees):
                        _sync(dev)
                        t0 = time.perf_counter()
                        tr = _orig(*a)
                        _sync(dev)
                        _ms[_name].append(1e3 * (time.perf_counter() - t0))
                        _trees[_name].append(tr)
                        return tr

                    eng.proposer.propose = timed
                    eng.generate(prompts[0], 32, es.eos_ids(), sampling=sampling)  # warm-up: captures the graphs
                    trees[name].clear()
                    round_ms[name].clear()
                    tree_ms.clear()
                    for p in prompts:
                        tokens[name].append(eng.generate(p, max_new, es.eos_ids(), sampling=sampling).token_ids)
            finally:
                TreeGraph.run = run_tree
        graphs_built = list(runners["tree"].trees.values())
        out[kind] = {
            "steps_vs_eager": _compare(trees["eager"], trees["steps"]),
            "tree_vs_eager": _compare(trees["eager"], trees["tree"]),
            "tree_vs_steps": _compare(trees["steps"], trees["tree"]),
            "tree_module_vs_eager": _compare(trees["eager"], trees["tree_module"]),
            "fused": not isinstance(runners["tree"].forward, torch.nn.Module),
            "sequences_identical": {f"{n}_vs_eager": sum(x == y for x, y in zip(tokens["eager"], tokens[n]))
                                    for n in ENGINES[1:]},
            "sequences": len(prompts),
            "tree_graph": {"built": len(graphs_built), "failed": sum(g.failed for g in graphs_built),
                           "runs": len(tree_ms), "captured": sum(len(g.graphs) for g in graphs_built),  # one per (tree, span)
                           "spans": sorted({s for g in graphs_built for s in g.graphs}),
                           "warnings": [str(w.message) for w in caught]},
            "propose_ms_median": {n: round(statistics.median(v), 3) for n, v in round_ms.items() if v},
            "tree_graph_run_ms_median": round(statistics.median(tree_ms), 3) if tree_ms else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kinds", default=",".join(SPECS), help=f"engine checks to run, of {', '.join(SPECS)}")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    a = ap.parse_args()
    kinds = tuple(k for k in a.kinds.split(",") if k)
    unknown = [k for k in kinds if k not in SPECS]
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; choose from {', '.join(SPECS)}")
    dev = torch.device(a.device)
    graphs = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report: dict = {"device": torch.cuda.get_device_name() if graphs else "cpu", "torch": torch.__version__,
                    "cuda_graphs": graphs}
    for dtype in a.dtypes.split(","):
        es = EagleSpec.from_pretrained(None, a.draft, device=a.device, dtype=dtype, backend="hf")
        report["draft"] = es.draft_note
        prompts = [es.encode(f"Write a short story about a {w} and explain the moral.")
                   for w in ("robot", "river", "teacher", "lighthouse", "fox", "clock")[: a.prompts]]
        with torch.no_grad():
            report[dtype] = {"step": step_check(es.drafter, dev, graphs),
                             "engine": engine_check(es, prompts, a.max_new_tokens, graphs, kinds)}
        del es
        print(json.dumps(report[dtype], indent=1), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
