"""Fine-tuning with transformers' `Seq2SeqTrainer`: the data, the metrics and the trainer.

The pieces `scripts/finetune.py` puts together, and the tests reach:
- `finetune_data`: the data of `tasks.load_task_data` (as for `scripts/train.py`) as source texts, target texts
  and, for evaluation, every reference of each source (a G2P word may have several pronunciations; scoring takes
  the closest).
- `tokenize_pairs`: a `datasets.Dataset` of unpadded `input_ids`, `attention_mask`, `labels`.
  Padding is the collator's job: `DataCollatorForSeq2Seq(tokenizer, model=model)` pads the
  labels with -100 itself (never with the tokenizer's pad id 0, which would be learned as a
  target) and adds `decoder_input_ids` from the model's `prepare_decoder_input_ids_from_labels`,
  which Trainer's label smoothing needs (it takes `labels` away from the model).
- `make_compute_metrics`: decodes the generated ids and scores them: WER and PER (G2P) or BLEU
  and chrF (text), all in percent.
- `build_trainer`: `Seq2SeqTrainer` over these.

Gradient accumulation: our model's `forward` takes `**kwargs`, so Trainer counts the label
tokens of the whole accumulated batch (`num_items_in_batch`), passes the count to the model (or
to its label smoother) and stops dividing by the accumulation steps; the model divides its summed
loss by that count. 4 x 2 accumulated therefore gives the gradient of the full batch of 8
(tests/test_training_finetune.py checks the weights after a step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .evaluation import score
from .tasks import TASKS, TaskData


@dataclass
class FinetuneData:
    """Training pairs and evaluation sources with all their references (eval may be empty)."""

    train_sources: list[str]
    train_targets: list[str]
    eval_sources: list[str]
    eval_references: list[list[str]]


def finetune_data(data: TaskData) -> FinetuneData:
    """The task data `scripts/train.py` uses (`tasks.load_task_data`: the same files, dev rule and grouping of
    references) in the shape Trainer wants."""
    return FinetuneData(
        train_sources=[source for source, _ in data.train_pairs],
        train_targets=[target for _, target in data.train_pairs],
        eval_sources=list(data.dev_sources),
        eval_references=[list(refs) for refs in data.dev_references],
    )


def tokenize_pairs(tokenizer, sources: Sequence[str], targets: Sequence[str],
                   max_source_length: int | None = None, max_target_length: int | None = None):
    """A `datasets.Dataset` with unpadded `input_ids`, `attention_mask` and `labels` per pair."""
    import datasets

    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if not sources:
        raise ValueError("no examples to tokenize")
    source_limit = {"truncation": True, "max_length": max_source_length} if max_source_length else {}
    target_limit = {"truncation": True, "max_length": max_target_length} if max_target_length else {}
    encoded = tokenizer(list(sources), **source_limit)
    labels = tokenizer(text_target=list(targets), **target_limit)["input_ids"]
    return datasets.Dataset.from_dict(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels}
    )


def decode_predictions(tokenizer, predictions) -> list[str]:
    """Generated ids (padded with -100 between batches by Trainer) -> texts without special tokens."""
    if isinstance(predictions, tuple):
        predictions = predictions[0]
    ids = np.where(np.asarray(predictions) < 0, tokenizer.pad_token_id, predictions)
    return [" ".join(text.split()) for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def make_compute_metrics(tokenizer, references: Sequence[Sequence[str]], task: str) -> Callable[..., dict]:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`.

    references[i]: every acceptable output for eval example i (same order as the eval dataset).
    Returns {"wer", "per"} for task "g2p" and {"bleu", "chrf"} for "translation", in percent.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    references = [list(refs) for refs in references]

    def compute_metrics(eval_prediction) -> dict:
        predictions = decode_predictions(tokenizer, eval_prediction.predictions)
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions for {len(references)} eval examples: the eval "
                             "dataset and the references given to make_compute_metrics differ")
        return score(task, predictions, references)

    return compute_metrics


def build_trainer(model, tokenizer, training_args, train_dataset, eval_dataset=None, compute_metrics=None):
    """`Seq2SeqTrainer` with `DataCollatorForSeq2Seq(tokenizer, model=model)` (labels padded with -100,
    `decoder_input_ids` from the labels). `training_args`: `Seq2SeqTrainingArguments`."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    return Seq2SeqTrainer(
        model=model,
        args=training_args,
        data_collator=collator,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=compute_metrics if eval_dataset is not None else None,
    )
