"""The CPU dropout mask (`_keep_mask`): the premise it stands on (torch's int64 `random_()` gives 63 uniform bits), its
rate on both halves of a word, the independence of neighbours, reproducibility from the default generator, and the
two dropout forms against `x * mask / (1 - p)` in value and gradient. Tolerances are 5 standard deviations."""

import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from vaswani.modeling_vaswani import _add_dropout, _dropout, _fast_dropout_applies, _keep_mask

N = 1 << 20


def test_int64_random_gives_63_uniform_bits():
    torch.manual_seed(0)
    words = torch.empty(1 << 16, dtype=torch.int64).random_()
    bits = (words[:, None] >> torch.arange(64)) & 1
    frequency = bits.double().mean(0)
    sigma = 0.5 / math.sqrt(words.numel())
    assert (frequency[:63] - 0.5).abs().max() < 5 * sigma, frequency
    assert frequency[63] == 0  # the sign bit: why `_keep_mask` keeps 31 bits of each half


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_mask_rate_on_both_halves_of_each_word(p):
    torch.manual_seed(1)
    mask = _keep_mask(torch.empty(N), p)
    assert mask.dtype == torch.bool and mask.shape == (N,)
    sigma = math.sqrt(p * (1 - p) / (N // 2))
    for half in (mask[0::2], mask[1::2]):  # the low and the high 32 bits of the draws
        assert abs(half.double().mean().item() - (1 - p)) < 5 * sigma


def test_keep_mask_neighbours_are_independent():
    p = 0.3
    torch.manual_seed(2)
    mask = _keep_mask(torch.empty(N), p).double()
    sigma = math.sqrt(p * p * (1 - p * p) / (N // 2))
    same_word = ((1 - mask[0::2]) * (1 - mask[1::2])).mean().item()
    next_word = ((1 - mask[1:-1:2]) * (1 - mask[2::2])).mean().item()
    assert abs(same_word - p * p) < 5 * sigma and abs(next_word - p * p) < 5 * sigma


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
    expected = x.detach() * mask / (1 - p)
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
    assert torch.allclose(fused[1], weight * mask / (1 - p), atol=1e-6)
    assert torch.allclose(branch.grad, fused[1], atol=1e-6)


def test_dropout_keeps_the_mean_and_scales_bfloat16():
    torch.manual_seed(6)
    out = _dropout(torch.ones(N), 0.1, training=True)
    assert abs(out.mean().item() - 1) < 5 * math.sqrt(0.1 / 0.9 / N)
    assert torch.equal(out.unique(), torch.tensor([0.0, 1 / 0.9]))
    half = _dropout(torch.ones(1000, dtype=torch.bfloat16), 0.1, training=True)
    assert half.dtype == torch.bfloat16 and set(half.unique().tolist()) <= {0.0, float(torch.tensor(1 / 0.9).bfloat16())}


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
