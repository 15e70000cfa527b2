"""`vaswani-pseudo-label`: new G2P training words, pronounced by an ensemble of trained models.

Distillation hands a student what its teachers know only on words they did not train on: on their own training
words their targets are the labels again (docs/recipes.md measures both). This command makes such words: words one
edit away from the shipped training words (a letter changed, inserted or deleted, letters drawn as often as they
occur there), none of them a CMUdict word and every one on the training side of the dev rule, so the dev set stays
the same 5,356 words. The teachers pronounce them together (greedy search on their mean log-probabilities), and the
command writes the shipped training file followed by them, for `vaswani-train --task g2p --train_file FILE
--teachers ...`. `python scripts/pseudo_label.py` is the same command; `scripts/distill_job.sh` runs it between the
teachers and the student.

    vaswani-pseudo-label --words 80000 --output outputs/kd/train_plus.tsv --teachers outputs/kd/teacher-1500 ...
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch


@torch.no_grad()
def ensemble_greedy(models: Sequence, tokenizer, sources: Sequence[str], batch_size: int = 512,
                    max_new_tokens: int = 27) -> list[str | None]:
    """Greedy search with the models' mean log-probabilities at each step, batched by length, each model decoding
    one token a step from its own cache; one string per source (None where the search did not end within
    `max_new_tokens`). One model gives its own greedy search."""
    encoded = [tokenizer(s)["input_ids"] for s in sources]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    start = models[0].config.decoder_start_token_id
    outputs: list[str | None] = [None] * len(sources)
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        width = max(len(encoded[i]) for i in rows)
        input_ids = torch.full((len(rows), width), pad)
        mask = torch.zeros_like(input_ids)
        for r, i in enumerate(rows):
            input_ids[r, :len(encoded[i])] = torch.tensor(encoded[i])
            mask[r, :len(encoded[i])] = 1
        encoder_outputs = [m.get_encoder()(input_ids=input_ids, attention_mask=mask) for m in models]
        caches = [None] * len(models)
        tokens = torch.full((len(rows), 1), start)
        done = torch.zeros(len(rows), dtype=torch.bool)
        for _ in range(max_new_tokens):
            log_probs = 0
            for j, (model, encoded_rows) in enumerate(zip(models, encoder_outputs)):
                output = model(encoder_outputs=encoded_rows, attention_mask=mask, decoder_input_ids=tokens[:, -1:],
                               cache=caches[j], use_cache=True)
                caches[j] = output.cache
                log_probs = log_probs + torch.log_softmax(output.logits[:, -1].float(), -1)
            step = log_probs.argmax(-1).masked_fill(done, pad)
            tokens = torch.cat([tokens, step[:, None]], 1)
            done |= step == eos
            if done.all():
                break
        for r, i in enumerate(rows):
            if done[r]:
                outputs[i] = tokenizer.decode(tokens[r, 1:].tolist(), skip_special_tokens=True)
    return outputs


def neighbour_words(count: int, seed: int = 0) -> list[str]:
    """`count` words one edit away from the shipped training words (letters drawn as often as they occur there),
    none of them a CMUdict word and every one on the training side of the dev rule; sorted."""
    from .data import default_g2p_file, is_dev_word, load_g2p, read_g2p

    lexicon = read_g2p(default_g2p_file())
    words = sorted({w for w, _ in load_g2p().train})
    letters = "".join(w for w in words if w.isalpha())
    rng = random.Random(seed)
    found: set[str] = set()
    while len(found) < count:
        word = rng.choice(words)
        if not word.isalpha() or len(word) < 3:
            continue
        i, letter, edit = rng.randrange(len(word)), rng.choice(letters), rng.random()
        if edit < 0.6:
            new = word[:i] + letter + word[i + 1:]
        elif edit < 0.8:
            new = word[:i] + letter + word[i:]
        else:
            new = word[:i] + word[i + 1:]
        if new not in lexicon and not is_dev_word(new):
            found.add(new)
    return sorted(found)


def write_pseudo_labelled(count: int, output: str | os.PathLike, teachers: Sequence[str], seed: int = 0,
                          log=print) -> int:
    """Write the shipped training file followed by `count` neighbour words as `teachers` pronounce them (one
    `WORD<TAB>PHONEMES` line each; a word whose search did not end is left out) to `output`, atomically; returns
    how many were written. Raises ValueError naming a teacher that cannot be loaded or that has another tokenizer."""
    from transformers import AutoTokenizer

    from .data import default_g2p_file
    from .distillation import load_teachers

    if count < 1:
        raise ValueError(f"--words must be at least 1, got {count}")
    if not teachers:
        raise ValueError("--teachers: name at least one saved model folder")
    if not (Path(teachers[0]) / "config.json").is_file():
        raise ValueError(f"--teachers: {str(teachers[0])!r} is not a saved model folder (no config.json); pass "
                         "the --output_dir of a finished vaswani-train run")
    import vaswani  # noqa: F401  registers the Auto classes

    tokenizer = AutoTokenizer.from_pretrained(str(teachers[0]))
    models = load_teachers(teachers, tokenizer)
    start = time.perf_counter()
    words = neighbour_words(count, seed)
    pronounced = [(w, p) for w, p in zip(words, ensemble_greedy(models, tokenizer, words)) if p]
    text = default_g2p_file().read_text(encoding="utf-8")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    partial.write_text(text + "".join(f"{w}\t{p}\n" for w, p in pronounced), encoding="utf-8")
    os.replace(partial, output)
    log(f"{len(pronounced)} of {len(words)} neighbour words pronounced by {len(models)} model(s) in "
        f"{time.perf_counter() - start:.0f} s; {output}: the shipped training file and them")
    return len(pronounced)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-pseudo-label",
        description="Write the shipped CMUdict training file followed by new words one edit away from its words "
                    "(none of them in CMUdict, none on the dev side of the split), pronounced by an ensemble of "
                    "trained G2P models, for vaswani-train --task g2p --train_file FILE --teachers ...")
    parser.add_argument("--words", type=int, required=True, help="how many new words to make")
    parser.add_argument("--output", required=True, help="the training file to write (.tsv)")
    parser.add_argument("--teachers", nargs="+", required=True, metavar="MODEL_FOLDER",
                        help="saved G2P model folders sharing one tokenizer (finished vaswani-train runs)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the words drawn")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    return parser


def main(argv=None) -> int:
    """`vaswani-pseudo-label`: 0 once the file is written; bad arguments end with one line on stderr (status 2)."""
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.threads:
        torch.set_num_threads(options.threads)
    try:
        write_pseudo_labelled(options.words, options.output, options.teachers, options.seed)
    except ValueError as error:
        parser.error(str(error))
    return 0
