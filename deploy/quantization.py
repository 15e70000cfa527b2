"""Int8 inference in PyTorch: torchao's dynamic quantization of the linear layers.

`quantize_int8(model)` replaces the weight of every `nn.Linear` (the attention projections, the feed-forward layers
and the output projection) with torchao's int8 tensor, per output channel; activations are quantized per token at
run time. Embeddings and layer norms stay float. The model still runs its own forward and `generate`: the weights
are no longer plain parameters, so the fast paths step aside (the module contract of fast_paths_vaswani.py).
"""

from __future__ import annotations

from torch import nn

from . import require


def quantize_int8(model: nn.Module, output_projection: bool = True) -> nn.Module:
    """Quantizes `model`'s linear layers to int8 in place (weights per channel, activations per token, dynamic)
    and returns it. output_projection=False keeps `lm_head` in float."""
    require("torchao", "int8 quantization")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    head = getattr(model, "lm_head", None)

    def is_quantized(module: nn.Module, name: str) -> bool:
        return isinstance(module, nn.Linear) and (output_projection or module is not head)

    quantize_(model, Int8DynamicActivationInt8WeightConfig(), filter_fn=is_quantized)
    return model
