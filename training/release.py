"""`vaswani-release`: the small Hub-ready folder of a finished run's model, its weights stored in 16 bits and scored
again. `python scripts/release_model.py RUN_DIR RELEASE_DIR` is the same command.

A model we publish keeps its weights in float16 (or bfloat16): a G2P model in a few MB. Rounding the weights changes
the model a little, so the release is evaluated again on the run's own dev set (its training_args.json gives the
data, the beam and the length limit), and its model card and metrics.json give the figures of the weights the
folder holds. The folder's config asks for float32 (`dtype`), so `from_pretrained` computes as the weights were
scored; `dtype=torch.float16` loads them in half precision. Nothing of the training run travels (checkpoints, logs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STORED_DTYPES = ("float16", "bfloat16")
REQUIRED = ("training_args.json", "metrics.json", "config.json", "model.safetensors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-release",
        description="Write the small Hub-ready folder of a finished vaswani-train run's model: 16-bit weights, "
                    "configs, code, tokenizer, and a model card and metrics.json with the dev figures of those "
                    "16-bit weights (scored again on the run's dev set).")
    parser.add_argument("run_dir", help="the --output_dir of a finished vaswani-train run (or vaswani-average's)")
    parser.add_argument("release_dir", help="the new folder (not the run's own)")
    parser.add_argument("--dtype", choices=STORED_DTYPES, default="float16", help="how the weights are stored")
    parser.add_argument("--hub_model_id", help="the Hub id the card names (e.g. your-name/vaswani-g2p)")
    return parser


def main(argv=None) -> int:
    """`vaswani-release`: 0 once the folder is written; bad arguments end with one line on stderr (status 2)."""
    parser = build_parser()
    options = parser.parse_args(argv)
    try:
        folder = release_run(options.run_dir, options.release_dir, options.dtype, options.hub_model_id)
    except ValueError as error:
        parser.error(str(error))
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    print(f"wrote {folder} ({size / 1e6:.1f} MB)")
    return 0


def release_run(run_dir, release_dir, dtype: str = "float16", hub_model_id: str | None = None) -> Path:
    """Write `release_dir` from the finished run in `run_dir`; returns its path. Raises ValueError when the run's
    folder lacks a file of a finished run, when the two folders are one, or for another dtype."""
    import torch

    from vaswani import VaswaniForConditionalGeneration, VaswaniTokenizer

    from .cli import export_run, make_settings, saved_arguments, task_data
    from .evaluation import evaluate
    from .loop import TrainingResult
    from .tasks import encode_pairs

    run, folder = Path(run_dir), Path(release_dir)
    if dtype not in STORED_DTYPES:
        raise ValueError(f"dtype={dtype!r}: a release stores its weights in {' or '.join(STORED_DTYPES)}")
    missing = [name for name in REQUIRED if not (run / name).is_file()]
    if missing:
        raise ValueError(f"{run} has no {', '.join(missing)}: pass the --output_dir of a vaswani-train run that "
                         "finished")
    if folder.resolve() == run.resolve():
        raise ValueError("the release folder must differ from the run's folder, which keeps its own model")
    model = VaswaniForConditionalGeneration.from_pretrained(run, dtype=torch.float32).eval()
    round_saved_weights(model, getattr(torch, dtype))
    args = saved_arguments(run)
    args.output_dir, args.resume, args.push_to_hub, args.hub_model_id = str(folder), False, False, hub_model_id
    args.num_beams = model.generation_config.num_beams or 1  # as the run exported it
    settings, data = make_settings(args), task_data(args)
    tokenizer = VaswaniTokenizer.from_pretrained(run)
    dev = evaluate(model, tokenizer, data.task, data.dev_sources, data.dev_references,
                   encode_pairs(tokenizer, data.dev_pairs), num_beams=settings.num_beams,
                   max_length=model.generation_config.max_length, batch_size=settings.eval_batch_size)
    ran = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    dev["step"] = ran["dev"].get("step", ran.get("best_step"))
    averaged = ran["dev"].get("averaged_steps")
    if averaged:
        dev["averaged_steps"] = averaged
    result = TrainingResult.from_metrics(ran, dev, model, averaged)
    export_run(args, settings, data, tokenizer, result, ran["num_processes"], ran.get("device", "cpu"),
               stored_dtype=dtype)
    config_file = folder / "config.json"  # computed in float32 unless the user asks otherwise: as it was scored
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["dtype"] = "float32"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return folder


def round_saved_weights(model, dtype) -> None:
    """Round every tensor the model saves (its state dict: parameters and persistent buffers) to `dtype` and back,
    in place: the float32 model then computes what the stored weights compute once loaded in float32."""
    import torch

    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(dtype))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
