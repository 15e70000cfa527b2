"""The fast-path seam (modeling/fast_paths_vaswani.py): the switch, the rule, the module contract (PEFT LoRA adapters,
hooks, a replaced projection: in training, eval and generation) and the whole model with the fast paths on against
the same model with them off."""

import copy
import json
from unittest import mock

import pytest
import torch
from helpers import make_model, padded_batch
from torch import nn

from vaswani import VaswaniForConditionalGeneration, fast_paths_vaswani, onednn_vaswani
from vaswani.fast_paths_vaswani import FAST_PATHS, fast

peft = pytest.importorskip("peft")

LINEAR_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]


class Ran:
    """Counts the calls of each fast path while it is active (a spy around the functions the seam calls)."""

    def __init__(self):
        self.calls = dict.fromkeys(FAST_PATHS, 0)
        self._patches = [
            self._spy("lean_decoding", fast_paths_vaswani, "lean_sample"),
            self._spy("lean_decoding", fast_paths_vaswani, "lean_beam_search"),
            self._spy("onednn_linear", onednn_vaswani, "onednn_linear"),
            self._spy("onednn_linear", fast_paths_vaswani, "onednn_linear"),  # the decoding loops'
        ]

    def _spy(self, name, module, attribute):
        original = getattr(module, attribute)

        def spy(*args, **kwargs):
            self.calls[name] += 1
            return original(*args, **kwargs)

        return mock.patch.object(module, attribute, spy)

    def __enter__(self):
        for patch in self._patches:
            patch.start()
        return self.calls

    def __exit__(self, *exc):
        for patch in self._patches:
            patch.stop()


@pytest.fixture
def onednn_here(monkeypatch):
    """The oneDNN linear layers apply on this CPU whatever it is (they are faster only on some: see
    onednn_vaswani.faster_here), and to the tiny models' GEMMs too, so that every machine runs the path the tests
    check."""
    monkeypatch.setattr(fast_paths_vaswani, "faster_here", lambda: True)
    monkeypatch.setattr(onednn_vaswani, "SMALLEST_GEMM", 0)


def generate(model, batch, **kwargs):
    with torch.no_grad():
        return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              max_new_tokens=8, do_sample=False, **kwargs)


# --- the switch -----------------------------------------------------------------------------------------------------


def test_switch_at_load_at_run_time_and_by_environment(tiny_config, tmp_path, monkeypatch):
    model = VaswaniForConditionalGeneration(tiny_config)
    assert FAST_PATHS == ("lean_decoding", "onednn_linear")
    on, off = dict.fromkeys(FAST_PATHS, True), dict.fromkeys(FAST_PATHS, False)
    assert model.fast_paths == on
    model.set_fast_paths({"lean_decoding": False})
    assert model.fast_paths == {"lean_decoding": False, "onednn_linear": True}
    model.set_fast_paths(True)
    assert model.fast_paths == on
    model.set_fast_paths(False)
    model.save_pretrained(tmp_path)
    assert "_fast_paths" not in json.loads((tmp_path / "config.json").read_text())
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.fast_paths == on  # not saved: the default again
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path, fast_paths={"onednn_linear": False})
    assert loaded.fast_paths == {"lean_decoding": True, "onednn_linear": False}
    assert all(m.config is loaded.config for m in (loaded.model.encoder, loaded.model.decoder))
    monkeypatch.setenv("VASWANI_FAST_PATHS", "0")
    assert VaswaniForConditionalGeneration.from_pretrained(tmp_path).fast_paths == off
    monkeypatch.setenv("VASWANI_FAST_PATHS", "onednn_linear")
    assert VaswaniForConditionalGeneration(tiny_config).fast_paths == {"lean_decoding": False, "onednn_linear": True}
    monkeypatch.setenv("VASWANI_FAST_PATHS", "none")
    assert VaswaniForConditionalGeneration(tiny_config, fast_paths=True).fast_paths == on


def test_each_model_has_its_own_switch_shared_with_its_stacks(tiny_config):
    """Two models over one config object never share a switch: building one leaves the other's as it was; the stacks
    inside a model follow the model's (the encoder's and decoder's forwards read theirs)."""
    a = VaswaniForConditionalGeneration(tiny_config)
    a.set_fast_paths(False)
    b = VaswaniForConditionalGeneration(tiny_config)
    assert a.fast_paths == dict.fromkeys(FAST_PATHS, False) and b.fast_paths == dict.fromkeys(FAST_PATHS, True)
    assert a.config is b.config
    b.set_fast_paths({"onednn_linear": False})
    assert a.fast_paths == dict.fromkeys(FAST_PATHS, False)
    for stack in (a.model, a.model.encoder, a.model.decoder):
        assert stack.fast_paths == a.fast_paths
    a.model.decoder.set_fast_paths(True)  # a stack's switch is its model's
    assert a.fast_paths == dict.fromkeys(FAST_PATHS, True)
    assert b.fast_paths == {"lean_decoding": True, "onednn_linear": False}


def test_unknown_names_are_refused_with_the_choices(tiny_config, monkeypatch):
    model = VaswaniForConditionalGeneration(tiny_config)
    with pytest.raises(ValueError, match="unknown fast path.*'lean'.*lean_decoding"):
        model.set_fast_paths({"lean": False})
    with pytest.raises(TypeError, match="True, False or a dict"):
        model.set_fast_paths("off")
    monkeypatch.setenv("VASWANI_FAST_PATHS", "onednn")
    with pytest.raises(ValueError, match="VASWANI_FAST_PATHS='onednn'.*unknown.*onednn_linear"):
        VaswaniForConditionalGeneration(tiny_config)


# --- the rule -------------------------------------------------------------------------------------------------------


def test_lean_decoding_rule(tiny_config):
    model = make_model(tiny_config)
    batch = padded_batch(0)
    with Ran() as calls:
        generate(model, batch)
        assert calls["lean_decoding"] == 1
        generate(model.train(), batch)
        model.eval()
        assert calls["lean_decoding"] == 1  # training mode: transformers' loop
        handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
        try:
            generate(model, batch)
        finally:
            handle.remove()
        assert calls["lean_decoding"] == 1  # a global hook
        handle = model.model.encoder.layers[0].self_attn.register_forward_hook(lambda *args: None)
        generate(model, batch)
        handle.remove()
        assert calls["lean_decoding"] == 1  # a hook anywhere in the model
        generate(model, batch, num_beams=3)
        assert calls["lean_decoding"] == 2


LINEAR_CALLS = 2 * 6 + 2 * 10 + 1  # 2 encoder layers (q, k, v, o, fc1, fc2), 2 decoder layers, the LM head


def test_onednn_linear_rule(tiny_config, onednn_here, monkeypatch):
    """Every linear layer of a training step runs on oneDNN where the rule holds, none where it does not."""
    model = make_model(tiny_config).train()
    batch = padded_batch(0)

    def linear_calls(model=model, **kwargs):
        with Ran() as calls:
            loss = model(**batch, **kwargs).loss
            if loss.requires_grad:
                loss.backward()
        return calls["onednn_linear"]

    assert linear_calls() == LINEAR_CALLS
    with torch.no_grad():
        assert linear_calls(model.eval(), use_cache=False) == LINEAR_CALLS  # eval, no graph: the same
    model.train()
    with Ran() as calls:
        generate(model.eval(), batch)
    assert calls["lean_decoding"] == 1 and calls["onednn_linear"] > LINEAR_CALLS  # the encoder and the lean loop
    model.train().set_fast_paths({"onednn_linear": False})
    assert linear_calls() == 0
    model.set_fast_paths(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear_calls() == 0  # autocast: the reference
    handle = model.model.decoder.layers[1].ffn.fc2.register_forward_hook(lambda *args: None)
    assert linear_calls() == 2 * 6  # a hook in the decoder: only the encoder stack, which holds none, runs it
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert linear_calls() == 0  # a global hook
    finally:
        handle.remove()
    assert linear_calls(make_model(tiny_config).double()) == 0  # float64: MKL's
    monkeypatch.setattr(fast_paths_vaswani, "faster_here", lambda: False)
    assert linear_calls() == 0  # a CPU where oneDNN is no faster


def test_the_contract_is_checked_on_every_module_below(tiny_config):
    """A module of another class, a parameter in another dtype or of a tensor subclass, anywhere below: not plain."""
    model = make_model(tiny_config)
    holds = fast_paths_vaswani.contract_holds
    assert holds(model) and holds(model.model.encoder, model.model.decoder)

    class OtherLinear(nn.Linear):
        pass

    ffn = model.model.decoder.layers[-1].ffn
    plain = ffn.fc2
    ffn.fc2 = OtherLinear(plain.in_features, plain.out_features)
    assert not holds(model) and not holds(model.model.decoder) and holds(model.model.encoder)
    ffn.fc2 = plain
    norm = model.model.encoder.layers[0].self_attn_layer_norm
    norm.double()
    assert not holds(model) and holds(model, dtypes=(torch.float32, torch.float64)) and holds(model.model.decoder)
    norm.float()
    assert holds(model)

    class OtherParameter(nn.Parameter):
        pass

    weight = ffn.fc1.weight
    ffn.fc1.weight = OtherParameter(weight.detach().clone())
    assert not holds(model)
    ffn.fc1.weight = weight
    ffn.fc1.bias = None  # a layer without bias: nothing to check there
    assert holds(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not holds(model)


def test_unknown_path_name_in_the_rule_is_an_error(tiny_config):
    with pytest.raises(ValueError, match="unknown fast path"):
        fast.applies("packing", make_model(tiny_config))


# --- the module contract --------------------------------------------------------------------------------------------


def lora_model(config, seed=0):
    """The tiny model with LoRA adapters on every linear layer, their B matrices random (peft's default init makes
    an adapter a no-op, which would hide one that is skipped)."""
    base = make_model(config, seed=seed)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=LINEAR_LAYERS, init_lora_weights=False)
    return peft.get_peft_model(base, lora)


def test_lora_adapters_on_every_linear_layer_get_gradients_and_change_the_outputs(tiny_config, onednn_here):
    batch = padded_batch(1)
    reference = make_model(tiny_config).train()
    with torch.no_grad():
        base_logits = reference(**batch).logits
    model = lora_model(tiny_config).train()
    lora_tensors = {name: p for name, p in model.named_parameters() if "lora_" in name}
    layers = 2 * 4 + 2 * 8 + 4 * 2  # attention projections of 2 encoder and 2 decoder layers (x2), FFNs
    assert len(lora_tensors) == 2 * layers  # A and B of each
    out = model(**batch)
    out.loss.backward()
    missing = [name for name, p in lora_tensors.items() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    assert not torch.allclose(out.logits, base_logits, atol=1e-3)


def test_unmerged_adapter_equals_the_merged_model(tiny_config, onednn_here):
    batch = padded_batch(2, batch=5)
    model = lora_model(tiny_config, seed=1).eval()
    with torch.no_grad():
        logits = model(**batch).logits
    greedy, beam = generate(model, batch), generate(model, batch, num_beams=3)
    merged = model.merge_and_unload()
    with Ran() as calls:
        with torch.no_grad():
            merged_logits = merged(**batch).logits
        merged_greedy, merged_beam = generate(merged, batch), generate(merged, batch, num_beams=3)
    assert calls["lean_decoding"] == 2 and calls["onednn_linear"] > 0  # the merged model is plain: the fast paths run
    assert torch.allclose(logits, merged_logits, rtol=0, atol=1e-5)
    assert torch.equal(greedy, merged_greedy)
    assert torch.equal(beam, merged_beam)


@pytest.mark.parametrize("mode", ["train", "eval", "greedy", "beam"])
def test_forward_hooks_on_every_linear_layer_fire(tiny_config, mode, onednn_here):
    model = make_model(tiny_config)
    fired = set()
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    for name, module in linears.items():
        module.register_forward_hook(lambda m, args, out, name=name: fired.add(name))
    batch = padded_batch(3)
    if mode in ("train", "eval"):
        getattr(model, mode)()
        model(**batch).loss.backward()
    else:
        generate(model, batch, num_beams=3 if mode == "beam" else 1)
    assert fired == set(linears)


class Doubled(nn.Module):
    """A user's replacement for a projection: the same linear layer, its output doubled, and counted."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.inner, self.calls = linear, 0

    def forward(self, x):
        self.calls += 1
        return 2 * self.inner(x)


@pytest.mark.parametrize("name", ["v_proj", "fc1"])
def test_a_replaced_projection_is_the_one_that_runs(tiny_config, name, onednn_here):
    batch = padded_batch(4)
    model, reference = make_model(tiny_config), make_model(copy.deepcopy(tiny_config))  # the switch is per config
    for layer, plain in zip(model.model.decoder.layers, reference.model.decoder.layers):
        owner = layer.self_attn if name == "v_proj" else layer.ffn
        setattr(owner, name, Doubled(getattr(owner, name)))
        plain_owner = plain.self_attn if name == "v_proj" else plain.ffn
        with torch.no_grad():  # the same function as plain layers with doubled parameters
            getattr(plain_owner, name).weight.mul_(2)
            getattr(plain_owner, name).bias.mul_(2)
    reference.set_fast_paths(False)
    with torch.no_grad():
        assert torch.allclose(model(**batch).logits, reference(**batch).logits, rtol=0, atol=1e-5)
    for num_beams in (1, 3):
        assert torch.equal(generate(model, batch, num_beams=num_beams), generate(reference, batch, num_beams=num_beams))
    replaced = model.model.decoder.layers[0].self_attn.v_proj if name == "v_proj" else model.model.decoder.layers[0].ffn.fc1
    assert replaced.calls > 3


# --- fast on == fast off --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize_before", [False, True])
def test_the_whole_model_with_fast_paths_on_equals_it_with_them_off(tiny_config, normalize_before, onednn_here):
    """Forward, every gradient, greedy and beam generate, on padded batches: within float32 rounding, the same
    tokens. The fast paths must really have run in the first pass."""
    tiny_config.normalize_before = normalize_before
    model = make_model(tiny_config, seed=5)
    batch = padded_batch(5, batch=6)

    def run():
        model.train()
        model.zero_grad()
        out = model(**batch)
        out.loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.eval()
        with torch.no_grad():
            logits = model(**batch).logits
        return out.loss.detach(), logits, grads, generate(model, batch), generate(model, batch, num_beams=4)

    with Ran() as calls:
        fast_run = run()
    assert calls["lean_decoding"] == 2 and calls["onednn_linear"] > 2 * LINEAR_CALLS
    model.set_fast_paths(False)
    with Ran() as calls:
        plain_run = run()
    assert not any(calls.values())
    loss, logits, grads, greedy, beam = fast_run
    plain_loss, plain_logits, plain_grads, plain_greedy, plain_beam = plain_run
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, plain_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert torch.equal(greedy, plain_greedy)
    assert torch.equal(beam, plain_beam)
