"""`python scripts/pseudo_label.py ARGS` is `vaswani-pseudo-label ARGS` (vaswani.training.pseudo_labels.main)."""

import sys

from vaswani.training.pseudo_labels import main

if __name__ == "__main__":
    sys.exit(main())
