"""vaswani.training.averaging: the mean of the last K complete checkpoints, against a float64 hand computation."""

import pytest
import torch
from safetensors.torch import save_file

from vaswani.training.averaging import average_checkpoints
from vaswani.training.checkpoints import MARKER, save_checkpoint, valid_checkpoints


def _write(folder, step, tensors, name="ema.safetensors"):
    return save_checkpoint(folder, step, lambda tmp: save_file(tensors, str(tmp / name)), epoch=0, batches_done=step,
                           keep_last=10)


def test_mean_of_the_newest_checkpoints_in_their_dtype(tmp_path):
    torch.manual_seed(0)
    weights = {step: {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16)} for step in (10, 20, 30)}
    for step, tensors in weights.items():
        _write(tmp_path, step, tensors)
    averaged, steps = average_checkpoints(tmp_path, 2)
    assert steps == [20, 30]
    expected_a = (weights[20]["a"].double() + weights[30]["a"].double()) / 2
    assert averaged["a"].dtype == torch.float32 and torch.equal(averaged["a"], expected_a.float())
    assert averaged["b"].dtype == torch.bfloat16
    assert torch.equal(averaged["b"], ((weights[20]["b"].double() + weights[30]["b"].double()) / 2).to(torch.bfloat16))
    one, steps = average_checkpoints(tmp_path, 1)
    assert steps == [30] and torch.equal(one["a"], weights[30]["a"])


def test_incomplete_checkpoints_are_skipped_and_too_few_is_a_clear_error(tmp_path):
    for step in (10, 20):
        _write(tmp_path, step, {"a": torch.full((2,), float(step))})
    (tmp_path / "checkpoint-20" / MARKER).unlink()  # an interrupted save
    assert [info.step for info in valid_checkpoints(tmp_path)] == [10]
    with pytest.raises(ValueError, match=r"holds 1 complete checkpoint\(s\), fewer than the 2 to average.*--keep_last 2"):
        average_checkpoints(tmp_path, 2)


def test_checkpoints_of_different_kinds_or_models_are_refused(tmp_path):
    _write(tmp_path / "kinds", 10, {"a": torch.zeros(2)}, "model.safetensors")
    _write(tmp_path / "kinds", 20, {"a": torch.zeros(2)})
    with pytest.raises(ValueError, match="hold different weights"):
        average_checkpoints(tmp_path / "kinds", 2)
    _write(tmp_path / "shapes", 10, {"a": torch.zeros(2)})
    _write(tmp_path / "shapes", 20, {"a": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"a has shape \(3,\)"):
        average_checkpoints(tmp_path / "shapes", 2)
    _write(tmp_path / "names", 10, {"a": torch.zeros(2)})
    _write(tmp_path / "names", 20, {"b": torch.zeros(2)})
    with pytest.raises(ValueError, match="other tensors"):
        average_checkpoints(tmp_path / "names", 2)
