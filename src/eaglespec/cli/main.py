"""`eaglespec`: the command line. Builds the parser from the subcommand modules and runs the chosen one.

Exit status 0 on success; 2 on bad usage or bad input, with one line on stderr naming it.
"""

from __future__ import annotations

import argparse
import sys

from eaglespec.cli import bench, chat, convert, generate, report, serve, train
from eaglespec.cli.args import log, quiet_libraries
from eaglespec.errors import EagleSpecError

SUBCOMMANDS = (generate, chat, serve, bench, report, train, convert)  # each has add_parser(subparsers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eaglespec", description="EAGLE speculative decoding for Hugging Face causal LMs.",
        epilog="Output is quiet by default: results on stdout, a stats line and errors on stderr. -v (before the "
               "subcommand: eaglespec -v generate ...) adds the drafter in use, progress and library logs.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print the drafter in use, progress bars and info logs (before the subcommand)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    for name, p in sub.choices.items():
        p.epilog = f"Quiet by default; eaglespec -v {name} ... (-v before the subcommand) prints more."
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries(args.verbose)
    try:
        return int(args.func(args) or 0)
    except EagleSpecError as exc:
        log(f"eaglespec: error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
