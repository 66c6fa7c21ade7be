"""Compare training logs (train_log.jsonl, --log-every 1) of the same run on 1 and 2 GPUs (issue 8).

    python bench/ddp_compare.py --one A/train_log.jsonl --two B/train_log.jsonl [--resumed C/train_log.jsonl
        --paused-at N] [--json OUT.json]

--one: a 1-GPU run with --grad-accum 2; --two: the same flags on 2 GPUs with --grad-accum 1 (the same global batch,
so the same micro-batches per step); --resumed: the 2-GPU run's checkpoint resumed on 1 GPU (--grad-accum 2), whose
steps after the pause are compared with the 2-GPU run's own. Prints the loss and top-1 differences per window of steps
and the throughput (tokens/s over the steps after the first 10, from each step's elapsed_s) of each run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_log(path: str) -> dict[int, dict]:
    """step -> record (a resumed run's file repeats nothing: later records win)."""
    rows = [json.loads(x) for x in Path(path).read_text().split("\n") if x.strip()]
    return {r["step"]: r for r in rows}


def throughput(log: dict[int, dict], first: int, last: int) -> float | None:
    """Tokens per second over steps first+1..last (elapsed_s is measured from the start of the process's run)."""
    steps = [s for s in range(first + 1, last + 1) if s in log]
    if first not in log or not steps or "elapsed_s" not in log[first]:
        return None
    seconds = log[last]["elapsed_s"] - log[first]["elapsed_s"]
    return sum(log[s]["tokens"] for s in steps) / seconds if seconds > 0 else None


def compare(a: dict[int, dict], b: dict[int, dict], window: int) -> list[dict]:
    """Per window of common steps: mean loss of each, max |loss difference| / loss, mean |top-1 (step 0) diff|."""
    common = sorted(set(a) & set(b))
    out = []
    for i in range(0, len(common), window):
        ss = common[i:i + window]
        la, lb = [a[s]["loss"] for s in ss], [b[s]["loss"] for s in ss]
        out.append({
            "steps": f"{ss[0]}-{ss[-1]}", "loss_a": sum(la) / len(ss), "loss_b": sum(lb) / len(ss),
            "max_rel_loss_diff": max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(la, lb)),
            "mean_abs_top1_diff": sum(abs(a[s]["acc_by_step"][0] - b[s]["acc_by_step"][0]) for s in ss) / len(ss),
        })
    return out


def print_windows(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['steps']:>12} {r['loss_a']:11.4f} {r['loss_b']:12.4f} {r['max_rel_loss_diff']:13.2e} "
              f"{r['mean_abs_top1_diff']:13.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--one", required=True)
    ap.add_argument("--two", required=True)
    ap.add_argument("--resumed", default=None)
    ap.add_argument("--paused-at", type=int, default=0, help="the step at which --resumed's run was paused")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    one, two = read_log(args.one), read_log(args.two)
    report: dict = {"one_vs_two": compare(one, two, args.window)}
    n = min(max(one), args.paused_at or max(two))  # the 2-GPU run's first process only: elapsed_s restarts on resume
    report["tokens_per_s"] = {"1 GPU": throughput(one, 10, n), "2 GPUs": throughput(two, 10, n), "steps": f"11-{n}"}
    if args.resumed:
        after = {s: r for s, r in read_log(args.resumed).items() if s > args.paused_at}
        report["paused_at"] = args.paused_at
        report["resumed_vs_two"] = compare(after, two, args.window)
    print(f"{'steps':>12} {'loss 1 GPU':>11} {'loss 2 GPUs':>12} {'max rel diff':>13} {'|top-1 diff|':>13}")
    print_windows(report["one_vs_two"])
    if args.resumed:
        print(f"resumed on 1 GPU after step {report['paused_at']} vs the 2-GPU run:")
        print_windows(report["resumed_vs_two"])
    tp = dict(report["tokens_per_s"])
    print(f"tokens/s over steps {tp.pop('steps')}:", {k: (round(v) if v else None) for k, v in tp.items()},
          f"speedup {tp['2 GPUs'] / tp['1 GPU']:.2f}x" if tp["1 GPU"] and tp["2 GPUs"] else "")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
