"""vaswani.training.train_state: the checkpointed training state round-trips exactly, as safetensors and JSON only."""

import json
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.training.checkpoints import latest_valid_checkpoint, save_checkpoint
from vaswani.training.schedule import make_optimizer, make_scheduler
from vaswani.training.train_state import (
    decode, encode, load_training_state, load_weights, save_training_state, save_weights,
)


def _run(steps: int, optimizer_kind: str = "adam"):
    """A tiny model with Accelerate, the optimizer (Adam, or Muon with Adam) and the schedule after `steps` updates
    with dropout on."""
    from accelerate import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=24, dropout=0.3))
    optimizer = make_optimizer(model, lr=1e-2, kind=optimizer_kind)
    scheduler = make_scheduler(optimizer, warmup_steps=3)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    batch = {"input_ids": torch.randint(4, 24, (3, 5)), "labels": torch.randint(4, 24, (3, 4))}
    for _ in range(steps):
        _step(accelerator, model, optimizer, scheduler, batch)
    return accelerator, model, optimizer, scheduler, batch


def _step(accelerator, model, optimizer, scheduler, batch):
    """One update of two accumulated micro-batches; returns the weights after it."""
    for _ in range(2):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
    scheduler.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_codec_round_trips_state_dict_types_exactly():
    value = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2, 3)}, 7: {"m": torch.zeros(0)}},
             "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.98), "params": [0, 7], "foreach": None, "name": "x"}],
             "numpy": ("MT19937", np.arange(5, dtype=np.uint32), 2, 0, 0.5), "scalar": np.float64(0.25), "flag": True}
    tensors = {}
    structure = encode(value, "root", tensors)
    back = decode(json.loads(json.dumps(structure)), tensors)
    assert list(back["state"]) == [0, 7] and back["param_groups"][0]["betas"] == (0.9, 0.98)
    assert torch.equal(back["state"][0]["exp_avg"], value["state"][0]["exp_avg"])
    assert back["numpy"][1].dtype == np.uint32 and back["numpy"][1].tolist() == [0, 1, 2, 3, 4]
    assert back["param_groups"] == value["param_groups"] and back["scalar"] == 0.25 and back["flag"] is True
    assert sorted(tensors) == ["root.state.0.exp_avg", "root.state.0.step", "root.state.7.m"]


def test_codec_refuses_what_only_pickle_could_store():
    with pytest.raises(TypeError, match=r"'root.hook' holds a function.*without pickling"):
        encode({"hook": lambda: 0}, "root", {})


@pytest.mark.parametrize("optimizer_kind", ["adam", "muon"])
def test_resume_from_state_continues_exactly_and_writes_no_pickle(tmp_path, optimizer_kind):
    accelerator, model, optimizer, scheduler, batch = _run(3, optimizer_kind)
    path = save_checkpoint(tmp_path, 3, lambda folder: save_training_state(folder, accelerator, model, optimizer,
                                                                             scheduler),
                           epoch=0, batches_done=6)
    names = sorted(p.name for p in path.iterdir())
    assert names == ["accelerator.json", "model.safetensors", "optimizer.json", "optimizer.safetensors",
                     "rng_state_0.json", "rng_state_0.safetensors", "scheduler.json", "vaswani_state.json"]
    for name in names:  # every file is JSON or safetensors: nothing that unpickles
        if name.endswith(".json"):
            json.loads((path / name).read_text())
        else:
            with safe_open(str(path / name), "pt") as f:
                assert list(f.keys())
    random.random(), np.random.rand()
    expected = [_step(accelerator, model, optimizer, scheduler, batch) for _ in range(2)]
    expected_draws = (random.random(), np.random.rand(), torch.rand(()))

    # a fresh run (other initial weights, other RNG state) restored from the checkpoint makes the same updates
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    accelerator, model, optimizer, scheduler, batch2 = _run(1, optimizer_kind)
    load_training_state(latest_valid_checkpoint(tmp_path).path, accelerator, model, optimizer, scheduler)
    assert scheduler.scheduler.last_epoch == 3 and accelerator.step == 6
    random.random(), np.random.rand()
    resumed = [_step(accelerator, model, optimizer, scheduler, batch) for _ in range(2)]
    # the scheduler's learning rate reaches every inner optimizer's groups after the load
    inner = optimizer.optimizer
    groups = [g for o in (inner.muon, inner.adam) for g in o.param_groups] if optimizer_kind == "muon" \
        else inner.param_groups
    assert all(group["lr"] == scheduler.get_last_lr()[0] for group in groups)
    for a, b in zip(expected, resumed):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (random.random(), np.random.rand(), torch.rand(())) == expected_draws


def test_a_checkpoint_written_by_accelerate_save_state_is_refused_not_unpickled(tmp_path):
    accelerator, model, optimizer, scheduler, _ = _run(1)
    accelerator.save_state(str(tmp_path))
    assert (tmp_path / "optimizer.bin").exists()
    with pytest.raises(ValueError, match=r"as pickles .*never unpickles a checkpoint.*start a new one"):
        load_training_state(tmp_path, accelerator, model, optimizer, scheduler)


def test_weights_file_holds_tied_tensors_once_and_rejects_another_model(tmp_path):
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=24))
    save_weights(model, tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.shared.weight" in keys and "lm_head.weight" not in keys
    other = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=24))
    from safetensors.torch import load_file

    load_weights(other, load_file(str(tmp_path / "w.safetensors")))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert other.lm_head.weight.data_ptr() == other.model.shared.weight.data_ptr()
    bigger = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=24, encoder_layers=3))
    with pytest.raises(ValueError, match=r"does not match the model \(missing \['model.encoder.layers.2"):
        load_weights(bigger, load_file(str(tmp_path / "w.safetensors")))


def test_the_float16_gradient_scaler_is_kept_and_a_mismatch_is_refused(tmp_path):
    """GPU fp16 runs keep a GradScaler; its JSON state comes back exactly (a CPU scaler stands in for it here)."""
    accelerator, model, optimizer, scheduler, _ = _run(1)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    accelerator.scaler.load_state_dict({**accelerator.scaler.state_dict(), "scale": 96.5, "_growth_tracker": 2})
    save_training_state(tmp_path, accelerator, model, optimizer, scheduler)
    saved = accelerator.scaler.state_dict()
    accelerator.scaler = torch.amp.GradScaler("cpu")
    load_training_state(tmp_path, accelerator, model, optimizer, scheduler)
    assert accelerator.scaler.state_dict() == saved and saved["scale"] == 96.5 and saved["_growth_tracker"] == 2
    accelerator.scaler = None
    with pytest.raises(ValueError, match="with a float16 gradient scaler; resume with the same --mixed_precision"):
        load_training_state(tmp_path, accelerator, model, optimizer, scheduler)


@pytest.mark.parametrize("saved_with, resumed_with", [("adam", "muon"), ("muon", "adam")])
def test_a_checkpoint_of_another_optimizer_is_refused_with_the_fix(tmp_path, saved_with, resumed_with):
    accelerator, model, optimizer, scheduler, _ = _run(1, saved_with)
    save_training_state(tmp_path, accelerator, model, optimizer, scheduler)
    accelerator, model, optimizer, scheduler, _ = _run(1, resumed_with)
    with pytest.raises(ValueError, match=r"the state of another optimizer than this run's \(--optimizer\): resume "
                                         r"with the optimizer the run started with"):
        load_training_state(tmp_path, accelerator, model, optimizer, scheduler)
