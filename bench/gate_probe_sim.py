"""The gate's probing cost on a stream where drafting keeps losing, simulated with constant per-round costs.

Usage: python bench/gate_probe_sim.py [--root DIR] [--rounds 240 1000] [--draft-ms 3.31] [--draft-tokens 1.82]
       [--plain-ms 1.32] [--catch-up-ms 0.0 --catch-up-per-row-ms 0.0]

Drives gate.SpeculationGate (this checkout's, or DIR/src's) with a drafted round costing draft-ms for draft-tokens
tokens and a plain step plain-ms for 1 token (defaults: the H200 T=1 chain means of session 7, drafter run 5),
plus, on the first drafted round after a plain stretch, catch-up-ms + catch-up-per-row-ms * (plain steps in the
stretch). Prints drafted rounds, probes, the longest catch-up and the time vs always-plain, per stream length.
A model of the policy, not a measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=None)
    ap.add_argument("--rounds", type=int, nargs="+", default=(240, 1000, 4000))
    ap.add_argument("--draft-ms", type=float, default=3.31)
    ap.add_argument("--draft-tokens", type=float, default=1.82)
    ap.add_argument("--plain-ms", type=float, default=1.32)
    ap.add_argument("--catch-up-ms", type=float, default=0.0)
    ap.add_argument("--catch-up-per-row-ms", type=float, default=0.0)
    args = ap.parse_args()
    if args.root:
        sys.path.insert(0, str(Path(args.root) / "src"))
    from eaglespec.engine.gate import SpeculationGate

    for rounds in args.rounds:
        gate = SpeculationGate()
        drafted = probes = stretch = longest = 0
        total = tokens = 0.0
        prev = True
        for _ in range(rounds):
            d = gate.draft()
            if d:
                ms = args.draft_ms + (args.catch_up_ms + args.catch_up_per_row_ms * stretch if stretch else 0.0)
                longest, stretch = max(longest, stretch), 0
                drafted += 1
                probes += not prev
                tok = args.draft_tokens
            else:
                ms, tok = args.plain_ms, 1.0
                stretch += 1
            prev = d
            total += ms
            tokens += tok
            gate.record(d, 2 if d else 1, ms / 1e3)  # whole tokens for the gate; the mean for the totals
        plain = tokens * args.plain_ms
        print(f"{rounds:5d} rounds: {drafted:4d} drafted ({probes} probes after plain stretches, longest stretch "
              f"{longest}); {plain / total:.3f}x always-plain")


if __name__ == "__main__":
    main()
