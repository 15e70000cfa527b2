"""Checkpoint averaging: the mean of the weights of a run's last K checkpoints (the paper's recipe).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints" (Vaswani et al.,
2017, section 6.1). A run's checkpoints hold the weights it evaluates: the exponential moving average
(`ema.safetensors`) when `ema_decay` > 0, else the trained weights (`model.safetensors`); the average is taken
over those, so with an EMA it widens the averaging window to the span of the K checkpoints.

`average_checkpoints(checkpoint_dir, last)` reads only complete checkpoints (their marker and hashes checked, as
`--resume` does) and only safetensors files; it sums in float64 and returns the tensors in their stored dtype
with the steps they came from. `vaswani-train --average_last K` applies it at the end of a run (inside its
time budget) and exports the average; `vaswani-average` applies it to a finished run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from .checkpoints import valid_checkpoints
from .ema import EMA_FILE
from .train_state import MODEL_FILE


def weights_file(checkpoint: str | Path) -> Path:
    """The weights a run evaluates, in one checkpoint: its weight average if it kept one, else the trained weights."""
    path = Path(checkpoint)
    return path / EMA_FILE if (path / EMA_FILE).is_file() else path / MODEL_FILE


def average_checkpoints(checkpoint_dir: str | Path, last: int) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The element-wise mean of the weights of the `last` newest complete checkpoints, and their steps."""
    if last < 1:
        raise ValueError(f"last={last} must be >= 1")
    infos = valid_checkpoints(checkpoint_dir)
    if len(infos) < last:
        raise ValueError(f"{checkpoint_dir} holds {len(infos)} complete checkpoint(s), fewer than the {last} to "
                         f"average; keep at least that many (--keep_last {last}) and save often enough "
                         "(--save_every) that the run writes them")
    chosen = infos[-last:]
    files = [weights_file(info.path) for info in chosen]
    kinds = {f.name for f in files}
    if len(kinds) > 1:
        raise ValueError(f"the checkpoints to average hold different weights ({sorted(kinds)}): some kept a weight "
                         "average and some did not")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            if total and set(f.keys()) != total.keys():
                raise ValueError(f"{path} holds other tensors than {files[0]}: not checkpoints of one model")
            for name in f.keys():
                tensor = f.get_tensor(name)
                if name in total:
                    if tensor.shape != total[name].shape:
                        raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)}, "
                                         f"{files[0]} {tuple(total[name].shape)}")
                    total[name] += tensor.double()
                else:
                    total[name], dtypes[name] = tensor.double(), tensor.dtype
    averaged = {name: (t / last).to(dtypes[name]) for name, t in total.items()}
    return averaged, [info.step for info in chosen]
