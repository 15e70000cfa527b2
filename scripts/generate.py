"""`python scripts/generate.py ARGS` is `vaswani-generate ARGS` (vaswani.training.generation)."""

import sys

from vaswani.training.generation import main

if __name__ == "__main__":
    sys.exit(main())
