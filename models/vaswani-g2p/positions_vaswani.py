"""Sinusoidal position encodings: computed from (position, d_model), never learned or saved, no length cap; and
word-aligned position ids (`word_position_ids`)."""

import torch
from torch import nn


class SinusoidalPositions(nn.Module):
    """
    Maps positions to the encodings of "Attention Is All You Need":
    PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    `layout="sinusoidal_interleaved"` puts sin and cos of each frequency side by side (the paper);
    `layout="sinusoidal_split"` puts all sines first, then all cosines (tensor2tensor, Marian).

    The module holds no parameter or buffer, so weight init and checkpoints can't touch it, and any position works.
    """

    def __init__(self, d_model: int, layout: str = "sinusoidal_interleaved"):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"d_model={d_model} must be even for sinusoidal positions")
        self.d_model = d_model
        self.layout = layout
        # Encodings of positions 0..n-1 per (device, dtype), grown on demand: a plain attribute, not a buffer, so
        # it is never saved, loaded or re-initialised (and always equals the formula).
        self._tables: dict = {}

    def range(self, start: int, length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Encodings of positions start .. start+length-1 as (length, d_model): a slice of the cached table, so
        that decoding step by step does not recompute the sines."""
        if torch.compiler.is_compiling():  # a traced graph (compile, export) computes them: it cannot hold a cache
            return self(torch.arange(length, device=device) + start, dtype)
        key = (torch.device(device), dtype)
        table = self._tables.get(key)
        if table is None or table.shape[0] < start + length:
            size = max(64, 2 * (start + length), 0 if table is None else 2 * table.shape[0])
            table = self(torch.arange(size, device=device), dtype)
            self._tables[key] = table
        return table[start : start + length]

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """position_ids: integer tensor (..., T). Returns (..., T, d_model) in `dtype`."""
        device = position_ids.device
        # float64 keeps large positions exact (pos * freq in float32 loses ~1e-4 by position 3000); MPS has no float64.
        work_device = device if device.type != "mps" else torch.device("cpu")
        exponent = torch.arange(0, self.d_model, 2, dtype=torch.float64, device=work_device) / self.d_model
        inv_freq = torch.pow(10000.0, -exponent)
        angles = position_ids.to(work_device, torch.float64).unsqueeze(-1) * inv_freq  # (..., T, d/2)
        sin, cos = angles.sin(), angles.cos()
        if self.layout == "sinusoidal_interleaved":
            encodings = torch.stack((sin, cos), dim=-1).flatten(-2)
        else:
            encodings = torch.cat((sin, cos), dim=-1)
        return encodings.to(device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, layout={self.layout}"


def word_position_ids(input_ids: torch.Tensor, boundary_id: int, stride: int) -> torch.Tensor:
    """Word-aligned positions: `stride` x (the token's word index) + (its offset in the word), where each
    `boundary_id` token opens a word at offset 0 and the first word starts at the sequence start. input_ids (..., T)
    -> int64 (..., T). For "A B | C D" (stride 64): 0, 1, 64, 65, 66. A word's tokens keep their positions wherever
    the word stands in a line, and the n-th word of a source and of its target share the same stretch."""
    is_boundary = input_ids == boundary_id
    index = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
    word_start = torch.where(is_boundary, index, 0).cummax(dim=-1).values
    return is_boundary.long().cumsum(dim=-1) * stride + (index - word_start)
