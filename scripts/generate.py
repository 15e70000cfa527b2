"""Generate with a trained checkpoint: one input per line in, one output per line out, in order.

    echo TRANSFORMER | python scripts/generate.py OUT             # G2P: prints T R AE N S F AO R M ER
    python scripts/generate.py OUT --input words.txt --num_beams 5 --batch_size 64 > phonemes.txt

Lines come from --input FILE or stdin; they are batched by length for speed and printed in input
order (a blank line prints a blank line). Greedy by default, beam search with --num_beams.
"""

import argparse
import os
import sys

import torch
import transformers

from vaswani.training.generation import CheckpointError, generate_lines, load_checkpoint


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a folder written by save_pretrained (model + tokenizer), or a Hub id")
    parser.add_argument("--input", metavar="FILE", help="UTF-8 text, one input per line (default: stdin)")
    parser.add_argument("--batch_size", type=int, default=64, help="lines per generate call")
    parser.add_argument("--num_beams", type=int, default=1, help="1: greedy; more: beam search")
    parser.add_argument("--max_new_tokens", type=int, default=None,
                        help="default: the checkpoint's generation config, else 2 x source tokens + 10")
    parser.add_argument("--max_source_length", type=int, default=None, help="truncate longer inputs (tokens)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for torch (default: all)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    transformers.logging.disable_progress_bar()  # stderr stays for errors
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.input is not None:
        try:
            with open(args.input, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            sys.exit(f"error: cannot read --input {args.input!r}: {getattr(error, 'strerror', None) or error}")
    else:
        lines = sys.stdin.read().splitlines()
    try:
        model, tokenizer = load_checkpoint(args.checkpoint, device=args.device)
        outputs = generate_lines(model, tokenizer, lines, batch_size=args.batch_size, num_beams=args.num_beams,
                                 max_new_tokens=args.max_new_tokens, max_source_length=args.max_source_length)
    except (CheckpointError, ValueError) as error:
        sys.exit(f"error: {error}")
    sys.stdout.write("".join(output + "\n" for output in outputs))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
