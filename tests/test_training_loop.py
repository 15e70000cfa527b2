"""vaswani-train (run as scripts/train.py) and vaswani.training.loop: exact resume after SIGKILL, the Hub-ready folder
(clean-interpreter load, model card, push file list), data-parallel training on 2 CPU processes, progress lines and
the closing summary, argument and data errors.

Every run is a subprocess on a few hundred CMUdict lines with the tiny preset, one thread per process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from helpers import REFUSE_VASWANI, run_group
from safetensors.torch import load_file

from vaswani.training import cli
from vaswani.training.data import default_g2p_file, read_g2p

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "scripts" / "train.py"
# float32 on every machine (the g2p default, --mixed_precision auto, is bf16 where the CPU multiplies it natively)
TINY = ["--preset", "tiny", "--task", "g2p", "--dev_percent", "10", "--max_tokens", "150", "--no_progress_bar",
        "--eval_subset", "0", "--eval_batch_size", "64", "--mixed_precision", "no"]
QUIET = [*TINY, "--no_tensorboard"]


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"),
               TOKENIZERS_PARALLELISM="false", **extra)
    return env


def _run(args, tmp_path, launcher=(), timeout=240, **env):
    command = [sys.executable, *launcher, str(TRAIN), *args] if launcher else [sys.executable, str(TRAIN), *args]
    return run_group(command, timeout, env=_env(tmp_path, **env), capture_output=True, text=True, cwd=tmp_path)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A slice of CMUdict (every 400th line: ~280 lines, ~25 dev words) and a tokenizer trained on it once."""
    root = tmp_path_factory.mktemp("train_loop")
    lines = default_g2p_file().read_text(encoding="utf-8").splitlines()[::400]
    data = root / "g2p.tsv"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    from vaswani.training.tasks import build_tokenizer, load_task_data

    build_tokenizer(load_task_data("g2p", str(data), dev_percent=10), root / "tokenizer")
    return root


@pytest.fixture(scope="module")
def trained(workspace):
    """train.py end to end: 20 steps, the whole output folder (trains its own tokenizer)."""
    out = workspace / "e2e"
    result = _run(["--train_file", str(workspace / "g2p.tsv"), *TINY, "--max_steps", "20", "--eval_every", "10",
                   "--save_every", "10", "--output_dir", str(out), "--show", "HELLO", "PYTORCH"], workspace)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return out, result


def test_end_to_end_output_folder(trained):
    out, result = trained
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


def test_model_card_front_matter(trained):
    from huggingface_hub import ModelCard

    out, _ = trained
    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    metrics = json.loads((out / "metrics.json").read_text())
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text2text-generation"
    assert data["license"] == "apache-2.0" and "g2p" in data["tags"]
    results = {m["type"]: m["value"] for m in data["model-index"][0]["results"][0]["metrics"]}
    assert results == {"wer": round(metrics["dev"]["wer"], 2), "per": round(metrics["dev"]["per"], 2)}
    assert "| d_model | 16 |" in card.text and "| label_smoothing | 0.1 |" in card.text
    assert "{{" not in card.text and "CMU Pronouncing Dictionary" in card.text
    # the optimizer the run built and its schedule, in words
    assert "| optimizer | Adam(0.9, 0.98, eps 1e-9) |" in card.text
    assert "| schedule | linear warmup, then linear decay to zero over the run's budget |" in card.text


def test_model_card_rejects_unknown_license_and_tag():
    from vaswani.training.model_card import check_metadata

    with pytest.raises(ValueError, match="license"):
        check_metadata("not-a-license", "text2text-generation")
    with pytest.raises(ValueError, match="pipeline_tag"):
        check_metadata("mit", "nonsense")


CLEAN_LOAD = REFUSE_VASWANI + textwrap.dedent(
    """
    import json

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder, words = sys.argv[1], sys.argv[2:]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert model.__class__.__module__.startswith("transformers_modules."), model.__class__.__module__
    assert tokenizer.__class__.__module__.startswith("transformers_modules."), tokenizer.__class__.__module__
    inputs = tokenizer(words, return_tensors="pt", padding=True)
    outputs = model.generate(**inputs)
    print(json.dumps(tokenizer.batch_decode(outputs, skip_special_tokens=True)))
    """
)


def test_output_folder_loads_in_a_clean_interpreter(trained, tmp_path):
    from vaswani import VaswaniForConditionalGeneration, VaswaniTokenizer

    out, _ = trained
    words = ["HELLO", "PYTORCH", "AACHEN"]
    model = VaswaniForConditionalGeneration.from_pretrained(out).eval()
    tokenizer = VaswaniTokenizer.from_pretrained(out)
    expected = tokenizer.batch_decode(model.generate(**tokenizer(words, return_tensors="pt", padding=True)),
                                      skip_special_tokens=True)
    script = tmp_path / "load.py"
    script.write_text(CLEAN_LOAD)
    (tmp_path / "elsewhere").mkdir()
    result = subprocess.run([sys.executable, str(script), str(out), *words], cwd=tmp_path / "elsewhere",
                            env=_env(tmp_path), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_push_sends_exactly_the_model_files(trained, monkeypatch):
    import socket

    from huggingface_hub import HfApi

    from vaswani.training.export import hub_files, push_folder

    out, _ = trained
    attempts = []
    monkeypatch.setattr(socket.socket, "connect", lambda *a, **k: attempts.append(a) or (_ for _ in ()).throw(OSError))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: attempts.append(a) or (_ for _ in ()).throw(OSError))
    sent = {}

    def fake_commit(self, repo_id, operations, commit_message, **kwargs):
        sent.update(repo_id=repo_id, message=commit_message, paths=sorted(op.path_in_repo for op in operations))
        return mock.Mock(commit_url=f"https://huggingface.co/{repo_id}/commit/0")

    with mock.patch.object(HfApi, "create_repo") as create_repo, \
            mock.patch.object(HfApi, "create_commit", fake_commit), \
            mock.patch.object(HfApi, "preupload_lfs_files"):
        url = push_folder(out, "someone/vaswani-g2p-test")
    create_repo.assert_called_once()
    assert sent["repo_id"] == "someone/vaswani-g2p-test" and url.endswith("/commit/0")
    expected = ["README.md", "attention_patterns_vaswani.py", "config.json", "configuration_vaswani.py",
                "decoding_vaswani.py",
                "fast_paths_vaswani.py", "generation_config.json", "metrics.json",
                "model.safetensors", "modeling_vaswani.py", "onednn_vaswani.py", "positions_vaswani.py", "spm.model",
                "tokenization_vaswani.py", "tokenizer_config.json"]
    assert sent["paths"] == expected == hub_files(out)
    assert attempts == []


def _tensors(path):
    return load_file(str(path))


def test_sigkill_and_resume_match_an_uninterrupted_run_bit_for_bit(workspace, tmp_path, caplog):
    common = ["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
              "--max_steps", "150", "--save_every", "10", "--keep_last", "3", "--eval_every", "0", "--ema_decay", "0.9",
              "--show"]
    straight = tmp_path / "straight"
    result = _run([*common, "--output_dir", str(straight)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    killed = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, str(TRAIN), *common, "--output_dir", str(killed)],
                               env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
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

    resumed = _run([*common, "--output_dir", str(killed), "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {killed / 'checkpoints' / f'checkpoint-{newest}'} (step {newest}" in resumed.stdout
    assert f"skipping checkpoint {partial}" in resumed.stderr and "interrupted save" in resumed.stderr

    a = _tensors(straight / "checkpoints" / "checkpoint-150" / "model.safetensors")
    b = _tensors(killed / "checkpoints" / "checkpoint-150" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # the weight average is restored too, and it is what the folder exports (the only evaluation is at step 150)
    ema_a = _tensors(straight / "checkpoints" / "checkpoint-150" / "ema.safetensors")
    ema_b = _tensors(killed / "checkpoints" / "checkpoint-150" / "ema.safetensors")
    assert ema_a.keys() == ema_b.keys() and all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
    exported = _tensors(killed / "model.safetensors")["model.shared.weight"]
    assert torch.equal(_tensors(straight / "model.safetensors")["model.shared.weight"], exported)
    assert torch.equal(exported, ema_b["model.shared.weight"]) and not torch.equal(exported, b["model.shared.weight"])
    # dropout was on: the bit-for-bit match would fail if the RNG state were not restored
    assert json.loads((killed / "config.json").read_text())["dropout"] == 0.1

    # one more --resume of the finished run trains nothing and leaves its model folder as it was
    before = {name: (killed / name).read_bytes() for name in ("model.safetensors", "README.md", "metrics.json")}
    again = _run([*common, "--output_dir", str(killed), "--resume"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished at step 150 (max_steps); nothing to train" in again.stdout
    assert not (killed / "checkpoints" / "checkpoint-151").exists()
    assert {name: (killed / name).read_bytes() for name in before} == before


def test_bf16_training_resumes_bit_for_bit_and_differs_from_float32(workspace, tmp_path):
    """--mixed_precision bf16 (what auto picks on CPUs with AVX512-BF16 or AMX): the forward runs autocast (its
    weights differ from the float32 run's after the same updates, and its loss follows it), a SIGKILL and --resume
    end bit for bit as the run left alone, and the card names the precision."""
    common = ["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
              "--max_steps", "40", "--save_every", "10", "--eval_every", "0", "--show"]
    bf16 = [*common, "--mixed_precision", "bf16"]  # the last flag wins over QUIET's float32
    runs = {name: tmp_path / name for name in ("fp32", "bf16", "killed")}
    for name, args in (("fp32", common), ("bf16", bf16)):
        result = _run([*args, "--output_dir", str(runs[name])], tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    process = subprocess.Popen([sys.executable, str(TRAIN), *bf16, "--output_dir", str(runs["killed"])],
                               env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    assert _kill_when(process, lambda: (runs["killed"] / "checkpoints" / "checkpoint-20" / "vaswani_state.json").exists())
    resumed = _run([*bf16, "--output_dir", str(runs["killed"]), "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    final = {name: _tensors(folder / "checkpoints" / "checkpoint-40" / "model.safetensors")
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


def test_killed_at_several_random_moments_some_inside_a_save_ends_bit_for_bit_as_the_run_left_alone(workspace,
                                                                                                  tmp_path):
    """Fault injection: SIGKILL at random moments (between updates, and inside a save: a temporary checkpoint folder
    on disk), resuming each time; the run ends with the weights of the run left alone, and one more --resume
    changes nothing."""
    import random

    common = ["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
              "--max_steps", "120", "--save_every", "2", "--eval_every", "0", "--ema_decay", "0.9", "--show"]
    straight = tmp_path / "straight"
    assert _run([*common, "--output_dir", str(straight)], tmp_path).returncode == 0
    out, chance = tmp_path / "killed", random.Random(7)
    folder = out / "checkpoints"

    def steps_saved() -> list[int]:
        return sorted(int(p.parent.name.split("-")[1]) for p in folder.glob("checkpoint-*/vaswani_state.json"))

    inside_a_save = 0
    for kill in range(5):
        process = subprocess.Popen([sys.executable, str(TRAIN), *common, "--output_dir", str(out),
                                    *(["--resume"] if kill else [])], env=_env(tmp_path),
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
    final = _run([*common, "--output_dir", str(out), "--resume"], tmp_path)
    assert final.returncode == 0, final.stderr[-3000:]
    for name in ("model.safetensors", "ema.safetensors"):
        a, b = (_tensors(run / "checkpoints" / "checkpoint-120" / name) for run in (straight, out))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert (out / "model.safetensors").read_bytes() == (straight / "model.safetensors").read_bytes()
    before = {name: (out / name).read_bytes() for name in ("model.safetensors", "README.md", "metrics.json")}
    again = _run([*common, "--output_dir", str(out), "--resume"], tmp_path)
    assert "already finished at step 120 (max_steps); nothing to train" in again.stdout
    assert {name: (out / name).read_bytes() for name in before} == before


def test_a_run_stopped_by_its_time_budget_stays_finished_unless_given_more(workspace, tmp_path):
    common = ["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
              "--max_steps", "100000", "--save_every", "50", "--eval_every", "0", "--show"]
    out = tmp_path / "budget"
    first = _run([*common, "--time_budget", "40s", "--output_dir", str(out)], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped_by"] == "time_budget"
    steps, exported = metrics["steps"], (out / "model.safetensors").read_bytes()
    again = _run([*common, "--time_budget", "40s", "--output_dir", str(out), "--resume"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"already finished at step {steps} (time_budget); nothing to train" in again.stdout
    assert (out / "model.safetensors").read_bytes() == exported
    more = _run([*common, "--time_budget", "55s", "--output_dir", str(out), "--resume"], tmp_path)
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


def _mean(files, name):
    return (sum(_tensors(f)[name].double() for f in files) / len(files)).float()


def test_average_last_exports_the_mean_of_the_last_checkpoints(workspace, tmp_path):
    out = tmp_path / "avg"
    result = _run(["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
                   "--max_steps", "30", "--save_every", "10", "--keep_last", "3", "--average_last", "3",
                   "--ema_decay", "0", "--eval_every", "0", "--show", "--output_dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    files = [out / "checkpoints" / f"checkpoint-{s}" / "model.safetensors" for s in (10, 20, 30)]
    exported = _tensors(out / "model.safetensors")
    for name in ("model.shared.weight", "model.encoder.layers.0.fc1.weight", "model.decoder.layers.1.fc2.bias"):
        name = name if name in exported else name.replace(".fc", ".ffn.fc")
        torch.testing.assert_close(exported[name], _mean(files, name), rtol=0, atol=1e-7)
    assert not torch.equal(exported["model.shared.weight"], _tensors(files[-1])["model.shared.weight"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dev"]["averaged_steps"] == [10, 20, 30] and metrics["dev"]["step"] == 30
    assert "the average of steps 10, 20, 30" in result.stdout
    assert "weights of the average of steps 10, 20, 30" in (out / "README.md").read_text()


def test_average_checkpoints_script_on_a_finished_run(trained, tmp_path):
    out, _ = trained
    script = ROOT / "scripts" / "average_checkpoints.py"
    command = [sys.executable, str(script), str(out), "--last", "2", "--output_dir", str(tmp_path / "avg")]
    result = run_group(command, 240, env=_env(tmp_path), capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "avg"
    assert {"model.safetensors", "config.json", "modeling_vaswani.py", "spm.model", "README.md",
            "metrics.json"} <= {p.name for p in folder.iterdir()}
    # the run kept a weight average (the G2P default): the script averages those, the weights the run evaluates
    files = [out / "checkpoints" / f"checkpoint-{s}" / "ema.safetensors" for s in (10, 20)]
    torch.testing.assert_close(_tensors(folder / "model.safetensors")["model.shared.weight"],
                               _mean(files, "model.shared.weight"), rtol=0, atol=1e-7)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["dev"]["averaged_steps"] == [10, 20] and 0 <= metrics["dev"]["wer"] <= 100
    assert "Dev (" in result.stdout and "the average of steps 10, 20" in result.stdout

    too_many = run_group([*command[:3], "--last", "3"], 120, env=_env(tmp_path), capture_output=True, text=True,
                         cwd=tmp_path)
    assert too_many.returncode == 2 and "holds 2 complete checkpoint(s), fewer than the 3" in too_many.stderr
    same = run_group([*command[:5], "--output_dir", str(out)], 120, env=_env(tmp_path), capture_output=True,
                     text=True, cwd=tmp_path)
    assert same.returncode == 2 and "must differ from the run's folder" in same.stderr


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
        result = _run([*args, "--output_dir", str(output_dir)], tmp_path, launcher=launcher, timeout=300)
        if (output_dir / "metrics.json").exists():
            return result
        assert attempt == 0, result.stderr[-4000:]
        if "--resume" not in args:
            shutil.rmtree(output_dir, ignore_errors=True)


def test_two_cpu_processes_match_one_process_with_the_same_global_batch(workspace, tmp_path):
    """2 ranks x 1 micro-batch per update == 1 rank x 2 micro-batches (grad_accum 2): the sampler deals the same
    global batch list round robin, every micro-batch loss is its own token mean, DDP and accumulation both average."""
    common = ["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
              "--config_overrides", "dropout=0.0", "--max_steps", "6", "--log_every", "1", "--eval_every", "0",
              "--save_every", "0", "--show"]
    one = tmp_path / "one"
    single = _run([*common, "--grad_accum", "2", "--output_dir", str(one)], tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]

    two = tmp_path / "two"
    result = _two_processes(common, tmp_path, two)
    metrics = json.loads((two / "metrics.json").read_text())
    assert metrics["num_processes"] == 2 and "MULTI_CPU" in result.stdout
    assert json.loads((one / "metrics.json").read_text())["num_processes"] == 1
    assert len(_losses(one)) == len(_losses(two)) == 6
    assert _losses(one) == pytest.approx(_losses(two), abs=1e-5)
    a, b = _tensors(one / "model.safetensors"), _tensors(two / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=0)


def test_two_processes_resume_exactly_from_each_rank_s_own_state(workspace, tmp_path):
    """Each rank restores its own RNG state (dropout is on) and the shared model/optimizer state: stopping at step 4
    and resuming to step 8 ends with the weights of a run straight to step 8, bit for bit."""
    common = ["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
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
    a = _tensors(straight / "checkpoints" / "checkpoint-8" / "model.safetensors")
    b = _tensors(state / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((split / "config.json").read_text())["dropout"] == 0.1


def test_translation_task_trains_on_a_headerless_two_column_tsv(workspace, tmp_path):
    """A TSV without a header (two columns, as the shipped G2P file) is source and target, for any task."""
    out = tmp_path / "headerless"
    result = _run(["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"),
                   "--preset", "tiny", "--max_steps", "2", "--max_tokens", "150", "--num_beams", "1",
                   "--no_progress_bar", "--no_tensorboard", "--eval_every", "0", "--save_every", "0",
                   "--output_dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "translation" and metrics["steps"] == 2 and {"bleu", "chrf"} <= set(metrics["dev"])


def test_unknown_train_file_format_names_the_formats_taken(tmp_path, capsys):
    data = tmp_path / "pairs.txt"
    data.write_text("a\tb\n")
    with pytest.raises(SystemExit) as error:
        cli.parse_args(["--train_file", str(data)])
    err = capsys.readouterr().err
    assert error.value.code == 2 and "pairs.txt" in err
    assert all(f in err for f in (".tsv", ".csv", ".jsonl", "Hub dataset")), err


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


def test_a_resumed_run_continues_its_clock(tmp_path):
    from vaswani.training.time_budget import Deadline

    now = [500.0]
    deadline = Deadline("10m", clock=lambda: now[0])
    now[0] += 30.0
    deadline.credit(400.0)  # what the checkpoint says the earlier invocations used
    assert deadline.elapsed() == pytest.approx(430.0) and deadline.remaining() == pytest.approx(170.0)
    deadline.credit(-5.0)  # nothing negative
    assert deadline.elapsed() == pytest.approx(430.0)


def test_evaluation_lines_go_through_the_progress_bar(tmp_path):
    run = _bare_run(tmp_path, max_steps=10)
    run.step, run.epoch, run.best = 10, 0, {"step": 10, "value": 50.0, "metric": "wer"}
    run._log_evaluation({"loss": 1.5, "wer": 50.0, "per": 10.0, "seconds": 0.5})
    assert run.bar.written == ["step 10: dev loss 1.5000 wer 50.00 per 10.00 (10 dev, 0.5s; best step 10)"]


def test_missing_train_file_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as error:
        cli.main(["--train_file", "no/such/file.tsv"])
    assert error.value.code == 2
    assert "--train_file 'no/such/file.tsv' does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config_overrides", "d_model"], "is not key=value"),
        (["--config_overrides", "vocab_size=10"], "vocab_size comes from the tokenizer"),
        (["--time_budget", "soon"], "--time_budget"),
        (["--push_to_hub"], "--push_to_hub needs --hub_model_id"),
        (["--tokenizer", "no/such/dir"], "is not a folder"),
        (["--label_smoothing", "1.5"], "must be in [0, 1)"),
        (["--average_last", "3"], "--average_last 3 averages the last 3 checkpoints: keep that many (--keep_last 2)"),
        (["--average_last", "0"], "--average_last 0 must be >= 1"),
        (["--ema_decay", "1"], "--ema_decay 1.0 must be in [0, 1)"),
        (["--max_tokens", "0"], "--max_tokens 0 must be >= 1"),
        (["--mixed_precision", "auto", "--lr", "-1"], "--lr -1.0 must be > 0"),
    ],
)
def test_bad_arguments_are_clear_errors(args, message, capsys):
    with pytest.raises(SystemExit) as error:
        cli.parse_args(args)
    assert error.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_config_override_names_the_field(workspace, tmp_path):
    result = _run(["--train_file", str(workspace / "g2p.tsv"), "--tokenizer", str(workspace / "tokenizer"), *QUIET,
                   "--config_overrides", "d_model=30", "--max_steps", "1", "--output_dir", str(tmp_path / "o")],
                  tmp_path)
    assert result.returncode != 0
    assert "bad model config" in result.stderr and "d_model=30" in result.stderr


def test_parse_overrides():
    assert cli.parse_overrides("d_model=128, encoder_layers=2,normalize_before=true,init_std=none,"
                               "activation_function=gelu,dropout=0.25") == {
        "d_model": 128, "encoder_layers": 2, "normalize_before": True, "init_std": None,
        "activation_function": "gelu", "dropout": 0.25}


def test_default_model_is_the_g2p_small_preset():
    """train.py without arguments builds the named preset (the main job's model) with nothing over it."""
    from vaswani import VaswaniConfig
    from vaswani.training.tasks import G2P_VOCAB_SIZE

    args = cli.parse_args([])
    assert args.task == "g2p" and args.preset == "g2p-small" and args.overrides == {}
    config = cli.build_config(args, G2P_VOCAB_SIZE)
    assert config.to_dict() == VaswaniConfig.from_preset("g2p-small", vocab_size=G2P_VOCAB_SIZE).to_dict()
    assert (config.d_model, config.encoder_layers, config.encoder_ffn_dim, config.decoder_ffn_dim) == (128, 3, 512, 512)
    assert config.dropout == 0.0 and config.label_smoothing == 0.1


def test_flag_defaults_are_the_settings_defaults_except_the_task_recipe():
    from vaswani.training.loop import TrainingSettings, resolve_mixed_precision

    for task, argv in (("g2p", []), ("translation", ["--task", "translation"]),
                       ("g2p-paragraph", ["--task", "g2p-paragraph"])):
        settings = vars(cli.make_settings(cli.parse_args(argv)))
        plain = vars(TrainingSettings(output_dir="outputs/g2p"))
        recipe = {k: v for k, v in cli.TASK_DEFAULTS[task].items() if k in plain}
        recipe["mixed_precision"] = resolve_mixed_precision(recipe["mixed_precision"])  # "auto", as this machine has it
        assert settings == {**plain, **recipe}, task
        assert recipe.keys() == cli.TASK_DEFAULTS[task].keys() - {"preset"}


def test_words_shown_after_g2p_training_are_not_in_the_training_file():
    lexicon = read_g2p(default_g2p_file())
    assert [w for w in cli.G2P_NEW_WORDS if w in lexicon] == []


def test_shipped_g2p_vocabulary_is_54():
    from vaswani.training.tasks import G2P_VOCAB_SIZE, load_task_data

    data = load_task_data("g2p")
    symbols = {ch for s, _ in data.train_pairs for ch in s} | {p for _, t in data.train_pairs for p in t.split()}
    assert len(symbols) + 4 == G2P_VOCAB_SIZE == 54


def test_translation_task_on_a_user_tsv_reports_bleu_and_chrf(tmp_path):
    """--train_file with a header (columns named by --source_column/--target_column): BLEU/chrF, a word tokenizer."""
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(12)]
    rows = ["src\ttgt"]
    for _ in range(300):
        sentence = [rng.choice(words) for _ in range(rng.randint(2, 6))]
        rows.append(" ".join(sentence) + "\t" + " ".join(reversed(sentence)))
    data = tmp_path / "pairs.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "mt"
    result = _run(["--train_file", str(data), "--source_column", "src", "--target_column", "tgt", "--preset", "tiny",
                   "--tokenizer_model_type", "word", "--tokenizer_vocab_size", "16", "--max_steps", "4",
                   "--max_tokens", "200", "--no_progress_bar", "--no_tensorboard", "--num_beams", "2",
                   "--output_dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "translation" and {"bleu", "chrf"} <= set(metrics["dev"])
    assert json.loads((out / "generation_config.json").read_text())["num_beams"] == 2
    from huggingface_hub import ModelCard

    results = ModelCard.load(out / "README.md").data.to_dict()["model-index"][0]["results"][0]["metrics"]
    assert {m["type"] for m in results} == {"bleu", "chrf"}
