"""vaswani.training.evaluation: the dev loss against a float64 computation example by example, generation in input
order whatever the batching, the task's metrics, and `final_evaluation` of a finished run's best weights."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from vaswani import VaswaniForConditionalGeneration, VaswaniTokenizer
from vaswani.training.evaluation import describe_final, dev_loss, evaluate, final_evaluation, generate_texts, score
from vaswani.training.tasks import encode_pairs

WORDS = ["HELLO", "WORLD", "A", "TRANSFORMERS", "CAT", "PRONUNCIATION", "GO", "ATTENTION"]


@pytest.fixture(scope="module")
def model_and_tokenizer(trained_checkpoint):
    return (VaswaniForConditionalGeneration.from_pretrained(trained_checkpoint).eval(),
            VaswaniTokenizer.from_pretrained(trained_checkpoint))


def test_dev_loss_is_the_token_mean_nll_of_each_example_in_float64(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    examples = encode_pairs(tokenizer, [(w, "HH AH L OW") for w in WORDS])
    reference = model.double()
    try:
        total, tokens = 0.0, 0
        with torch.no_grad():
            for example in examples:  # one at a time: no padding, no batching
                labels = torch.tensor([example["labels"]])
                logits = reference(input_ids=torch.tensor([example["input_ids"]]), labels=labels).logits
                total += torch.nn.functional.cross_entropy(logits[0], labels[0], reduction="sum").item()
                tokens += labels.numel()
    finally:
        model.float()
    for max_tokens in (8192, 24):  # one batch, or many small ones
        assert dev_loss(model, examples, tokenizer.pad_token_id, max_tokens=max_tokens) == pytest.approx(
            total / tokens, rel=1e-5)
    assert not model.training


def test_generation_keeps_the_input_order_whatever_the_batch(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    one_by_one = [generate_texts(model, tokenizer, [w])[0] for w in WORDS]
    assert generate_texts(model, tokenizer, WORDS, batch_size=3) == one_by_one
    assert generate_texts(model, tokenizer, WORDS) == one_by_one
    model.train()
    generate_texts(model, tokenizer, WORDS[:2])
    assert model.training  # the mode the caller left is restored


def test_score_is_the_task_metric_over_any_reference():
    figures = score("g2p", ["HH AH L OW", "W ER L D", "K AE T"], [["HH AH L OW", "HH EH L OW"], ["W ER L D"], ["K AA T"]])
    assert figures["wer"] == pytest.approx(100 / 3)
    assert figures["per"] == pytest.approx(100 * 1 / (4 + 4 + 3))  # one substitution over the closest references
    with pytest.raises(ValueError, match="unknown"):
        score("speech", [], [])


def test_evaluate_scores_what_it_generates(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    references = [["HH AH L OW"]] * len(WORDS)
    examples = encode_pairs(tokenizer, [(w, r[0]) for w, r in zip(WORDS, references)])
    result = evaluate(model, tokenizer, "g2p", WORDS, references, examples, num_beams=2)
    assert result["predictions"] == generate_texts(model, tokenizer, WORDS, num_beams=2)
    assert result["wer"] == score("g2p", result["predictions"], references)["wer"]
    assert result["loss"] == dev_loss(model, examples, tokenizer.pad_token_id)
    assert result["examples"] == len(WORDS) and result["num_beams"] == 2


def test_final_evaluation_scores_the_runs_best_weights(trained_run):
    from vaswani.training.cli import task_data

    run, _ = trained_run
    args = argparse.Namespace(**json.loads((run / "training_args.json").read_text(encoding="utf-8")))
    data = task_data(args)
    tokenizer = VaswaniTokenizer.from_pretrained(run)
    best_step = json.loads((run / "metrics.json").read_text(encoding="utf-8"))["best_step"]
    model, dev = final_evaluation(run / "checkpoints", tokenizer, data, num_beams=1, best_step=best_step)
    exported = VaswaniForConditionalGeneration.from_pretrained(run).eval()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), exported.state_dict().values()))
    assert model.generation_config.num_beams == 1
    assert dev["wer"] == score("g2p", generate_texts(exported, tokenizer, data.dev_sources),
                               data.dev_references)["wer"]
    assert describe_final(dev, len(data.dev_sources)).startswith(f"best step {best_step} on the full dev set")
