"""`python -m eaglespec.train ...` / `torchrun -m eaglespec.train ...` = `eaglespec train ...`."""

import sys

from eaglespec.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
