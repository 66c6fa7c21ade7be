"""Compile the round's Triton kernels for a GPU arch on a CPU: PTX size, barriers and shuffles per kernel.

    python bench/aot_check.py [--arch 90] [--json OUT]

eaglespec.kernels.aot.compile_round_kernels: a greedy round's argmax_keys, children and accept_path kernels
and the sampled round's sibling-test kernels, through Triton's compiler and ptxas down to a cubin
(TRITON_INTERPRET unset).
"""

from __future__ import annotations

import argparse
import json
import sys

from eaglespec.errors import EagleSpecError
from eaglespec.kernels.aot import compile_round_kernels


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100/H200)")
    ap.add_argument("--json", default=None, metavar="OUT")
    args = ap.parse_args(argv)
    try:
        rows = compile_round_kernels(args.arch)
    except EagleSpecError as e:
        raise SystemExit(f"aot_check: {e}") from None
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
