"""The training state a checkpoint holds, in safetensors and JSON only: nothing is pickled, nothing is unpickled.

`save_training_state(folder, accelerator, model, optimizer, scheduler)` writes, and `load_training_state` reads back:

- `model.safetensors`: the trained weights, tied tensors once under their first name (`model.shared.weight`);
- `optimizer.json` + `optimizer.safetensors`: `optimizer.state_dict()`, every tensor in it (Adam's moments and
  step counts) under its path in the safetensors file, everything else (the param groups: lr, betas, eps, ...)
  as JSON;
- `scheduler.json`: `scheduler.state_dict()` (numbers only for the schedules here);
- `accelerator.json`: Accelerate's micro-batch counter (gradient accumulation) and the mixed-precision
  `GradScaler`'s state;
- `rng_state_<rank>.json` + `.safetensors`, one pair per process: Python's and numpy's Mersenne Twister states
  and the torch CPU (and CUDA) generator states, which drive dropout, so a resumed run draws the same masks.

`accelerator.save_state` would write all but the model with `torch.save`, and loading a pickle can run code.
Here every value goes through `encode`/`decode`: tensors go to safetensors under their path, numpy arrays,
tuples and dicts with integer keys get tagged JSON forms, and any other type is an error that names it, so
what is written is exactly what is read back. A folder written by `save_state` (`optimizer.bin`,
`random_states_*.pkl`) is refused with an error that says so, instead of being unpickled.

The main process writes the shared files; every process writes its own RNG pair (call on every process). Runs
that shard the model or the optimizer (FSDP, DeepSpeed) are not supported: their state is per rank.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

MODEL_FILE = "model.safetensors"
OPTIMIZER = "optimizer"
SCHEDULER = "scheduler"
ACCELERATOR = "accelerator"
LEGACY_FILES = ("optimizer.bin", "scheduler.bin", "scaler.pt", "random_states_0.pkl")


def rng_name(rank: int) -> str:
    return f"rng_state_{rank}"


# ---- a JSON + tensors codec for state dicts -------------------------------------------------------------------

def encode(value, path: str, tensors: dict[str, torch.Tensor]):
    """`value` as JSON; its tensors are added to `tensors` under their path (`decode` reverses it exactly)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().to("cpu", copy=True).contiguous()
        return {"__tensor__": path}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v, f"{path}.{k}", tensors) for k, v in value.items()}
        if all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in value):
            return {"__items__": [[k, encode(v, f"{path}.{k}", tensors)] for k, v in value.items()]}
    raise TypeError(f"training state at {path!r} holds a {type(value).__name__}, which a checkpoint cannot store "
                    "without pickling; only tensors, numpy arrays, numbers, strings and lists/tuples/dicts of them")


def decode(value, tensors: dict[str, torch.Tensor]):
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__ndarray__" in value:
        return np.asarray(value["__ndarray__"], dtype=value["dtype"])
    if "__tuple__" in value:
        return tuple(decode(v, tensors) for v in value["__tuple__"])
    if "__items__" in value:
        return {k: decode(v, tensors) for k, v in value["__items__"]}
    return {k: decode(v, tensors) for k, v in value.items()}


def save_object(folder: Path, name: str, value) -> None:
    """`<name>.json`, and `<name>.safetensors` when `value` holds tensors."""
    tensors: dict[str, torch.Tensor] = {}
    structure = encode(value, name, tensors)
    if tensors:
        save_file(tensors, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps(structure), encoding="utf-8")


def load_object(folder: Path, name: str):
    path = folder / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no {path.name}: it is not a complete training checkpoint")
    structure = json.loads(path.read_text(encoding="utf-8"))
    tensor_file = folder / f"{name}.safetensors"
    tensors = load_file(str(tensor_file)) if tensor_file.is_file() else {}
    return decode(structure, tensors)


# ---- weights ---------------------------------------------------------------------------------------------------

def _tied_aliases(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict with each shared tensor once (its first name), and every other name -> that first name."""
    kept: dict[str, torch.Tensor] = {}
    alias: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()))
        if key in first:
            alias[name] = first[key]
        else:
            first[key] = name
            kept[name] = tensor
    return kept, alias


def save_weights(model: torch.nn.Module, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """The model's state dict as safetensors, tied tensors once."""
    kept, _ = _tied_aliases(model)
    save_file({k: v.detach().contiguous() for k, v in kept.items()}, str(path), metadata=metadata)


@torch.no_grad()
def load_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str = "the checkpoint") -> None:
    """Copy `tensors` (a `save_weights` file's contents) into `model`; every tensor of the model must be covered."""
    kept, alias = _tied_aliases(model)
    missing, unexpected = sorted(kept.keys() - tensors.keys()), sorted(tensors.keys() - kept.keys() - alias.keys())
    if missing or unexpected:
        raise ValueError(f"{source} does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]}): "
                         "was the run resumed with another configuration?")
    for name, tensor in tensors.items():
        target = kept[alias.get(name, name)]
        if target.shape != tensor.shape:
            raise ValueError(f"{source}: {name} has shape {tuple(tensor.shape)}, the model {tuple(target.shape)}")
        target.copy_(tensor)


# ---- RNG states -------------------------------------------------------------------------------------------------

def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        if not torch.cuda.is_available() or torch.cuda.device_count() < len(state["cuda"]):
            raise ValueError(f"the checkpoint holds the RNG states of {len(state['cuda'])} CUDA devices but this run "
                             f"has {torch.cuda.device_count() if torch.cuda.is_available() else 0}; resume on the same "
                             "hardware for an exact continuation")
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- the whole state ------------------------------------------------------------------------------------------

def _check_supported(accelerator) -> None:
    kind = str(accelerator.distributed_type)
    if any(name in kind for name in ("FSDP", "DEEPSPEED", "MEGATRON", "XLA")):
        raise ValueError(f"checkpoints of this loop hold one copy of the model and optimizer state; {kind} shards "
                         "them per process and is not supported. Train with plain data parallelism (DDP)")


def save_training_state(folder: str | Path, accelerator, model, optimizer, scheduler) -> None:
    """Write the state of a run into `folder` (an existing, empty temporary folder); call on every process."""
    _check_supported(accelerator)
    folder = Path(folder)
    if accelerator.is_main_process:
        save_weights(accelerator.unwrap_model(model), folder / MODEL_FILE)
        save_object(folder, OPTIMIZER, optimizer.state_dict())
        save_object(folder, SCHEDULER, scheduler.state_dict())
        scaler = accelerator.scaler.state_dict() if accelerator.scaler is not None else None
        save_object(folder, ACCELERATOR, {"step": accelerator.step, "scaler": scaler})
    save_object(folder, rng_name(accelerator.process_index), rng_state())


def load_training_state(folder: str | Path, accelerator, model, optimizer, scheduler) -> None:
    """Restore what `save_training_state` wrote (on every process; each reads its own RNG state)."""
    _check_supported(accelerator)
    folder = Path(folder)
    if not (folder / f"{OPTIMIZER}.json").is_file() and any((folder / name).exists() for name in LEGACY_FILES):
        raise ValueError(f"{folder} holds optimizer and RNG states as pickles (written by Accelerate's save_state "
                         "in an earlier vaswani); this version never unpickles a checkpoint. Resume that run with "
                         "the vaswani version that wrote it, or start a new one")
    load_weights(accelerator.unwrap_model(model), load_file(str(folder / MODEL_FILE)), str(folder / MODEL_FILE))
    saved = load_object(folder, OPTIMIZER)
    if set(saved) != set(optimizer.state_dict()):
        raise ValueError(f"{folder} holds the state of another optimizer than this run's (--optimizer): resume with "
                         "the optimizer the run started with")
    optimizer.load_state_dict(saved)
    scheduler.load_state_dict(load_object(folder, SCHEDULER))
    loop = load_object(folder, ACCELERATOR)
    accelerator.step = loop["step"]
    if (loop["scaler"] is None) != (accelerator.scaler is None):
        raise ValueError(f"{folder} was written with{'out' if loop['scaler'] is None else ''} a float16 gradient "
                         "scaler; resume with the same --mixed_precision")
    if accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(loop["scaler"])
    rng = rng_name(accelerator.process_index)
    if not (folder / f"{rng}.json").is_file():
        raise ValueError(f"{folder} has no {rng}.json: it was written by fewer processes than this run has; resume "
                         "with the number of processes that wrote it")
    set_rng_state(load_object(folder, rng))
