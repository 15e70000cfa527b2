"""An exponential moving average (EMA) of the weights: what the loop evaluates, keeps as best and exports.

Averaging the weights over the last few hundred updates removes most of the noise a high learning rate leaves in
them, at the cost of one `lerp` per parameter per update (its effect on the G2P job: docs/history.md). Built on `torch.optim.swa_utils.AveragedModel`; the decay is warmed up
as `min(decay, (1 + n) / (10 + n))` after `n` updates, so early averages are not dominated by the random
initialisation (the rule of TensorFlow's ExponentialMovingAverage `num_updates`).

State for exact resume: one safetensors file in the checkpoint folder (so the checkpoint's sha256 marker covers
it) with the averaged parameters and, in its metadata, the number of updates.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.optim.swa_utils import AveragedModel

from .train_state import load_weights, save_weights

EMA_FILE = "ema.safetensors"


def warmed_up_decay(decay: float, updates: int) -> float:
    """The decay applied by the `updates`-th update after the first (which copies the weights)."""
    return min(decay, (1 + updates) / (10 + updates))


class WeightEMA:
    """`update(model)` after every optimizer update; `module` is the averaged copy (eval mode, no gradients)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0 < decay < 1:
            raise ValueError(f"ema decay={decay} must be in (0, 1); 0.998 averages over ~500 updates")
        self.decay = decay
        self._averaged = AveragedModel(model, multi_avg_fn=self._lerp)
        self.module.requires_grad_(False)
        self.module.eval()

    def _lerp(self, averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged) -> None:
        weight = 1.0 - warmed_up_decay(self.decay, int(num_averaged))
        torch._foreach_lerp_(averaged, current, weight)

    @property
    def module(self) -> torch.nn.Module:
        return self._averaged.module

    @property
    def updates(self) -> int:
        return int(self._averaged.n_averaged)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self._averaged.update_parameters(model)

    def save(self, folder: str | Path) -> None:
        """The averaged weights (tied ones once, by their first name) to `folder/ema.safetensors`."""
        save_weights(self.module, Path(folder) / EMA_FILE, metadata={"updates": str(self.updates)})

    @torch.no_grad()
    def load(self, folder: str | Path) -> None:
        path = Path(folder) / EMA_FILE
        if not path.is_file():
            raise ValueError(f"{folder} has no {EMA_FILE}: the run being resumed did not average its weights; "
                             "resume with --ema_decay 0, or start a new run")
        with safe_open(str(path), framework="pt") as f:
            updates = (f.metadata() or {}).get("updates")
        load_weights(self.module, load_file(str(path)), str(path))
        if updates is None:  # without it the decay's warm-up would restart: the resume would not be exact
            raise ValueError(f"{path} has no update count in its metadata; it was not written by "
                             "WeightEMA.save. Resume with --ema_decay 0, or start a new run")
        self._averaged.n_averaged.fill_(int(updates))
