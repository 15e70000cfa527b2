"""The command line `vaswani-train` (`main`: arguments -> data, tokenizer, config -> `loop.train` -> the model
folder); `python scripts/train.py` is the same command. `vaswani-average` is in `average.py`; what the model card
says of the optimizer and schedule, in `model_card.py`.

With no arguments `vaswani-train` trains the default G2P model on the shipped CMUdict split. Model hyperparameters
come from the config only (`--preset`, or the config of the `--init_from` model, plus `--config_overrides`); the
other flags say how to train.

The long-input task, paragraph-level G2P, from scratch, or warm-started from a word-level G2P model folder (the
main job's outputs/g2p) with full or local attention:
    vaswani-train --task g2p-paragraph --time_budget 20m --output_dir outputs/paragraph
    vaswani-train --task g2p-paragraph --init_from outputs/g2p --config_overrides max_position_embeddings=2048 \
        --time_budget 20m --output_dir outputs/paragraph-full
    vaswani-train --task g2p-paragraph --init_from outputs/g2p --time_budget 20m --output_dir outputs/paragraph-local \
        --config_overrides max_position_embeddings=2048,encoder_attention_pattern=local,attention_window=64
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import sys
from pathlib import Path

from vaswani import PRESETS

from .checkpoints import CHECKPOINT_DIR, refuse_older_run
from .data import DEFAULT_DEV_PERCENT, FILE_FORMATS, data_file_format
from .loop import EXPORTED, MIXED_PRECISIONS, TrainingSettings, resolve_mixed_precision, settings_dict
from .recipes import RECIPES, TASK_DEFAULTS, describe, flag_defaults
from .schedule import OPTIMIZERS, SCHEDULES
from .paragraphs import DEV_LINES, PARAGRAPH_WORDS, TRAIN_LINES, WORD_BOUNDARY
from .tasks import SPECS, TASKS
from .time_budget import Deadline, parse_duration

logger = logging.getLogger(__name__)

# Words that are not in the shipped training file (checked by tests/test_training_loop.py), shown after G2P training.
G2P_NEW_WORDS = ["VASWANI", "HUGGINGFACE", "TOKENIZER", "PYTORCH", "SMARTPHONE", "SELFIE", "PODCAST", "WIKIPEDIA"]

# What the end of a run shows when --show is not given (other tasks: the first 5 dev sources): words that are not in
# the shipped file, alone and as one line.
SHOWN = {"g2p": G2P_NEW_WORDS, "g2p-paragraph": [f" {WORD_BOUNDARY} ".join(G2P_NEW_WORDS)]}

_SETTING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainingSettings)}


def _by_task(name: str) -> str:
    """"default: 1500 for g2p, 4096 for translation": the help text of a flag whose default is in TASK_DEFAULTS."""
    return "default: " + ", ".join(f"{recipe[name]} for {task}" for task, recipe in TASK_DEFAULTS.items()
                                   if name in recipe)


def parse_overrides(text: str) -> dict:
    """"d_model=128,encoder_layers=2,normalize_before=true" -> {"d_model": 128, ...}."""
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--config_overrides: {item!r} is not key=value")
        value = value.strip()
        lowered = value.lower()
        if lowered in ("true", "false"):
            parsed = lowered == "true"
        elif lowered in ("none", "null"):
            parsed = None
        else:
            try:
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                parsed = value
        overrides[key.strip()] = parsed
    return overrides


def build_parser() -> argparse.ArgumentParser:
    """The flags of vaswani-train; those left None are filled from TASK_DEFAULTS by `parse_args`."""
    p = argparse.ArgumentParser(
        prog="vaswani-train",
        description="Train a vaswani encoder-decoder Transformer. With no arguments: the default grapheme-to-phoneme "
                    "model on the shipped CMUdict split. Under `torchrun`/`accelerate launch` it trains data-parallel.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_data_arguments(p.add_argument_group("data"))
    _add_model_arguments(p.add_argument_group("model (the config is the single source of truth)"))
    _add_training_arguments(p.add_argument_group("training"))
    _add_evaluation_arguments(p.add_argument_group("evaluation, checkpoints, logging"))
    h = p.add_argument_group("hub")
    h.add_argument("--push_to_hub", action="store_true", help="upload the model folder (needs --hub_model_id)")
    h.add_argument("--hub_model_id", help="e.g. your-name/vaswani-g2p")
    h.add_argument("--hub_private", action="store_true")
    h.add_argument("--license", default="apache-2.0", help="license of the trained model (model card)")
    return p


def _add_data_arguments(d) -> None:
    d.add_argument("--task", choices=TASKS, default=None,
                   help="g2p (WORD<TAB>PHONEMES files, WER/PER), g2p-paragraph (lines of those words, the "
                        "long-input task; WER/PER of the lines) or translation (any text pairs, BLEU/chrF); "
                        "default: g2p without --train_file, translation with it")
    d.add_argument("--train_file", help="training data: .tsv/.csv (a header row naming the columns, or two "
                                        "columns without one), .jsonl, or a Hub dataset name; for --task g2p a "
                                        "WORD<TAB>PHONEMES file. Default: the shipped CMUdict split (vaswani.data)")
    d.add_argument("--validation_file", help="dev data in the same format; default: carved from the training file")
    d.add_argument("--source_column", default="source")
    d.add_argument("--target_column", default="target")
    d.add_argument("--dev_percent", type=int, default=DEFAULT_DEV_PERCENT,
                   help="without --validation_file: percent of sources (by crc32) held out as dev set")
    d.add_argument("--paragraph_words", type=int, nargs=2, default=list(PARAGRAPH_WORDS), metavar=("MIN", "MAX"),
                   help="g2p-paragraph: words per line")
    d.add_argument("--paragraph_lines", type=int, nargs=2, default=[TRAIN_LINES, DEV_LINES], metavar=("TRAIN", "DEV"),
                   help="g2p-paragraph: training lines (drawn with --seed) and dev lines (a fixed draw)")
    d.add_argument("--tokenizer", help="an existing tokenizer folder; default: train one on the training data")
    d.add_argument("--tokenizer_vocab_size", type=int, help="vocabulary of a newly trained tokenizer "
                                                            "(default: every symbol for g2p, 8000 otherwise)")
    d.add_argument("--tokenizer_model_type", choices=("unigram", "bpe", "char", "word"))


def _add_model_arguments(m) -> None:
    m.add_argument("--preset", choices=sorted(PRESETS), help=f"config preset ({_by_task('preset')})")
    m.add_argument("--init_from", metavar="MODEL_FOLDER",
                   help="warm start: the config and weights of a saved vaswani model folder (its embedding rows "
                        "matched to this run's tokenizer by piece, new pieces initialised fresh); instead of --preset")
    m.add_argument("--config_overrides", default="", help="config fields over the preset's, e.g. "
                                                          "d_model=128,encoder_layers=2,dropout=0.2")
    m.add_argument("--label_smoothing", type=float, default=0.1, help="set on the config for training")
    m.add_argument("--word_positions", action="store_true",
                   help=f"g2p-paragraph: word-aligned positions in both stacks (the config's word_boundary_token_id "
                        f"set to the tokenizer's id of {WORD_BOUNDARY!r}; word_position_stride, default 64, "
                        "word_position_period and cross_attention_words through --config_overrides)")
    m.add_argument("--attn_implementation", choices=("eager", "sdpa", "flash_attention_2", "flex_attention"),
                   help="attention backend for training and evaluation (default: eager for g2p, the model's own "
                        "default, sdpa, otherwise)")


def _add_training_arguments(t) -> None:
    t.add_argument("--output_dir", default="outputs/g2p", help="checkpoints, logs and the final model folder")
    t.add_argument("--max_steps", type=int, help=f"optimizer updates ({_by_task('max_steps')})")
    t.add_argument("--max_epochs", type=int)
    t.add_argument("--time_budget", help="wall-clock limit of the run (all its invocations: a resumed run continues "
                                         "its clock), including the final evaluation, e.g. 15m, 1h30m, 900")
    t.add_argument("--recipe", choices=sorted(RECIPES), help="a named recipe: the defaults of a task's flags for a budget (flags given here "
                                    "win); " + "; ".join(describe(name) for name in RECIPES))
    t.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in output_dir")
    t.add_argument("--max_tokens", type=int,
                   help=f"padded tokens per micro-batch and process ({_by_task('max_tokens')})")
    t.add_argument("--max_source_length", type=int, help="training examples longer than this many tokens on either "
                                                         f"side are dropped ({_by_task('max_source_length')})")
    t.add_argument("--grad_accum", type=int, default=_SETTING_DEFAULTS["grad_accum"])
    t.add_argument("--lr", type=float, help=f"peak learning rate after warmup ({_by_task('lr')})")
    t.add_argument("--warmup_steps", type=int, help=_by_task("warmup_steps"))
    t.add_argument("--schedule", choices=SCHEDULES,
                   help="after warmup: inverse_sqrt (the paper's), or linear / cosine decay to zero as the run's "
                        f"budget (--max_steps, --max_epochs or --time_budget) runs out ({_by_task('schedule')})")
    t.add_argument("--weight_decay", type=float, default=_SETTING_DEFAULTS["weight_decay"])
    t.add_argument("--optimizer", choices=OPTIMIZERS, help="adam (the paper's), or muon: Muon for the layers' "
                   "weight matrices and Adam for the embeddings, biases and norms, at the same lr "
                   f"({_by_task('optimizer')})")
    t.add_argument("--clip_norm", type=float, default=_SETTING_DEFAULTS["clip_norm"],
                   help="gradient norm clipping; 0 disables")
    t.add_argument("--seed", type=int, default=_SETTING_DEFAULTS["seed"],
                   help="seed of the weights, the batches and dropout")
    t.add_argument("--ema_decay", type=float, help="evaluate, keep and export an exponential moving average of the "
                                                   "weights with this decay (warmed up); 0: the raw weights "
                                                   f"({_by_task('ema_decay')})")
    t.add_argument("--mixed_precision", choices=MIXED_PRECISIONS,
                   help="autocast the forward to fp16 or bf16; auto: bf16 where the device multiplies it in hardware "
                        f"(AVX512-BF16 or AMX CPUs, CUDA GPUs), else no ({_by_task('mixed_precision')})")
    t.add_argument("--cpu", action="store_true", help="force CPU (multi-process CPU runs need it, set by default "
                                                      "when no GPU is present)")
    t.add_argument("--teachers", nargs="+", default=[], metavar="MODEL_FOLDER",
                   help="distill from these trained models: the loss mixes the labels with their mean distribution "
                        "at each target position (they must share the student's tokenizer; docs/recipes.md)")
    t.add_argument("--distill_alpha", type=float, default=_SETTING_DEFAULTS["distill_alpha"],
                   help="the teachers' share of the loss with --teachers, in (0, 1]")
    t.add_argument("--distill_top_k", type=int, default=_SETTING_DEFAULTS["distill_top_k"],
                   help="the teachers' most likely tokens kept per target position")


def _add_evaluation_arguments(e) -> None:
    e.add_argument("--eval_every", type=int, help=f"updates between evaluations (0: only at the end; "
                                                  f"{_by_task('eval_every')})")
    e.add_argument("--eval_subset", type=int, default=_SETTING_DEFAULTS["eval_subset"],
                   help="dev sources used during training (0: all); the final evaluation uses all")
    e.add_argument("--eval_batch_size", type=int, default=_SETTING_DEFAULTS["eval_batch_size"],
                   help="sources per generate call")
    e.add_argument("--num_beams", type=int, help="beam size of the final evaluation and the saved generation "
                                                f"config ({_by_task('num_beams')})")
    e.add_argument("--save_every", type=int, help=f"updates between checkpoints (0: only at the end; "
                                                  f"{_by_task('save_every')})")
    e.add_argument("--keep_last", type=int, default=_SETTING_DEFAULTS["keep_last"], help="checkpoints kept")
    e.add_argument("--average_last", type=int, default=_SETTING_DEFAULTS["average_last"],
                   help="export the mean of the weights of the last K checkpoints instead of the best one (the "
                        "paper's checkpoint averaging; needs --keep_last >= K)")
    e.add_argument("--no_confirm_best", action="store_true",
                   help="keep the subset's best step as it is; by default, when it is not the last step, both are "
                        "scored on the full dev set (greedy) at the end and the better one is kept")
    e.add_argument("--log_every", type=int, default=_SETTING_DEFAULTS["log_every"])
    e.add_argument("--no_progress_bar", action="store_true")
    e.add_argument("--no_tensorboard", action="store_true")
    e.add_argument("--show", nargs="*", help="sources to translate at the end (default for g2p: a few new words)")


def _check_args(parser: argparse.ArgumentParser, args) -> None:
    for name in ("train_file", "validation_file"):
        path = getattr(args, name)
        if path and Path(path).suffix and not Path(path).is_file():
            parser.error(f"--{name} {path!r} does not exist")
        if path and args.task == "translation" and Path(path).is_file() and Path(path).suffix not in FILE_FORMATS:
            try:
                data_file_format(path)
            except ValueError as error:
                parser.error(f"--{name}: {error}")
    for teacher in args.teachers:
        if not (Path(teacher) / "config.json").is_file():
            parser.error(f"--teachers {teacher!r} is not a saved model folder (no config.json); pass the --output_dir "
                         "of a finished vaswani-train run")
    if args.init_from is not None and not (Path(args.init_from) / "config.json").is_file():
        parser.error(f"--init_from {args.init_from!r} is not a saved model folder (no config.json); pass the "
                     "--output_dir of a finished vaswani-train run")
    low, high = args.paragraph_words
    if not 1 <= low <= high:
        parser.error(f"--paragraph_words {low} {high}: give MIN MAX with 1 <= MIN <= MAX")
    if min(args.paragraph_lines) < 1:
        parser.error(f"--paragraph_lines {' '.join(map(str, args.paragraph_lines))}: give at least 1 training and 1 "
                     "dev line")
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        parser.error(f"--tokenizer {args.tokenizer!r} is not a folder (a saved tokenizer is a folder with spm.model)")
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id (e.g. your-name/vaswani-g2p)")
    if args.time_budget is not None:
        try:
            parse_duration(args.time_budget)
        except ValueError as error:
            parser.error(f"--time_budget: {error}")
    if not 0 <= args.label_smoothing < 1:
        parser.error(f"--label_smoothing {args.label_smoothing} must be in [0, 1)")
    try:
        args.overrides = parse_overrides(args.config_overrides)
    except ValueError as error:
        parser.error(str(error))
    if "label_smoothing" in args.overrides:
        parser.error("set label smoothing with --label_smoothing, not --config_overrides")
    if "vocab_size" in args.overrides:
        parser.error("vocab_size comes from the tokenizer; do not override it")


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    recipe_task = RECIPES[args.recipe]["task"] if args.recipe in RECIPES else None
    args.task = args.task or recipe_task or ("translation" if args.train_file else "g2p")
    if args.init_from is not None and args.preset is not None:
        parser.error("--init_from takes the model's config from the folder; drop --preset (change fields with "
                     "--config_overrides)")
    try:
        defaults = flag_defaults(args.task, args.recipe)
    except ValueError as error:
        parser.error(str(error))
    for key, value in defaults.items():
        if getattr(args, key) is None and not (key == "preset" and args.init_from is not None):
            setattr(args, key, value)
    _check_args(parser, args)
    try:
        make_settings(args).validate(as_flags=True)  # the settings' own rules, named by their flags
    except ValueError as error:
        parser.error(str(error))
    return args


def make_settings(args) -> TrainingSettings:
    """The TrainingSettings of parsed vaswani-train arguments (a flag and its field share the name)."""
    given = {name: getattr(args, name) for name in _SETTING_DEFAULTS if hasattr(args, name)}
    given.update(progress_bar=not args.no_progress_bar, tensorboard=not args.no_tensorboard,
                 confirm_best=not args.no_confirm_best)
    given["mixed_precision"] = resolve_mixed_precision(given["mixed_precision"], given["cpu"])
    given["teachers"] = tuple(given.get("teachers") or ())
    return TrainingSettings(**given)


def _config_for_comparison(config) -> dict:
    d = config.to_dict()
    for key in ("transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype", "auto_map"):
        d.pop(key, None)
    return d


def _confirmation_words(confirmation: dict | None, metric: str) -> str:
    """How `confirm_best` decided, for the model card's training summary ("" when it did not run)."""
    if not confirmation:
        return ""
    best, last = confirmation["best_step"], confirmation["last_step"]
    values = confirmation[metric]
    return (f", then compared with the last step on the full dev set with greedy search (step {best}: "
            f"{values[str(best)]:.2f}, step {last}: {values[str(last)]:.2f}; step {confirmation['kept']} kept)")


def export_run(args, settings: TrainingSettings, data, tokenizer, result, num_processes: int, device: str,
               stored_dtype: str | None = None) -> dict:
    """The end product of a run (main process): show a few outputs, write the Hub-ready folder with its model card
    and metrics.json into `args.output_dir`, print the dev figures, push if asked; returns the metrics.

    `stored_dtype` ("float16", "bfloat16"): the folder stores the weights in that dtype, and the card and
    metrics.json say so (`result.dev` must then be the scores of the rounded weights: `release.release_run`)."""
    import torch

    from .evaluation import generate_texts
    from .export import push_folder, write_model_folder
    from .model_card import build_model_card, describe_optimizer, describe_schedule
    from .schedule import make_optimizer

    output_dir = Path(args.output_dir)
    model = result.model
    show = args.show if args.show is not None else SHOWN.get(data.task, data.dev_sources[:5])
    outputs = generate_texts(model, tokenizer, show) if show else []
    dev = {k: v for k, v in result.dev.items() if k != "predictions"}
    dev["max_length"] = model.generation_config.max_length
    dev["num_parameters"] = sum(p.numel() for p in model.parameters())
    metrics = {"task": data.task, "dev": dev, "best_step": result.best_step, "steps": result.step,
               "epochs_completed": result.epoch, "stopped_by": result.stopped_by,
               "train_seconds": round(result.train_seconds, 1),
               "target_tokens_per_second": round(result.target_tokens_per_second, 1),
               "num_processes": num_processes, "device": device, "history": result.history,
               "examples": dict(zip(show, outputs))}
    if result.confirmation:
        metrics["confirm_best"] = result.confirmation
    if stored_dtype:
        metrics["stored_dtype"] = stored_dtype
    n_settings = {k: v for k, v in settings_dict(settings).items()
                  if k in ("max_tokens", "grad_accum", "lr", "warmup_steps", "weight_decay", "clip_norm", "seed",
                           "mixed_precision", "num_beams", "eval_subset", "ema_decay", "average_last")}
    # the optimizer the run built (a finished run's average, which builds none: the same builder's, from its settings)
    optimizer = result.optimizer or describe_optimizer(make_optimizer(model, settings.lr,
                                                                      weight_decay=settings.weight_decay,
                                                                      kind=settings.optimizer))
    n_settings.update(num_processes=num_processes, optimizer=optimizer, schedule=describe_schedule(settings.schedule))
    if settings.teachers:
        n_settings["distillation"] = (f"token-level, from the mean distribution of {len(settings.teachers)} "
                                      f"teacher(s) ({', '.join(Path(t).name for t in settings.teachers)}), top "
                                      f"{settings.distill_top_k}, weight {settings.distill_alpha} against the labels'")
    summary = (f"{result.step} updates ({result.epoch} full epochs, stopped by {result.stopped_by}) in "
               f"{result.train_seconds / 60:.1f} minutes on {num_processes} process(es) "
               f"({device}), about {result.target_tokens_per_second:.0f} target tokens/s; "
               + (f"the average of the weights of the last {len(result.averaged_steps)} checkpoints (steps "
                  f"{', '.join(map(str, result.averaged_steps))}) was exported" if result.averaged_steps else
                  f"the best step by dev {data.metric} on a {settings.eval_subset or 'full'}-source dev subset was "
                  "kept" + _confirmation_words(result.confirmation, data.metric))
               + (f" (weights: exponential moving average, decay {settings.ema_decay})." if settings.ema_decay
                  else "."))
    weights = (f"the average of steps {', '.join(map(str, result.averaged_steps))}" if result.averaged_steps
               else f"step {result.best_step}") + (f", stored in {stored_dtype}" if stored_dtype else "")
    card = build_model_card(
        task=data.task, model_name=args.hub_model_id.split("/")[-1] if args.hub_model_id else
        f"vaswani-{data.task}", config=model.config, dev=dev, dev_size=len(data.dev_sources),
        weights=weights, data_description=data.description, training_summary=summary,
        settings=n_settings, repo_id=args.hub_model_id, predictions=list(zip(show, outputs)),
        examples=show[:3], license=args.license)
    write_model_folder(output_dir, model.to(getattr(torch, stored_dtype)) if stored_dtype else model, tokenizer,
                       card=card, metrics=metrics)
    spec = data.spec
    what = " ".join(f"{k.upper()} {dev[k]:.2f}%" if spec.percent else f"{k} {dev[k]:.2f}" for k in spec.metrics)
    print(f"\nDev ({len(data.dev_sources)} {spec.unit}, beam {settings.num_beams}, {weights}): {what}")
    for source, output in zip(show, outputs):
        print(f"  {source:<14} {output}")
    if args.push_to_hub:
        url = push_folder(output_dir, args.hub_model_id, private=args.hub_private)
        print(f"Pushed to {url}")
    best = f"best step {result.best_step}" if result.best_step is not None else "no evaluation"
    print(f"Done: {result.step} updates (stopped by {result.stopped_by}), {best}, dev {what} ({weights}); "
          f"the model is in {output_dir}")
    return metrics


def main(argv=None) -> int:
    """`vaswani-train`: 0 once the model folder is written; bad arguments or data end with one line
    `vaswani-train: error: ...` on stderr."""
    run_training(parse_args(argv))
    return 0


def run_training(args) -> dict:
    """Train and export for parsed arguments (`parse_args`); returns the metrics written to
    `<output_dir>/metrics.json` (on the main process; {} on the others)."""
    deadline = Deadline(args.time_budget) if args.time_budget is not None else None  # counts data and tokenizer too
    _configure_logging()
    settings = make_settings(args)
    settings.validate()

    from .loop import make_accelerator, train
    from .model_card import check_metadata

    check_metadata(args.license, "text2text-generation")
    accelerator = make_accelerator(settings)
    try:
        data = task_data(args)
    except ValueError as error:
        raise SystemExit(f"vaswani-train: error: {error}") from None
    accelerator.print(data.description)
    tokenizer = _run_tokenizer(args, data, accelerator)
    if settings.teachers:
        from .distillation import check_tokenizers

        try:
            check_tokenizers(settings.teachers, tokenizer)
        except ValueError as error:
            raise SystemExit(f"vaswani-train: error: {error}") from None
    config = _run_config(args, tokenizer, accelerator)

    result = train(config, tokenizer, data, settings, accelerator, deadline=deadline)
    if result.already_finished:  # the run's model folder stands as it was written
        accelerator.print(f"the model of that run is in {args.output_dir}, unchanged")
        accelerator.end_training()
        return json.loads((Path(args.output_dir) / EXPORTED).read_text(encoding="utf-8"))

    metrics = {}
    if accelerator.is_main_process:
        metrics = export_run(args, settings, data, tokenizer, result, accelerator.num_processes,
                             accelerator.device.type)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return metrics


def saved_arguments(run_dir) -> argparse.Namespace:
    """The parsed arguments a run saved in its folder (training_args.json), as `parse_args` returned them."""
    return argparse.Namespace(**json.loads((Path(run_dir) / "training_args.json").read_text(encoding="utf-8")))


def task_data(args):
    """The `tasks.TaskData` of parsed arguments (a run's, or its saved training_args.json, where runs from before
    the paragraph task lack its flags)."""
    from .tasks import load_task_data

    return load_task_data(args.task, args.train_file, args.validation_file, args.source_column, args.target_column,
                          args.dev_percent, paragraph_words=getattr(args, "paragraph_words", PARAGRAPH_WORDS),
                          paragraph_lines=getattr(args, "paragraph_lines", (TRAIN_LINES, DEV_LINES)), seed=args.seed)


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "datasets", "huggingface_hub", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # "Removed shared tensor": tied weights, harmless


def _run_tokenizer(args, data, accelerator):
    """The run's tokenizer: given, saved by the run being resumed, or trained now (once, on the main process)."""
    from vaswani import VaswaniTokenizer
    from vaswani.tokenizer import TokenizerTrainingError

    from .tasks import build_tokenizer

    state_dir = Path(args.output_dir) / CHECKPOINT_DIR
    saved_tokenizer = state_dir / "tokenizer"
    if args.tokenizer:
        tokenizer_dir = Path(args.tokenizer)
    elif args.resume and (saved_tokenizer / "tokenizer_config.json").is_file():
        tokenizer_dir = saved_tokenizer
    else:
        tokenizer_dir = saved_tokenizer
        if accelerator.is_main_process:
            try:
                refuse_older_run(state_dir, args.resume)
            except ValueError as error:
                raise SystemExit(f"vaswani-train: error: {error}") from None
            try:
                build_tokenizer(data, tokenizer_dir, args.tokenizer_vocab_size, args.tokenizer_model_type)
            except TokenizerTrainingError as error:
                raise SystemExit(f"vaswani-train: error: training the tokenizer: {error} (for options this command "
                                 "lacks, train one with vaswani-train-tokenizer and pass --tokenizer)") from None
    accelerator.wait_for_everyone()
    return VaswaniTokenizer.from_pretrained(tokenizer_dir)


def build_config(args, vocab_size: int, tokenizer=None):
    """The model config of parsed vaswani-train arguments: the preset (or the config of the --init_from model), the
    overrides, the label smoothing, the vocabulary (and with --word_positions, the tokenizer's boundary id)."""
    from vaswani import VaswaniConfig

    fields = {**args.overrides, "vocab_size": vocab_size, "label_smoothing": args.label_smoothing}
    if getattr(args, "word_positions", False):
        fields["word_boundary_token_id"] = word_boundary_id(tokenizer)
    if getattr(args, "init_from", None) is not None:
        return VaswaniConfig.from_dict({**VaswaniConfig.get_config_dict(args.init_from)[0], **fields})
    return VaswaniConfig.from_preset(args.preset, **fields)


def word_boundary_id(tokenizer) -> int:
    """The id of the word boundary piece in `tokenizer`, which must hold it as one piece of its own."""
    ids = tokenizer(WORD_BOUNDARY, add_special_tokens=False)["input_ids"]
    if len(ids) != 1 or ids[0] == tokenizer.unk_token_id:
        raise ValueError(f"--word_positions: the tokenizer has no piece of its own for the word boundary "
                         f"{WORD_BOUNDARY!r} (it gives {ids}); train on --task g2p-paragraph, whose tokenizer keeps "
                         "it as one piece")
    return ids[0]


def _run_config(args, tokenizer, accelerator):
    """The run's model config, checked against the one saved by the run being resumed, and saved (main process)."""
    import torch

    from vaswani import VaswaniConfig

    output_dir = Path(args.output_dir)
    state_dir = output_dir / CHECKPOINT_DIR
    try:
        config = build_config(args, len(tokenizer), tokenizer)
    except (TypeError, ValueError) as error:
        raise SystemExit(f"vaswani-train: error: bad model config: {error}") from None
    if args.resume and (state_dir / "config.json").is_file():
        before, now = _config_for_comparison(VaswaniConfig.from_pretrained(state_dir)), _config_for_comparison(config)
        if before != now:
            changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            raise SystemExit(f"vaswani-train: error: --resume with a different model config ({', '.join(changed)}); "
                             "use the same --preset/--config_overrides as the run being resumed")
    if accelerator.is_main_process:
        state_dir.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(state_dir)
        (output_dir / "training_args.json").write_text(json.dumps(vars(args), indent=1, default=str), encoding="utf-8")
    base = f"the config of {args.init_from}" if args.init_from is not None else f"preset {args.preset}"
    accelerator.print(f"model: {base}, {json.dumps(args.overrides)}; vocab {len(tokenizer)}; "
                      f"{accelerator.num_processes} process(es), {accelerator.distributed_type}, "
                      f"{torch.get_num_threads()} thread(s) each")
    return config
