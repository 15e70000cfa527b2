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
