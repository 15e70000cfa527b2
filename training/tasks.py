"""What a training run learns and how it is scored: the task's data, its tokenizer recipe and its dev metric.

Three tasks (`SPECS` holds how each is scored):
- `g2p` (grapheme-to-phoneme): `WORD<TAB>PH PH ...` files (default: the shipped CMUdict split); the
  source is spelled out letter by letter, every phoneme is one piece; dev metric WER (lower is
  better), PER reported too. The dev set is carved by `data.load_g2p` (crc32 of the word).
- `g2p-paragraph` (a long-input task): lines of 32 to 128 words of the same split, their pronunciations joined by a
  word boundary (`vaswani.training.paragraphs`); training lines from training words, dev lines from dev words;
  the tokenizer as for g2p (the boundary is one more symbol); dev metric the word-level WER of the lines, PER and
  WER by line length reported too (`metrics.paragraph_scores`).
- `translation` (any text-to-text pairs): the user's TSV/CSV/JSONL through
  `data.load_parallel_data`; a SentencePiece unigram (or bpe/char) tokenizer; dev metric BLEU
  (higher is better), chrF reported too. Without a validation file the dev set is carved from
  the training file by the same crc32 rule applied to the source text.

In both, dev sources are unique and each carries every reference seen for it (a prediction is
right if it matches any), and an example is `{"input_ids": [...], "labels": [...]}` (eos included).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .data import DEFAULT_DEV_PERCENT, DEFAULT_G2P_FILE, FORMATS_TAKEN, is_dev_word, load_g2p, load_parallel_data
from .metrics import bleu, chrf, g2p_scores, paragraph_scores, wer_by_length
from .paragraphs import DEV_LINES, DEV_SEED, PARAGRAPH_WORDS, TRAIN_LINES, WORD_BOUNDARY, build_lines

logger = logging.getLogger(__name__)

G2P_VOCAB_SIZE = 54  # 4 specials + 50 symbols of the shipped CMUdict file (letters, ' . - and 39 phonemes)


def _g2p_metrics(predictions, references) -> dict[str, float]:
    scores = g2p_scores(predictions, references)
    return {"wer": 100 * scores.wer, "per": 100 * scores.per}


def _paragraph_metrics(predictions, references) -> dict[str, float]:
    """WER and PER of the lines, then the WER of each length bin (`wer_32_63`, ...) for the lengths compared."""
    scores = paragraph_scores(predictions, references)
    by_length = wer_by_length(predictions, references)
    return {"wer": 100 * scores.wer, "per": 100 * scores.per,
            **{f"wer_{label.replace('-', '_')}": 100 * s.wer for label, s in by_length.items()}}


def _text_metrics(predictions, references) -> dict[str, float]:
    return {"bleu": bleu(predictions, references), "chrf": chrf(predictions, references)}


@dataclass(frozen=True)
class TaskSpec:
    """How a task is scored and named: `score(predictions, references)` gives its dev figures; `metrics` are the
    ones reported everywhere, the first picks the best checkpoint; `unit` is what one dev source is;
    `spelled`: the tokenizer spells sources out and every symbol (letter, phoneme, boundary) is one piece."""

    score: Callable[[Sequence[str], Sequence[Sequence[str]]], dict[str, float]]  # (predictions, references per source)
    metrics: tuple[str, ...]
    greater_is_better: bool
    unit: str
    percent: bool  # the metrics are rates in percent (WER 12.30%), else scores (bleu 25.10)
    spelled: bool


SPECS = {
    "g2p": TaskSpec(_g2p_metrics, ("wer", "per"), greater_is_better=False, unit="words", percent=True, spelled=True),
    "g2p-paragraph": TaskSpec(_paragraph_metrics, ("wer", "per"), greater_is_better=False, unit="lines",
                              percent=True, spelled=True),
    "translation": TaskSpec(_text_metrics, ("bleu", "chrf"), greater_is_better=True, unit="sources", percent=False,
                            spelled=False),
}
TASKS = tuple(SPECS)


@dataclass
class TaskData:
    """Everything a run needs to know about its data; `metric` is the dev metric that picks the best checkpoint."""

    task: str
    train_pairs: list[tuple[str, str]]
    dev_sources: list[str]
    dev_references: list[list[str]]
    description: str  # one line for logs and the model card
    source_files: list[str] = field(default_factory=list)

    @property
    def spec(self) -> TaskSpec:
        return SPECS[self.task]

    @property
    def metric(self) -> str:
        return self.spec.metrics[0]

    @property
    def greater_is_better(self) -> bool:
        return self.spec.greater_is_better

    @property
    def dev_pairs(self) -> list[tuple[str, str]]:
        return [(s, r) for s, refs in zip(self.dev_sources, self.dev_references) for r in refs]


def _group(pairs) -> tuple[list[str], list[list[str]]]:
    grouped: dict[str, list[str]] = {}
    for source, target in pairs:
        refs = grouped.setdefault(source, [])
        if target not in refs:
            refs.append(target)
    return list(grouped), list(grouped.values())


def load_task_data(
    task: str = "g2p",
    train_file: str | None = None,
    validation_file: str | None = None,
    source_column: str = "source",
    target_column: str = "target",
    dev_percent: int = DEFAULT_DEV_PERCENT,
    *,
    paragraph_words: tuple[int, int] = PARAGRAPH_WORDS,
    paragraph_lines: tuple[int, int] = (TRAIN_LINES, DEV_LINES),
    seed: int = 0,
) -> TaskData:
    """Load the training pairs and the dev set for `task` (see the module docstring).

    g2p and g2p-paragraph: `train_file` is a `WORD<TAB>PHONEMES` file (default: the shipped CMUdict split);
    `validation_file`, if given, is another such file used whole as the dev words.
    g2p-paragraph: `paragraph_lines` (training lines, dev lines) of `paragraph_words` (min, max) words; the training
    lines are drawn with `seed`, the dev lines with a fixed seed (the same dev set for every run).
    translation: `train_file` is required (see `data.load_parallel_data` for the formats).
    """
    if task not in TASKS:
        raise ValueError(f"task={task!r} is unknown; choose one of {TASKS}")
    if task == "translation":
        return _load_translation(train_file, validation_file, source_column, target_column, dev_percent)
    data = _load_g2p(train_file, validation_file, dev_percent)
    if task == "g2p":
        return data
    return _paragraphs(data, tuple(paragraph_words), tuple(paragraph_lines), seed)


def _load_g2p(train_file, validation_file, dev_percent: int) -> TaskData:
    if validation_file:
        data = load_g2p(train_file, dev_percent=0)
        dev_sources, dev_refs = _group(load_g2p(validation_file, dev_percent=0).train)
    else:
        data = load_g2p(train_file, dev_percent=dev_percent)
        dev_sources, dev_refs = list(data.dev), list(data.dev.values())
    name = str(train_file) if train_file else "CMUdict g014b2b.train (shipped)"
    description = (f"{name}: {len(data.train)} training pairs, {len(dev_sources)} dev words "
                   f"({'from ' + str(validation_file) if validation_file else f'{dev_percent}% by crc32 of the word'})")
    files = [str(train_file) if train_file else "/".join(("vaswani.data",) + DEFAULT_G2P_FILE)]
    return TaskData("g2p", data.train, dev_sources, dev_refs, description, files)


def _paragraphs(words: TaskData, paragraph_words: tuple[int, int], paragraph_lines: tuple[int, int],
                seed: int) -> TaskData:
    """The g2p-paragraph task from the word-level data: lines of training words, and lines of dev words with
    every pronunciation (`paragraphs.build_lines`)."""
    train_count, dev_count = paragraph_lines
    train_words = dict(zip(*_group(words.train_pairs)))
    train = build_lines(train_words, train_count, paragraph_words, seed)
    dev = build_lines(dict(zip(words.dev_sources, words.dev_references)), dev_count, paragraph_words, DEV_SEED,
                      all_references=True)
    low, high = paragraph_words
    description = (f"lines of {low}-{high} words joined by '{WORD_BOUNDARY}' ({train_count} training lines from the "
                   f"{len(train_words)} training words, seed {seed}; {dev_count} dev lines from the "
                   f"{len(words.dev_sources)} dev words, seed {DEV_SEED}), from {words.description}")
    return TaskData("g2p-paragraph", [(source, refs[0]) for source, refs in train], [source for source, _ in dev],
                    [refs for _, refs in dev], description, words.source_files)


def _load_translation(train_file, validation_file, source_column: str, target_column: str,
                      dev_percent: int) -> TaskData:
    if not train_file:
        raise ValueError(f"task 'translation' needs --train_file: {FORMATS_TAKEN}")
    train = load_parallel_data(train_file, source_column, target_column)
    pairs = list(zip(train["source"], train["target"]))
    if validation_file:
        dev = load_parallel_data(validation_file, source_column, target_column)
        dev_pairs = list(zip(dev["source"], dev["target"]))
        how = f"from {validation_file}"
    else:
        dev_pairs = [p for p in pairs if is_dev_word(p[0], dev_percent)]
        pairs = [p for p in pairs if not is_dev_word(p[0], dev_percent)]
        how = f"{dev_percent}% of {train_file} by crc32 of the source"
        if not dev_pairs or not pairs:
            raise ValueError(f"{train_file} is too small to carve a dev set ({len(dev_pairs)} dev / {len(pairs)} train "
                             "rows); pass --validation_file")
    dev_sources, dev_refs = _group(dev_pairs)
    description = f"{train_file}: {len(pairs)} training pairs, {len(dev_sources)} dev sources ({how})"
    return TaskData("translation", pairs, dev_sources, dev_refs, description, [str(train_file)])


def build_tokenizer(data: TaskData, output_dir: str | os.PathLike, vocab_size: int | None = None,
                    model_type: str | None = None):
    """Train the task's tokenizer on the training pairs and save it to `output_dir`.

    g2p and g2p-paragraph: the "word" model over spelled-out sources and phoneme strings, one piece per symbol (the
    word boundary is one; vocab_size: the exact symbol count + 4 specials, found here). translation: unigram by
    default.
    """
    from vaswani.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.tsv"
        with open(corpus, "w", encoding="utf-8") as f:
            for source, target in data.train_pairs:
                f.write(f"{' '.join(source.split())}\t{' '.join(target.split())}\n")
        if data.spec.spelled:
            symbols = {ch for s, _ in data.train_pairs for ch in s if not ch.isspace()}
            symbols |= {p for _, t in data.train_pairs for p in t.split()}
            return train_tokenizer([corpus], output_dir, vocab_size=vocab_size or len(symbols) + 4,
                                   model_type=model_type or "word", columns=[0, 1], spell_source=True)
        return train_tokenizer([corpus], output_dir, vocab_size=vocab_size or 8000,
                               model_type=model_type or "unigram", columns=[0, 1])


def encode_pairs(tokenizer, pairs, batch_size: int = 4096, check: int = 2000) -> list[dict]:
    """Tokenize (source, target) pairs into `{"input_ids", "labels"}` dicts (eos appended by the tokenizer).

    The tokenizer's Python path is slow for a whole corpus, so a `VaswaniTokenizer` is run through its SentencePiece
    model directly, the way the tokenizer does (spelled-out source, eos); the first
    `check` pairs are encoded both ways and any difference falls back to the tokenizer itself.
    """
    pairs = list(pairs)
    fast = _fast_encoder(tokenizer)
    if fast is not None:
        sample = pairs[:check]
        if fast(sample) == _slow_encode(tokenizer, sample, batch_size):
            return fast(pairs)
        logger.warning("fast encoding differs from the tokenizer on the first %d pairs; using the tokenizer", len(sample))
    return _slow_encode(tokenizer, pairs, batch_size)


def _slow_encode(tokenizer, pairs, batch_size: int) -> list[dict]:
    examples = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        encoded = tokenizer([s for s, _ in chunk], text_target=[t for _, t in chunk])
        examples.extend({"input_ids": i, "labels": l} for i, l in zip(encoded["input_ids"], encoded["labels"]))
    return examples


def _fast_encoder(tokenizer):
    from vaswani.tokenizer import VaswaniTokenizer, spell_out

    if type(tokenizer) is not VaswaniTokenizer:
        return None
    sp, eos = tokenizer.sp_model, tokenizer.eos_token_id
    prepare = spell_out if tokenizer.spell_source else (lambda text: text)

    def encode(pairs):
        sources = sp.encode([prepare(s) for s, _ in pairs])
        targets = sp.encode([t for _, t in pairs])
        return [{"input_ids": s + [eos], "labels": t + [eos]} for s, t in zip(sources, targets)]

    return encode
