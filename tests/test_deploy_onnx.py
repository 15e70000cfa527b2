"""vaswani.deploy.onnx_export and onnx_generation: the three graphs (exported once, through `vaswani-export onnx`)
against the model they came from: optimum's names and dynamic axes, logits within fp32 rounding on shapes the
export never saw, step-by-step decoding with the cache equal to the full decoder, and greedy and beam generation
equal to vaswani's `generate_lines` on held-out words."""

import sys

import numpy as np
import pytest
import torch

from helpers import held_out_words

from vaswani.deploy import MissingExportDependency, cli
from vaswani.deploy.onnx_export import cache_names
from vaswani.deploy.onnx_generation import OnnxGenerator
from vaswani.training.generation import generate_lines, load_checkpoint

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.fixture(scope="module")
def exported(trained_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "model"
    assert cli.main(["onnx", str(trained_checkpoint), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def generator(exported):
    return OnnxGenerator(exported, threads=1)


@pytest.fixture(scope="module")
def model_and_tokenizer(trained_checkpoint):
    return load_checkpoint(trained_checkpoint, device="cpu")


def test_files_and_names_follow_optimum(exported, generator, model_and_tokenizer):
    model, _ = model_and_tokenizer
    layers = model.config.decoder_layers
    names = {p.name for p in exported.iterdir()}
    assert {"encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx", "config.json",
            "generation_config.json", "spm.model", "tokenizer_config.json"} <= names

    def io(session):
        return [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]

    assert io(generator.encoder) == (["input_ids", "attention_mask"], ["last_hidden_state"])
    assert io(generator.decoder) == (["input_ids", "encoder_hidden_states", "encoder_attention_mask"],
                                     ["logits", *cache_names("present", layers)])
    assert io(generator.decoder_with_past) == (
        ["input_ids", "encoder_attention_mask", *cache_names("past_key_values", layers)],
        ["logits", *cache_names("present", layers, sides=("decoder",))])
    assert "present.0.decoder.key" in cache_names("present", layers)
    shapes = {i.name: i.shape for i in generator.decoder.get_inputs()}
    assert all(isinstance(axis, str) for axis in shapes["input_ids"])  # batch and length are dynamic
    assert isinstance(shapes["encoder_hidden_states"][1], str)


def _batch(tokenizer, words):
    batch = tokenizer(words, padding=True, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


def test_logits_equal_vaswani_on_new_shapes(generator, model_and_tokenizer):
    """Batch 5 and other lengths than the export's example (batch 2, source 5, target 3), with padding."""
    model, tokenizer = model_and_tokenizer
    input_ids, attention_mask = _batch(tokenizer, ["TRANSFORMERS", "A", "ATTENTION", "ZYX", "PHONEMES"])
    decoder_input_ids = torch.tensor([[2, 7, 9, 11, 5, 6, 8]] * 5)
    with torch.no_grad():
        reference = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    (hidden,) = generator.encoder.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
    rows = attention_mask.bool().numpy()
    assert np.abs(hidden - reference.encoder_last_hidden_state.numpy())[rows].max() < 1e-5
    logits, *presents = generator.decoder.run(None, {"input_ids": decoder_input_ids.numpy(), "encoder_hidden_states": hidden,
                                                    "encoder_attention_mask": attention_mask.numpy()})
    assert np.abs(logits - reference.logits.numpy()).max() < 1e-4 * np.abs(reference.logits.numpy()).max()

    # step by step with the cache: the first position through decoder_model, then decoder_with_past
    step_logits, past = generator._first_step(decoder_input_ids[:, :1].numpy(), hidden, attention_mask.numpy())
    steps = [step_logits]
    for t in range(1, decoder_input_ids.shape[1]):
        step_logits, past = generator._next_step(decoder_input_ids[:, t : t + 1].numpy(), attention_mask.numpy(), past)
        steps.append(step_logits)
    assert past[0].shape[2] == decoder_input_ids.shape[1]
    assert np.abs(np.stack(steps, 1) - reference.logits.numpy()).max() < 1e-4 * np.abs(reference.logits.numpy()).max()


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_equals_vaswani(generator, model_and_tokenizer, num_beams):
    model, tokenizer = model_and_tokenizer
    words = held_out_words(100)
    expected = generate_lines(model, tokenizer, words, num_beams=num_beams)
    got = generator.generate_lines(words, num_beams=num_beams)
    assert sum(a == b for a, b in zip(expected, got)) >= 99, [(a, b) for a, b in zip(expected, got) if a != b]
    assert len(set(got)) > 20


def test_generate_returns_vaswanis_ids(generator, model_and_tokenizer):
    """The id arrays themselves (start token, end token, padding after it), beam 3 with a short limit."""
    model, tokenizer = model_and_tokenizer
    input_ids, attention_mask = _batch(tokenizer, held_out_words(6))
    for num_beams, limit in ((1, 6), (3, 6), (3, 40)):
        with torch.no_grad():
            expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                                      max_new_tokens=limit, do_sample=False).numpy()
        got = generator.generate(input_ids.numpy(), attention_mask.numpy(), num_beams=num_beams, max_new_tokens=limit)
        assert got.shape == expected.shape and (got == expected).all(), (num_beams, limit)


def test_errors_name_the_fix(tmp_path, exported, monkeypatch, trained_checkpoint, capsys):
    with pytest.raises(FileNotFoundError, match="decoder_with_past_model.onnx.*vaswani-export onnx"):
        (tmp_path / "partial").mkdir()
        for name in ("encoder_model.onnx", "decoder_model.onnx", "config.json"):
            (tmp_path / "partial" / name).write_bytes((exported / name).read_bytes())
        OnnxGenerator(tmp_path / "partial")
    with pytest.raises(SystemExit, match="not empty.*--force"):
        cli.main(["onnx", str(trained_checkpoint), str(exported)])
    with pytest.raises(SystemExit, match="does not exist"):
        cli.main(["onnx", str(tmp_path / "nowhere"), str(tmp_path / "out")])
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingExportDependency, match=r"'onnxruntime'.*pip install \"vaswani\[export\]\""):
        OnnxGenerator(exported)
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(SystemExit, match=r"'onnxscript'.*vaswani\[export\]"):
        cli.main(["onnx", str(trained_checkpoint), str(tmp_path / "out")])
