"""vaswani.training.release: a finished run's model in 16-bit weights, scored again, its card and metrics giving the
figures of the weights the folder holds."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from safetensors import safe_open

from vaswani.training.release import main as release_main
from vaswani.training.release import release_run


@pytest.fixture(scope="module")
def released(trained_run, tmp_path_factory):
    run, _ = trained_run
    return run, release_run(run, tmp_path_factory.mktemp("release") / "g2p")


def test_release_stores_16_bit_weights_and_loads_in_float32(released):
    from transformers import AutoModelForSeq2SeqLM

    from vaswani import VaswaniTokenizer

    run, folder = released
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "spm.model", "tokenizer_config.json",
            "README.md", "metrics.json", "modeling_vaswani.py"} <= names
    assert not {"checkpoints", "train_log.jsonl", "runs", "training_args.json"} & names
    with safe_open(folder / "model.safetensors", "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    assert {t.dtype for t in stored.values()} == {torch.float16}
    assert (folder / "model.safetensors").stat().st_size < 0.6 * (run / "model.safetensors").stat().st_size
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert model.dtype == torch.float32  # the config asks for float32: it computes as it was scored
    original = AutoModelForSeq2SeqLM.from_pretrained(run).eval()
    model.eval()
    for name, tensor in model.state_dict().items():
        if name in stored:
            torch.testing.assert_close(tensor, stored[name].float(), rtol=0, atol=0)
    tokenizer = VaswaniTokenizer.from_pretrained(folder)
    batch = tokenizer(["HELLO", "WORLD", "TRANSFORMER"], padding=True, return_tensors="pt")
    with torch.no_grad():
        decoder_input_ids = original.generate(**batch, num_beams=1)
        a = original(**batch, decoder_input_ids=decoder_input_ids).logits
        b = model(**batch, decoder_input_ids=decoder_input_ids).logits
    assert not torch.equal(a, b)  # the weights were rounded to 16 bits
    torch.testing.assert_close(b, a, atol=0.05, rtol=0.01)  # and compute the same function within that rounding


def test_release_figures_are_those_of_the_stored_weights(released):
    """metrics.json and the card give the dev figures of the 16-bit weights: recomputed here from the folder."""
    from transformers import AutoModelForSeq2SeqLM

    from vaswani import VaswaniTokenizer
    from vaswani.training.cli import task_data
    from vaswani.training.evaluation import dev_loss
    from vaswani.training.tasks import encode_pairs

    run, folder = released
    metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    ran = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["stored_dtype"] == "float16" and metrics["steps"] == ran["steps"]
    args = argparse.Namespace(**json.loads((run / "training_args.json").read_text(encoding="utf-8")))
    data = task_data(args)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = VaswaniTokenizer.from_pretrained(folder)
    # the loss tells rounded weights from the run's float32 ones (the run's own figure differs in its low digits)
    loss = dev_loss(model, encode_pairs(tokenizer, data.dev_pairs), tokenizer.pad_token_id)
    assert loss == pytest.approx(metrics["dev"]["loss"], rel=1e-6)
    assert loss != pytest.approx(ran["dev"]["loss"], rel=1e-6)
    batch = tokenizer(data.dev_sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch)  # the folder's generation config: the run's beam and length limit
    predictions = [" ".join(p.split()) for p in tokenizer.batch_decode(out, skip_special_tokens=True)]
    wrong = sum(p not in refs for p, refs in zip(predictions, data.dev_references))
    assert metrics["dev"]["wer"] == pytest.approx(100 * wrong / len(predictions))
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert f"| WER (%) | {metrics['dev']['wer']:.2f} |" in card
    assert "stored in float16" in card


def test_release_refuses_what_is_not_a_finished_run(trained_run, tmp_path, capsys):
    run, _ = trained_run
    with pytest.raises(ValueError, match="training_args.json"):
        release_run(tmp_path, tmp_path / "release")
    with pytest.raises(ValueError, match="must differ"):
        release_run(run, run)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        release_run(run, tmp_path / "release", dtype="int8")
    with pytest.raises(SystemExit) as exit_info:
        release_main([str(tmp_path), str(tmp_path / "release")])
    assert exit_info.value.code == 2
    assert "vaswani-release: error:" in capsys.readouterr().err
    assert release_main([str(run), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    assert "MB)" in capsys.readouterr().out
    with safe_open(tmp_path / "bf16" / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
