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
        training file followed by them, for `vaswani-train --task g2p --train_file` (the dev set stays the same);
        the same as `vaswani-pseudo-label --words 60000 --output outputs/train_plus.tsv --teachers ...`

Every model must share one tokenizer (the first model's is used). The dev set is the loop's (`tasks.load_task_data`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vaswani.training.pseudo_labels import ensemble_greedy, write_pseudo_labelled  # noqa: E402


def load(paths: list[str]):
    """The models of `paths` (float32, eval) and the first one's tokenizer."""
    from transformers import AutoTokenizer

    from vaswani.training.distillation import load_teachers

    tokenizer = AutoTokenizer.from_pretrained(paths[0])
    return load_teachers(paths, tokenizer), tokenizer


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
        write_pseudo_labelled(args.count, args.output, args.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
