"""Train the shared SentencePiece model from the user's corpus and save a VaswaniTokenizer folder; `main` is the
command line `vaswani-train-tokenizer` (also `python scripts/train_tokenizer.py`).

Subword vocabulary for translation (one sentence per line, source and target files together):
    vaswani-train-tokenizer --input train.de train.en --vocab_size 32000 --model_type unigram --output_dir tok/
Grapheme-to-phoneme (TSV `WORD<TAB>PH PH PH`): letters and phonemes in one symbol vocabulary, every source word
spelled out into letters, every phoneme one piece:
    vaswani-train-tokenizer --input words.tsv --columns 0 1 --spell_source --model_type word --vocab_size 54 \\
        --output_dir tok/
"""

import argparse
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import sentencepiece as spm

from .tokenization_vaswani import SPECIAL_TOKENS, VaswaniTokenizer, spell_out


MODEL_TYPES = ("unigram", "bpe", "char", "word")


class TokenizerTrainingError(ValueError):
    """Bad input to tokenizer training; the message is one line meant for the user."""


def read_corpus(
    inputs: Sequence[str | os.PathLike], columns: Sequence[int] | None = None, spell_source: bool = False
) -> Iterator[str]:
    """Yield training sentences from text files.

    columns=None: every line is one sentence. columns=[0, 1]: lines are tab-separated and each
    listed column of each line is one sentence (source and target share the vocabulary).
    spell_source: the first listed column (the whole line if columns is None) is spelled out
    into space-separated characters, as `VaswaniTokenizer(spell_source=True)` does when encoding.
    """
    for path in inputs:
        try:
            with open(path, encoding="utf-8") as f:
                for line_number, line in enumerate(f, 1):
                    line = line.rstrip("\r\n")
                    if not line.strip():
                        continue
                    if columns is None:
                        fields = [line]
                    else:
                        cells = line.split("\t")
                        if max(columns) >= len(cells):
                            raise TokenizerTrainingError(
                                f"{path}:{line_number}: has {len(cells)} tab-separated column(s), "
                                f"column {max(columns)} was asked for (columns are counted from 0)"
                            )
                        fields = [cells[c] for c in columns]
                    if spell_source:
                        fields[0] = spell_out(fields[0])
                    yield from (field for field in fields if field.strip())
        except OSError as error:
            raise TokenizerTrainingError(f"cannot read input file {os.fspath(path)!r}: {error.strerror}") from None
        except UnicodeDecodeError as error:
            raise TokenizerTrainingError(f"{os.fspath(path)!r} is not UTF-8 text ({error.reason})") from None


def train_tokenizer(
    inputs: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    *,
    columns: Sequence[int] | None = None,
    spell_source: bool = False,
    character_coverage: float | None = None,
    byte_fallback: bool | None = None,
    user_defined_symbols: Iterable[str] = (),
    normalization: str = "identity",
    seed: int = 0,
    num_threads: int = 1,
) -> VaswaniTokenizer:
    """Train one piece model on `inputs` and save a loadable tokenizer folder to `output_dir`.

    model_type: "unigram" or "bpe" (subwords), "word" (every whitespace-separated symbol is one
    piece) or "char" (every character is one piece).
    Defaults chosen so that decode(encode(text)) == text:
    - unigram/bpe: byte_fallback=True (characters outside the vocabulary become UTF-8 byte pieces
      instead of <unk>; costs 256 ids) and character_coverage=0.9995;
    - word/char: byte_fallback=False and character_coverage=1.0 (every character of the corpus
      is kept; anything unseen encodes to <unk>), runs of spaces collapsed for "word".
    normalization: a SentencePiece rule; "identity" keeps text as written, "nmt_nfkc" is the
    usual choice for MT but changes e.g. full-width characters, so round trips are not exact.
    Same corpus and arguments (num_threads included) give a byte-identical model: every sentence
    is used (no sampling) and the seed is fixed; 1 thread and 2 threads give different models.
    Raises TokenizerTrainingError for unreadable or empty input, for a vocabulary size the
    corpus cannot fill (the message says the largest that works) and for one too small for the
    characters and reserved pieces (the message says the smallest, with and without byte fallback).
    """
    if model_type not in MODEL_TYPES:
        raise TokenizerTrainingError(f"model_type must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}")
    if not inputs:
        raise TokenizerTrainingError("no input files given")
    if columns is not None and (not columns or min(columns) < 0):
        raise TokenizerTrainingError(f"columns must be a non-empty list of indices >= 0, got {list(columns)}")
    subword = model_type in ("unigram", "bpe")
    if byte_fallback is None:
        byte_fallback = subword
    if character_coverage is None:
        character_coverage = 0.9995 if subword else 1.0
    user_defined_symbols = list(user_defined_symbols)
    clash = set(user_defined_symbols) & set(SPECIAL_TOKENS)
    if clash:
        raise TokenizerTrainingError(f"user_defined_symbols may not contain special tokens: {sorted(clash)}")
    sentences = list(read_corpus(inputs, columns, spell_source))
    if not sentences:
        raise TokenizerTrainingError(f"the corpus is empty: no non-blank lines in {', '.join(map(str, inputs))}")
    _check_room(vocab_size, model_type, byte_fallback, user_defined_symbols)

    model = _train_piece_model(sentences, model_type, vocab_size, character_coverage=character_coverage,
                               byte_fallback=byte_fallback, user_defined_symbols=user_defined_symbols,
                               normalization=normalization, seed=seed, num_threads=num_threads)
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_file = os.path.join(tmp, VaswaniTokenizer.vocab_files_names["vocab_file"])
        with open(model_file, "wb") as f:
            f.write(model)
        tokenizer = VaswaniTokenizer(vocab_file=model_file, spell_source=spell_source)
        tokenizer.save_pretrained(output_dir)
    return VaswaniTokenizer.from_pretrained(output_dir)


def _check_room(vocab_size: int, model_type: str, byte_fallback: bool, user_defined_symbols: list[str]) -> None:
    """Raises TokenizerTrainingError when the reserved ids leave no room for learned pieces (word/char models; for
    unigram/bpe SentencePiece also counts the characters it must keep, and `_too_small` names the smallest size)."""
    reserved = len(SPECIAL_TOKENS) + len(user_defined_symbols) + (256 if byte_fallback else 0)
    if model_type in ("unigram", "bpe") or vocab_size > reserved:
        return
    raise TokenizerTrainingError(
        f"vocab_size={vocab_size} leaves no room for pieces: {len(SPECIAL_TOKENS)} special tokens"
        + (", 256 byte-fallback pieces" if byte_fallback else "")
        + (f", {len(user_defined_symbols)} user-defined symbols" if user_defined_symbols else "")
        + f" already take {reserved} ids; pass --vocab_size {reserved + 1} or more"
        + (f", or --no-byte_fallback (then {reserved - 255} or more)" if byte_fallback else "")
    )


def _train_piece_model(sentences: list[str], model_type: str, vocab_size: int, *, character_coverage: float,
                       byte_fallback: bool, user_defined_symbols: list[str], normalization: str, seed: int,
                       num_threads: int) -> bytes:
    """The serialized SentencePiece model of `sentences`, with our special tokens at their fixed ids."""
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            model_type=model_type,
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            user_defined_symbols=user_defined_symbols,
            normalization_rule_name=normalization,
            remove_extra_whitespaces=model_type == "word",
            pad_id=SPECIAL_TOKENS["<pad>"],
            unk_id=SPECIAL_TOKENS["<unk>"],
            bos_id=SPECIAL_TOKENS["<s>"],
            eos_id=SPECIAL_TOKENS["</s>"],
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            input_sentence_size=0,  # use every sentence: sampling would make the model depend on the seed
            shuffle_input_sentence=False,
            max_sentence_length=1 << 16,  # bytes; longer lines are skipped
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as error:
        raise TokenizerTrainingError(_explain_sentencepiece_error(str(error), vocab_size, model_type, byte_fallback,
                                                                  len(user_defined_symbols))) from None
    trained = spm.SentencePieceProcessor(model_proto=model.getvalue()).get_piece_size()
    if trained != vocab_size:  # the char model stops at the corpus' alphabet instead of failing
        raise TokenizerTrainingError(_too_high(vocab_size, model_type, trained))
    return model.getvalue()


def _explain_sentencepiece_error(message: str, vocab_size: int, model_type: str, byte_fallback: bool,
                                 num_user_symbols: int) -> str:
    too_high = re.search(r"Vocabulary size (?:is )?too high \((\d+)\)\. Please set it to a value <= (\d+)", message)
    if too_high:
        return _too_high(vocab_size, model_type, int(too_high.group(2)))
    too_low = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", message)
    if too_low:
        return _too_small(vocab_size, int(too_low.group(2)), byte_fallback, num_user_symbols)
    # "INTERNAL: src/trainer_interface.cc(123) [check] message": keep the message
    first_line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return "sentencepiece training failed: " + re.sub(r"^.*?\)\s*(\[.*?\]\s*)?", "", first_line)


def _too_small(vocab_size: int, smallest: int, byte_fallback: bool, num_user_symbols: int) -> str:
    """SentencePiece's smallest size is exact: every character kept (character_coverage) plus the reserved pieces,
    so without the 256 byte pieces it is 256 less."""
    reserved = len(SPECIAL_TOKENS) + num_user_symbols + (256 if byte_fallback else 0)
    parts = f"{len(SPECIAL_TOKENS)} special tokens" + (", 256 byte-fallback pieces" if byte_fallback else "") + (
        f", {num_user_symbols} user-defined symbols" if num_user_symbols else "")
    return (f"vocab_size={vocab_size} is too small: {parts} and the {smallest - reserved} characters kept "
            f"(character_coverage) need at least {smallest}; pass --vocab_size {smallest} or more"
            + (f", or --no-byte_fallback (then {smallest - 256} or more: unseen characters become <unk>)"
               if byte_fallback else "")
            + ", or lower --character_coverage")


def _too_high(vocab_size: int, model_type: str, largest: int) -> str:
    return (
        f"vocab_size={vocab_size} is more than this corpus can fill with model_type={model_type}: "
        f"the largest it can fill is {largest}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-train-tokenizer", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train the shared SentencePiece tokenizer on a corpus and save it as a loadable folder.",
        epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--input", nargs="+", required=True, metavar="FILE", help="UTF-8 text or TSV files")
    parser.add_argument("--output_dir", required=True, help="folder for spm.model and tokenizer_config.json")
    parser.add_argument("--vocab_size", type=int, required=True, help="pieces, special tokens included")
    parser.add_argument("--model_type", choices=MODEL_TYPES, default="unigram")
    parser.add_argument("--columns", type=int, nargs="+", default=None, metavar="N",
                        help="read tab-separated columns N... (from 0) of each line as separate sentences; the first "
                             "is the source")
    parser.add_argument("--tsv", action="store_true", help="same as --columns 0 1")
    parser.add_argument("--spell_source", action="store_true",
                        help="spell the source (first column) out into characters, here and whenever the tokenizer "
                             "encodes a source")
    parser.add_argument("--character_coverage", type=float, default=None,
                        help="share of characters kept (default 0.9995 for unigram/bpe, 1.0 for char/word)")
    parser.add_argument("--byte_fallback", action=argparse.BooleanOptionalAction, default=None,
                        help="encode unknown characters as UTF-8 bytes (default on for unigram/bpe, off for char/word)")
    parser.add_argument("--user_defined_symbols", nargs="+", default=[], metavar="SYMBOL",
                        help="strings always kept as single pieces")
    parser.add_argument("--normalization", default="identity",
                        help="SentencePiece normalization rule: identity (exact round trips) or nmt_nfkc")
    parser.add_argument("--seed", type=int, default=0, help="the SentencePiece trainer's seed")
    parser.add_argument("--num_threads", type=int, default=1,
                        help="more is faster; the model is reproducible for a given thread count")
    return parser


def main(argv=None) -> int:
    """`vaswani-train-tokenizer`: a bad input ends with one line `error: ...` on stderr (exit status 1)."""
    args = build_parser().parse_args(argv)
    columns = args.columns if args.columns is not None else ([0, 1] if args.tsv else None)
    try:
        tokenizer = train_tokenizer(
            args.input, args.output_dir, args.vocab_size, args.model_type, columns=columns,
            spell_source=args.spell_source, character_coverage=args.character_coverage,
            byte_fallback=args.byte_fallback, user_defined_symbols=args.user_defined_symbols,
            normalization=args.normalization, seed=args.seed, num_threads=args.num_threads)
    except TokenizerTrainingError as error:
        sys.exit(f"error: {error}")
    print(f"saved a {args.model_type} tokenizer with {len(tokenizer)} pieces to {args.output_dir}")
    return 0
