"""Fine-tuning with transformers' `Seq2SeqTrainer`: the data, the metrics and the trainer.

The pieces the command line `vaswani-finetune` (`main`, also `python scripts/finetune.py`) puts together, and the
tests reach:
- `finetune_data`: the data of `tasks.load_task_data` (as for `vaswani-train`) as source texts, target texts
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

G2P (default data: the shipped CMUdict split and its dev words; WER/PER):
    vaswani-finetune --model OUT --output_dir OUT-ft --max_steps 2000 --learning_rate 1e-4
Parallel text (.tsv/.csv with a header or two columns, .jsonl, or a Hub dataset; BLEU/chrF on the validation file):
    vaswani-finetune --model OUT --train_file train.tsv --validation_file dev.tsv \\
        --source_column de --target_column en --output_dir OUT-ft --num_train_epochs 3
The result in --output_dir is a checkpoint like any other (model, generation config, tokenizer, code):
`vaswani-generate` and AutoModelForSeq2SeqLM load it. Final eval metrics are printed and written to
eval_results.json there.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
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
    """The task data `vaswani-train` uses (`tasks.load_task_data`: the same files, dev rule and grouping of
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
    Returns the task's figures (`evaluation.score`): {"wer", "per"} for "g2p" (and WER by line length for
    "g2p-paragraph"), {"bleu", "chrf"} for "translation".
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


# The command line `vaswani-finetune`: flags named as the Seq2SeqTrainingArguments they set.

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-finetune", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fine-tune a saved checkpoint with transformers' Seq2SeqTrainer (evaluation by generation).",
        epilog=__doc__[__doc__.index("G2P (default data"):])
    parser.add_argument("--model", required=True, metavar="CHECKPOINT", help="folder with model + tokenizer (or Hub id)")
    parser.add_argument("--output_dir", required=True, help="Trainer checkpoints, then the final model + tokenizer")
    data = parser.add_argument_group("data")
    data.add_argument("--g2p_file", default=None, help="WORD<TAB>PHONEMES file (default: the shipped CMUdict split)")
    data.add_argument("--dev_percent", type=int, default=5, help="without --validation_file: percent of sources "
                                                                 "held out for evaluation (by crc32, as vaswani-train)")
    data.add_argument("--train_file", default=None, help="parallel text instead of G2P (.tsv/.csv/.jsonl or Hub name)")
    data.add_argument("--validation_file", default=None, help="data for evaluation (default: carved from the "
                                                              "training data)")
    data.add_argument("--source_column", default="source")
    data.add_argument("--target_column", default="target")
    data.add_argument("--task", choices=TASKS, default=None,
                      help="metrics: g2p (WER/PER), g2p-paragraph (WER/PER of lines of words, the default line counts; "
                           "the checkpoint's tokenizer needs the word boundary '|': start from a vaswani-train "
                           "--task g2p-paragraph model) or translation (BLEU/chrF); default g2p without --train_file")
    data.add_argument("--max_train_samples", type=int, default=None, help="a random subset (seeded) of this size")
    data.add_argument("--max_eval_samples", type=int, default=None, help="the first N evaluation sources")
    data.add_argument("--max_source_length", type=int, default=None, help="truncate sources (tokens)")
    data.add_argument("--max_target_length", type=int, default=None, help="truncate targets (tokens)")
    _add_trainer_arguments(parser.add_argument_group("training (Seq2SeqTrainingArguments of the same name)"))
    return parser


def _add_trainer_arguments(train) -> None:
    train.add_argument("--max_steps", type=int, default=-1, help="optimizer steps; overrides --num_train_epochs")
    train.add_argument("--num_train_epochs", type=float, default=1.0)
    train.add_argument("--learning_rate", type=float, default=1e-4)
    train.add_argument("--lr_scheduler_type", default="linear")
    train.add_argument("--warmup_steps", type=int, default=0)
    train.add_argument("--weight_decay", type=float, default=0.0)
    train.add_argument("--max_grad_norm", type=float, default=1.0)
    train.add_argument("--per_device_train_batch_size", type=int, default=64)
    train.add_argument("--per_device_eval_batch_size", type=int, default=64)
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--label_smoothing_factor", type=float, default=None,
                       help="Trainer's label smoothing (default: the checkpoint's config.label_smoothing)")
    train.add_argument("--eval_steps", type=int, default=None, help="evaluate every N steps (default: at the end only)")
    train.add_argument("--save_steps", type=int, default=0, help="Trainer checkpoint every N steps (0: final save only)")
    train.add_argument("--save_total_limit", type=int, default=2)
    train.add_argument("--logging_steps", type=int, default=50)
    train.add_argument("--generation_num_beams", type=int, default=1, help="beams for evaluation")
    train.add_argument("--generation_max_length", type=int, default=None,
                       help="evaluation output limit in tokens (default: longest eval target + 10)")
    train.add_argument("--seed", type=int, default=0, help="Trainer's seed (data order, dropout)")
    train.add_argument("--report_to", default="none", help="none, tensorboard, ...")
    train.add_argument("--use_cpu", action="store_true", help="train on the CPU even when a GPU is present")
    train.add_argument("--disable_tqdm", action="store_true")


def _load_data(args, task: str) -> FinetuneData:
    from .tasks import load_task_data

    data = finetune_data(load_task_data(task, args.train_file or args.g2p_file, args.validation_file,
                                        args.source_column, args.target_column, args.dev_percent))
    if args.max_train_samples is not None and args.max_train_samples < len(data.train_sources):
        keep = sorted(random.Random(args.seed).sample(range(len(data.train_sources)), args.max_train_samples))
        data.train_sources = [data.train_sources[i] for i in keep]
        data.train_targets = [data.train_targets[i] for i in keep]
    if args.max_eval_samples is not None:
        data.eval_sources = data.eval_sources[: args.max_eval_samples]
        data.eval_references = data.eval_references[: args.max_eval_samples]
    return data


def _training_arguments(args, eval_dataset, generation_max_length):
    import torch
    from transformers import Seq2SeqTrainingArguments

    same_name = ("output_dir", "max_steps", "num_train_epochs", "learning_rate", "lr_scheduler_type", "warmup_steps",
                 "weight_decay", "max_grad_norm", "per_device_train_batch_size", "per_device_eval_batch_size",
                 "gradient_accumulation_steps", "eval_steps", "save_total_limit", "logging_steps",
                 "generation_num_beams", "seed", "report_to", "disable_tqdm")
    return Seq2SeqTrainingArguments(
        **{name: getattr(args, name) for name in same_name},
        label_smoothing_factor=args.label_smoothing_factor or 0.0,
        eval_strategy="steps" if args.eval_steps and eval_dataset is not None else "no",
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        predict_with_generate=True,
        generation_max_length=generation_max_length,
        use_cpu=args.use_cpu or not torch.cuda.is_available(),
    )


def run_finetune(args: argparse.Namespace):
    """What `main` does for parsed arguments; returns the Trainer (its state holds the log history)."""
    from .generation import CheckpointError, load_checkpoint

    task = args.task or ("translation" if args.train_file is not None else "g2p")
    try:
        model, tokenizer = load_checkpoint(args.model, device="cpu")  # Trainer places it
        data = _load_data(args, task)
    except (CheckpointError, ValueError) as error:
        sys.exit(f"error: {error}")
    lengths = {"max_source_length": args.max_source_length, "max_target_length": args.max_target_length}
    train_dataset = tokenize_pairs(tokenizer, data.train_sources, data.train_targets, **lengths)
    eval_dataset = compute_metrics = None
    if data.eval_sources:
        # eval loss against the first reference; the metrics use all of them
        eval_dataset = tokenize_pairs(tokenizer, data.eval_sources, [refs[0] for refs in data.eval_references], **lengths)
        compute_metrics = make_compute_metrics(tokenizer, data.eval_references, task)
    generation_max_length = args.generation_max_length
    if generation_max_length is None and eval_dataset is not None:
        generation_max_length = max(len(labels) for labels in eval_dataset["labels"]) + 10

    config_smoothing = model.config.label_smoothing
    if args.label_smoothing_factor is not None:
        model.config.label_smoothing = 0.0  # the flag replaces the checkpoint's value for this run
    training_args = _training_arguments(args, eval_dataset, generation_max_length)
    trainer = build_trainer(model, tokenizer, training_args, train_dataset, eval_dataset, compute_metrics)
    print(f"fine-tuning {args.model} on {len(train_dataset)} pairs ({task}; {len(data.eval_sources)} eval sources)")
    train_result = trainer.train()
    model.config.label_smoothing = config_smoothing
    trainer.save_model(args.output_dir)  # model, generation config, tokenizer, code
    trainer.save_metrics("train", train_result.metrics)
    if eval_dataset is not None:
        metrics = trainer.evaluate()
        trainer.save_metrics("eval", metrics)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}))
    print(f"saved the fine-tuned model and tokenizer to {args.output_dir}")
    return trainer


def main(argv=None) -> int:
    """`vaswani-finetune`: a bad checkpoint or data file ends with one line `error: ...` (exit status 1)."""
    run_finetune(build_parser().parse_args(argv))
    return 0
