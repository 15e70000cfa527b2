"""Convert a MarianMT (opus-mt) checkpoint folder to a vaswani checkpoint folder, or back with --to-marian.

    python scripts/convert_marian.py opus-mt-en-de opus-mt-en-de-vaswani
    python scripts/convert_marian.py opus-mt-en-de-vaswani opus-mt-en-de-again --to-marian

The weights give the same logits (fp32, ~1e-6 relative); the generation settings and Marian's tokenizer go along.
What the other side cannot represent (separate decoder vocabulary, pre-LN, interleaved positions, ...) is refused.
"""

import argparse
import sys

from vaswani.training.convert_marian import ConversionError, marian_to_vaswani, vaswani_to_marian


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src_dir", metavar="SRC_DIR", help="checkpoint folder to read")
    parser.add_argument("dst_dir", metavar="DST_DIR", help="new (or empty) folder to write")
    parser.add_argument("--to-marian", action="store_true", help="read a vaswani folder, write a MarianMT folder")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    convert = vaswani_to_marian if args.to_marian else marian_to_vaswani
    try:
        dst = convert(args.src_dir, args.dst_dir)
    except ConversionError as error:
        print(f"convert_marian: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
