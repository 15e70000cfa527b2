"""Learning-rate schedules (the paper's inverse square root; linear or cosine decay to zero over a known budget)
and the optimizer.

    paper:      lr(step) = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    peak form:  lr(step) = peak  * min(step / warmup, sqrt(warmup / step))

The two are the same curve: the paper's peak, reached at step = warmup, is
scale * (d_model * warmup)^-0.5 (7.0e-4 for d_model 512, warmup 4000).

Steps count optimizer updates from 1: the n-th update uses lr(n), so no update runs at lr 0
and nothing divides by zero (LambdaLR's internal counter starts at 0; we add 1).

With Accelerate: a scheduler passed to `accelerator.prepare` is stepped num_processes times
per `scheduler.step()` (accelerate/scheduler.py, unless `split_batches=True`), which would make
warmup N times shorter on N processes. Our steps are optimizer updates of the global batch, so
build `Accelerator(step_scheduler_with_optimizer=False)` and call `scheduler.step()` once after
each real update (`if accelerator.sync_gradients:`); the loop's checkpoints hold its state either way.

Budget schedules ("linear", "cosine"): when the run's length is known in advance (max_steps, or a time budget),
the learning rate rises linearly over warmup_steps and falls to zero as the budget runs out:

    factor(step) = min(step / warmup, decay(progress)),  decay = 1 - p (linear) or (1 + cos(pi p)) / 2 (cosine)

where `progress` p is the fraction of the run's budget used before the update (the loop's `TrainingRun.progress`:
updates over max_steps, or the run's clock over its time budget, whichever is further). The peak is where the two
lines meet, just under the given lr (1 - warmup/total for linear). A schedule of steps alone is a pure function of
the step, so resume is exact; one of time reads the run's clock, which checkpoints carry.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def inverse_sqrt_factor(step: int, warmup_steps: int) -> float:
    """min(step / warmup, sqrt(warmup / step)): rises linearly to 1 at `warmup_steps`, then decays.

    Step 0 is treated as step 1.
    """
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps={warmup_steps} must be >= 1")
    step = max(step, 1)
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def paper_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """The paper's formula: scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (step 0 as 1)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


SCHEDULES = ("inverse_sqrt", "linear", "cosine")


def budget_factor(schedule: str, step: int, warmup_steps: int, progress: float) -> float:
    """A budget schedule's factor of the peak lr for update `step` (from 1) with `progress` in [0, 1] of the run
    used before it: min(step / warmup, decay(progress)); 0 once the budget is used up."""
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps={warmup_steps} must be >= 1")
    rest = min(1.0, max(0.0, 1.0 - progress))
    if schedule == "linear":
        decay = rest
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * (1.0 - rest)))
    else:
        raise ValueError(f"schedule={schedule!r} is not a budget schedule; choose linear or cosine")
    return min(max(step, 1) / warmup_steps, decay)


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    d_model: int | None = None,
    scale: float = 1.0,
    schedule: str = "inverse_sqrt",
    progress=None,
) -> LambdaLR:
    """A LambdaLR for the schedule; call `scheduler.step()` after each `optimizer.step()`.

    - `d_model` given: the paper's formula gives the learning rate itself, so the optimizer must
      have been made with lr=1.0 (checked). `scale` multiplies it.
    - `d_model=None`: the peak form; the optimizer's lr is the peak (`scale` multiplies it too).
    - `schedule` "linear" or "cosine": a budget schedule (module docstring); `progress(updates_done)` gives the
      fraction of the run's budget used before the next update.
    """
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps={warmup_steps} must be >= 1")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if schedule != "inverse_sqrt":
        if d_model is not None or progress is None:
            raise ValueError(f"schedule={schedule!r} decays over the run's budget: pass progress (a function of the "
                             "updates done) and no d_model (the optimizer's lr is the peak)")

        def factor(counter: int) -> float:
            return scale * budget_factor(schedule, counter + 1, warmup_steps, progress(counter))

        return LambdaLR(optimizer, factor)
    if d_model is not None:
        lrs = [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]
        if any(lr != 1.0 for lr in lrs):
            raise ValueError(
                f"with d_model given, the paper's formula is the learning rate itself, but the optimizer has "
                f"lr={lrs}; create it with lr=1.0 (or pass d_model=None to use its lr as the peak)"
            )

        def factor(counter: int) -> float:
            return paper_learning_rate(counter + 1, d_model, warmup_steps, scale)
    else:

        def factor(counter: int) -> float:
            return scale * inverse_sqrt_factor(counter + 1, warmup_steps)

    return LambdaLR(optimizer, factor)


def make_optimizer(
    model: torch.nn.Module,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """Adam with the paper's betas and eps; AdamW when `weight_decay` > 0.

    With weight decay, parameters of fewer than 2 dimensions (biases, layer norms) are not
    decayed. Frozen parameters (requires_grad False) are left out. The fused implementation is
    used where torch has one (floating-point parameters on CPU or CUDA; on CPU torch's default is a
    Python loop over the parameters); the update is the same within float rounding (tested).
    """
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    fused = True if all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for _, p in params) else None
    if weight_decay == 0:
        return torch.optim.Adam([p for _, p in params], lr=lr, betas=betas, eps=eps, fused=fused)
    groups = [
        {"params": [p for _, p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for _, p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, eps=eps, fused=fused)
