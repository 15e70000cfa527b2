"""The GPU kit (scripts/gpu_run.sh -> gpu_check.py, gpu_benchmark.py, gpu_patterns.py) run end to end on the CPU at
the tiny size, so that a lent GPU machine's few minutes are not lost to a broken script: the package copied into a
site folder (no build) is the one imported, the scripts' tables and JSON come out, and SDPA agrees with eager (for
the long-input patterns too)."""

import json
import os
import sys

import pytest
import torch

from helpers import REPO, load_script, run_group


def test_gpu_run_kit_smoke_on_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(tmp_path / "site"), "PYTHON": sys.executable,
           "GPU_RUN_SMOKE": "1"}
    result = run_group(["bash", str(REPO / "scripts" / "gpu_run.sh")], timeout=300, env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "out"
    assert f"vaswani from {tmp_path / 'site' / 'vaswani' / '__init__.py'}" in (out / "versions.txt").read_text()
    check = (out / "gpu_check.log").read_text()
    sdpa = next(line for line in check.splitlines() if line.startswith("sdpa "))
    logits_rel, grads_rel, same, finite = sdpa.split()[1:]
    assert float(logits_rel) < 0.05 and float(grads_rel) < 0.1 and same == "100%" and finite == "True"
    assert "flash_attention_2: unavailable" in check  # no flash-attn package here: reported, not a crash
    report = json.loads((out / "gpu_benchmark.json").read_text())
    assert report["device"] == "cpu" and report["dtype"] == "float32"
    assert {row["backend"] for row in report["rows"]} == {"eager", "sdpa"}
    assert all(row["tokens_per_s"] > 0 and row["generate_tokens_per_s"] > 0 for row in report["rows"])
    assert all(row["peak_memory_gib"] is None for row in report["rows"])  # strict JSON: no NaN for "not measured"
    patterns = json.loads((out / "gpu_patterns.json").read_text())
    checked = {(r["pattern"], r["backend"]): r for r in patterns["agreement"]}
    assert {("local", "sdpa"), ("block_sparse", "sdpa"), ("linear", "sdpa")} <= set(checked)
    assert all(r["logits_rel"] < 1e-4 and r["greedy_same"] == 1.0 and r["finite"] for r in checked.values())
    costs = {(r["pattern"], r["source_length"]): r["step_seconds"] for r in patterns["costs"]}
    assert set(costs) == {(p, n) for p in ("full", "local", "block_sparse", "linear") for n in (32, 64)}
    assert all(isinstance(seconds, float) and seconds > 0 for seconds in costs.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
@pytest.mark.parametrize("script", ["gpu_check", "gpu_benchmark", "gpu_patterns"])
def test_gpu_scripts_say_what_is_missing_without_cuda(script):
    module = load_script(script)
    with pytest.raises(SystemExit, match=r"no CUDA device here.*--device cpu"):
        module.main([])
