"""vaswani-generate (training/generation.py, also scripts/generate.py), on a tiny checkpoint: one case runs
scripts/generate.py as a real subprocess reading stdin, the others call main(argv) in-process (imports cost seconds
per subprocess)."""

import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO

from vaswani.training import generation as generate

WORDS = ["TRANSFORMER", "AB", "ATTENTION", "A", "", "AACHEN", "ZYX", "ABBREVIATE", "AB"]


def _one_by_one(model, tokenizer, lines, max_new_tokens=None, num_beams=1):
    """model.generate on each line alone (no padding), greedy or beam."""
    outputs = []
    for line in lines:
        if not line.strip():
            outputs.append("")
            continue
        batch = tokenizer([line], return_tensors="pt")
        limit = max_new_tokens or 2 * batch["input_ids"].shape[1] + 10
        with torch.inference_mode():
            ids = model.generate(**batch, max_new_tokens=limit, num_beams=num_beams, do_sample=False)
        outputs.append(tokenizer.decode(ids[0], skip_special_tokens=True).strip())
    return outputs


def test_generate_stdin_subprocess(checkpoint, loaded):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "generate.py"), str(checkpoint), "--batch_size", "4", "--threads", "1"],
        input="\n".join(WORDS) + "\n", capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout.split("\n")
    assert printed[-1] == "" and len(printed) - 1 == len(WORDS)
    # default limits are per line, so batching (sorted by length, batches of 4) changes nothing
    assert printed[:-1] == _one_by_one(*loaded, WORDS)


def test_generate_file_input_order_and_beam(checkpoint, loaded, tmp_path, capsys):
    words = WORDS * 3  # 27 lines, batches of 5 mix lengths from across the file
    path = tmp_path / "words.txt"
    path.write_text("\n".join(words) + "\n", encoding="utf-8")
    common = [str(checkpoint), "--input", str(path), "--batch_size", "5", "--threads", "1", "--max_new_tokens", "8"]

    generate.main(common)
    greedy = capsys.readouterr().out.splitlines()
    assert len(greedy) == len(words)
    assert greedy == _one_by_one(*loaded, words, max_new_tokens=8)
    assert greedy[4] == "" and greedy[1] == greedy[8]  # blank line stays blank; equal inputs, equal outputs

    generate.main(common + ["--num_beams", "3"])
    beam = capsys.readouterr().out.splitlines()
    assert len(beam) == len(words)
    assert beam == _one_by_one(*loaded, words, max_new_tokens=8, num_beams=3)


def test_generate_missing_checkpoint_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as error:
        generate.main([str(tmp_path / "no-such-run"), "--input", os.devnull, "--threads", "1"])
    message = str(error.value.code)
    assert message.startswith("error: checkpoint folder") and "does not exist" in message and "\n" not in message
    with pytest.raises(SystemExit, match="has no config.json"):
        generate.main([str(tmp_path), "--input", os.devnull, "--threads", "1"])
