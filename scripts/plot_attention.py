"""Plot a checkpoint's attention for one input and its own (greedy) output as PNG heat maps.

    python scripts/plot_attention.py OUT TRANSFORMER --output_dir plots/
writes plots/encoder_self_attention.png, decoder_self_attention.png and cross_attention.png, each
a grid of layers (rows) x heads (columns) with the tokens on the axes, and prints their paths.
--per_layer writes one PNG per layer instead (easier to read for big models or long inputs).
"""

import argparse
import sys

import transformers

from vaswani.training.attention_plots import attention_maps, save_attention_plots
from vaswani.training.generation import CheckpointError, load_checkpoint


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a folder written by save_pretrained (model + tokenizer), or a Hub id")
    parser.add_argument("text", help="the input (for G2P: one word)")
    parser.add_argument("--output_dir", default="attention_plots", help="folder for the PNGs (created)")
    parser.add_argument("--per_layer", action="store_true", help="one PNG per kind and layer")
    parser.add_argument("--prefix", default="", help="put before every file name")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: 2 x source tokens + 10")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    transformers.logging.disable_progress_bar()
    try:
        model, tokenizer = load_checkpoint(args.checkpoint, device=args.device, attn_implementation="eager")
        maps = attention_maps(model, tokenizer, args.text, max_new_tokens=args.max_new_tokens)
    except (CheckpointError, ValueError) as error:
        sys.exit(f"error: {error}")
    paths = save_attention_plots(maps, args.output_dir, per_layer=args.per_layer, prefix=args.prefix)
    print(f"output: {maps.output_text}", file=sys.stderr)
    for path in paths:
        print(path)
    return maps, paths


if __name__ == "__main__":
    main()
