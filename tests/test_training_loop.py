"""vaswani.training.loop (run as scripts/train.py): the Hub-ready output folder, exact resume after SIGKILL (also in
bf16 and at random moments, some inside a save), the stop rule of a finished run, --average_last, data-parallel
training on 2 CPU processes, the progress total, time left and evaluation lines, and --mixed_precision auto.

Every run is a subprocess on a few hundred CMUdict lines with the tiny preset, one thread per process (tests/helpers.py,
the `train_workspace` and `trained_run` fixtures of tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import QUIET, TRAIN, mean_weights, run_train, tensors, train_env

from vaswani.training import cli


def test_end_to_end_output_folder(trained_run):
    out, result = trained_run
    files = {p.name for p in out.iterdir()}
    for name in ("config.json", "generation_config.json", "model.safetensors", "configuration_vaswani.py",
                 "modeling_vaswani.py", "positions_vaswani.py", "fast_paths_vaswani.py", "decoding_vaswani.py",
                 "onednn_vaswani.py", "attention_patterns_vaswani.py", "tokenization_vaswani.py",
                 "spm.model", "tokenizer_config.json", "README.md", "metrics.json", "train_log.jsonl", "runs", "checkpoints"):
        assert name in files, (name, files)
    assert list((out / "runs").glob("events.out.tfevents.*"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 20 and metrics["stopped_by"] == "max_steps"
    assert set(metrics["dev"]) >= {"wer", "per", "loss", "num_beams"} and 0 <= metrics["dev"]["wer"] <= 100
    assert [h["step"] for h in metrics["history"]] == [10, 20]
    assert set(metrics["examples"]) == {"HELLO", "PYTORCH"}
    assert "Dev (" in result.stdout and "WER" in result.stdout
    # --no_progress_bar: one line per log_every (20) updates; the run ends with a one-line summary
    assert any(line.startswith("step 20/20: loss ") and "target tokens/s" in line and line.endswith(" left")
               for line in result.stdout.splitlines()), result.stdout[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("Done: 20 updates (stopped by max_steps), best step ") and " dev WER " in last, last
    assert "% PER " in last and last.endswith(f"the model is in {out}")
    config = json.loads((out / "config.json").read_text())
    from vaswani import VaswaniTokenizer

    assert config["label_smoothing"] == 0.1 and config["d_model"] == 16
    assert config["vocab_size"] == len(VaswaniTokenizer.from_pretrained(out))
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and 10 <= generation["max_length"] <= 40
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["best", "checkpoint-10", "checkpoint-20", "config.json", "configuration_vaswani.py",
                           "tokenizer"]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert any("loss" in r and "lr" in r and "target_tokens_per_second" in r for r in log)


def test_sigkill_and_resume_match_an_uninterrupted_run_bit_for_bit(train_workspace, tmp_path, caplog):
    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
              "--max_steps", "150", "--save_every", "10", "--keep_last", "3", "--eval_every", "0", "--ema_decay", "0.9",
              "--show"]
    straight = tmp_path / "straight"
    result = run_train([*common, "--output_dir", str(straight)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    killed = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, str(TRAIN), *common, "--output_dir", str(killed)],
                               env=train_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    deadline = time.monotonic() + 180
    while not (killed / "checkpoints" / "checkpoint-40" / "vaswani_state.json").exists():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint written in time"
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    assert not (killed / "checkpoints" / "checkpoint-150").exists(), "the run finished before the kill"
    assert not (killed / "metrics.json").exists()

    # A newer checkpoint whose save never finished (no marker) and a leftover temporary folder: both skipped.
    steps = sorted(int(p.name.split("-")[1]) for p in (killed / "checkpoints").glob("checkpoint-*"))
    newest = steps[-1]
    partial = killed / "checkpoints" / f"checkpoint-{newest + 10}"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"truncated")
    (killed / "checkpoints" / f".tmp-checkpoint-{newest + 20}").mkdir()

    resumed = run_train([*common, "--output_dir", str(killed), "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {killed / 'checkpoints' / f'checkpoint-{newest}'} (step {newest}" in resumed.stdout
    assert f"skipping checkpoint {partial}" in resumed.stderr and "interrupted save" in resumed.stderr

    a = tensors(straight / "checkpoints" / "checkpoint-150" / "model.safetensors")
    b = tensors(killed / "checkpoints" / "checkpoint-150" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # the weight average is restored too, and it is what the folder exports (the only evaluation is at step 150)
    ema_a = tensors(straight / "checkpoints" / "checkpoint-150" / "ema.safetensors")
    ema_b = tensors(killed / "checkpoints" / "checkpoint-150" / "ema.safetensors")
    assert ema_a.keys() == ema_b.keys() and all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
    exported = tensors(killed / "model.safetensors")["model.shared.weight"]
    assert torch.equal(tensors(straight / "model.safetensors")["model.shared.weight"], exported)
    assert torch.equal(exported, ema_b["model.shared.weight"]) and not torch.equal(exported, b["model.shared.weight"])
    # dropout was on: the bit-for-bit match would fail if the RNG state were not restored
    assert json.loads((killed / "config.json").read_text())["dropout"] == 0.1

    # one more --resume of the finished run trains nothing and leaves its model folder as it was
    before = {name: (killed / name).read_bytes() for name in ("model.safetensors", "README.md", "metrics.json")}
    again = run_train([*common, "--output_dir", str(killed), "--resume"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished at step 150 (max_steps); nothing to train" in again.stdout
    assert not (killed / "checkpoints" / "checkpoint-151").exists()
    assert {name: (killed / name).read_bytes() for name in before} == before


def test_bf16_training_resumes_bit_for_bit_and_differs_from_float32(train_workspace, tmp_path):
    """--mixed_precision bf16 (what auto picks on CPUs with AVX512-BF16 or AMX): the forward runs autocast (its
    weights differ from the float32 run's after the same updates, and its loss follows it), a SIGKILL and --resume
    end bit for bit as the run left alone, and the card names the precision."""
    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
              "--max_steps", "40", "--save_every", "10", "--eval_every", "0", "--show"]
    bf16 = [*common, "--mixed_precision", "bf16"]  # the last flag wins over QUIET's float32
    runs = {name: tmp_path / name for name in ("fp32", "bf16", "killed")}
    for name, args in (("fp32", common), ("bf16", bf16)):
        result = run_train([*args, "--output_dir", str(runs[name])], tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    process = subprocess.Popen([sys.executable, str(TRAIN), *bf16, "--output_dir", str(runs["killed"])],
                               env=train_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    assert _kill_when(process, lambda: (runs["killed"] / "checkpoints" / "checkpoint-20" / "vaswani_state.json").exists())
    resumed = run_train([*bf16, "--output_dir", str(runs["killed"]), "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    final = {name: tensors(folder / "checkpoints" / "checkpoint-40" / "model.safetensors")
             for name, folder in runs.items()}
    assert all(torch.equal(final["bf16"][k], final["killed"][k]) for k in final["bf16"])
    assert not torch.equal(final["bf16"]["model.shared.weight"], final["fp32"]["model.shared.weight"])
    losses = {name: json.loads((runs[name] / "metrics.json").read_text())["dev"]["loss"] for name in ("fp32", "bf16")}
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)
    assert "| mixed_precision | bf16 |" in (runs["bf16"] / "README.md").read_text(encoding="utf-8")


def test_mixed_precision_auto_is_bf16_where_the_device_multiplies_it_natively(monkeypatch):
    from vaswani.training import loop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for avx512_bf16, amx, expected in ((True, False, "bf16"), (False, True, "bf16"), (False, False, "no")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert loop.resolve_mixed_precision("auto") == expected
        for given in ("no", "bf16", "fp16"):
            assert loop.resolve_mixed_precision(given) == given
        # vaswani-train resolves it before the run (the card and the checkpoint's arguments name what ran)
        assert cli.make_settings(cli.parse_args([])).mixed_precision == expected
        assert cli.make_settings(cli.parse_args(["--mixed_precision", "no"])).mixed_precision == "no"
        assert cli.make_settings(cli.parse_args(["--task", "translation"])).mixed_precision == "no"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert loop.resolve_mixed_precision("auto") == "bf16"
    assert loop.resolve_mixed_precision("auto", cpu=True) == "no"  # --cpu on a GPU machine: the CPU decides
    with pytest.raises(ValueError, match="choose one of no, fp16, bf16, auto"):
        loop.TrainingSettings(output_dir="x", max_steps=1, mixed_precision="fp8").validate()


def _kill_when(process, ready, timeout=180.0) -> bool:
    """SIGKILL `process` as soon as `ready()` holds; False if it ended first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, "the moment to kill never came"
        time.sleep(0.001)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return True


def test_killed_at_several_random_moments_some_inside_a_save_ends_bit_for_bit_as_the_run_left_alone(train_workspace,
                                                                                                  tmp_path):
    """Fault injection: SIGKILL at random moments (between updates, and inside a save: a temporary checkpoint folder
    on disk), resuming each time; the run ends with the weights of the run left alone, and one more --resume
    changes nothing."""
    import random

    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
              "--max_steps", "120", "--save_every", "2", "--eval_every", "0", "--ema_decay", "0.9", "--show"]
    straight = tmp_path / "straight"
    assert run_train([*common, "--output_dir", str(straight)], tmp_path).returncode == 0
    out, chance = tmp_path / "killed", random.Random(7)
    folder = out / "checkpoints"

    def steps_saved() -> list[int]:
        return sorted(int(p.parent.name.split("-")[1]) for p in folder.glob("checkpoint-*/vaswani_state.json"))

    inside_a_save = 0
    for kill in range(5):
        process = subprocess.Popen([sys.executable, str(TRAIN), *common, "--output_dir", str(out),
                                    *(["--resume"] if kill else [])], env=train_env(tmp_path),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        before = steps_saved()[-1] if kill else 0
        target = min(110, before + chance.randint(4, 24))  # a new checkpoint at least, then a random moment
        if kill % 2:  # inside a save: the temporary folder of one is there
            killed = _kill_when(process, lambda: steps_saved()[-1:] >= [target] and any(folder.glob(".tmp-*")))
            inside_a_save += killed
        else:
            killed = _kill_when(process, lambda: steps_saved()[-1:] >= [target] and not time.sleep(
                chance.random() * 0.05))
        assert killed, "the run finished before its kill"
    assert inside_a_save >= 2
    assert not (out / "metrics.json").exists()
    final = run_train([*common, "--output_dir", str(out), "--resume"], tmp_path)
    assert final.returncode == 0, final.stderr[-3000:]
    for name in ("model.safetensors", "ema.safetensors"):
        a, b = (tensors(run / "checkpoints" / "checkpoint-120" / name) for run in (straight, out))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert (out / "model.safetensors").read_bytes() == (straight / "model.safetensors").read_bytes()
    before = {name: (out / name).read_bytes() for name in ("model.safetensors", "README.md", "metrics.json")}
    again = run_train([*common, "--output_dir", str(out), "--resume"], tmp_path)
    assert "already finished at step 120 (max_steps); nothing to train" in again.stdout
    assert {name: (out / name).read_bytes() for name in before} == before


def test_a_run_stopped_by_its_time_budget_stays_finished_unless_given_more(train_workspace, tmp_path):
    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
              "--max_steps", "100000", "--save_every", "50", "--eval_every", "0", "--show"]
    out = tmp_path / "budget"
    first = run_train([*common, "--time_budget", "40s", "--output_dir", str(out)], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped_by"] == "time_budget"
    steps, exported = metrics["steps"], (out / "model.safetensors").read_bytes()
    again = run_train([*common, "--time_budget", "40s", "--output_dir", str(out), "--resume"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"already finished at step {steps} (time_budget); nothing to train" in again.stdout
    assert (out / "model.safetensors").read_bytes() == exported
    more = run_train([*common, "--time_budget", "55s", "--output_dir", str(out), "--resume"], tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / f'checkpoint-{steps}'}" in more.stdout
    later = json.loads((out / "metrics.json").read_text())
    assert later["steps"] > steps and later["stopped_by"] == "time_budget"
    # the clock went on from where the first invocation stopped: every record of the second one reads the run's
    # clock ahead of its own by at least the first invocation's time
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    records = [r for r in records if "target_tokens_per_second" in r]
    first_seconds = max(r["run_clock"] for r in records if r["step"] <= steps)
    resumed = [r for r in records if r["step"] > steps]
    assert resumed and all(r["run_clock"] - r["elapsed"] >= first_seconds for r in resumed)
    assert max(r["run_clock"] for r in resumed) < 55


def test_average_last_exports_the_mean_of_the_last_checkpoints(train_workspace, tmp_path):
    out = tmp_path / "avg"
    result = run_train(["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
                   "--max_steps", "30", "--save_every", "10", "--keep_last", "3", "--average_last", "3",
                   "--ema_decay", "0", "--eval_every", "0", "--show", "--output_dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    files = [out / "checkpoints" / f"checkpoint-{s}" / "model.safetensors" for s in (10, 20, 30)]
    exported = tensors(out / "model.safetensors")
    for name in ("model.shared.weight", "model.encoder.layers.0.fc1.weight", "model.decoder.layers.1.fc2.bias"):
        name = name if name in exported else name.replace(".fc", ".ffn.fc")
        torch.testing.assert_close(exported[name], mean_weights(files, name), rtol=0, atol=1e-7)
    assert not torch.equal(exported["model.shared.weight"], tensors(files[-1])["model.shared.weight"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dev"]["averaged_steps"] == [10, 20, 30] and metrics["dev"]["step"] == 30
    assert "the average of steps 10, 20, 30" in result.stdout
    assert "weights of the average of steps 10, 20, 30" in (out / "README.md").read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(folder):
    return [r["loss"] for r in map(json.loads, (folder / "train_log.jsonl").read_text().splitlines()) if "loss" in r]


def _two_processes(args, tmp_path, output_dir):
    """train.py on 2 CPU processes (torchrun); a rank can abort at exit after finishing (gloo, see notes), so the
    run is judged by its artifacts and retried once."""
    for attempt in range(2):
        launcher = ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()))
        result = run_train([*args, "--output_dir", str(output_dir)], tmp_path, launcher=launcher, timeout=300)
        if (output_dir / "metrics.json").exists():
            return result
        assert attempt == 0, result.stderr[-4000:]
        if "--resume" not in args:
            shutil.rmtree(output_dir, ignore_errors=True)


def test_two_cpu_processes_match_one_process_with_the_same_global_batch(train_workspace, tmp_path):
    """2 ranks x 1 micro-batch per update == 1 rank x 2 micro-batches (grad_accum 2): the sampler deals the same
    global batch list round robin, every micro-batch loss is its own token mean, DDP and accumulation both average."""
    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
              "--config_overrides", "dropout=0.0", "--max_steps", "6", "--log_every", "1", "--eval_every", "0",
              "--save_every", "0", "--show"]
    one = tmp_path / "one"
    single = run_train([*common, "--grad_accum", "2", "--output_dir", str(one)], tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]

    two = tmp_path / "two"
    result = _two_processes(common, tmp_path, two)
    metrics = json.loads((two / "metrics.json").read_text())
    assert metrics["num_processes"] == 2 and "MULTI_CPU" in result.stdout
    assert json.loads((one / "metrics.json").read_text())["num_processes"] == 1
    assert len(_losses(one)) == len(_losses(two)) == 6
    assert _losses(one) == pytest.approx(_losses(two), abs=1e-5)
    a, b = tensors(one / "model.safetensors"), tensors(two / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=0)


def test_two_processes_resume_exactly_from_each_rank_s_own_state(train_workspace, tmp_path):
    """Each rank restores its own RNG state (dropout is on) and the shared model/optimizer state: stopping at step 4
    and resuming to step 8 ends with the weights of a run straight to step 8, bit for bit."""
    common = ["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
              "--save_every", "2", "--keep_last", "4", "--eval_every", "0", "--show",
              "--schedule", "inverse_sqrt"]  # a schedule that does not depend on max_steps, which the split changes
    straight, split = tmp_path / "straight", tmp_path / "split"
    _two_processes([*common, "--max_steps", "8"], tmp_path, straight)
    _two_processes([*common, "--max_steps", "4"], tmp_path, split)
    (split / "metrics.json").unlink()
    resumed = _two_processes([*common, "--max_steps", "8", "--resume"], tmp_path, split)
    assert "(step 4, epoch" in resumed.stdout and json.loads((split / "metrics.json").read_text())["num_processes"] == 2
    state = split / "checkpoints" / "checkpoint-8"
    assert {"rng_state_0.json", "rng_state_1.json"} <= {p.name for p in state.iterdir()}
    a = tensors(straight / "checkpoints" / "checkpoint-8" / "model.safetensors")
    b = tensors(state / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((split / "config.json").read_text())["dropout"] == 0.1


class _Bar:
    def __init__(self):
        self.written = []

    def write(self, line):
        self.written.append(line)


def _bare_run(tmp_path, **settings):
    """A TrainingRun with just the state its progress and logging methods read (no model, no data)."""
    from vaswani.training.loop import TrainingRun, TrainingSettings
    from vaswani.training.tasks import TaskData

    run = TrainingRun.__new__(TrainingRun)
    run.settings = TrainingSettings(output_dir=str(tmp_path), **settings)
    run.data = TaskData("g2p", [], ["A"] * 100, [["EY"]] * 100, "test")
    run.dev_sources, run.eval_seconds_per_source, run.loader = ["A"] * 10, 0.01, [None] * 50
    run.main, run.writer, run.bar, run.history, run.log_path = True, None, _Bar(), [], tmp_path / "log.jsonl"
    return run


def test_progress_total_and_time_left_follow_the_budget_that_ends_first(tmp_path, monkeypatch):
    from vaswani.training import loop
    from vaswani.training.time_budget import Deadline

    now = [1000.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: now[0])
    run = _bare_run(tmp_path, max_steps=30000, time_budget="15m")
    run.deadline = Deadline("15m", clock=lambda: now[0])
    run.start_time, run.start_step, run.step = now[0], 0, 0
    assert run.expected_end() == (30000, None)  # no pace measured yet
    now[0] += 100.0
    run.step = 1000  # 0.1 s per update: the time budget ends first
    end, left = run.expected_end()
    reserve = run.final_reserve()
    assert end == 1000 + int((800 - reserve) / 0.1) and left == pytest.approx((end - 1000) * 0.1)
    assert end < 30000 and 700 < left < 800
    run.settings.max_steps = 1500  # now the step budget ends first
    assert run.expected_end() == (1500, pytest.approx(50.0))
    run.settings.max_steps, run.settings.max_epochs, run.deadline, run.step = None, 3, None, 100
    assert run.expected_end() == (150, pytest.approx(50.0))  # 3 epochs of 50 batches, 1 s per update


def test_progress_is_the_furthest_of_steps_epochs_and_the_clock(tmp_path):
    from vaswani.training.time_budget import Deadline

    now = [0.0]
    run = _bare_run(tmp_path, max_steps=1000, time_budget="100s")
    run.deadline = Deadline("100s", clock=lambda: now[0])
    reserve = run.final_reserve()
    assert run.progress(0) == 0.0  # asked once while the scheduler is built
    assert run.progress(100) == pytest.approx(0.1)  # steps lead
    now[0] = 0.5 * (100 - reserve)
    assert run.progress(100) == pytest.approx(0.5)  # the clock leads: half of the budget less the end's reserve
    now[0] = 100.0
    assert run.progress(100) == 1.0  # never past the end
    run.settings.max_steps, run.settings.max_epochs, run.deadline = None, 2, None
    assert run.progress(25) == pytest.approx(0.25)  # 2 epochs of 50 batches


def test_evaluation_lines_go_through_the_progress_bar(tmp_path):
    run = _bare_run(tmp_path, max_steps=10)
    run.step, run.epoch, run.best = 10, 0, {"step": 10, "value": 50.0, "metric": "wer"}
    run._log_evaluation({"loss": 1.5, "wer": 50.0, "per": 10.0, "seconds": 0.5})
    assert run.bar.written == ["step 10: dev loss 1.5000 wer 50.00 per 10.00 (10 dev, 0.5s; best step 10)"]


def _confirming_run(tmp_path, tokenizer, sources, references, best_model, last_model, **settings):
    """A TrainingRun at its end: `best_model` kept in checkpoints/best at step 10 by the subset, `last_model` the
    evaluated weights of the last step, 20; a dev set larger than the subset, so `confirm_best` applies."""
    import types

    from vaswani.training.checkpoints import write_best
    from vaswani.training.tasks import TaskData

    run = _bare_run(tmp_path, eval_subset=2, **settings)
    run.data = TaskData("g2p", [], sources, references, "test")
    run.tokenizer, run.max_length, run.step = tokenizer, 32, 20
    run.checkpoint_dir, run.evaluated = tmp_path / "checkpoints", last_model
    run.accelerator = types.SimpleNamespace(device=torch.device("cpu"))
    run.best = {"step": 10, "value": 0.0, "metric": "wer"}
    run.history = [{"step": 10, "wer": 0.0}, {"step": 20, "wer": 50.0}]  # the subset preferred step 10
    write_best(best_model, run.checkpoint_dir)
    return run


def test_confirm_best_keeps_the_better_of_the_subsets_best_and_the_last_weights_on_the_full_dev_set(
        tmp_path, trained_checkpoint):
    """The subset's pick against the last weights, both scored on the whole dev set with greedy search, as
    `evaluate` scores them: a trained model and a random one of the same config, in both orders, and a tie (the same
    weights), which keeps the last. Fails if the subset's pick is kept blindly, if the comparison is reversed, or if
    a tie keeps the earlier step."""
    from vaswani import VaswaniForConditionalGeneration, VaswaniTokenizer
    from vaswani.training.evaluation import evaluate, generate_texts
    from vaswani.training.tasks import encode_pairs

    tokenizer = VaswaniTokenizer.from_pretrained(trained_checkpoint)
    trained = VaswaniForConditionalGeneration.from_pretrained(trained_checkpoint).eval()
    torch.manual_seed(0)
    untrained = VaswaniForConditionalGeneration(trained.config).eval()
    sources = ["HELLO", "WORLD", "CAT", "ATTENTION", "GO", "PYTORCH"]
    # the trained model is right on all, decoded with the length limit `evaluate` gets below: a word the tiny model
    # repeats on (which one depends on the CPU's arithmetic) would otherwise be cut at the generation config's default
    references = [[p] for p in generate_texts(trained, tokenizer, sources, max_length=32)]

    def full_dev_wer(model):
        return evaluate(model, tokenizer, "g2p", sources, references, encode_pairs(
            tokenizer, [(s, r[0]) for s, r in zip(sources, references)]), num_beams=1, max_length=32)["wer"]

    assert full_dev_wer(trained) == 0.0 < full_dev_wer(untrained)

    def kept_weights(run):
        return VaswaniForConditionalGeneration.from_pretrained(run.checkpoint_dir / "best").state_dict()

    # the subset's pick (step 10) is worse on the full dev set: the last weights replace it
    run = _confirming_run(tmp_path / "a", tokenizer, sources, references, untrained, trained)
    assert run._confirms()
    confirmation = run.confirm_best()
    assert confirmation == {"best_step": 10, "last_step": 20, "wer": {"10": full_dev_wer(untrained), "20": 0.0},
                            "kept": 20}
    assert run.best == {"step": 20, "value": 50.0, "metric": "wer"}  # the last step's own subset figure
    assert all(torch.equal(a, b) for a, b in zip(kept_weights(run).values(), trained.state_dict().values()))
    log = [json.loads(line) for line in run.log_path.read_text().splitlines()]
    assert log[-1] == {"confirm_best": confirmation}
    assert run.bar.written[-1].endswith("step 20 kept")

    # the subset's pick is better: it stays, and its weights with it
    run = _confirming_run(tmp_path / "b", tokenizer, sources, references, trained, untrained)
    assert run.confirm_best()["kept"] == 10 and run.best["step"] == 10
    assert all(torch.equal(a, b) for a, b in zip(kept_weights(run).values(), trained.state_dict().values()))

    # a tie keeps the last step
    run = _confirming_run(tmp_path / "c", tokenizer, sources, references, trained, trained)
    assert run.confirm_best()["kept"] == 20 and run.best["step"] == 20


def test_confirm_best_applies_only_to_a_subset_of_the_dev_set_and_a_kept_best_step(tmp_path):
    """`_confirms`: on by default; off with --no_confirm_best, with a subset that is the whole dev set (0, or at
    least its size), and with --average_last (no best step is exported); its two greedy passes enter the end's
    reserve of the time budget."""
    run = _bare_run(tmp_path, max_steps=10, eval_subset=10)  # 10 of 100 dev sources
    assert run._confirms()
    with_confirmation = run.final_reserve()
    for settings in ({"confirm_best": False}, {"eval_subset": 0}, {"eval_subset": 100}, {"eval_subset": 500},
                     {"average_last": 2, "keep_last": 2}):
        other = _bare_run(tmp_path, max_steps=10, **{"eval_subset": 10, **settings})
        assert not other._confirms(), settings
    without = _bare_run(tmp_path, max_steps=10, eval_subset=10, confirm_best=False).final_reserve()
    assert with_confirmation - without == pytest.approx(0.01 * 2 * 100)  # two greedy passes over 100 sources
    assert cli.make_settings(cli.build_parser().parse_args(
        ["--output_dir", str(tmp_path), "--no_confirm_best"])).confirm_best is False
    assert cli.make_settings(cli.build_parser().parse_args(["--output_dir", str(tmp_path)])).confirm_best is True


def test_a_run_whose_subset_pick_is_not_its_last_step_confirms_it_on_the_full_dev_set(train_workspace, tmp_path):
    """End to end: a 3-source subset at steps 10 and 20 of a tiny run (both wrong on every word, so the subset's
    tie keeps step 10), then the full dev set decides; metrics.json, the log, the printed line and the model card
    say what was compared and kept, and the exported weights are the kept step's."""
    out = tmp_path / "run"
    result = run_train(["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer",
                        str(train_workspace / "tokenizer"), *QUIET, "--max_steps", "20", "--eval_every", "10",
                        "--save_every", "10", "--eval_subset", "3", "--show", "--output_dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    subset = {h["step"]: h["wer"] for h in metrics["history"]}
    assert subset[10] <= subset[20], "the subset did not pick step 10: the premise of this test"
    confirmation = metrics["confirm_best"]
    assert confirmation["best_step"] == 10 and confirmation["last_step"] == 20
    values = confirmation["wer"]
    assert confirmation["kept"] == (20 if values["20"] <= values["10"] else 10) == metrics["best_step"]
    assert metrics["dev"]["step"] == confirmation["kept"]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert {"confirm_best": confirmation} in log
    assert f"step {confirmation['kept']} kept" in result.stdout
    assert "then compared with the last step on the full dev set with greedy search" in (out / "README.md").read_text()
    kept = tensors(out / "checkpoints" / "best" / "model.safetensors")
    assert all(torch.equal(kept[k], v) for k, v in tensors(out / "model.safetensors").items())
