"""scripts/hour_job.sh, the hour's one command, run against stand-ins of scripts/train.py and scripts/pseudo_label.py
that record their arguments (the probe's training writes a log at the rate the test sets), with the real
scripts/distill_job.sh and the real plan (`python -m vaswani.training.recipes hour-plan`): the probe decides between
distillation and one model for the hour, the plan is kept for a rerun, HOUR_PLAN skips the probe, bad settings stop
before anything runs. (The decision's function is tested in test_training_recipes.py, the pipeline's parts in
test_distill_job.py.)"""

import os
import subprocess
import sys

import pytest
from helpers import script_workspace

STAND_IN = r"""#!/usr/bin/env bash
# `-m vaswani.training.recipes` runs the real module; a training records its call and writes metrics.json in its
# --output_dir (a probe, whose folder ends in /probe, first a train_log.jsonl at $RATE updates a second; fails if it
# is $FAIL_IN); a pseudo-label run writes its --output
if [[ $1 == -m ]]; then exec "$REAL_PYTHON" "$@"; fi
echo "$*" >> "$CALLS"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        --output_dir) dir=${args[i + 1]} ;;
        --output) output=${args[i + 1]} ;;
        --max_steps) steps=${args[i + 1]} ;;
    esac
done
if [[ $1 == scripts/train.py ]]; then
    mkdir -p "$dir"
    [[ $dir == "${FAIL_IN:-}" ]] && { echo "the probe broke"; exit 1; }
    if [[ $dir == */probe ]]; then
        for ((step = 20; step <= steps; step += 20)); do
            echo "{\"step\": $step, \"loss\": 1.0, \"elapsed\": $(awk -v s=$step -v r="$RATE" 'BEGIN {print s / r}')}"
        done > "$dir/train_log.jsonl"
    fi
    echo '{}' > "$dir/metrics.json"
else
    echo "WORD	W ER D" > "$output"
fi
"""


@pytest.fixture
def repo(tmp_path):
    """A copy of the scripts in a folder laid out like the repository, with stand-ins for what they run."""
    return script_workspace(tmp_path, ("hour_job.sh", "distill_job.sh"), STAND_IN)


def _run(repo, *args, check=True, **env):
    calls = repo / "calls.log"
    calls.unlink(missing_ok=True)
    result = subprocess.run(["bash", str(repo / "scripts" / "hour_job.sh"), *args], capture_output=True, text=True,
                            cwd=repo, timeout=60,
                            env={**os.environ, "CALLS": str(calls), "REAL_PYTHON": sys.executable, **env})
    if check:
        assert result.returncode == 0, result.stderr
    return result, calls.read_text().splitlines() if calls.exists() else []


PROBE = ("scripts/train.py --task g2p --max_steps 300 --eval_every 0 --save_every 0 --num_beams 1 --log_every 20 "
         "--no_progress_bar --no_tensorboard --output_dir out/probe")


def test_on_a_slow_host_the_hour_trains_one_model(repo):
    result, calls = _run(repo, "out", "--seed", "3", RATE="8.8")
    assert calls == [PROBE, "scripts/train.py --recipe g2p-1h --time_budget 58m --output_dir out/single --seed 3"]
    assert "makes 8.80 updates a second here: the plan is single" in result.stdout
    assert (repo / "out" / "hour_plan.txt").read_text() == "single 8.80\n"
    assert os.readlink(repo / "out" / "model") == "single"
    assert result.stdout.strip().endswith("the hour's model is out/model (out/single)")


def test_on_a_fast_host_the_hour_distills(repo):
    result, calls = _run(repo, "out", "--seed", "3", RATE="14.3")
    assert calls[0] == PROBE and "the plan is distill" in result.stdout
    teachers = [f"out/teacher-{n}" for n in (1500, 3000, 6000)]
    assert [c.split()[4] for c in calls[1:4]] == teachers and all("--time_budget 10m" in c for c in calls[1:4])
    assert calls[4].startswith("scripts/pseudo_label.py --words 80000")
    assert calls[5].startswith("scripts/train.py --task g2p --output_dir out/student --time_budget 23m")
    assert calls[5].endswith("--distill_alpha 0.8 --seed 3") and len(calls) == 6
    assert os.readlink(repo / "out" / "model") == "student"


def test_the_threshold_is_the_modules(repo):
    from vaswani.training.recipes import HOUR_DISTILL_MIN_RATE

    # just either side of it (the boundary itself, where a log's rounding decides, is hour_plan's own test)
    _, calls = _run(repo, "out", RATE=str(HOUR_DISTILL_MIN_RATE + 0.01))
    assert "out/student" in calls[-1]
    _, calls = _run(repo, "other", RATE=str(HOUR_DISTILL_MIN_RATE - 0.01))
    assert "other/single" in calls[-1]


def test_a_rerun_keeps_the_plan_and_resumes_the_model(repo):
    _run(repo, "out", RATE="8.8", FAIL_IN="out/single", check=False)
    (repo / "out" / "single" / "checkpoints" / "checkpoint-500").mkdir(parents=True)
    result, calls = _run(repo, "out", RATE="20")  # the host is faster now: the plan stays the one recorded
    assert "the plan recorded in out/hour_plan.txt: single (8.80 updates a second)" in result.stdout
    assert calls == ["scripts/train.py --recipe g2p-1h --time_budget 58m --output_dir out/single --resume"]
    result, calls = _run(repo, "out")
    assert calls == [] and "out/single has finished" in result.stdout


def test_hour_plan_and_single_budget_set_the_plan_without_a_probe(repo):
    _, calls = _run(repo, "out", HOUR_PLAN="single", SINGLE_BUDGET="45m")
    assert calls == ["scripts/train.py --recipe g2p-1h --time_budget 45m --output_dir out/single"]
    _, calls = _run(repo, "fast", HOUR_PLAN="distill", TEACHER_BUDGET="7m")
    assert "probe" not in " ".join(calls) and "--time_budget 7m" in calls[0] and "fast/student" in calls[-1]
    assert not (repo / "fast" / "hour_plan.txt").exists()


def test_a_failed_probe_stops_and_says_where_its_output_is(repo):
    result, calls = _run(repo, "out", RATE="9", FAIL_IN="out/probe", check=False)
    assert result.returncode == 1 and "the probe failed, its output is in out/probe.log" in result.stderr
    assert calls == [PROBE] and "the probe broke" in (repo / "out" / "probe.log").read_text()
    assert not (repo / "out" / "hour_plan.txt").exists()


@pytest.mark.parametrize("name, value, message", [
    ("HOUR_PLAN", "both", "HOUR_PLAN must be distill or single"),
    ("PROBE_STEPS", "150", "PROBE_STEPS must be at least 200 updates"),
    ("PROBE_STEPS", "3e2", "PROBE_STEPS must be at least 200 updates"),
    ("SINGLE_BUDGET", "58min", "SINGLE_BUDGET must be a time like 58m"),
    ("SINGLE_BUDGET", "0m", "SINGLE_BUDGET must be a time like 58m"),
])
def test_bad_settings_stop_before_anything_runs(repo, name, value, message):
    result, calls = _run(repo, "out", check=False, RATE="9", **{name: value})
    assert result.returncode == 2 and message in result.stderr and f"got '{value}'" in result.stderr
    assert calls == [] and not (repo / "out").exists()


def test_without_an_output_folder_it_says_how_to_call_it(repo):
    result, calls = _run(repo, check=False)
    assert result.returncode != 0 and "usage: bash scripts/hour_job.sh OUTPUT" in result.stderr and calls == []
