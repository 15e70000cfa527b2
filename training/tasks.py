"""What a training run learns and how it is scored: the task's data, its tokenizer recipe and its dev metric.

Two kinds of task:
- `g2p` (grapheme-to-phoneme): `WORD<TAB>PH PH ...` files (default: the shipped CMUdict split); the
  source is spelled out letter by letter, every phoneme is one piece; dev metric WER (lower is
  better), PER reported too. The dev set is carved by `data.load_g2p` (crc32 of the word).
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
from dataclasses import dataclass, field
from pathlib import Path

from .data import DEFAULT_DEV_PERCENT, DEFAULT_G2P_FILE, FORMATS_TAKEN, is_dev_word, load_g2p, load_parallel_data

logger = logging.getLogger(__name__)

TASKS = ("g2p", "translation")
G2P_VOCAB_SIZE = 54  # 4 specials + 50 symbols of the shipped CMUdict file (letters, ' . - and 39 phonemes)


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
    def metric(self) -> str:
        return "wer" if self.task == "g2p" else "bleu"

    @property
    def greater_is_better(self) -> bool:
        return self.task != "g2p"

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
) -> TaskData:
    """Load the training pairs and the dev set for `task` (see the module docstring).

    g2p: `train_file` is a `WORD<TAB>PHONEMES` file (default: the shipped CMUdict split);
    `validation_file`, if given, is another such file used whole as the dev set.
    translation: `train_file` is required (see `data.load_parallel_data` for the formats).
    """
    if task not in TASKS:
        raise ValueError(f"task={task!r} is unknown; choose one of {TASKS}")
    if task == "g2p":
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

    g2p: the "word" model over spelled-out sources and phoneme strings, one piece per symbol
    (vocab_size: the exact symbol count + 4 specials, found here). translation: unigram by default.
    """
    from vaswani.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.tsv"
        with open(corpus, "w", encoding="utf-8") as f:
            for source, target in data.train_pairs:
                f.write(f"{' '.join(source.split())}\t{' '.join(target.split())}\n")
        if data.task == "g2p":
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
