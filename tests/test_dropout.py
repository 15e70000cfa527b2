"""The CPU dropout mask (`_keep_mask`): the premise it stands on (torch's int64 `random_()` over the full int64 range
gives 64 uniform bits), its rate on each quarter of a word, the independence of neighbours, reproducibility from the
default generator, the rate's 2**-16 resolution, and the two dropout forms against `x * mask / keep rate` in value and
gradient. Tolerances are 5 standard deviations."""

import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from vaswani.modeling_vaswani import _add_dropout, _dropout, _fast_dropout_applies, _keep_mask, _keep_scale

N = 1 << 20


def test_full_range_int64_random_gives_64_uniform_bits():
    torch.manual_seed(0)
    words = torch.empty(1 << 16, dtype=torch.int64).random_(-(2**63), None)
    bits = (words[:, None] >> torch.arange(64)) & 1
    frequency = bits.double().mean(0)
    sigma = 0.5 / math.sqrt(words.numel())
    assert (frequency - 0.5).abs().max() < 5 * sigma, frequency  # the sign bit too: all four 16-bit quarters usable
    plain = torch.empty(1 << 10, dtype=torch.int64).random_()
    assert (plain >= 0).all()  # without the range, the sign bit is always 0 (the premise the range avoids)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_mask_rate_on_each_quarter_of_each_word(p):
    torch.manual_seed(1)
    mask = _keep_mask(torch.empty(N), p)
    assert mask.dtype == torch.bool and mask.shape == (N,)
    sigma = math.sqrt(p * (1 - p) / (N // 4))
    for quarter in range(4):  # the 16-bit quarters of the 64-bit draws
        assert abs(mask[quarter::4].double().mean().item() - (1 - p)) < 5 * sigma


def test_keep_mask_neighbours_are_independent():
    p = 0.3
    torch.manual_seed(2)
    mask = _keep_mask(torch.empty(N), p).double()
    sigma = math.sqrt(p * p * (1 - p * p) / (N // 4))
    for offset in range(4):  # pairs within a word (offsets 0-2) and across two words (offset 3)
        pair = ((1 - mask[offset:-4:4]) * (1 - mask[offset + 1::4][: N // 4 - 1])).mean().item()
        assert abs(pair - p * p) < 5 * sigma, offset


def test_drop_rate_is_resolved_to_two_to_the_minus_16_and_the_scale_follows_it():
    for p in (0.1, 0.25, 0.3, 2**-8, 1 - 2**-8):
        realised = 1 - 1 / _keep_scale(p)
        assert abs(realised - p) <= 2**-17 and abs(realised * 2**16 - round(realised * 2**16)) < 1e-6
    assert _keep_scale(0.25) == 4 / 3  # representable rates are exact
    x = torch.empty(1 << 18)
    torch.manual_seed(8)
    tiny = _keep_mask(x, 2**-12)
    assert (~tiny).sum() > 0  # 16 of 65536 values drop
    assert not _fast_dropout_applies(x, 2**-9) and not _fast_dropout_applies(x, 1 - 2**-9)  # F.dropout there


def test_keep_mask_odd_sizes_and_shapes_and_the_default_generator():
    x = torch.empty(3, 5, 7)
    torch.manual_seed(3)
    first = _keep_mask(x, 0.2)
    torch.manual_seed(3)
    again = _keep_mask(x, 0.2)
    assert first.shape == x.shape and torch.equal(first, again)
    assert not torch.equal(first, _keep_mask(x, 0.2))  # the generator moved on


def test_dropout_is_x_times_mask_over_keep_probability_in_value_and_gradient():
    p = 0.25
    x = torch.randn(37, 11, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(4)
    out = _dropout(x, p, training=True)
    torch.manual_seed(4)
    mask = _keep_mask(x, p)
    expected = x.detach() * mask / (1 - p)  # 0.25 is a multiple of 2**-16: the realised rate is p itself
    assert torch.allclose(out, expected, rtol=1e-15, atol=0)
    assert 0 < mask.sum() < mask.numel()
    out.backward(torch.full_like(out, 2.0))
    assert torch.allclose(x.grad, 2.0 * mask.double() / (1 - p), rtol=1e-15, atol=0)


def test_add_dropout_equals_residual_plus_dropout_in_value_and_gradient():
    p = 0.1
    residual = torch.randn(64, 32, requires_grad=True)
    branch = torch.randn(64, 32, requires_grad=True)
    weight = torch.randn(64, 32)
    torch.manual_seed(5)
    (_add_dropout(residual, branch, p, training=True) * weight).sum().backward()
    fused = residual.grad.clone(), branch.grad.clone()
    residual.grad = branch.grad = None
    torch.manual_seed(5)
    mask = _keep_mask(branch, p)
    torch.manual_seed(5)
    plain = residual + _dropout(branch, p, training=True)
    (plain * weight).sum().backward()
    torch.manual_seed(5)
    assert torch.allclose(_add_dropout(residual, branch, p, training=True), plain, atol=1e-6)
    assert torch.equal(fused[0], weight)
    assert torch.allclose(fused[1], weight * mask * _keep_scale(p), atol=1e-6)
    assert torch.allclose(branch.grad, fused[1], atol=1e-6)


def test_dropout_keeps_the_mean_and_scales_bfloat16():
    torch.manual_seed(6)
    out = _dropout(torch.ones(N), 0.1, training=True)
    assert abs(out.mean().item() - 1) < 5 * math.sqrt(0.1 / 0.9 / N)
    assert torch.equal(out.unique(), torch.tensor([0.0, _keep_scale(0.1)]))
    half = _dropout(torch.ones(1000, dtype=torch.bfloat16), 0.1, training=True)
    assert half.dtype == torch.bfloat16
    assert set(half.unique().tolist()) <= {0.0, float(torch.tensor(_keep_scale(0.1)).bfloat16())}


def test_identity_when_off_and_fallbacks():
    x = torch.randn(8, 8)
    assert _dropout(x, 0.1, training=False) is x and _dropout(x, 0.0, training=True) is x
    assert torch.equal(_add_dropout(x, x, 0.1, training=False), 2 * x)
    assert _fast_dropout_applies(x, 0.1)
    assert not _fast_dropout_applies(x.to("meta"), 0.1) and not _fast_dropout_applies(x, 1.0)
    with mock.patch.object(torch.compiler, "is_compiling", return_value=True):  # a compiled graph: F.dropout
        assert not _fast_dropout_applies(x, 0.1)
        torch.manual_seed(7)
        out = _dropout(x, 0.5, training=True)
    torch.manual_seed(7)
    assert torch.equal(out, F.dropout(x, 0.5, training=True))
