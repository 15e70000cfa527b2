"""vaswani.training.export: the release folder of a published model (16-bit weights, no training leftovers)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
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
