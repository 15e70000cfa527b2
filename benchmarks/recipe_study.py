"""The G2P recipe study: run one training setting and record it, or print the table of every setting recorded.

    python benchmarks/recipe_study.py run NAME [--threads 1] -- TRAIN.PY ARGUMENTS...   # after --: as written
    python benchmarks/recipe_study.py decode NAME [--weights ema raw] [--beams 1 4] [--length_penalty 1.0]
    python benchmarks/recipe_study.py decode NAME --model models/vaswani-g2p [--beams ...] [--length_penalty ...]
    python benchmarks/recipe_study.py table            # benchmarks/recipe_study.jsonl as one markdown table

`run` trains `scripts/train.py ARGUMENTS --output_dir outputs/study/NAME` (the main job's defaults, plus what the
arguments change), then appends one row to benchmarks/recipe_study.jsonl: the name, the arguments, the updates,
target tokens/s, train seconds, dev WER/PER of the final evaluation (the full dev set), the subset curve, the
machine (CPU model, family, AVX-512 or not), the threads and the time. Every run goes in, kept and dropped alike.

`decode` scores a finished run's last checkpoint again on the full dev set, for the choices made after training:
its moving average of the weights or its raw weights, the beam size and the length penalty (one row each). With
`--model DIR` it scores a saved model folder instead (a release, such as the shipped models/vaswani-g2p; the
weights as saved), on the dev set of the default g2p task; NAME labels its rows.

Screening runs use `--max_steps` (the result is a function of the updates, not of the machine's speed, so two of
them may share the machine on one thread each); runs that measure a time budget must have the machine alone.
Choices are made on the dev set only (the shipped training file's crc32 dev split); no other split is used.

This is not library code: nothing in the package imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "recipe_study.jsonl"


def machine() -> str:
    """"AMD EPYC family 25 model 1, AVX2, 2 cores": what the figures of a row depend on."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    vector = "AVX-512" if "avx512f" in info.get("flags", "").split() else "AVX2"
    return (f"{info.get('model name', '?')} family {info.get('cpu family', '?')} model {info.get('model', '?')}, "
            f"{vector}, {os.cpu_count()} cores")


def run(name: str, threads: int, train_args: list[str]) -> dict:
    output_dir = ROOT / "outputs" / "study" / name
    if (output_dir / "metrics.json").is_file():
        raise SystemExit(f"recipe_study: {output_dir} holds a finished run; choose another NAME")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), *train_args, "--output_dir", str(output_dir),
               "--no_progress_bar", "--no_tensorboard"]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(output_dir.parent / f"{name}.log", "w", encoding="utf-8") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=ROOT)
    metrics = json.loads((output_dir / "metrics.json").read_text(encoding="utf-8"))
    row = {"name": name, "args": train_args, "updates": metrics["steps"], "best_step": metrics["best_step"],
           "stopped_by": metrics["stopped_by"], "target_tokens_per_second": metrics["target_tokens_per_second"],
           "train_seconds": metrics["train_seconds"], "wer": metrics["dev"]["wer"], "per": metrics["dev"]["per"],
           "num_beams": metrics["dev"].get("num_beams"),
           "curve": [(h["step"], round(h["wer"], 2)) for h in metrics["history"]],
           "machine": machine(), "threads": threads, "started": started}
    with open(RECORDS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return row


def decode(name: str, weights: list[str], beams: list[int], length_penalties: list[float],
           model_dir: str | None = None) -> list[dict]:
    import torch
    from safetensors.torch import load_file

    from vaswani import VaswaniForConditionalGeneration, VaswaniTokenizer
    from vaswani.training.checkpoints import latest_valid_checkpoint
    from vaswani.training.cli import parse_args, saved_arguments, task_data
    from vaswani.training.evaluation import evaluate
    from vaswani.training.tasks import encode_pairs
    from vaswani.training.train_state import load_weights

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if model_dir is not None:  # a saved folder: its weights as they are, the default g2p task's dev set
        run_dir, data, last = Path(model_dir), task_data(parse_args([])), None
        tokenizer, weights = VaswaniTokenizer.from_pretrained(run_dir), ["saved"]
        step = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8")).get("dev", {}).get("step") \
            if (run_dir / "metrics.json").is_file() else None
    else:
        run_dir = ROOT / "outputs" / "study" / name
        data = task_data(saved_arguments(run_dir))
        tokenizer = VaswaniTokenizer.from_pretrained(run_dir / "checkpoints" / "tokenizer")
        last = latest_valid_checkpoint(run_dir / "checkpoints")
        step = last.step
    examples = encode_pairs(tokenizer, data.dev_pairs)
    rows = []
    for kind in weights:
        model = VaswaniForConditionalGeneration.from_pretrained(run_dir).eval()
        if last is not None:
            load_weights(model, load_file(str(last.path / ("ema.safetensors" if kind == "ema" else
                                                           "model.safetensors"))))
        for num_beams in sorted(set(beams)):
            for penalty in length_penalties if num_beams > 1 else [1.0]:
                model.generation_config.length_penalty = penalty
                dev = evaluate(model, tokenizer, data.task, data.dev_sources, data.dev_references, examples,
                               num_beams=num_beams, max_length=model.generation_config.max_length)
                row = {"name": name, "decode": {"weights": kind, "step": step, "num_beams": num_beams,
                                                "length_penalty": penalty},
                       "wer": dev["wer"], "per": dev["per"], "machine": machine(),
                       "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
                rows.append(row)
                with open(RECORDS, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row))
    return rows


def table() -> str:
    rows = [json.loads(line) for line in RECORDS.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = ["| setting | arguments | updates | target tokens/s (threads) | dev WER | dev PER | machine | started |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "decode" in r:
            d = r["decode"]
            step = "?" if d.get("step") is None else f"{d['step']:,}"  # a saved folder without metrics.json
            lines.append(f"| {r['name']}, decoded again | {d['weights']} weights of step {step}, beam "
                         f"{d['num_beams']}, length penalty {d['length_penalty']} | | | {r['wer']:.2f} % | "
                         f"{r['per']:.2f} % | {r['machine']} | {r['started']} |")
            continue
        lines.append(f"| {r['name']} | `{' '.join(r['args'])}` | {r['updates']:,} | "
                     f"{r['target_tokens_per_second']:,.0f} ({r['threads']}) | {r['wer']:.2f} % | {r['per']:.2f} % | "
                     f"{r['machine']} | {r['started']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train one setting and record it")
    r.add_argument("name")
    r.add_argument("--threads", type=int, default=1)
    d = sub.add_parser("decode", help="score a finished run's last checkpoint again (weights, beam, length penalty)")
    d.add_argument("name")
    d.add_argument("--weights", nargs="+", choices=("ema", "raw"), default=["ema", "raw"])
    d.add_argument("--beams", nargs="+", type=int, default=[1, 4])
    d.add_argument("--length_penalty", nargs="+", type=float, default=[1.0])
    d.add_argument("--model", help="a saved model folder to score instead of outputs/study/NAME's last checkpoint")
    sub.add_parser("table", help="print the table of every recorded run")
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    options = parser.parse_args(ours)
    if options.command == "run":  # everything after "--" goes to scripts/train.py as written
        run(options.name, options.threads, train_args)
    elif options.command == "decode":
        decode(options.name, options.weights, options.beams, options.length_penalty, options.model)
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
