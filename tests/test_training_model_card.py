"""vaswani.training.model_card: what the card says of the optimizer and the schedule, read from what was built."""

from __future__ import annotations

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
