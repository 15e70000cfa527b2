"""`python scripts/plot_attention.py ARGS` is `vaswani-plot-attention ARGS` (vaswani.training.attention_plots)."""

import sys

from vaswani.training.attention_plots import main

if __name__ == "__main__":
    sys.exit(main())
