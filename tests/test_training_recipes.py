"""vaswani.training.recipes: the flag defaults of each task and the named recipes, as vaswani-train reads them."""

from __future__ import annotations

import pytest

from vaswani import PRESETS
from vaswani.training import cli
from vaswani.training.recipes import RECIPES, TASK_DEFAULTS, describe, flag_defaults
from vaswani.training.schedule import SCHEDULES


def test_every_recipe_names_a_task_a_budget_and_known_values():
    for name, recipe in RECIPES.items():
        assert recipe["task"] in TASK_DEFAULTS and "time_budget" in recipe, name
        defaults = flag_defaults(recipe["task"], name)
        assert defaults["preset"] in PRESETS and defaults["schedule"] in SCHEDULES, name
    for task, defaults in TASK_DEFAULTS.items():
        assert defaults["preset"] in PRESETS and defaults["schedule"] in SCHEDULES, task


def test_a_recipe_is_its_task_defaults_with_its_own_values_over_them():
    assert flag_defaults("g2p") == TASK_DEFAULTS["g2p"]
    hour = flag_defaults("g2p", "g2p-1h")
    assert hour == {**TASK_DEFAULTS["g2p"], **{k: v for k, v in RECIPES["g2p-1h"].items() if k != "task"}}
    assert hour["time_budget"] == "1h" and hour["preset"] == "g2p-small"
    with pytest.raises(ValueError, match="recipe for --task g2p, not translation"):
        flag_defaults("translation", "g2p-1h")
    with pytest.raises(ValueError, match="unknown"):
        flag_defaults("g2p", "g2p-1d")
    assert describe("g2p-1h") == "g2p-1h (g2p: time_budget 1h)"
    assert "schedule linear" in describe("g2p-1h", with_defaults=True)


def test_vaswani_train_reads_a_recipe_and_flags_win_over_it(capsys):
    args = cli.parse_args(["--recipe", "g2p-1h"])
    assert (args.task, args.time_budget, args.preset) == ("g2p", "1h", "g2p-small")
    assert args.schedule == TASK_DEFAULTS["g2p"]["schedule"] and args.max_tokens == TASK_DEFAULTS["g2p"]["max_tokens"]
    args = cli.parse_args(["--recipe", "g2p-1h", "--lr", "1e-4", "--time_budget", "2m", "--preset", "tiny"])
    assert (args.lr, args.time_budget, args.preset) == (1e-4, "2m", "tiny")
    assert cli.parse_args(["--recipe", "g2p-15m"]).time_budget == "15m"
    assert cli.parse_args([]).time_budget is None  # no recipe: nothing sets a budget
    with pytest.raises(SystemExit):
        cli.parse_args(["--recipe", "g2p-1h", "--task", "translation", "--train_file", "x"])
    assert "recipe for --task g2p" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["--recipe", "nope"])
    assert "invalid choice" in capsys.readouterr().err
