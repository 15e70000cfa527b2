"""vaswani.training.recipes: the flag defaults of each task and the named recipes, as vaswani-train reads them."""

from __future__ import annotations

import json

import pytest

from vaswani import PRESETS
from vaswani.training import cli
from vaswani.training.recipes import (HOUR_DISTILL_MIN_RATE, HOUR_PLANS, RECIPES, TASK_DEFAULTS, describe,
                                      flag_defaults, hour_plan, probe_rate)
from vaswani.training.recipes import main as recipes_main
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


def _log(path, rate, steps=range(20, 301, 20), start_up=7.0):
    """A train_log.jsonl as the loop writes it: a record every 20 updates, `rate` updates a second after a slower
    start (the first 100 updates take `start_up` seconds more), an evaluation record between them."""
    lines = []
    for step in steps:
        elapsed = step / rate + (start_up if step >= 100 else start_up * step / 100)
        lines.append(json.dumps({"step": step, "epoch": 0, "loss": 1.0, "lr": 1e-3, "target_tokens_per_second": 1e4,
                                 "elapsed": elapsed}))
        if step == 200:
            lines.append(json.dumps({"eval": {"step": step, "wer": 50.0}, "seconds": 0.5, "best_step": step}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_probe_rate_times_the_updates_after_the_start_up(tmp_path):
    log = _log(tmp_path / "train_log.jsonl", rate=8.5)
    assert probe_rate(log) == pytest.approx(8.5)
    assert probe_rate(log, skip_steps=0) < 8.5  # the start-up's updates counted in would slow it
    with pytest.raises(ValueError, match="fewer than two timed steps from step 100 on"):
        probe_rate(_log(tmp_path / "short.jsonl", rate=9.0, steps=range(20, 101, 20)))


def test_the_hour_plan_distills_only_on_a_host_fast_enough():
    assert hour_plan(HOUR_DISTILL_MIN_RATE) == "distill" and hour_plan(14.3) == "distill"
    assert hour_plan(HOUR_DISTILL_MIN_RATE - 0.01) == "single" and hour_plan(8.8) == "single"
    assert hour_plan(8.8, threshold=8.0) == "distill" and set(HOUR_PLANS) == {"distill", "single"}


def test_the_hour_plan_command_prints_the_plan_and_the_rate(tmp_path, capsys):
    assert recipes_main(["hour-plan", str(_log(tmp_path / "log.jsonl", rate=14.3))]) == 0
    assert capsys.readouterr().out == "distill 14.30\n"
    recipes_main(["hour-plan", str(tmp_path / "log.jsonl"), "--threshold", "15"])
    assert capsys.readouterr().out == "single 14.30\n"
    with pytest.raises(SystemExit) as stop:
        recipes_main(["hour-plan", str(tmp_path / "missing.jsonl")])
    assert stop.value.code == 2 and "missing.jsonl" in capsys.readouterr().err


def test_the_loop_logs_what_the_probe_reads(trained_run):
    out, _ = trained_run
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    timed = [r for r in records if "loss" in r]
    assert timed and all(isinstance(r["step"], int) and r["elapsed"] > 0 for r in timed)
