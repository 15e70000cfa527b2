"""`python scripts/average_checkpoints.py ARGS` is `vaswani-average ARGS` (vaswani.training.average.main)."""

import sys

from vaswani.training.average import main

if __name__ == "__main__":
    sys.exit(main())
