"""`python scripts/average_checkpoints.py ARGS` is `vaswani-average ARGS` (vaswani.training.cli.average_main)."""

import sys

from vaswani.training.cli import average_main

if __name__ == "__main__":
    sys.exit(average_main())
