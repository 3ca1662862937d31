"""``python -m replicron._demo``: the same as ``replicron demo``."""

import sys

from replicron.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
