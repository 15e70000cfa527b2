"""Sinusoidal positions (modeling/positions_vaswani.py) against the paper's formula evaluated in float64."""

import math

import pytest
import torch
from helpers import make_model

from vaswani.positions_vaswani import SinusoidalPositions


@pytest.mark.parametrize("layout", ["sinusoidal_interleaved", "sinusoidal_split"])
def test_positions_equal_float64_formula(layout):
    d_model, positions = 32, torch.arange(0, 3000, 7)
    got = SinusoidalPositions(d_model, layout)(positions, torch.float64)
    expected = torch.empty(len(positions), d_model, dtype=torch.float64)
    for row, pos in enumerate(positions.tolist()):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            if layout == "sinusoidal_interleaved":
                expected[row, 2 * i], expected[row, 2 * i + 1] = math.sin(angle), math.cos(angle)
            else:
                expected[row, i], expected[row, d_model // 2 + i] = math.sin(angle), math.cos(angle)
    assert (got - expected).abs().max() < 1e-12
    assert (SinusoidalPositions(d_model, layout)(positions, torch.float32).double() - expected).abs().max() < 1e-6


def test_cached_position_table_equals_the_formula_as_it_grows(tiny_config):
    positions = SinusoidalPositions(16, "sinusoidal_split")
    for start, length in [(0, 3), (60, 10), (1000, 5), (5, 2)]:
        expected = positions(torch.arange(start, start + length), torch.float32)
        assert torch.equal(positions.range(start, length, torch.float32, torch.device("cpu")), expected)
    model = make_model(tiny_config)
    model.init_weights()  # re-initialising the model cannot touch computed positions
    table = model.model.encoder.embed_positions.range(0, 8, torch.float64, torch.device("cpu"))
    assert table[3, 1].item() == pytest.approx(math.cos(3.0), abs=1e-12)
