"""The `onednn_linear` fast path: the linear layers' GEMMs on oneDNN instead of MKL.

torch runs a float32 `F.linear` on CPU through MKL's sgemm. On AMD CPUs with AVX-512, MKL takes a code path without
AVX-512 and oneDNN's inner product (`torch.ops.mkldnn._linear_pointwise`, the kernel inductor emits on CPU) runs the
same GEMMs much faster (docs/performance.md has the table), except the smallest: below `SMALLEST_GEMM` multiply-adds
(a decoding step's GEMMs at small batches) oneDNN's fixed cost per call outweighs its speed, so those stay on
F.linear. The path changes which library multiplies, nothing else: every module's forward still runs, and each
`F.linear` called inside the model's forward becomes `onednn_linear`, whose gradients also run on oneDNN. The result
is the same product, rounded in another order.

`OneDNNLinearMode` is the torch function mode that makes the substitution; fast_paths_vaswani.py decides where it is
entered.
"""

from __future__ import annotations

import functools
import threading

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def _inner_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (m, k) @ weight(n, k)^T + bias on oneDNN; x and weight may be transposed views."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _weight_gradients(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: bool):
    """(g^T x, the column sums of g when `bias`, else an undefined value) from oneDNN's inner-product backward-weights
    primitive, which reads g and x row by row as they are stored: a plain copy of each into oneDNN's tensors, and no
    transposed operand (the inner product would copy g^T and x^T first, as transposes)."""
    return torch.ops.aten.mkldnn_linear_backward_weights(grad.to_mkldnn(), x.to_mkldnn(), weight, bias)


class _OneDNNLinear(torch.autograd.Function):
    """F.linear over 2D input on oneDNN: the forward and the input gradient g W by its inner product, the weight
    gradient g^T x and the bias gradient (the column sums of g) in one call of its backward-weights primitive
    (docs/performance.md has the measurements). Saves what F.linear saves: the input and the weight."""

    @staticmethod
    def forward(x, weight, bias):
        return _inner_product(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        wants_x, wants_weight, wants_bias = ctx.needs_input_grad
        wants_bias = wants_bias and ctx.has_bias
        grad_x = _inner_product(grad, weight.t()) if wants_x else None
        grad_weight = grad_bias = None
        if wants_weight:
            grad_weight, grad_bias = _weight_gradients(grad, x, weight, wants_bias)
        elif wants_bias:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias if wants_bias else None


# GEMMs of fewer multiply-adds (rows x in x out) stay on F.linear (measured by shape in docs/performance.md).
SMALLEST_GEMM = 1 << 22


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x (..., k) on oneDNN, or on F.linear when it is smaller than `SMALLEST_GEMM`;
    through autograd only where a gradient is wanted (the decoding loops, which run without gradients, call it
    directly)."""
    if x.numel() * weight.shape[0] < SMALLEST_GEMM:  # rows x in x out
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    out = _OneDNNLinear.apply(flat, weight, bias) if wants_grad else _inner_product(flat, weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


def _servable(x, weight, bias=None) -> bool:
    """float32 dense CPU tensors of plain types, a 2D weight, a non-empty input (anything else keeps F.linear)."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == torch.float32 and t.device.type == "cpu"
                and t.layout == torch.strided for t in tensors)
            and weight.dim() == 2 and x.dim() >= 1 and x.numel() > 0 and (bias is None or bias.dim() == 1))


def _linear_arguments(input, weight, bias=None):  # noqa: A002 (F.linear's names)
    return input, weight, bias


class OneDNNLinearMode(TorchFunctionMode):
    """While active, `F.linear` on servable tensors runs as `onednn_linear`; every other call is untouched."""

    def __enter__(self):
        _entered.depth = getattr(_entered, "depth", 0) + 1
        return super().__enter__()

    def __exit__(self, *exc_info):
        _entered.depth -= 1
        return super().__exit__(*exc_info)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, bias = _linear_arguments(*args, **kwargs)
            if _servable(x, weight, bias):
                return onednn_linear(x, weight, bias)
        return func(*args, **kwargs)


_entered = threading.local()  # how many OneDNNLinearModes this thread is inside


def mode_active() -> bool:
    """Whether this thread runs inside a OneDNNLinearMode."""
    return getattr(_entered, "depth", 0) > 0


@functools.cache
def faster_here() -> bool:
    """Whether this CPU is one where oneDNN's float32 GEMMs beat MKL's: AMD with AVX-512 (MKL's own AVX-512 code runs
    on Intel CPUs, where oneDNN is no faster), and a torch built with oneDNN."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in cpuinfo)
    except OSError:
        return False
