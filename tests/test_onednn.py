"""The oneDNN kernels of the fast paths (modeling/onednn_vaswani.py) against the plain layers: float64 `F.linear`, the
same oneDNN kernels as separate nodes, and the dense weight against the packed one."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from vaswani.onednn_vaswani import FrozenLinear, _linear, onednn_available, relu_feed_forward

pytestmark = pytest.mark.skipif(not onednn_available(), reason="oneDNN's AVX-512 kernels are not available here")


class _Separate(torch.autograd.Function):
    """One oneDNN linear layer (optionally with its ReLU) as its own autograd node: the reference for the fused one."""

    @staticmethod
    def forward(ctx, x, weight, bias, relu):
        out = _linear(x, weight, bias, relu)
        ctx.save_for_backward(x, weight, out)
        ctx.relu = relu
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, out = ctx.saved_tensors
        if ctx.relu:
            grad = grad * (out > 0)
        flat = grad.reshape(-1, grad.shape[-1])
        return (_linear(grad, weight.t(), None), flat.t() @ x.reshape(-1, x.shape[-1]), flat.sum(0), None)


@pytest.mark.parametrize("wanted", ["all", "weights only", "input only"])
def test_relu_feed_forward_node_equals_separate_layers_and_float64(wanted):
    """The feed-forward as one node (the ReLU's backward in place on its own buffer): the output bit for bit as the
    two kernels give it, gradients as float64 `F.linear` gives them, also when only some are wanted."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 32, generator=g)
    weight1, bias1 = torch.randn(64, 32, generator=g) / 32**0.5, torch.randn(64, generator=g)
    weight2, bias2 = torch.randn(32, 64, generator=g) / 8, torch.randn(32, generator=g)
    grad_output = torch.randn(3, 7, 32, generator=g)
    wants = {"all": [True] * 5, "weights only": [False, True, True, True, True],
             "input only": [True, False, False, False, False]}[wanted]

    def run(fn, dtype=torch.float32):
        leaves = [t.detach().to(dtype).requires_grad_(w) for t, w in zip((x, weight1, bias1, weight2, bias2), wants)]
        out = fn(*leaves)
        out.backward(grad_output.to(dtype))
        return out, [leaf.grad for leaf in leaves]

    def fused(x, w1, b1, w2, b2):
        return relu_feed_forward(x, SimpleNamespace(weight=w1, bias=b1), SimpleNamespace(weight=w2, bias=b2))

    out, grads = run(fused)
    assert type(out.grad_fn).__name__ == "_ReLUFeedForwardBackward"
    separate, separate_grads = run(lambda x, w1, b1, w2, b2: _Separate.apply(_Separate.apply(x, w1, b1, True), w2,
                                                                            b2, False))
    assert torch.equal(out, separate)
    expected, expected_grads = run(lambda x, w1, b1, w2, b2: F.linear(F.relu(F.linear(x, w1, b1)), w2, b2),
                                   torch.float64)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    for grad, separate_grad, expected_grad, want in zip(grads, separate_grads, expected_grads, wants):
        assert (grad is not None) == want
        if want:
            torch.testing.assert_close(grad, separate_grad, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert torch.equal(fused(x, weight1, bias1, weight2, bias2), separate)


def test_frozen_linear_is_the_plain_layer_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    x, weight, bias = torch.randn(64, 64, generator=g), torch.randn(96, 64, generator=g) / 8, torch.randn(96, generator=g)
    other = torch.randn(64, 96, generator=g)
    dense = _linear(x, weight, bias)
    torch.testing.assert_close(dense, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    frozen = FrozenLinear(weight, bias, rows=64)
    assert frozen.onednn
    assert torch.equal(frozen(x), dense)  # the packed weight computes what the dense one does
    assert torch.equal(frozen.plus(x, other), dense + other)
    assert torch.equal(FrozenLinear(weight, bias, rows=64, relu=True)(x), dense.relu())
    small = FrozenLinear(weight, bias, rows=FrozenLinear.MIN_ROWS - 1)
    assert not small.onednn and torch.equal(small(x[:2]), F.linear(x[:2], weight, bias))
    assert not FrozenLinear(weight.double(), bias.double(), rows=64).onednn
