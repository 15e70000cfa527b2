"""`python scripts/convert_marian.py ARGS` is `vaswani-convert-marian ARGS` (vaswani.training.convert_marian)."""

import sys

from vaswani.training.convert_marian import main

if __name__ == "__main__":
    sys.exit(main())
