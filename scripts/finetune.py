"""Fine-tune a saved checkpoint with transformers' Seq2SeqTrainer (evaluation by generation).

G2P (default data: the shipped CMUdict split and its dev words; WER/PER):
    python scripts/finetune.py --model OUT --output_dir OUT-ft --max_steps 2000 --learning_rate 1e-4
Parallel text (TSV/CSV with a header, or JSON lines; BLEU/chrF on the validation file):
    python scripts/finetune.py --model OUT --train_file train.tsv --validation_file dev.tsv \
        --source_column de --target_column en --output_dir OUT-ft --num_train_epochs 3

The result in --output_dir is a checkpoint like any other (model, generation config, tokenizer,
code): scripts/generate.py and AutoModelForSeq2SeqLM load it. Final eval metrics are printed and
written to eval_results.json there.
"""

import argparse
import json
import random
import sys

import torch
from transformers import Seq2SeqTrainingArguments

from vaswani.training.finetune import TASKS, build_trainer, finetune_data, make_compute_metrics, tokenize_pairs
from vaswani.training.generation import CheckpointError, load_checkpoint
from vaswani.training.tasks import load_task_data


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, metavar="CHECKPOINT", help="folder with model + tokenizer (or Hub id)")
    parser.add_argument("--output_dir", required=True, help="Trainer checkpoints, then the final model + tokenizer")
    data = parser.add_argument_group("data")
    data.add_argument("--g2p_file", default=None, help="WORD<TAB>PHONEMES file (default: the shipped CMUdict split)")
    data.add_argument("--dev_percent", type=int, default=5,
                      help="without --validation_file: percent of sources held out for evaluation (by crc32, as train.py)")
    data.add_argument("--train_file", default=None, help="parallel text instead of G2P (.tsv/.csv/.jsonl or Hub name)")
    data.add_argument("--validation_file", default=None, help="data for evaluation (default: carved from the training data)")
    data.add_argument("--source_column", default="source")
    data.add_argument("--target_column", default="target")
    data.add_argument("--task", choices=TASKS, default=None,
                      help="metrics: g2p (WER/PER) or translation (BLEU/chrF); default g2p without --train_file")
    data.add_argument("--max_train_samples", type=int, default=None, help="a random subset (seeded) of this size")
    data.add_argument("--max_eval_samples", type=int, default=None, help="the first N evaluation sources")
    data.add_argument("--max_source_length", type=int, default=None, help="truncate sources (tokens)")
    data.add_argument("--max_target_length", type=int, default=None, help="truncate targets (tokens)")
    train = parser.add_argument_group("training (Seq2SeqTrainingArguments of the same name)")
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
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--report_to", default="none", help="none, tensorboard, ...")
    train.add_argument("--use_cpu", action="store_true", help="train on the CPU even when a GPU is present")
    train.add_argument("--disable_tqdm", action="store_true")
    return parser.parse_args(argv)


def _load_data(args, task: str):
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


def main(argv=None):
    args = parse_args(argv)
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
    training_args = Seq2SeqTrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        num_train_epochs=args.num_train_epochs,
        learning_rate=args.learning_rate,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        label_smoothing_factor=args.label_smoothing_factor or 0.0,
        eval_strategy="steps" if args.eval_steps and eval_dataset is not None else "no",
        eval_steps=args.eval_steps,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        save_total_limit=args.save_total_limit,
        logging_steps=args.logging_steps,
        predict_with_generate=True,
        generation_max_length=generation_max_length,
        generation_num_beams=args.generation_num_beams,
        seed=args.seed,
        report_to=args.report_to,
        use_cpu=args.use_cpu or not torch.cuda.is_available(),
        disable_tqdm=args.disable_tqdm,
    )
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


if __name__ == "__main__":
    main()
