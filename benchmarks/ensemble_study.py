"""What an ensemble of G2P models knows, and how much of it distillation can hand to one model (docs/recipes.md,
sixteenth session).

    python benchmarks/ensemble_study.py score outputs/g2p outputs/g2p-b outputs/g2p-c
        greedy decoding of the dev set with the models' mean log-probabilities at each step; WER/PER as the loop
        scores them (one model: its own greedy figures)
    python benchmarks/ensemble_study.py confidence outputs/g2p outputs/g2p-b outputs/g2p-c
        under teacher forcing, the models' mean distribution on training words and on dev words: the mean
        probability of the reference token, how often it is the most likely one, and the entropy. A distribution that
        gives the training words' references nearly everything is the labels again, and teaches a student nothing more
    python benchmarks/ensemble_study.py neighbours 60000 outputs/train_plus.tsv outputs/g2p outputs/g2p-b
        words one edit away from training words (a letter changed, inserted or deleted), none of them in CMUdict and
        every one on the training side of the dev rule, pronounced by the ensemble (greedy); writes the shipped
        training file followed by them, for `vaswani-train --task g2p --train_file` (the dev set stays the same)

Every model must share one tokenizer (the first model's is used). The dev set is the loop's (`tasks.load_task_data`).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load(paths: list[str]):
    """The models of `paths` (float32, eval) and the first one's tokenizer."""
    from transformers import AutoTokenizer

    from vaswani.training.distillation import load_teachers

    tokenizer = AutoTokenizer.from_pretrained(paths[0])
    return load_teachers(paths, tokenizer), tokenizer


@torch.no_grad()
def ensemble_greedy(models, tokenizer, sources: list[str], batch_size: int = 512, max_new_tokens: int = 27) -> list:
    """Greedy search with the models' mean log-probabilities at each step, batched by length; one string per source
    (None where the search did not end within `max_new_tokens`)."""
    encoded = [tokenizer(s)["input_ids"] for s in sources]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    start = models[0].config.decoder_start_token_id
    outputs: list = [None] * len(sources)
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        width = max(len(encoded[i]) for i in rows)
        input_ids = torch.full((len(rows), width), pad)
        mask = torch.zeros_like(input_ids)
        for r, i in enumerate(rows):
            input_ids[r, :len(encoded[i])] = torch.tensor(encoded[i])
            mask[r, :len(encoded[i])] = 1
        encoder_outputs = [m.get_encoder()(input_ids=input_ids, attention_mask=mask) for m in models]
        tokens = torch.full((len(rows), 1), start)
        done = torch.zeros(len(rows), dtype=torch.bool)
        for _ in range(max_new_tokens):
            log_probs = sum(torch.log_softmax(m(encoder_outputs=e, attention_mask=mask, decoder_input_ids=tokens)
                                              .logits[:, -1].float(), -1) for m, e in zip(models, encoder_outputs))
            step = log_probs.argmax(-1).masked_fill(done, pad)
            tokens = torch.cat([tokens, step[:, None]], 1)
            done |= step == eos
            if done.all():
                break
        for r, i in enumerate(rows):
            if done[r]:
                outputs[i] = tokenizer.decode(tokens[r, 1:].tolist(), skip_special_tokens=True)
    return outputs


def score(paths: list[str]) -> dict:
    from vaswani.training.evaluation import score as task_score
    from vaswani.training.tasks import load_task_data

    models, tokenizer = load(paths)
    data = load_task_data("g2p")
    start = time.perf_counter()
    predictions = ensemble_greedy(models, tokenizer, data.dev_sources)
    figures = task_score("g2p", [p or "" for p in predictions], data.dev_references)
    print(f"{len(models)} model(s) {' '.join(paths)}: dev WER {figures['wer']:.2f} % PER {figures['per']:.2f} % "
          f"(greedy, {len(predictions)} words, {time.perf_counter() - start:.1f} s)")
    return figures


@torch.no_grad()
def confidence(paths: list[str], words: int = 5000) -> dict:
    from vaswani.training.batching import Seq2SeqCollator
    from vaswani.training.distillation import teacher_distribution
    from vaswani.training.tasks import encode_pairs, load_task_data

    models, tokenizer = load(paths)
    data = load_task_data("g2p")
    collate = Seq2SeqCollator(tokenizer.pad_token_id)
    result = {}
    for side, pairs in (("train", data.train_pairs[::20][:words]), ("dev", data.dev_pairs[:words])):
        examples = encode_pairs(tokenizer, pairs)
        reference, top, entropy, tokens = 0.0, 0, 0.0, 0
        for first in range(0, len(examples), 256):
            batch = collate(examples[first:first + 256])
            probs = teacher_distribution(models, batch)
            labels = batch["labels"]
            real = labels != -100
            reference += probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0][real].sum().item()
            top += (probs.argmax(-1) == labels)[real].sum().item()
            entropy += (-(probs * probs.clamp(min=1e-12).log()).sum(-1))[real].sum().item()
            tokens += int(real.sum())
        result[side] = {"p_reference": reference / tokens, "top1": top / tokens, "entropy": entropy / tokens,
                        "tokens": tokens}
        print(f"{side}: mean p(reference) {reference / tokens:.3f}, reference most likely {top / tokens:.3f}, "
              f"entropy {entropy / tokens:.3f} nats ({tokens} target tokens)")
    return result


def neighbour_words(count: int, seed: int = 0) -> list[str]:
    """`count` words one edit away from the shipped training words (letters drawn as often as they occur there),
    none of them a CMUdict word and every one on the training side of the dev rule; sorted."""
    from vaswani.training.data import default_g2p_file, is_dev_word, load_g2p, read_g2p

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


def neighbours(count: int, output: str, paths: list[str]) -> int:
    from vaswani.training.data import default_g2p_file

    models, tokenizer = load(paths)
    start = time.perf_counter()
    words = neighbour_words(count)
    pronounced = [(w, p) for w, p in zip(words, ensemble_greedy(models, tokenizer, words)) if p]
    text = default_g2p_file().read_text(encoding="utf-8")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(text + "".join(f"{w}\t{p}\n" for w, p in pronounced), encoding="utf-8")
    print(f"{len(pronounced)} of {len(words)} neighbour words pronounced by {len(models)} model(s) in "
          f"{time.perf_counter() - start:.0f} s; {output}: the shipped training file and them")
    return len(pronounced)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("score", "confidence"):
        sub.add_parser(name).add_argument("models", nargs="+")
    n = sub.add_parser("neighbours")
    n.add_argument("count", type=int)
    n.add_argument("output")
    n.add_argument("models", nargs="+")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    if args.command == "score":
        score(args.models)
    elif args.command == "confidence":
        confidence(args.models)
    else:
        neighbours(args.count, args.output, args.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
