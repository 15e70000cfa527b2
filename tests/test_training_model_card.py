"""vaswani.training.model_card: what the card says of the optimizer and the schedule, read from what was built; the
card of the tiny run of tests/conftest.py (front matter, hyperparameters, metrics); metadata checks."""

from __future__ import annotations

import json

import pytest
import torch

from vaswani.training.model_card import SCHEDULE_TEXT, describe_optimizer, describe_schedule
from vaswani.training.schedule import SCHEDULES, make_optimizer


def test_the_card_names_the_optimizer_make_optimizer_built_with_weight_decay_on_and_off():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    assert describe_optimizer(make_optimizer(model, lr=1e-3)) == "Adam(0.9, 0.98, eps 1e-9)"
    # weight decay builds AdamW (norms and biases in an undecayed group); the card says so
    assert describe_optimizer(make_optimizer(model, lr=1e-3, weight_decay=0.01)) == \
        "AdamW(0.9, 0.98, eps 1e-9, weight decay 0.01)"
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(KeyError):  # an optimizer without betas is not described as Adam by mistake
        describe_optimizer(other)


def test_the_card_reads_through_accelerate_s_wrapper():
    from accelerate import Accelerator

    model = torch.nn.Linear(4, 4)
    _, wrapped = Accelerator(cpu=True).prepare(model, make_optimizer(model, lr=1e-3, weight_decay=0.1))
    assert type(wrapped).__name__ == "AcceleratedOptimizer"
    assert describe_optimizer(wrapped) == "AdamW(0.9, 0.98, eps 1e-9, weight decay 0.1)"


def test_every_schedule_has_its_words():
    assert set(SCHEDULE_TEXT) == set(SCHEDULES)
    assert describe_schedule("linear") == "linear warmup, then linear decay to zero over the run's budget"


def test_model_card_front_matter(trained_run):
    from huggingface_hub import ModelCard

    out, _ = trained_run
    card = ModelCard.load(out / "README.md")
    data = card.data.to_dict()
    metrics = json.loads((out / "metrics.json").read_text())
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text2text-generation"
    assert data["license"] == "apache-2.0" and "g2p" in data["tags"]
    results = {m["type"]: m["value"] for m in data["model-index"][0]["results"][0]["metrics"]}
    assert results == {"wer": round(metrics["dev"]["wer"], 2), "per": round(metrics["dev"]["per"], 2)}
    assert "| d_model | 16 |" in card.text and "| label_smoothing | 0.1 |" in card.text
    assert "{{" not in card.text and "CMU Pronouncing Dictionary" in card.text
    # the optimizer the run built and its schedule, in words
    assert ("| optimizer | Muon(momentum 0.95, Nesterov) for the layers' weight matrices, Adam(0.9, 0.98, eps 1e-9) "
            "for the rest |") in card.text
    assert "| schedule | linear warmup, then linear decay to zero over the run's budget |" in card.text


def test_model_card_rejects_unknown_license_and_tag():
    from vaswani.training.model_card import check_metadata

    with pytest.raises(ValueError, match="license"):
        check_metadata("not-a-license", "text2text-generation")
    with pytest.raises(ValueError, match="pipeline_tag"):
        check_metadata("mit", "nonsense")
