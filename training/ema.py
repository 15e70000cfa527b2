"""An exponential moving average (EMA) of the weights: what the loop evaluates, keeps as best and exports.

Averaging the weights over the last few hundred updates removes most of the noise a high learning rate leaves in
them, at the cost of one `lerp` per parameter per update (its effect on the G2P job: docs/history.md), done as one
`torch._foreach_lerp_` over parameter lists bound once (what `torch.optim.swa_utils.AveragedModel` computes, without
rebuilding its lists on every update). The decay is warmed up as `min(decay, (1 + n) / (10 + n))` after `n` updates,
so early averages are not dominated by the random initialisation (the rule of TensorFlow's ExponentialMovingAverage
`num_updates`); the first update copies the weights.

State for exact resume: one safetensors file in the checkpoint folder (so the checkpoint's sha256 marker covers
it) with the averaged parameters and, in its metadata, the number of updates.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

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
        self.module = copy.deepcopy(model)
        self.module.requires_grad_(False)
        self.module.eval()
        self.updates = 0
        self._averaged = [p.detach() for p in self.module.parameters()]  # tied weights once, as parameters() lists
        self._bound: tuple[torch.nn.Module, list[torch.Tensor]] | None = None

    def _current(self, model: torch.nn.Module) -> list[torch.Tensor]:
        """`model`'s parameters in the averaged copy's order; the list is built once per model."""
        if self._bound is None or self._bound[0] is not model:
            current = [p.detach() for p in model.parameters()]
            if len(current) != len(self._averaged):
                raise ValueError(f"the model has {len(current)} parameters, its average {len(self._averaged)}: "
                                 "average the model the EMA was built from")
            self._bound = (model, current)
        return self._bound[1]

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        current = self._current(model)
        if self.updates == 0:
            torch._foreach_copy_(self._averaged, current)
        else:
            torch._foreach_lerp_(self._averaged, current, 1.0 - warmed_up_decay(self.decay, self.updates))
        self.updates += 1

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
        self.updates = int(updates)
