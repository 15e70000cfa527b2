"""Token-level knowledge distillation from an ensemble of teachers (`vaswani-train --teachers DIR [DIR ...]`).

A student learns from the training targets and, at every target position, from the mean next-token distribution
of a few trained models ("teachers") under teacher forcing (Hinton et al. 2015; for G2P, Sun et al. 2019, token-level
ensemble distillation). An ensemble of models trained alike is more often right than any one of them; distillation
tries to hand that to one model, which costs one model's time at inference. How much it hands on depends on the
words: on the ones the teachers trained on, their targets are close to the labels, so the gain has to come from
examples they did not see (docs/recipes.md measures both on G2P).

How it runs:
- before training, `attach_teacher_targets` runs every teacher once over the training examples (eval mode, no
  gradient, batches sorted by length) and keeps, per target position, the `top_k` most likely tokens of the
  teachers' mean distribution with their probabilities, renormalized over those k. They travel with the examples
  (`batching.TEACHER_FIELDS`), so batching, sharding and an exact resume are unchanged: a resumed run computes the
  same targets again from the same teachers.
- the student's loss per update is `(1 - alpha) * CE + alpha * KD`: CE is the model's own token-mean cross-entropy
  against the labels (with its label smoothing), KD the token-mean cross-entropy against the teachers' top-k
  distribution (`distillation_loss`), over the same positions.

The teachers must share the student's tokenizer (the same vocabulary, id for id): their distributions are over its
ids. A run of vaswani-train on the same training file trains that tokenizer again (it is deterministic), or pass
`--tokenizer` with a teacher's folder.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from .batching import Seq2SeqCollator


def check_tokenizers(paths: Sequence[str], tokenizer) -> None:
    """Raise ValueError naming the first of `paths` (local saved model folders) that cannot be loaded or whose
    tokenizer's vocabulary is not `tokenizer`'s, id for id, with the fix."""
    from transformers import AutoTokenizer

    import vaswani  # noqa: F401  registers the Auto classes

    vocabulary = tokenizer.get_vocab()
    for path in paths:
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"--teachers: {str(path)!r} is not a saved model folder (no config.json); pass the "
                             "--output_dir of a finished vaswani-train run")
        try:
            theirs = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ValueError(f"--teachers: cannot load the tokenizer of {str(path)!r}: {first}") from None
        if theirs.get_vocab() != vocabulary:
            raise ValueError(f"--teachers: {str(path)!r} was trained with another tokenizer ({len(theirs)} pieces "
                             f"against the student's {len(tokenizer)}, or the same count with other ids); train the "
                             f"student with the teacher's: --tokenizer {path}")


def load_teachers(paths: Sequence[str], tokenizer, device="cpu", attn_implementation: str | None = None) -> list:
    """The teacher models of `paths` (saved model folders, float32, in eval mode on `device`); raises ValueError
    naming a folder that cannot be loaded or whose tokenizer is not the student's (`check_tokenizers`)."""
    from .generation import CheckpointError, load_checkpoint

    check_tokenizers(paths, tokenizer)
    teachers = []
    for path in paths:
        try:
            model, _ = load_checkpoint(path, device=device, attn_implementation=attn_implementation)
        except CheckpointError as error:
            raise ValueError(f"--teachers: {error}") from None
        teachers.append(model.float())
    return teachers


@torch.no_grad()
def teacher_distribution(teachers: Sequence, batch: dict) -> torch.Tensor:
    """The teachers' mean next-token distribution (B, T, V), float32, at every target position of `batch` (the
    collator's `input_ids`, `attention_mask`, `labels`; decoder inputs are the labels shifted right)."""
    total = None
    for teacher in teachers:
        logits = teacher(**batch).logits
        probs = torch.softmax(logits.float(), dim=-1)
        total = probs if total is None else total.add_(probs)
    return total.div_(len(teachers))


def attach_teacher_targets(teachers: Sequence, examples: list[dict], pad_token_id: int, top_k: int = 8,
                           max_tokens: int = 8192, autocast=contextlib.nullcontext, log=print) -> None:
    """Give every example of `examples` its teachers' top-k targets (in place): `teacher_ids` (T, k) int64 and
    `teacher_probs` (T, k) float32, renormalized over the k, one row per label. `autocast`: a context manager
    factory for the teachers' forward (the run's mixed precision)."""
    if not teachers:
        raise ValueError("attach_teacher_targets needs at least one teacher")
    start = time.perf_counter()
    device = next(teachers[0].parameters()).device
    collate = Seq2SeqCollator(pad_token_id)
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i]["labels"]), len(examples[i]["input_ids"])))
    k = min(top_k, teachers[0].config.vocab_size)
    batch: list[int] = []

    def flush(indices: list[int]) -> None:
        inputs = {key: value.to(device) for key, value in collate([examples[i] for i in indices]).items()}
        with autocast():
            probs = teacher_distribution(teachers, inputs)
        top, ids = probs.topk(k, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        for row, i in enumerate(indices):
            length = len(examples[i]["labels"])
            examples[i]["teacher_ids"] = ids[row, :length].cpu()
            examples[i]["teacher_probs"] = top[row, :length].cpu()

    for i in order:
        width = max(len(examples[i]["input_ids"]), len(examples[i]["labels"]))
        if batch and width * (len(batch) + 1) > max_tokens:
            flush(batch)
            batch = []
        batch.append(i)
    if batch:
        flush(batch)
    tokens = sum(len(e["labels"]) for e in examples)
    log(f"distillation: {len(teachers)} teacher(s), top {k} of their mean distribution at {tokens} target tokens of "
        f"{len(examples)} examples in {time.perf_counter() - start:.1f} s")


def distillation_loss(logits: torch.Tensor, labels: torch.Tensor, teacher_ids: torch.Tensor,
                      teacher_probs: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy of the student's `logits` (B, T, V) against the teachers' top-k distribution
    (`teacher_ids`, `teacher_probs`: B, T, k) over the positions where `labels` != -100 (the model's own loss
    averages over the same positions)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    per_token = -(teacher_probs * log_probs.gather(-1, teacher_ids)).sum(-1)
    mask = labels != -100
    return per_token[mask].sum() / mask.sum().clamp(min=1)
