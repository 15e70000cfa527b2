"""vaswani.training.average (vaswani-average, scripts/average_checkpoints.py) on the finished tiny run of
tests/conftest.py: the average of its last checkpoints' weight averages as a new Hub-ready folder, and its refusals."""

from __future__ import annotations

import json
import sys

import torch
from helpers import REPO, mean_weights, run_group, tensors, train_env


def test_average_checkpoints_script_on_a_finished_run(trained_run, tmp_path):
    out, _ = trained_run
    script = REPO / "scripts" / "average_checkpoints.py"
    command = [sys.executable, str(script), str(out), "--last", "2", "--output_dir", str(tmp_path / "avg")]
    result = run_group(command, 240, env=train_env(tmp_path), capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "avg"
    assert {"model.safetensors", "config.json", "modeling_vaswani.py", "spm.model", "README.md",
            "metrics.json"} <= {p.name for p in folder.iterdir()}
    # the run kept a weight average (the G2P default): the script averages those, the weights the run evaluates
    files = [out / "checkpoints" / f"checkpoint-{s}" / "ema.safetensors" for s in (10, 20)]
    torch.testing.assert_close(tensors(folder / "model.safetensors")["model.shared.weight"],
                               mean_weights(files, "model.shared.weight"), rtol=0, atol=1e-7)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["dev"]["averaged_steps"] == [10, 20] and 0 <= metrics["dev"]["wer"] <= 100
    assert "Dev (" in result.stdout and "the average of steps 10, 20" in result.stdout

    too_many = run_group([*command[:3], "--last", "3"], 120, env=train_env(tmp_path), capture_output=True, text=True,
                         cwd=tmp_path)
    assert too_many.returncode == 2 and "holds 2 complete checkpoint(s), fewer than the 3" in too_many.stderr
    same = run_group([*command[:5], "--output_dir", str(out)], 120, env=train_env(tmp_path), capture_output=True,
                     text=True, cwd=tmp_path)
    assert same.returncode == 2 and "must differ from the run's folder" in same.stderr
