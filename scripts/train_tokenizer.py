"""Train the shared SentencePiece tokenizer on a corpus and save it as a loadable folder.

Subword vocabulary for translation (one sentence per line, source and target files together):
    python scripts/train_tokenizer.py --input train.de train.en --vocab_size 32000 \
        --model_type unigram --output_dir tok/
Grapheme-to-phoneme (TSV `WORD<TAB>PH PH PH`): letters and phonemes in one symbol vocabulary,
every source word spelled out into letters, every phoneme one piece:
    python scripts/train_tokenizer.py --input data/cmudict-g2p/g014b2b.train.tsv --columns 0 1 \
        --spell_source --model_type word --vocab_size 54 --output_dir tok/
"""

import argparse
import sys

from vaswani.tokenizer import MODEL_TYPES, TokenizerTrainingError, train_tokenizer


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", nargs="+", required=True, metavar="FILE", help="UTF-8 text or TSV files")
    parser.add_argument("--output_dir", required=True, help="folder for spm.model and tokenizer_config.json")
    parser.add_argument("--vocab_size", type=int, required=True, help="pieces, special tokens included")
    parser.add_argument("--model_type", choices=MODEL_TYPES, default="unigram")
    parser.add_argument(
        "--columns", type=int, nargs="+", default=None, metavar="N",
        help="read tab-separated columns N... (from 0) of each line as separate sentences; the first is the source",
    )
    parser.add_argument("--tsv", action="store_true", help="same as --columns 0 1")
    parser.add_argument(
        "--spell_source", action="store_true",
        help="spell the source (first column) out into characters, here and whenever the tokenizer encodes a source",
    )
    parser.add_argument(
        "--character_coverage", type=float, default=None,
        help="share of characters kept (default 0.9995 for unigram/bpe, 1.0 for char/word)",
    )
    parser.add_argument(
        "--byte_fallback", action=argparse.BooleanOptionalAction, default=None,
        help="encode unknown characters as UTF-8 bytes (default on for unigram/bpe, off for char/word)",
    )
    parser.add_argument("--user_defined_symbols", nargs="+", default=[], metavar="SYMBOL",
                        help="strings always kept as single pieces")
    parser.add_argument("--normalization", default="identity",
                        help="SentencePiece normalization rule: identity (exact round trips) or nmt_nfkc")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_threads", type=int, default=1, help="more is faster; the model is reproducible for a given thread count")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    columns = args.columns if args.columns is not None else ([0, 1] if args.tsv else None)
    try:
        tokenizer = train_tokenizer(
            args.input,
            args.output_dir,
            args.vocab_size,
            args.model_type,
            columns=columns,
            spell_source=args.spell_source,
            character_coverage=args.character_coverage,
            byte_fallback=args.byte_fallback,
            user_defined_symbols=args.user_defined_symbols,
            normalization=args.normalization,
            seed=args.seed,
            num_threads=args.num_threads,
        )
    except TokenizerTrainingError as error:
        sys.exit(f"error: {error}")
    print(f"saved a {args.model_type} tokenizer with {len(tokenizer)} pieces to {args.output_dir}")


if __name__ == "__main__":
    main()
