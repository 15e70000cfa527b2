"""Training recipes: the defaults of vaswani-train's flags for each task, and named recipes with a budget.

A recipe is a set of flag defaults; a flag given on the command line wins over it. `TASK_DEFAULTS` holds what
differs by task (every other flag defaults to its `TrainingSettings` field); `RECIPES` are named recipes
(`--recipe NAME`), each for one task and a wall-clock budget, over that task's defaults. The model comes from a
config preset (`vaswani.PRESETS`), so a recipe keeps no second copy of the model's hyperparameters.

The G2P recipes were chosen by the study in docs/recipes.md (dev set only; every setting tried is listed there with
its figure): Muon for the layers' weight matrices (Adam for the rest) at a peak of 4e-3, a learning rate that decays
linearly to zero as the budget runs out, eager attention (at CMUdict's
10-token words torch's CPU flash kernel costs more than the plain matmul and softmax), a dev evaluation every 500
updates, and bf16 autocast where the CPU multiplies bf16 in hardware (`--mixed_precision auto`: the same learning per
update, cheaper updates; float32 elsewhere).
- g2p (the main job, `scripts/main_job.sh` gives it 15 minutes): the `g2p-small` model (128 wide, 3+3 layers).
- g2p-1h: the same recipe over one hour (the 192-wide model and the hour's overfitting are measured in
  docs/recipes.md).
- g2p-paragraph: lines of 250-1,150 tokens a side, so a batch holds a few lines (4096 tokens, ~4 lines on average,
  the longest alone fits); a warm start from a word-level model is the expected use, hence the short warmup; the
  word recipe's optimizer (Muon at 4e-3, linear decay: in 8-minute screens of warm starts it learned more than Adam
  at 1e-3 with inverse square root, docs/long_inputs.md) in float32 (bf16 made fewer updates); greedy decoding (a
  beam over 600-token outputs multiplies the evaluation's cost for little); every example kept (max_source_length
  over the longest line of 128 words).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASK_DEFAULTS = {
    "g2p": dict(preset="g2p-small", max_tokens=1500, lr=4e-3, warmup_steps=100, schedule="linear",
                attn_implementation="eager", eval_every=500, save_every=500, max_steps=30000, num_beams=4,
                ema_decay=0.998, max_source_length=256, mixed_precision="auto", optimizer="muon"),
    "g2p-paragraph": dict(preset="g2p-paragraph", max_tokens=4096, lr=4e-3, warmup_steps=100, schedule="linear",
                          eval_every=500, save_every=200, max_steps=20000, num_beams=1, ema_decay=0.99,
                          max_source_length=2048, mixed_precision="no", optimizer="muon"),
    "translation": dict(preset="base", max_tokens=4096, lr=7e-4, warmup_steps=4000, schedule="inverse_sqrt",
                        eval_every=1000, save_every=1000, max_steps=100000, num_beams=4, ema_decay=0.0,
                        max_source_length=256, mixed_precision="no", optimizer="adam"),
}

RECIPES = {
    "g2p-15m": dict(task="g2p", time_budget="15m"),
    "g2p-1h": dict(task="g2p", time_budget="1h"),
}


def flag_defaults(task: str, recipe: str | None = None) -> dict:
    """The defaults of the flags for `task` under `recipe` (None: the task's own); raises ValueError when the recipe
    is for another task."""
    if recipe is None:
        return dict(TASK_DEFAULTS[task])
    if recipe not in RECIPES:
        raise ValueError(f"--recipe {recipe!r} is unknown; choose one of {', '.join(RECIPES)}")
    named = {k: v for k, v in RECIPES[recipe].items() if k != "task"}
    if RECIPES[recipe]["task"] != task:
        raise ValueError(f"--recipe {recipe} is a recipe for --task {RECIPES[recipe]['task']}, not {task}")
    return {**TASK_DEFAULTS[task], **named}


def describe(name: str, with_defaults: bool = False) -> str:
    """"g2p-1h (g2p: time_budget 1h)": a recipe as --help lists it (with its task's defaults: all its flags)."""
    recipe = RECIPES[name]
    fields = flag_defaults(recipe["task"], name) if with_defaults else {k: v for k, v in recipe.items() if k != "task"}
    return f"{name} ({recipe['task']}: " + ", ".join(f"{k} {v}" for k, v in fields.items()) + ")"


# The hour on a host: distillation (`scripts/distill_job.sh`) pays where a 10-minute teacher makes enough updates for
# its ensemble to beat one model trained for the hour, and a single model (`--recipe g2p-1h`) wins below that. The
# rate is the main job's recipe on all cores, in updates a second; the threshold and the two hosts it comes from are
# in docs/recipes.md.
HOUR_DISTILL_MIN_RATE = 12.0
HOUR_PLANS = ("distill", "single")


def probe_rate(log_path, skip_steps: int = 100) -> float:
    """Updates a second in a training's train_log.jsonl, from its first logged step at or after `skip_steps` (the
    start-up's first updates left out) to its last; raises ValueError when the log holds fewer than two such steps."""
    points = []
    for line in Path(log_path).read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if "elapsed" in record and record.get("step", -1) >= skip_steps:
            points.append((record["step"], record["elapsed"]))
    if len(points) < 2 or points[-1][1] <= points[0][1]:
        raise ValueError(f"{log_path} logs fewer than two timed steps from step {skip_steps} on: the probe must run "
                         f"past step {skip_steps} with logging on (--max_steps, --log_every)")
    (first_step, first_time), (last_step, last_time) = points[0], points[-1]
    return (last_step - first_step) / (last_time - first_time)


def hour_plan(rate: float, threshold: float = HOUR_DISTILL_MIN_RATE) -> str:
    """"distill" when the main job's recipe makes at least `threshold` updates a second on this host, else "single"."""
    return "distill" if rate >= threshold else "single"


def main(argv=None) -> int:
    """`python -m vaswani.training.recipes hour-plan TRAIN_LOG`: prints the hour's plan for a probe's log and its
    rate ("single 8.61"); 2 with one line on stderr when the log cannot say."""
    parser = argparse.ArgumentParser(prog="python -m vaswani.training.recipes")
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("hour-plan", help="the hour's plan (distill or single) from a probe's train_log.jsonl")
    plan.add_argument("train_log")
    plan.add_argument("--threshold", type=float, default=HOUR_DISTILL_MIN_RATE,
                      help="updates a second from which distillation is the plan")
    options = parser.parse_args(argv)
    try:
        rate = probe_rate(options.train_log)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    print(hour_plan(rate, options.threshold), f"{rate:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
