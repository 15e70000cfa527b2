"""vaswani.training.ema: the averaged weights against a float64 hand computation, ties, save/load, errors."""

from __future__ import annotations

import pytest
import torch

from vaswani import VaswaniForConditionalGeneration
from vaswani.training.ema import EMA_FILE, WeightEMA, warmed_up_decay


def test_warmed_up_decay():
    assert warmed_up_decay(0.998, 0) == pytest.approx(0.1)
    assert warmed_up_decay(0.998, 90) == pytest.approx(0.91)
    assert warmed_up_decay(0.998, 10**6) == 0.998


def test_average_matches_a_float64_hand_computation():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ema = WeightEMA(model, decay=0.5)
    expected = None
    for n in range(6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        current = {k: v.detach().double().clone() for k, v in model.named_parameters()}
        ema.update(model)
        if expected is None:  # the first update copies
            expected = current
        else:
            d = min(0.5, (1 + n) / (10 + n))  # update n (0-based) is the n-th after the copy
            expected = {k: d * expected[k] + (1 - d) * current[k] for k in current}
    assert ema.updates == 6
    for name, p in ema.module.named_parameters():
        torch.testing.assert_close(p.double(), expected[name], rtol=1e-6, atol=1e-7)
        assert not p.requires_grad
    assert not torch.equal(ema.module.weight, model.weight)


def test_ties_survive_and_save_load_round_trips(tiny_config, tmp_path):
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(tiny_config)
    ema = WeightEMA(model, decay=0.9)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.1)
        ema.update(model)
    averaged = ema.module
    assert averaged.lm_head.weight is averaged.model.shared.weight  # one tensor, averaged once
    ema.save(tmp_path)

    fresh = WeightEMA(VaswaniForConditionalGeneration(tiny_config), decay=0.9)
    fresh.load(tmp_path)
    assert fresh.updates == 3
    for (name, a), (_, b) in zip(ema.module.named_parameters(), fresh.module.named_parameters()):
        assert torch.equal(a, b), name
    assert fresh.module.lm_head.weight is fresh.module.model.shared.weight


def test_errors_name_the_fix(tiny_config, tmp_path):
    model = VaswaniForConditionalGeneration(tiny_config)
    with pytest.raises(ValueError, match=r"decay=1.0 must be in \(0, 1\)"):
        WeightEMA(model, decay=1.0)
    with pytest.raises(ValueError, match=f"has no {EMA_FILE}.*--ema_decay 0"):
        WeightEMA(model, decay=0.9).load(tmp_path)
    from safetensors.torch import save_file

    save_file({"other.weight": torch.zeros(2)}, str(tmp_path / EMA_FILE))
    with pytest.raises(ValueError, match="does not match the model"):
        WeightEMA(model, decay=0.9).load(tmp_path)
    save_file({name: p.detach() for name, p in WeightEMA(model, decay=0.9).module.named_parameters()},
              str(tmp_path / EMA_FILE))  # the right tensors, but no update count
    with pytest.raises(ValueError, match="no update count.*--ema_decay 0"):
        WeightEMA(model, decay=0.9).load(tmp_path)
