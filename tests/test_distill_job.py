"""scripts/distill_job.sh, the distillation pipeline, run against stand-ins of scripts/train.py and
scripts/pseudo_label.py that record their arguments: the parts in order with the budgets and files each is given,
the student's extra arguments passed on, the wider teacher added by WIDE_TEACHER_BUDGET, bad sizes and budgets
refused before anything runs, finished parts kept and an interrupted one resumed on a rerun, and a part
that fails stops the rest. (The training and the pseudo-labelling themselves are tested in
test_training_distillation.py and test_training_pseudo_labels.py.)"""

import os
import subprocess

import pytest
from helpers import script_workspace

STAND_IN = r"""#!/usr/bin/env bash
# records each call, and in $CALLS.threads the folder and OMP_NUM_THREADS of each training; a training writes
# metrics.json in its --output_dir (fails if it is $FAIL_IN; if it is $WAIT_IN, it first waits up to 20 s for every
# file in $WAIT_FOR, and fails if one does not appear), a pseudo-label run writes its --output
echo "$*" >> "$CALLS"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        --output_dir) dir=${args[i + 1]} ;;
        --output) output=${args[i + 1]} ;;
    esac
done
if [[ $1 == scripts/train.py ]]; then
    echo "$dir ${OMP_NUM_THREADS:-unset}" >> "$CALLS.threads"
    echo "training $dir"
    mkdir -p "$dir" && touch "$dir/started"
    [[ $dir == "${FAIL_IN:-}" ]] && exit 1
    if [[ $dir == "${WAIT_IN:-}" ]]; then
        for file in $WAIT_FOR; do
            for ((tries = 0; tries < 200; tries++)); do [[ -e $file ]] && break; sleep 0.1; done
            [[ -e $file ]] || exit 3
        done
    fi
    echo '{}' > "$dir/metrics.json"
else
    echo "WORD	W ER D" > "$output"
fi
"""


@pytest.fixture
def repo(tmp_path):
    """A copy of the script in a folder laid out like the repository, with stand-ins for what it runs."""
    return script_workspace(tmp_path, ("distill_job.sh",), STAND_IN)


def _run(repo, *args, check=True, **env):
    calls = repo / "calls.log"
    calls.unlink(missing_ok=True)
    (repo / "calls.log.threads").unlink(missing_ok=True)
    result = subprocess.run(["bash", str(repo / "scripts" / "distill_job.sh"), *args], capture_output=True, text=True,
                            env={**os.environ, "CALLS": str(calls), **env}, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result, lines


def test_the_parts_run_in_order_with_their_budgets_and_files(repo):
    _, calls = _run(repo, "out", "--seed", "3", TEACHER_BUDGET="7m", WORDS="500", STUDENT_BUDGET="9m")
    teachers = [f"out/teacher-{n}" for n in (1500, 3000, 6000)]
    assert calls == [
        *(f"scripts/train.py --task g2p --output_dir {t} --time_budget 7m --num_beams 1 --no_progress_bar "
          f"--max_tokens {n}" for t, n in zip(teachers, (1500, 3000, 6000))),
        f"scripts/pseudo_label.py --words 500 --output out/train_plus.tsv --teachers {' '.join(teachers)}",
        f"scripts/train.py --task g2p --output_dir out/student --time_budget 9m --train_file out/train_plus.tsv "
        f"--tokenizer out/teacher-1500 --teachers {' '.join(teachers)} --distill_alpha 0.8 --seed 3",
    ]


def test_the_defaults_fill_about_an_hour(repo):
    _, calls = _run(repo, "out")
    assert sum("--time_budget 10m" in c for c in calls) == 3
    assert "--words 80000" in calls[3] and "--time_budget 23m" in calls[4]


def test_a_rerun_keeps_the_finished_parts_and_resumes_the_interrupted_one(repo):
    _, first = _run(repo, "out", FAIL_IN="out/teacher-3000", check=False)
    assert len(first) == 2  # the first teacher, then the second, which failed: nothing after it ran
    assert not (repo / "out" / "student").exists()
    (repo / "out" / "teacher-3000" / "checkpoints" / "checkpoint-200").mkdir(parents=True)
    result, calls = _run(repo, "out")
    assert "out/teacher-1500 has finished" in result.stdout
    assert calls[0].startswith("scripts/train.py --task g2p --output_dir out/teacher-3000 --resume --time_budget")
    assert [c.split()[0] for c in calls] == ["scripts/train.py"] * 2 + ["scripts/pseudo_label.py", "scripts/train.py"]
    result, calls = _run(repo, "out")
    assert calls == [] and result.stdout.count("has finished") == 4


def test_teacher_tokens_names_the_teachers(repo):
    _, calls = _run(repo, "out", TEACHER_TOKENS=" 2000  1000 ")
    assert [c.split()[4] for c in calls[:2]] == ["out/teacher-2000", "out/teacher-1000"]
    assert "--max_tokens 2000" in calls[0] and "--max_tokens 1000" in calls[1]
    assert calls[2].endswith("--teachers out/teacher-2000 out/teacher-1000")
    assert "--tokenizer out/teacher-2000 --teachers out/teacher-2000 out/teacher-1000 --distill_alpha" in calls[3]



def test_wide_teacher_budget_adds_a_wider_teacher_with_dropout(repo):
    _, calls = _run(repo, "out", TEACHER_BUDGET="15m", WIDE_TEACHER_BUDGET="1H 30m")
    assert calls[3] == ("scripts/train.py --task g2p --output_dir out/teacher-wide --time_budget 1H 30m --num_beams 1 "
                        "--no_progress_bar --config_overrides d_model=192,encoder_ffn_dim=768,decoder_ffn_dim=768,"
                        "dropout=0.1")
    teachers = "out/teacher-1500 out/teacher-3000 out/teacher-6000 out/teacher-wide"
    assert calls[4].endswith(f"--teachers {teachers}")
    assert f"--tokenizer out/teacher-1500 --teachers {teachers} --distill_alpha 0.8" in calls[5]
    assert len(calls) == 6 and not any("teacher-wide" in c for c in _run(repo, "other")[1])


def test_teacher_config_changes_the_three_teachers_model_and_nothing_else(repo):
    _, calls = _run(repo, "out", "--seed", "3", TEACHER_CONFIG="encoder_layers=6,decoder_layers=2",
                    WIDE_TEACHER_BUDGET="1h")
    assert all(c.endswith(f"--max_tokens {n} --config_overrides encoder_layers=6,decoder_layers=2")
               for c, n in zip(calls[:3], (1500, 3000, 6000)))
    assert calls[3].endswith("--config_overrides d_model=192,encoder_ffn_dim=768,decoder_ffn_dim=768,dropout=0.1")
    assert "config_overrides" not in calls[4] + calls[5] and calls[5].endswith("--distill_alpha 0.8 --seed 3")


@pytest.mark.parametrize("value", ["encoder_layers", "encoder_layers=6 decoder_layers=2", "encoder_layers=6,",
                                   "=6", "encoder_layers==6"])
def test_a_bad_teacher_config_stops_before_anything_runs(repo, value):
    result, calls = _run(repo, "out", check=False, TEACHER_CONFIG=value)
    assert result.returncode == 2 and "TEACHER_CONFIG must be config settings for --config_overrides" in result.stderr
    assert f"got '{value}'" in result.stderr and calls == []


@pytest.mark.parametrize("name", ["TEACHER_BUDGET", "WIDE_TEACHER_BUDGET", "STUDENT_BUDGET"])
@pytest.mark.parametrize("value", ["10min", "1hour", "0m", "m", "ten"])
def test_a_bad_budget_stops_before_anything_runs(repo, name, value):
    result, calls = _run(repo, "out", check=False, **{name: value})
    assert result.returncode == 2 and f"{name} must be a time like 10m" in result.stderr and calls == []
    assert f"got '{value}'" in result.stderr

@pytest.mark.parametrize("value, message", [
    ("1500 3k", "TEACHER_TOKENS must be batch sizes in tokens"),
    ("1500 0", "TEACHER_TOKENS must be batch sizes in tokens"),
    ("   ", "TEACHER_TOKENS names no batch size"),
    ("3000 1500 3000", "TEACHER_TOKENS names a batch size twice"),
])
def test_bad_teacher_tokens_stop_before_anything_runs(repo, value, message):
    result, calls = _run(repo, "out", check=False, TEACHER_TOKENS=value)
    assert result.returncode == 2 and message in result.stderr and calls == []


def test_without_an_output_folder_it_says_how_to_call_it(repo):
    result, calls = _run(repo, check=False)
    assert result.returncode != 0 and "usage: bash scripts/distill_job.sh OUTPUT" in result.stderr and calls == []


def _threads(repo):
    return dict(line.split() for line in (repo / "calls.log.threads").read_text().splitlines())


def test_teacher_jobs_trains_teachers_side_by_side_on_a_share_of_the_cores_each(repo):
    # teacher-1500 waits for teacher-2000 to start: run one after the other, it would wait in vain and fail
    result, calls = _run(repo, "out", TEACHER_JOBS="2", TEACHER_TOKENS="1500 2000 3000 6000", TEACHER_BUDGET="15m",
                         WAIT_IN="out/teacher-1500", WAIT_FOR="out/teacher-2000/started", OMP_NUM_THREADS="7")
    teachers = [f"out/teacher-{n}" for n in (1500, 2000, 3000, 6000)]
    assert sorted(c.split()[4] for c in calls[:4]) == teachers and all("--time_budget 15m" in c for c in calls[:4])
    assert calls[4].endswith(f"--teachers {' '.join(teachers)}")  # the order given, whichever finished first
    assert f"--tokenizer out/teacher-1500 --teachers {' '.join(teachers)} --distill_alpha 0.8" in calls[5]
    threads = _threads(repo)
    assert [threads[t] for t in teachers] == ["3"] * 4  # half of the 7 threads the caller allows (nproc)
    assert threads["out/student"] == "7"  # the student runs as the caller set it
    assert "teacher-2000: training out/teacher-2000" in result.stdout.splitlines()


def test_teacher_jobs_gives_the_longest_budget_a_queue_of_its_own(repo):
    # the wide teacher (1 h) waits for the three 15-minute ones to finish: queued before any of them, it would wait
    # in vain
    finished = " ".join(f"out/teacher-{n}/metrics.json" for n in (1500, 3000, 6000))
    _, calls = _run(repo, "out", TEACHER_JOBS="2", TEACHER_BUDGET="15m", WIDE_TEACHER_BUDGET="1h",
                    WAIT_IN="out/teacher-wide", WAIT_FOR=finished)
    assert sorted(c.split()[4] for c in calls[:4])[-1] == "out/teacher-wide"
    assert calls[4].endswith("--teachers out/teacher-1500 out/teacher-3000 out/teacher-6000 out/teacher-wide")


def test_teacher_jobs_stops_before_the_student_when_a_teacher_fails_and_a_rerun_resumes(repo):
    result, calls = _run(repo, "out", check=False, TEACHER_JOBS="2", FAIL_IN="out/teacher-3000")
    assert result.returncode != 0 and "a teacher failed" in result.stderr
    assert all(c.startswith("scripts/train.py") for c in calls) and not (repo / "out" / "student").exists()
    assert (repo / "out" / "teacher-1500" / "metrics.json").exists()  # the other queue's teacher is kept
    result, calls = _run(repo, "out", TEACHER_JOBS="2")
    assert "teacher-1500: distill_job: out/teacher-1500 has finished" in result.stdout
    assert [c.split()[0] for c in calls].count("scripts/train.py") == 2  # teacher-3000, then the student


def test_more_jobs_than_teachers_gives_each_teacher_its_share(repo):
    _run(repo, "out", TEACHER_JOBS="8", TEACHER_TOKENS="1500 3000", OMP_NUM_THREADS="7")
    assert [_threads(repo)[f"out/teacher-{n}"] for n in (1500, 3000)] == ["3"] * 2


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_teacher_jobs_stops_before_anything_runs(repo, value):
    result, calls = _run(repo, "out", check=False, TEACHER_JOBS=value)
    assert result.returncode == 2 and "TEACHER_JOBS must be how many teachers train at once" in result.stderr
    assert f"got '{value}'" in result.stderr and calls == []
