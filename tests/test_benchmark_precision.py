"""The precision study's measurement (not its figures): float32 gradients are reproducible, bf16 autocast gives a
gradient close to them but not equal, and a key projection's bias has no float32 gradient to speak of (a constant
added to every key's score of a query leaves the softmax unchanged), which is what makes it show the rounding alone."""

import random
import sys
from unittest import mock

import torch
import torch.nn.functional as F

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ is not part of the package
import precision_study  # noqa: E402

SHIPPED = REPO / "models" / "vaswani-g2p"


def _batch(tokenizer, words=24):
    from vaswani.training.data import load_g2p

    pairs = random.Random(1).sample(load_g2p().train, words)
    batch = dict(tokenizer([w for w, _ in pairs], text_target=[p for _, p in pairs], padding=True, return_tensors="pt"))
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    return batch


def test_bf16_gradient_is_near_the_float32_one_and_key_biases_get_none():
    from transformers import AutoTokenizer

    from vaswani import VaswaniForConditionalGeneration

    model = VaswaniForConditionalGeneration.from_pretrained(SHIPPED, dtype=torch.float32,
                                                            attn_implementation="eager").train()
    batch = _batch(AutoTokenizer.from_pretrained(SHIPPED, trust_remote_code=True))
    loss_a, first = precision_study.gradients(model, batch, bf16=False)
    loss_b, again = precision_study.gradients(model, batch, bf16=False)
    loss_16, bf16 = precision_study.gradients(model, batch, bf16=True)
    assert loss_a == loss_b and all(torch.equal(first[n], again[n]) for n in first)
    assert abs(loss_16 - loss_a) < 0.02 * loss_a and loss_16 != loss_a
    flat32 = torch.cat([g.flatten() for g in first.values()])
    flat16 = torch.cat([g.flatten() for g in bf16.values()])
    assert 0.95 < F.cosine_similarity(flat16, flat32, 0) < 1.0
    key_biases = [n for n in first if n.endswith("k_proj.bias")]
    query_biases = [n for n in first if n.endswith("q_proj.bias")]
    assert key_biases and query_biases
    for k, q in zip(key_biases, query_biases):
        assert first[k].norm() < 1e-4 * first[q].norm()  # zero up to float32 rounding; a query bias learns


def test_the_script_runs_end_to_end(capsys):
    with mock.patch.object(sys, "argv", ["precision_study.py", str(SHIPPED), "--batches", "2", "--words", "16"]):
        precision_study.main()
    out = capsys.readouterr().out
    assert out.count("gradient relative error") == 2
    assert "mean error / mean gradient" in out and "k_proj.bias" in out
