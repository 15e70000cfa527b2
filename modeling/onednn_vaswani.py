"""oneDNN kernels for the fast paths: the ReLU feed-forward as one autograd node, and linear layers with their weights
packed once for the many calls of one `generate`.

`torch.ops.mkldnn._linear_pointwise` computes x @ W^T + b (optionally followed by a ReLU, or plus another tensor)
in one kernel. Where the CPU runs torch's AVX-512 kernels, oneDNN's inner product is faster than MKL's at this model's
shapes (docs/performance.md); elsewhere the fast paths that use it step aside.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def onednn_available() -> bool:
    """Whether torch has oneDNN's linear kernels and runs AVX-512 kernels on this CPU."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and torch.backends.cpu.get_cpu_capability() == "AVX512")


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False) -> torch.Tensor:
    """x @ weight.T + bias on oneDNN (then a ReLU in the same kernel when `relu`); `weight` dense (N, K), any strides,
    or packed by `pack_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "relu" if relu else "none", [], "")


def _linear_gradients(grad_output: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, needs_x: bool,
                      needs_weight: bool, needs_bias: bool) -> tuple[torch.Tensor | None, ...]:
    """The wanted gradients of x @ weight.T + bias: the input's on oneDNN, the weight's with `mm`, the bias's a sum."""
    flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
    grad_x = _linear(grad_output, weight.t(), None) if needs_x else None
    grad_weight = flat_grad.t() @ x.reshape(-1, x.shape[-1]) if needs_weight else None
    grad_bias = flat_grad.sum(0) if needs_bias else None
    return grad_x, grad_weight, grad_bias


class _ReLUFeedForward(torch.autograd.Function):
    """fc2(relu(fc1(x))) as one autograd node: the ReLU runs inside fc1's kernel, and its backward runs in place on
    the gradient buffer of fc2's input, where separate layers write a second (tokens, ffn_dim) buffer. Saves what the
    separate layers save: the input, the ReLU's output and the weights."""

    @staticmethod
    def forward(ctx, x, weight1, bias1, weight2, bias2) -> torch.Tensor:
        inner = _linear(x, weight1, bias1, relu=True)
        ctx.save_for_backward(x, weight1, weight2, inner)
        ctx.has_bias = (bias1 is not None, bias2 is not None)
        return _linear(inner, weight2, bias2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        x, weight1, weight2, inner = ctx.saved_tensors
        needs_x, needs_weight1, needs_bias1, needs_weight2, needs_bias2 = ctx.needs_input_grad
        has_bias1, has_bias2 = ctx.has_bias
        needs_inner = needs_x or needs_weight1 or needs_bias1
        grad_inner, grad_weight2, grad_bias2 = _linear_gradients(grad_output, inner, weight2, needs_inner,
                                                                 needs_weight2, needs_bias2 and has_bias2)
        grad_x = grad_weight1 = grad_bias1 = None
        if needs_inner:  # the ReLU's backward, in place, then fc1's gradients
            torch.ops.aten.threshold_backward.grad_input(grad_inner, inner, 0, grad_input=grad_inner)
            grad_x, grad_weight1, grad_bias1 = _linear_gradients(grad_inner, x, weight1, needs_x, needs_weight1,
                                                                 needs_bias1 and has_bias1)
        return grad_x, grad_weight1, grad_bias1, grad_weight2, grad_bias2


def relu_feed_forward(x: torch.Tensor, fc1: torch.nn.Linear, fc2: torch.nn.Linear) -> torch.Tensor:
    """fc2(relu(fc1(x))) on oneDNN: one autograd node when a gradient is wanted, two kernels otherwise."""
    leaves = (x, fc1.weight, fc1.bias, fc2.weight, fc2.bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in leaves):
        return _ReLUFeedForward.apply(*leaves)
    return _linear(_linear(x, fc1.weight, fc1.bias, relu=True), fc2.weight, fc2.bias)


class FrozenLinear:
    """A linear layer's weights prepared for many inference calls on inputs of about `rows` rows (one `generate`):
    packed once into oneDNN's blocked layout where it is available, else used as they are. `relu`: a ReLU follows,
    inside oneDNN's kernel. The same results as the plain layer either way."""

    MIN_ROWS = 4  # below this, oneDNN's fixed cost per call outweighs its faster kernel

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int, relu: bool = False):
        self.bias, self.relu = bias, relu
        self.onednn = (rows >= self.MIN_ROWS and onednn_available() and weight.device.type == "cpu"
                       and weight.dtype == torch.float32)
        if self.onednn:
            with torch.no_grad():
                weight = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            return _linear(x, self.weight, self.bias, self.relu)
        out = F.linear(x, self.weight, self.bias)
        return out.relu_() if self.relu else out

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """self(x) + other (a residual connection), the addition inside oneDNN's kernel."""
        if self.onednn and not self.relu:
            return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.weight, self.bias, "add")
        return other + self(x)
