"""vaswani.deploy.quantization: torchao's int8 linear layers run the model's own forward and generate. The
references: the float model (close logits, mostly equal outputs) and the quantized model with the fast paths off
(identical tokens: the fast paths step aside for weights that are not plain parameters)."""

import sys

import pytest
import torch

from helpers import held_out_words

from vaswani.deploy import MissingExportDependency
from vaswani.fast_paths_vaswani import contract_holds
from vaswani.training.generation import generate_lines, load_checkpoint

pytest.importorskip("torchao")

from vaswani.deploy.quantization import quantize_int8  # noqa: E402


@pytest.fixture(scope="module")
def pair(trained_checkpoint):
    model, tokenizer = load_checkpoint(trained_checkpoint, device="cpu")
    quantized, _ = load_checkpoint(trained_checkpoint, device="cpu")
    return model, quantize_int8(quantized), tokenizer


def test_every_linear_layer_is_int8(pair):
    model, quantized, _ = pair
    linear = [m for m in quantized.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linear) == 4 * 3 + 2 * 2 + 4 * 2 * 2 + 1  # attention (enc+dec self+cross) + FFN + lm_head
    assert all(type(m.weight.data).__name__ != "Tensor" and type(m.weight).__name__ != "Parameter" for m in linear)
    assert contract_holds(model) and not contract_holds(quantized)
    assert isinstance(quantized.model.shared.weight, torch.nn.Parameter)  # embeddings stay float


def test_logits_close_to_float(pair):
    model, quantized, tokenizer = pair
    batch = tokenizer(["TRANSFORMER", "ATTENTION"], padding=True, return_tensors="pt")
    decoder_input_ids = torch.tensor([[2, 7, 9, 11]] * 2)
    with torch.no_grad():
        full = model(**batch, decoder_input_ids=decoder_input_ids).logits
        int8 = quantized(**batch, decoder_input_ids=decoder_input_ids).logits
    error = ((int8 - full).abs().max() / full.abs().max()).item()
    assert 0 < error < 0.05


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_runs_the_reference_path(pair, num_beams):
    model, quantized, tokenizer = pair
    words = held_out_words(60)
    fast = generate_lines(quantized, tokenizer, words, num_beams=num_beams)
    quantized.set_fast_paths(False)
    try:
        reference = generate_lines(quantized, tokenizer, words, num_beams=num_beams)
    finally:
        quantized.set_fast_paths(True)
    assert fast == reference
    full = generate_lines(model, tokenizer, words, num_beams=num_beams)
    assert sum(a == b for a, b in zip(full, fast)) >= 45


def test_output_projection_can_stay_float(trained_checkpoint):
    model, _ = load_checkpoint(trained_checkpoint, device="cpu")
    quantize_int8(model, output_projection=False)
    assert type(model.lm_head.weight) is torch.nn.Parameter
    assert type(model.model.decoder.layers[0].ffn.fc1.weight) is not torch.nn.Parameter


def test_missing_torchao_names_the_extra(trained_checkpoint, monkeypatch):
    model, _ = load_checkpoint(trained_checkpoint, device="cpu")
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(MissingExportDependency, match=r"'torchao'.*vaswani\[export\]"):
        quantize_int8(model)


def test_importing_vaswani_beside_torchao_is_quiet():
    """transformers imports torchao where it is installed; its import-time notes are filtered (modeling/
    _import_noise.py), so a command's one-line error stays one line."""
    import subprocess

    result = subprocess.run([sys.executable, "-c", "import vaswani, torchao.quantization"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
