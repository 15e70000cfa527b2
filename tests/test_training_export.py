"""vaswani.training.export: the folder a run exports (it loads in a clean interpreter with its own code; a push sends
exactly its model files); the release folder of a published model is tests/test_training_release.py's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from unittest import mock

from helpers import REFUSE_VASWANI, train_env

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
    expected = ["README.md", "attention_patterns_vaswani.py", "caches_vaswani.py", "config.json",
                "configuration_vaswani.py", "decoding_vaswani.py",
                "fast_paths_vaswani.py", "generation_config.json", "masks_vaswani.py", "metrics.json",
                "model.safetensors", "modeling_vaswani.py", "onednn_vaswani.py", "positions_vaswani.py", "spm.model",
                "tokenization_vaswani.py", "tokenizer_config.json"]
    assert sent["paths"] == expected == hub_files(out)
    assert attempts == []
