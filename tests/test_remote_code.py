"""A saved checkpoint carries its code: it loads with trust_remote_code=True where vaswani is not importable."""

import os
import subprocess
import sys
import textwrap

import torch
from helpers import REFUSE_VASWANI
from safetensors.torch import load_file, save_file

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration

# Runs in a fresh interpreter, from an empty folder, with every `vaswani` import refused.
CLEAN_LOAD = REFUSE_VASWANI + textwrap.dedent(
    """
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSeq2SeqLM

    folder, inputs_file, outputs_file = sys.argv[1:4]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert model.__class__.__module__.startswith("transformers_modules."), model.__class__.__module__
    assert model.lm_head.weight is model.model.shared.weight
    inputs = load_file(inputs_file)
    with torch.no_grad():
        logits = model(**inputs).logits
    generated = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=5)
    save_file({"logits": logits.contiguous(), "generated": generated.contiguous()}, outputs_file)
    fast = sys.modules[model.__class__.__module__].fast
    print("loaded", model.__class__.__module__, "fast paths:", type(fast).__name__, model.fast_paths,
          getattr(fast, "error", None))
    """
)


def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    return env


def _save_and_load_elsewhere(tmp_path, model, break_fast_paths: str | None = None):
    """Save `model`, optionally replace its fast-path file with `break_fast_paths`, load it in a clean interpreter;
    returns (outputs, the inputs, the interpreter's stdout and stderr)."""
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    if break_fast_paths is not None:
        (folder / "fast_paths_vaswani.py").write_text(break_fast_paths)
    inputs = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        "decoder_input_ids": torch.tensor([[2, 11, 12], [2, 13, 0]]),
    }
    save_file(inputs, tmp_path / "inputs.safetensors")
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    script = tmp_path / "load.py"
    script.write_text(CLEAN_LOAD)
    result = subprocess.run(
        [sys.executable, str(script), str(folder), str(tmp_path / "inputs.safetensors"), str(tmp_path / "out.st")],
        cwd=workdir,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(tmp_path / "out.st"), inputs, result.stdout + result.stderr


def _expected(model, inputs):
    with torch.no_grad():
        logits = model(**inputs).logits
    generated = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                               max_new_tokens=5)
    return logits, generated


def test_trust_remote_code_load_in_a_clean_interpreter(tmp_path):
    torch.manual_seed(0)
    config = VaswaniConfig.from_preset("tiny", dropout=0.0, normalize_before=True, position_encoding="sinusoidal_split")
    model = VaswaniForConditionalGeneration(config).eval()
    outputs, inputs, stdout = _save_and_load_elsewhere(tmp_path, model)
    config_json = (tmp_path / "checkpoint" / "config.json").read_text()
    assert '"AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration"' in config_json
    assert '"AutoConfig": "configuration_vaswani.VaswaniConfig"' in config_json
    assert "_fast_paths" not in config_json
    assert "fast paths: _FastPaths" in stdout  # the fast paths travelled and loaded
    logits, generated = _expected(model, inputs)
    assert torch.equal(outputs["logits"], logits)
    assert torch.equal(outputs["generated"], generated)


def test_a_checkpoint_whose_fast_paths_fail_to_import_loads_on_the_reference_path(tmp_path):
    """A fast-path file that cannot be imported (another torch, a missing kernel: simulated by a file that raises)
    leaves the model on the reference path, with the same outputs as the reference model here."""
    torch.manual_seed(1)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", dropout=0.0)).eval()
    broken = 'raise ImportError("simulated: this torch lacks the kernels")\n'
    outputs, inputs, stdout = _save_and_load_elsewhere(tmp_path, model, break_fast_paths=broken)
    assert "fast paths: _ReferenceOnly {}" in stdout and "simulated" in stdout
    warning = "the CPU fast paths could not be imported (ImportError: simulated: this torch lacks the kernels)"
    assert stdout.count(warning) == 1 and "runs on its reference path" in stdout
    model.set_fast_paths(False)
    logits, generated = _expected(model, inputs)
    assert torch.allclose(outputs["logits"], logits, rtol=0, atol=1e-5)
    assert torch.equal(outputs["generated"], generated)



def test_attention_patterns_travel_with_the_checkpoint(tmp_path):
    """A local encoder and a linear decoder load through trust_remote_code (attention_patterns_vaswani.py copied
    beside the model) and give the same logits and tokens, the decoder's cache built for its pattern there too."""
    torch.manual_seed(2)
    config = VaswaniConfig.from_preset("tiny", dropout=0.0, encoder_attention_pattern="local", attention_window=1,
                                       decoder_attention_pattern="linear")
    model = VaswaniForConditionalGeneration(config).eval()
    outputs, inputs, _ = _save_and_load_elsewhere(tmp_path, model)
    assert (tmp_path / "checkpoint" / "attention_patterns_vaswani.py").exists()
    config_json = (tmp_path / "checkpoint" / "config.json").read_text()
    assert '"encoder_attention_pattern": "local"' in config_json and '"attention_window": 1' in config_json
    logits, generated = _expected(model, inputs)
    assert torch.equal(outputs["logits"], logits)
    assert torch.equal(outputs["generated"], generated)
