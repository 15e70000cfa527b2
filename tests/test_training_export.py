"""vaswani.training.export: the folder a run exports (it loads in a clean interpreter with its own code; a push sends
exactly its model files) and the release folder of a published model (16-bit weights, no training leftovers)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
import torch
from helpers import REFUSE_VASWANI, train_env
from safetensors import safe_open

from vaswani.training.export import release_main, write_release_folder


@pytest.fixture(scope="module")
def run_folder(trained_checkpoint, tmp_path_factory):
    """The trained tiny checkpoint as a finished run leaves it: a model card, metrics.json and a checkpoints folder."""
    folder = tmp_path_factory.mktemp("run") / "g2p"
    shutil.copytree(trained_checkpoint, folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n\n# the card\n\nWER 12.34 %\n", encoding="utf-8")
    (folder / "metrics.json").write_text(json.dumps({"dev": {"wer": 12.34}, "history": [{"step": 1}]}), encoding="utf-8")
    (folder / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    (folder / "train_log.jsonl").write_text("{}\n", encoding="utf-8")
    return folder


def test_release_folder_holds_fp16_weights_that_compute_the_run_model(run_folder, tmp_path):
    from vaswani import VaswaniForConditionalGeneration, VaswaniTokenizer

    release = write_release_folder(run_folder, tmp_path / "release")
    names = {p.name for p in release.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "spm.model", "tokenizer_config.json",
            "README.md", "metrics.json", "modeling_vaswani.py", "configuration_vaswani.py"} <= names
    assert not {"checkpoints", "train_log.jsonl", "runs"} & names
    with safe_open(release / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert (release / "README.md").read_text(encoding="utf-8") == (run_folder / "README.md").read_text(encoding="utf-8")
    assert json.loads((release / "metrics.json").read_text())["dev"]["wer"] == 12.34
    assert (release / "model.safetensors").stat().st_size < 0.6 * (run_folder / "model.safetensors").stat().st_size

    tokenizer = VaswaniTokenizer.from_pretrained(release)
    full = VaswaniForConditionalGeneration.from_pretrained(run_folder, dtype=torch.float32).eval()
    half = VaswaniForConditionalGeneration.from_pretrained(release, dtype=torch.float32).eval()
    batch = tokenizer(["HELLO", "WORLD", "TRANSFORMER"], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = full(**batch, decoder_input_ids=full.generate(**batch, num_beams=1)).logits
        b = half(**batch, decoder_input_ids=full.generate(**batch, num_beams=1)).logits
    assert not torch.equal(a, b)  # the weights were rounded to 16 bits
    torch.testing.assert_close(b, a, atol=0.05, rtol=0.01)  # and compute the same function within that rounding
    assert torch.equal(half.generate(**batch, num_beams=4), full.generate(**batch, num_beams=4))


def test_release_refuses_an_unfinished_run_and_its_own_folder(run_folder, tmp_path, capsys):
    with pytest.raises(ValueError, match="no config.json"):
        write_release_folder(run_folder / "checkpoints", tmp_path / "r")
    with pytest.raises(ValueError, match="must differ"):
        write_release_folder(run_folder, run_folder)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        write_release_folder(run_folder, tmp_path / "r", dtype="int8")
    with pytest.raises(SystemExit):
        release_main([str(tmp_path / "missing"), str(tmp_path / "r")])
    assert "no config.json" in capsys.readouterr().err
    assert release_main([str(run_folder), str(tmp_path / "r2"), "--dtype", "bfloat16"]) == 0
    assert "MB)" in capsys.readouterr().out


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


def test_output_folder_loads_in_a_clean_interpreter(trained_run, tmp_path):
    from vaswani import VaswaniForConditionalGeneration, VaswaniTokenizer

    out, _ = trained_run
    words = ["HELLO", "PYTORCH", "AACHEN"]
    model = VaswaniForConditionalGeneration.from_pretrained(out).eval()
    tokenizer = VaswaniTokenizer.from_pretrained(out)
    expected = tokenizer.batch_decode(model.generate(**tokenizer(words, return_tensors="pt", padding=True)),
                                      skip_special_tokens=True)
    script = tmp_path / "load.py"
    script.write_text(CLEAN_LOAD)
    (tmp_path / "elsewhere").mkdir()
    result = subprocess.run([sys.executable, str(script), str(out), *words], cwd=tmp_path / "elsewhere",
                            env=train_env(tmp_path), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_push_sends_exactly_the_model_files(trained_run, monkeypatch):
    import socket

    from huggingface_hub import HfApi

    from vaswani.training.export import hub_files, push_folder

    out, _ = trained_run
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
