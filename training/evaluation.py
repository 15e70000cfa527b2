"""Dev-set evaluation during and after training: dev loss, batched generation, task metrics.

Runs on one process (the main one in a multi-process run; the others wait): the dev sets here
are small (5.4k G2P words) and generation is the cost, so sharding it would save little and
add gathers. Inputs are sorted by length and generated in chunks of `batch_size` so that the
padding stays small; predictions come back in the original order.

`final_evaluation` is the end of every run, in one place: the end of `loop.train` and
`vaswani-average` both load the weights to export with it and score them on the whole dev set.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .averaging import average_checkpoints
from .batching import Seq2SeqCollator
from .checkpoints import BEST_DIR
from .generation import generate_lines
from .tasks import SPECS, TaskData, encode_pairs
from .train_state import load_weights


def generate_texts(model, tokenizer, sources: list[str], num_beams: int = 1, max_length: int | None = None,
                   batch_size: int = 512) -> list[str]:
    """Decode `sources` with `model.generate` (greedy when num_beams == 1), batched by length, in input order;
    `max_length` counts decoder tokens with the start token (None: the model's generation config)."""
    was_training = model.training
    model.eval()
    try:
        return generate_lines(model, tokenizer, sources, batch_size=batch_size, num_beams=num_beams,
                              max_length=max_length)
    finally:
        model.train(was_training)


@torch.no_grad()
def dev_loss(model, examples: list[dict], pad_token_id: int, max_tokens: int = 8192) -> float:
    """Token-mean cross-entropy (no label smoothing: a plain NLL, exp() is the perplexity) over `examples`."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    collate = Seq2SeqCollator(pad_token_id)
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    total, tokens, batch = 0.0, 0, []

    def flush(batch):
        inputs = {k: v.to(device) for k, v in collate([examples[i] for i in batch]).items()}
        labels = inputs.pop("labels")
        logits = model(**inputs, labels=labels).logits
        return (F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum").item(),
                int((labels != -100).sum()))

    for i in order:
        width = max(len(examples[i]["input_ids"]), len(examples[i]["labels"]))
        if batch and width * (len(batch) + 1) > max_tokens:
            s, n = flush(batch)
            total, tokens, batch = total + s, tokens + n, []
        batch.append(i)
    if batch:
        s, n = flush(batch)
        total, tokens = total + s, tokens + n
    model.train(was_training)
    return total / max(tokens, 1)


def score(task: str, predictions: list[str], references: list[list[str]]) -> dict[str, float]:
    """The task's dev figures (`tasks.SPECS`): g2p and g2p-paragraph -> wer, per (percent; by line length too for
    paragraphs); translation -> bleu, chrf."""
    if task not in SPECS:
        raise ValueError(f"task={task!r} is unknown; choose one of {tuple(SPECS)}")
    return SPECS[task].score(predictions, references)


def evaluate(model, tokenizer, task: str, sources: list[str], references: list[list[str]], examples: list[dict],
             num_beams: int = 1, max_length: int | None = None, batch_size: int = 512) -> dict:
    """Dev loss, generation metrics and timings for one dev set; `examples` are the encoded (source, reference) pairs."""
    start = time.perf_counter()
    loss = dev_loss(model, examples, tokenizer.pad_token_id)
    loss_seconds = time.perf_counter() - start
    predictions = generate_texts(model, tokenizer, sources, num_beams=num_beams, max_length=max_length,
                                 batch_size=batch_size)
    generate_seconds = time.perf_counter() - start - loss_seconds
    result = {"loss": loss, "perplexity": math.exp(min(loss, 50)), **score(task, predictions, references),
              "examples": len(sources), "num_beams": num_beams, "seconds": time.perf_counter() - start,
              "generate_seconds": generate_seconds}
    result["predictions"] = predictions
    return result


def load_best(checkpoint_dir: str | Path, attn_implementation: str | None = None):
    """The best weights a run keeps (`<checkpoint_dir>/best`), with `attn_implementation` when given."""
    from vaswani import VaswaniForConditionalGeneration

    model = VaswaniForConditionalGeneration.from_pretrained(Path(checkpoint_dir) / BEST_DIR)
    if attn_implementation:
        model.set_attn_implementation(attn_implementation)
    return model


def final_evaluation(checkpoint_dir: str | Path, tokenizer, data: TaskData, *, num_beams: int, batch_size: int = 512,
                     average_last: int | None = None, best_step: int | None = None,
                     attn_implementation: str | None = None, max_length: int | None = None) -> tuple[object, dict]:
    """The model a run exports and its scores on the whole dev set with `num_beams`; returns (model, dev).

    The weights are the best ones kept in `<checkpoint_dir>/best`, or with `average_last` K the mean of the last K
    checkpoints (`averaging`; the best folder still gives the config and generation settings). `num_beams` (and
    `max_length`, when given) go into the model's generation config, so the export decodes as it was scored.
    `dev["step"]` is the weights' step (`best_step`, or the newest averaged); `dev["averaged_steps"]` lists the
    steps averaged. Raises ValueError when fewer than K complete checkpoints exist.
    """
    checkpoint_dir = Path(checkpoint_dir)
    averaged = average_checkpoints(checkpoint_dir, average_last) if average_last is not None else None
    model = load_best(checkpoint_dir, attn_implementation)
    if averaged is not None:
        load_weights(model, averaged[0], f"the average of checkpoints {averaged[1]}")
    if max_length is not None:
        model.generation_config.max_length = max_length
    model.generation_config.num_beams = num_beams
    dev = evaluate(model, tokenizer, data.task, data.dev_sources, data.dev_references,
                   encode_pairs(tokenizer, data.dev_pairs), num_beams=num_beams,
                   max_length=model.generation_config.max_length, batch_size=batch_size)
    dev["step"] = averaged[1][-1] if averaged else best_step
    if averaged:
        dev["averaged_steps"] = averaged[1]
    return model, dev


def describe_final(dev: dict, dev_size: int) -> str:
    """One line for the log: which weights `final_evaluation` scored, on what, and the figures."""
    weights = f"the average of steps {dev['averaged_steps']}" if "averaged_steps" in dev else f"best step {dev['step']}"
    return (f"{weights} on the full dev set ({dev_size} sources, beam {dev['num_beams']}): loss {dev['loss']:.4f} "
            + " ".join(f"{k} {dev[k]:.2f}" for k in ("wer", "per", "bleu", "chrf") if k in dev))
