"""`vaswani-average`: the mean of the weights of a finished run's last K checkpoints, evaluated on the full dev set
and written as a new Hub-ready model folder (the paper's checkpoint averaging; `averaging.py` holds the averaging
itself). `python scripts/average_checkpoints.py` is the same command.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from .checkpoints import CHECKPOINT_DIR
from .cli import export_run, make_settings, saved_arguments, task_data


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-average",
        description="Average the weights of the last K checkpoints of a finished vaswani-train run (the paper's "
                    "checkpoint averaging), evaluate the average on the full dev set and write it as a Hub-ready "
                    "model folder (model, tokenizer, code, model card with the dev figures of the average).")
    parser.add_argument("run_dir", help="the --output_dir of a finished vaswani-train run")
    parser.add_argument("--last", type=int, required=True, help="how many of the newest checkpoints to average")
    parser.add_argument("--output_dir", help="the new model folder (default: RUN_DIR-avgK)")
    parser.add_argument("--num_beams", type=int, help="beam size of the evaluation (default: the run's)")
    parser.add_argument("--push_to_hub", action="store_true")
    parser.add_argument("--hub_model_id")
    parser.add_argument("--hub_private", action="store_true")
    return parser


def main(argv=None) -> int:
    """`vaswani-average`: 0 once the new folder is written; bad arguments end with one line on stderr (status 2)."""
    average_run(argv)
    return 0


def average_run(argv=None) -> dict:
    """The end product of a finished run, from the mean of its last K checkpoints.

    The run's own settings (training_args.json), data, tokenizer and generation config; only the weights differ.
    Writes a new Hub-ready folder (never the run's own) and returns its metrics.
    """
    parser = build_parser()
    options = parser.parse_args(argv)
    run = Path(options.run_dir)
    missing = [name for name in ("training_args.json", "metrics.json") if not (run / name).is_file()]
    if missing:
        parser.error(f"{run} has no {' or '.join(missing)}: pass the --output_dir of a vaswani-train run that "
                     "finished")
    output_dir = Path(options.output_dir or f"{str(run).rstrip('/')}-avg{options.last}")
    if output_dir.resolve() == run.resolve():
        parser.error("--output_dir must differ from the run's folder, which keeps its own model")
    if options.push_to_hub and not options.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id (e.g. your-name/vaswani-g2p)")

    logging.basicConfig(level=logging.WARNING)
    from vaswani import VaswaniTokenizer

    from .evaluation import describe_final, final_evaluation
    from .loop import TrainingResult

    args = saved_arguments(run)
    args.output_dir, args.average_last, args.resume = str(output_dir), options.last, False
    args.push_to_hub, args.hub_model_id, args.hub_private = options.push_to_hub, options.hub_model_id, options.hub_private
    if options.num_beams:
        args.num_beams = options.num_beams
    settings = make_settings(args)
    data = task_data(args)
    state_dir = run / CHECKPOINT_DIR
    tokenizer = VaswaniTokenizer.from_pretrained(args.tokenizer or state_dir / "tokenizer")
    print(f"averaging the weights of the last {options.last} checkpoints of {run}, then evaluating them on the "
          f"{len(data.dev_sources)} dev sources (beam {settings.num_beams})")
    try:
        model, dev = final_evaluation(state_dir, tokenizer, data, num_beams=settings.num_beams,
                                      batch_size=settings.eval_batch_size, average_last=options.last,
                                      attn_implementation=settings.attn_implementation)
    except ValueError as error:
        parser.error(str(error))
    print(describe_final(dev, len(data.dev_sources)))
    ran = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    result = TrainingResult.from_metrics(ran, dev, model, dev["averaged_steps"])
    return export_run(args, settings, data, tokenizer, result, ran["num_processes"], ran.get("device", "cpu"))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
