"""The oneDNN linear layers (modeling/onednn_vaswani.py, the `onednn_linear` fast path): forward and every gradient
against F.linear in float64, and what the function mode replaces and what it leaves alone."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from vaswani import onednn_vaswani
from vaswani.onednn_vaswani import OneDNNLinearMode, onednn_linear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture(autouse=True)
def every_size_on_onednn(monkeypatch):
    """The tests' GEMMs are small: send them to oneDNN all the same (the size rule has its own test)."""
    monkeypatch.setattr(onednn_vaswani, "SMALLEST_GEMM", 0)


@pytest.mark.parametrize("rows, on_onednn", [(1, False), (2, True)])
def test_gemms_below_the_smallest_stay_on_f_linear(monkeypatch, rows, on_onednn):
    """rows x 24 -> 40 against a threshold of 1.5 rows' multiply-adds: one row stays on F.linear (no oneDNN call,
    the same tensor as F.linear), two go to oneDNN; with and without gradients."""
    monkeypatch.setattr(onednn_vaswani, "SMALLEST_GEMM", 24 * 40 * 3 // 2)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 24, generator=g, requires_grad=True)
    weight, bias = torch.randn(40, 24, generator=g, requires_grad=True), torch.randn(40, generator=g)
    for grad_mode in (torch.enable_grad, torch.no_grad):
        with grad_mode(), mock.patch.object(onednn_vaswani, "_inner_product",
                                            wraps=onednn_vaswani._inner_product) as inner:
            out = onednn_linear(x, weight, bias)
        assert inner.called is on_onednn
        if not on_onednn:
            torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=0, atol=0)
        torch.testing.assert_close(out, F.linear(x.double(), weight.double(), bias.double()).float())


def float64_reference(x, weight, bias, grad):
    """F.linear's output and gradients in float64, rounded to float32 at the end."""
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias) if t is not None]
    out = F.linear(*leaves)
    out.backward(grad.double())
    return out.float(), [leaf.grad.float() for leaf in leaves]


@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24), (1, 24)])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_every_gradient_equal_float64(shape, bias):
    g = torch.Generator().manual_seed(len(shape) + bias)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    weight = torch.randn(40, 24, generator=g, requires_grad=True)
    b = torch.randn(40, generator=g, requires_grad=True) if bias else None
    grad = torch.randn(*shape[:-1], 40, generator=g)
    out = onednn_linear(x, weight, b)
    out.backward(grad)
    expected, expected_grads = float64_reference(x, weight, b, grad)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for leaf, expected_grad in zip([t for t in (x, weight, b) if t is not None], expected_grads):
        torch.testing.assert_close(leaf.grad, expected_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(64, 24), (4, 9, 24)])
def test_the_decoding_loops_function_equals_float64(shape):
    """onednn_linear without gradients, as the decoding loops call it: no autograd node, the same product."""
    g = torch.Generator().manual_seed(len(shape))
    x, weight, bias = torch.randn(*shape, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    with torch.inference_mode(), mock.patch.object(onednn_vaswani._OneDNNLinear, "apply") as apply:
        out = onednn_linear(x, weight, bias)
    apply.assert_not_called()
    expected = F.linear(x.double(), weight.double(), bias.double()).float()
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_strided_input_and_gradient():
    """A transposed view as input and a non-contiguous incoming gradient (what reshapes and transposes hand on)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 9, generator=g).t().requires_grad_()
    weight = torch.randn(16, 24, generator=g, requires_grad=True)
    grad = torch.randn(16, 9, generator=g).t()
    out = onednn_linear(x, weight)
    out.backward(grad)
    expected, (grad_x, grad_weight) = float64_reference(x, weight, None, grad)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, grad_x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, grad_weight, rtol=1e-5, atol=1e-5)


def test_only_the_gradients_asked_for_are_computed():
    x = torch.randn(6, 8, requires_grad=True)
    weight, bias = torch.randn(4, 8), torch.randn(4, requires_grad=True)  # a frozen weight
    with mock.patch.object(onednn_vaswani, "_inner_product", wraps=onednn_vaswani._inner_product) as product:
        onednn_linear(x, weight, bias).sum().backward()
    assert product.call_count == 2  # the forward and the input gradient, no weight gradient
    assert weight.grad is None and x.grad is not None and torch.equal(bias.grad, torch.full((4,), 6.0))


def test_the_mode_replaces_float32_cpu_linear_calls_only():
    linear = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with mock.patch.object(onednn_vaswani, "onednn_linear", wraps=onednn_linear) as spy, OneDNNLinearMode():
        assert onednn_vaswani.mode_active()
        out = linear(x)
        F.linear(input=x, weight=linear.weight)  # keyword arguments too
        assert spy.call_count == 2
        linear.double()(x.double())  # float64: F.linear's own
        F.linear(torch.randn(0, 8), torch.randn(4, 8))  # empty
        torch.matmul(x, x.t())  # not a linear layer
        assert spy.call_count == 2
    assert not onednn_vaswani.mode_active()
    torch.testing.assert_close(out, F.linear(x, linear.weight.float(), linear.bias.float()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vendor, capability, expected", [("AuthenticAMD", "AVX512", True),
                                                          ("GenuineIntel", "AVX512", False),
                                                          ("AuthenticAMD", "AVX2", False)])
def test_faster_here_means_amd_with_avx512(tmp_path, vendor, capability, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu\n")
    real_open = open
    onednn_vaswani.faster_here.cache_clear()
    try:
        with mock.patch("builtins.open", lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path,
                                                                         *a, **k)), \
                mock.patch.object(torch.backends.cpu, "get_cpu_capability", return_value=capability):
            assert onednn_vaswani.faster_here() is expected
    finally:
        onednn_vaswani.faster_here.cache_clear()


def test_the_weight_gradient_reads_its_operands_untransposed():
    """The backward multiplies g W by oneDNN's inner product, and g^T x with the bias's column sums by its
    backward-weights primitive, handed g and x as they are stored (the inner product on g^T and x^T would copy both
    first): one call of each."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(12, 24, generator=g, requires_grad=True)
    weight = torch.randn(40, 24, generator=g, requires_grad=True)
    bias = torch.randn(40, generator=g, requires_grad=True)
    out = onednn_linear(x, weight, bias)
    with mock.patch.object(onednn_vaswani, "_inner_product", wraps=onednn_vaswani._inner_product) as inner, \
            mock.patch.object(onednn_vaswani, "_weight_gradients", wraps=onednn_vaswani._weight_gradients) as weights:
        out.backward(torch.randn(12, 40, generator=g))
    assert inner.call_count == 1
    assert inner.call_args.args[0].shape == (12, 40)  # the incoming gradient, for the input's gradient
    assert weights.call_count == 1
    grad, saved = weights.call_args.args[:2]
    assert grad.shape == (12, 40) and grad.stride() == (40, 1)  # row by row, not a transposed view
    assert saved.shape == (12, 24) and saved.stride() == (24, 1)


def test_a_trainable_weight_beside_a_frozen_bias():
    """The bias's column sums come with the weight's gradient only when the bias wants one."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(10, 24, generator=g)
    weight, bias = torch.randn(40, 24, generator=g, requires_grad=True), torch.randn(40, generator=g)
    grad = torch.randn(10, 40, generator=g)
    onednn_linear(x, weight, bias).backward(grad)
    assert bias.grad is None
    torch.testing.assert_close(weight.grad, (grad.double().t() @ x.double()).float(), rtol=1e-5, atol=1e-5)
