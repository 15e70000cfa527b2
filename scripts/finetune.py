"""`python scripts/finetune.py ARGS` is `vaswani-finetune ARGS` (vaswani.training.finetune)."""

import sys

from vaswani.training.finetune import main

if __name__ == "__main__":
    sys.exit(main())
