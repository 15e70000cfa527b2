"""The CPU fast paths: one switch, one rule.

modeling_vaswani.py is the reference; a fast path replaces one of its calls with faster code that gives the same
result. Each is named here, switched here and decided here:

- `lean_decoding`: greedy search, sampling and beam search in a loop that keeps each layer's keys and values in one
  buffer and runs the decoder on frozen weights (decoding_vaswani.py).
- `onednn_linear`: the linear layers' GEMMs, forward and backward, on oneDNN instead of MKL, on the CPUs where
  oneDNN's are faster, except the smallest (onednn_vaswani.py). It enters at the `@fast.kernels` of the models'
  forwards (and the decoding loops multiply with it); every module's forward still runs.

Each path earns its place in docs/performance.md, measured against the same model with it off; paths that did not
(padding-free layers, a custom dropout mask, fused q/k/v projections, ...) were removed.

Each path is one record of `PATHS` (`FastPath`: name, dtypes, its own condition, entry point).

The switch belongs to the model: `fast_paths=` at load (True, False or {name: bool}), `model.set_fast_paths(...)` at
run time, and the environment variable VASWANI_FAST_PATHS (`1`/`all`, `0`/`none`, or a comma-separated list of the
names to enable) for the default of models created afterwards. A model and the models inside it (its encoder and
decoder stacks) share one switch; two models never do, even when built from one config object.

The rule (`applies`), for every path: the path is switched on; the tensors it reads are on the CPU in a dtype it
serves (float32; float64 too for the decoding loop), with no tensor subclass, outside autocast, `torch.compile` and
tracing; and the module contract holds: every module whose call the path replaces is exactly the plain layer
(the model's own class or torch's, not a subclass or a wrapper such as a PEFT LoRA layer), with no hooks (its own or
global) and plain parameters. Otherwise the path steps aside and the modules' own forwards run. Each path adds its
own conditions: for the decoding loop, `decoding_vaswani.lean_blocker` (eval mode, no gradients, the config values
and module types of its allow-list, eager or SDPA, a fresh cache, tokens only); for the oneDNN linear layers, a CPU
where they are faster (`faster_here`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module_globals

from .decoding_vaswani import lean_beam_search, lean_blocker, lean_sample
from .onednn_vaswani import OneDNNLinearMode, faster_here, mode_active, onednn_linear

@dataclass(frozen=True)
class FastPath:
    """One fast path: its name, the dtypes it serves, its own condition beside the shared rule (called with the
    module and the caller's `context`), and where it enters the reference file."""

    name: str
    dtypes: tuple
    condition: Callable[..., bool]
    entry: str


PATHS = {path.name: path for path in (
    FastPath("lean_decoding", (torch.float32, torch.float64),  # the loop's roundings are the model's in both
             lambda module, **context: lean_blocker(module, **context) is None,
             "VaswaniForConditionalGeneration._sample / _beam_search -> lean_sample / lean_beam_search"),
    FastPath("onednn_linear", (torch.float32,), lambda module, **context: faster_here(),
             "@fast.kernels on VaswaniEncoder.forward and VaswaniDecoder.forward; the decoding loops' linear"),
)}
FAST_PATHS = tuple(PATHS)
ENVIRONMENT_VARIABLE = "VASWANI_FAST_PATHS"

# The torch and transformers classes the model is built of; with the model's own classes (recognised by their
# module, so that a remote-code copy counts too), the only ones a fast path accepts.
_PLAIN_MODULES = (nn.Linear, nn.LayerNorm, nn.Embedding, nn.ModuleList, nn.ReLU, nn.GELU, nn.SiLU, nn.Identity)
_OWN_FILES = ("modeling_vaswani", "positions_vaswani")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _default() -> dict[str, bool]:
    value = os.environ.get(ENVIRONMENT_VARIABLE, "1").strip().lower()
    if value in ("1", "all", "true", "on"):
        return dict.fromkeys(FAST_PATHS, True)
    if value in ("0", "none", "false", "off", ""):
        return dict.fromkeys(FAST_PATHS, False)
    names = [name.strip() for name in value.split(",")]
    _check_names(names, f"{ENVIRONMENT_VARIABLE}={value!r}")
    return {name: name in names for name in FAST_PATHS}


def _check_names(names, where: str) -> None:
    unknown = sorted(set(names) - set(FAST_PATHS))
    if unknown:
        raise ValueError(f"{where}: unknown fast path(s) {unknown}; the fast paths are {list(FAST_PATHS)}, "
                         f"or use True / False for all of them")


def resolve(value: bool | dict | None = None, current: dict | None = None) -> dict[str, bool]:
    """The switch as {name: bool} from True, False, None (the environment's default) or {name: bool} (names not
    given keep `current`, or the default)."""
    base = dict(current) if current is not None else _default()
    if value is None:
        return base
    if isinstance(value, bool):
        return dict.fromkeys(FAST_PATHS, value)
    if isinstance(value, dict):
        _check_names(value, "fast_paths")
        return {**base, **{name: bool(on) for name, on in value.items()}}
    raise TypeError(f"fast_paths={value!r}: give True, False or a dict {{name: bool}} of {list(FAST_PATHS)}")


def _plain_state() -> bool:
    """Outside autocast, `torch.compile` and tracing."""
    return not (torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling() or torch.jit.is_tracing())


def _cpu_strided(t: torch.Tensor, dtypes) -> bool:
    return t.is_cpu and t.dtype in dtypes and t.layout == torch.strided


def _plain_tensors(tensors, dtypes) -> bool:
    return (all(_cpu_strided(t, dtypes) for t in tensors) and not torch.overrides.has_torch_function(tensors)
            and _plain_state())


def _plain_module(module: nn.Module, dtypes) -> bool:
    """Exactly one of the model's own or torch's plain classes, without hooks, with plain CPU parameters (exactly
    `nn.Parameter`, so no tensor subclass). The state checks of `_plain_tensors` are the caller's, once."""
    kind = type(module)
    if not (kind in _PLAIN_MODULES or kind.__module__ == "transformers.activations"
            or kind.__module__.rsplit(".", 1)[-1] in _OWN_FILES):
        return False
    if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks:
        return False
    return all(p is None or (type(p) is nn.Parameter and _cpu_strided(p, dtypes)) for p in module._parameters.values())


def contract_holds(*modules: nn.Module, dtypes=(torch.float32,)) -> bool:
    """The module contract for every module in `modules` and below them (walked on every call: a hook or a PEFT
    layer added since the last call counts at once)."""
    if any(getattr(_module_globals, name) for name in _GLOBAL_HOOKS) or not _plain_state():
        return False
    pending = list(modules)  # what `modules()` walks, without its names (a shared module may come twice)
    while pending:
        module = pending.pop()
        if not _plain_module(module, dtypes):
            return False
        pending.extend(child for child in module._modules.values() if child is not None)
    return True


class _FastPaths:
    """What modeling_vaswani.py calls: `applies` (the rule) and the fast paths themselves."""

    names = FAST_PATHS

    @staticmethod
    def resolve(value: bool | dict | None = None, current: dict | None = None) -> dict[str, bool]:
        return resolve(value, current)

    @staticmethod
    def applies(name: str, module: nn.Module, *tensors: torch.Tensor, **context) -> bool:
        """Whether fast path `name` replaces `module`'s call on `tensors` (see the module docstring)."""
        if name not in PATHS:
            raise ValueError(f"unknown fast path {name!r}; the fast paths are {list(FAST_PATHS)}")
        path = PATHS[name]
        if not module.fast_paths_switch.get(name, False) or not _plain_tensors(tensors, path.dtypes):
            return False
        return path.condition(module, **context) and contract_holds(module, dtypes=path.dtypes)

    @staticmethod
    def kernels(forward):
        """Decorates a model's forward: it runs with the linear layers on oneDNN where `onednn_linear` applies to the
        module. A forward called inside another's mode runs in it; otherwise each decides for its own modules (a hook
        in the decoder leaves the encoder stack on oneDNN)."""

        @functools.wraps(forward)
        def run(module, *args, **kwargs):
            if mode_active() or not fast.applies("onednn_linear", module):
                return forward(module, *args, **kwargs)
            with OneDNNLinearMode():
                return forward(module, *args, **kwargs)

        return run

    @staticmethod
    def _decoding_linear(model):
        """What multiplies in the decoding loops: oneDNN where `onednn_linear` applies (called directly: a function
        mode around the loop would cost a Python call on every operation of every step), else F.linear."""
        return onednn_linear if fast.applies("onednn_linear", model) else F.linear

    @staticmethod
    def sample(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs):
        return lean_sample(model, input_ids, logits_processor, stopping_criteria, generation_config,
                           linear=fast._decoding_linear(model), **model_kwargs)

    @staticmethod
    def beam_search(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs):
        return lean_beam_search(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                linear=fast._decoding_linear(model), **model_kwargs)


fast = _FastPaths()
