"""`python scripts/train_tokenizer.py ARGS` is `vaswani-train-tokenizer ARGS` (in vaswani.tokenizer)."""

import sys

from vaswani.tokenizer.train_vaswani_tokenizer import main

if __name__ == "__main__":
    sys.exit(main())
