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


OPTIMIZERS = ("adam", "muon")


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether `device` multiplies bfloat16 in hardware: a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX
    tiles. Elsewhere bfloat16 GEMMs are emulated and slower than float32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon with the matrices of one shape updated together: the momentum as one foreach call, and the
    Newton-Schulz iterations of every matrix of a shape as batched GEMMs (tall matrices transposed to wide, as
    torch's Muon does). The same algorithm, hyperparameters and state (a `momentum_buffer` per parameter, so the
    state dicts are interchangeable); torch's own loops over the matrices one by one (it has no foreach form yet),
    which costs a small model several times its Adam step. The updates agree with torch.optim.Muon's within bf16
    rounding (tested).

    `ns_dtype` is the precision of the iterations. None (the default): bfloat16, as torch's Muon, where the matrices'
    device multiplies it in hardware (`native_bf16`), float32 elsewhere: a CPU without AVX512-BF16 or AMX emulates
    bfloat16 GEMMs, many times slower than float32 ones."""

    def __init__(self, params, *args, ns_dtype: torch.dtype | None = None, **kwargs):
        super().__init__(params, *args, **kwargs)
        self.ns_dtype = ns_dtype

    def _ns_dtype(self, device: torch.device) -> torch.dtype:
        if self.ns_dtype is not None:
            return self.ns_dtype
        return torch.bfloat16 if native_bf16(device) else torch.float32

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            buffers: list[torch.Tensor] = []
            self._init_group(group, params, grads, buffers)
            if not params:
                continue
            lr, decay, momentum = float(group["lr"]), group["weight_decay"], group["momentum"]
            torch._foreach_lerp_(buffers, grads, 1 - momentum)
            updates = torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers
            if decay:
                torch._foreach_mul_(params, 1 - lr * decay)
            shapes: dict[torch.Size, list[int]] = {}
            for i, p in enumerate(params):
                shapes.setdefault(p.shape, []).append(i)
            for shape, indices in shapes.items():
                tall = shape[0] > shape[1]
                x = torch.stack([updates[i] for i in indices]).to(self._ns_dtype(params[indices[0]].device))
                x = _newton_schulz(x.mT if tall else x, group["ns_coefficients"], group["ns_steps"], group["eps"])
                x = (x.mT if tall else x).float()
                torch._foreach_add_([params[i] for i in indices], list(x.unbind(0)),
                                    alpha=-_muon_lr(lr, group["adjust_lr_fn"], shape))
        return loss


def _newton_schulz(x: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iterations on a batch of wide matrices (n, A, B), A <= B: each scaled to unit
    Frobenius norm, then X <- a X + (b G + c G G) X with G = X X^T."""
    a, b, c = coefficients
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x


def _muon_lr(lr: float, adjust: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's step size for a matrix of `shape` (its `adjust_lr_fn`)."""
    rows, cols = shape[:2]
    if adjust is None or adjust == "original":
        return lr * math.sqrt(max(1, rows / cols))
    if adjust == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


class MuonWithAdam(torch.optim.Optimizer):
    """Muon (torch.optim.Muon: momentum, then the update orthogonalized by Newton-Schulz iterations) for the weight
    matrices of the layers, Adam (AdamW with weight decay) for everything else: the embeddings and the output
    projection, biases and norms, as Muon's authors prescribe.

    One optimizer to the loop, the scheduler and Accelerate: `param_groups` are the two inner optimizers' own
    groups (Muon's first), so a scheduler that sets a group's lr sets it where the step reads it. Muon's groups take
    `adjust_lr_fn="match_rms_adamw"`: the update of an (A, B) matrix is scaled by 0.2 * sqrt(max(A, B)), which gives
    it about the root-mean-square size of Adam's, so the peak lr and schedule of an Adam recipe carry over.
    `state_dict()` is `{"muon": ..., "adam": ...}`, the inner optimizers' own."""

    def __init__(self, matrices, others, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 momentum: float = 0.95, fused: bool | None = None):
        if not matrices:
            raise ValueError("Muon needs weight matrices to optimize; the model has no trainable nn.Linear weights "
                             "(use the adam optimizer)")
        self.muon = BatchedMuon(matrices, lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=True,
                                     adjust_lr_fn="match_rms_adamw")
        if not others:
            self.adam = None
        elif weight_decay == 0:
            self.adam = torch.optim.Adam(others, lr=lr, betas=betas, eps=eps, fused=fused)
        else:
            groups = [{"params": [p for p in others if p.ndim >= 2], "weight_decay": weight_decay},
                      {"params": [p for p in others if p.ndim < 2], "weight_decay": 0.0}]
            self.adam = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, eps=eps,
                                          fused=fused)
        super().__init__(self._inner_groups(), {})

    def _inner(self) -> list[torch.optim.Optimizer]:
        return [self.muon] + ([self.adam] if self.adam is not None else [])

    def _inner_groups(self) -> list[dict]:
        return [group for optimizer in self._inner() for group in optimizer.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self._inner():
            optimizer.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adam": self.adam.state_dict() if self.adam is not None else {}}

    def load_state_dict(self, state_dict: dict) -> None:
        if set(state_dict) != {"muon", "adam"}:
            raise ValueError(f"this optimizer is Muon with Adam; the saved state holds {sorted(state_dict)} (it was "
                             "written by another optimizer: resume with the optimizer the run started with)")
        self.muon.load_state_dict(state_dict["muon"])
        if self.adam is not None:
            self.adam.load_state_dict(state_dict["adam"])
        self.param_groups = self._inner_groups()  # loading replaces the inner groups' dicts: share them again


def muon_matrices(model: torch.nn.Module) -> set[int]:
    """The ids of the parameters Muon updates: the weights of the model's nn.Linear layers, except the output
    projection (and the embedding it may be tied to)."""
    skipped = set()
    for get in ("get_output_embeddings", "get_input_embeddings"):
        module = getattr(model, get, lambda: None)()
        if module is not None and getattr(module, "weight", None) is not None:
            skipped.add(id(module.weight))
    return {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear) and id(m.weight) not in skipped}


def make_optimizer(
    model: torch.nn.Module,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
    kind: str = "adam",
) -> torch.optim.Optimizer:
    """Adam with the paper's betas and eps; AdamW when `weight_decay` > 0. `kind="muon"`: `MuonWithAdam`, Muon for
    the layers' weight matrices and that Adam for the rest (with weight decay, Muon's matrices are decayed too).

    With weight decay, parameters of fewer than 2 dimensions (biases, layer norms) are not
    decayed. Frozen parameters (requires_grad False) are left out. The fused implementation is
    used where torch has one (floating-point parameters on CPU or CUDA; on CPU torch's default is a
    Python loop over the parameters); the update is the same within float rounding (tested).
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer {kind!r} is not one of {OPTIMIZERS}")
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    fused = True if all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for _, p in params) else None
    if kind == "muon":
        matrices = muon_matrices(model)
        return MuonWithAdam([p for _, p in params if id(p) in matrices], [p for _, p in params if id(p) not in matrices],
                            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    if weight_decay == 0:
        return torch.optim.Adam([p for _, p in params], lr=lr, betas=betas, eps=eps, fused=fused)
    groups = [
        {"params": [p for _, p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for _, p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, eps=eps, fused=fused)
