import copy
import math

import pytest
import torch

from vaswani.training.schedule import (
    BatchedMuon, MuonWithAdam, inverse_sqrt_factor, make_optimizer, make_scheduler, paper_learning_rate,
)


def test_paper_formula_by_hand():
    # d_model 512, warmup 4000: peak at step 4000 = 512^-0.5 * 4000^-0.5
    assert paper_learning_rate(4000, 512, 4000) == pytest.approx(6.987712429686844e-4, rel=1e-12)
    assert paper_learning_rate(1000, 512, 4000) == pytest.approx(1000 / (math.sqrt(512) * 4000**1.5), rel=1e-12)
    assert paper_learning_rate(16000, 512, 4000) == pytest.approx(1 / math.sqrt(512 * 16000), rel=1e-12)
    assert paper_learning_rate(16000, 512, 4000, scale=2.0) == pytest.approx(2 / math.sqrt(512 * 16000))
    assert paper_learning_rate(0, 512, 4000) == paper_learning_rate(1, 512, 4000) > 0


def test_peak_form():
    assert inverse_sqrt_factor(0, 10) == inverse_sqrt_factor(1, 10) == pytest.approx(0.1)
    assert inverse_sqrt_factor(5, 10) == pytest.approx(0.5)
    assert inverse_sqrt_factor(10, 10) == 1.0
    assert inverse_sqrt_factor(40, 10) == pytest.approx(0.5)


def _lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])  # lr used by this update
        optimizer.step()
        scheduler.step()
    return out


def test_lambda_lr_paper_mode_nth_update_uses_lr_n():
    model = torch.nn.Linear(2, 2)
    optimizer = make_optimizer(model, lr=1.0)
    scheduler = make_scheduler(optimizer, warmup_steps=4, d_model=512)
    lrs = _lrs(scheduler, optimizer, 8)
    assert lrs == pytest.approx([paper_learning_rate(n, 512, 4) for n in range(1, 9)], rel=1e-12)
    assert lrs[3] == pytest.approx(512**-0.5 * 4**-0.5)


def test_lambda_lr_peak_mode():
    optimizer = make_optimizer(torch.nn.Linear(2, 2), lr=1e-3)
    scheduler = make_scheduler(optimizer, warmup_steps=4)
    assert _lrs(scheduler, optimizer, 6) == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3 * math.sqrt(4 / 5),
                                                           1e-3 * math.sqrt(4 / 6)])


def test_paper_mode_needs_lr_one():
    with pytest.raises(ValueError, match="lr=1.0"):
        make_scheduler(make_optimizer(torch.nn.Linear(2, 2), lr=1e-3), 4000, d_model=512)


def test_make_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    adam = make_optimizer(model, lr=0.1)
    assert type(adam) is torch.optim.Adam
    assert adam.defaults["betas"] == (0.9, 0.98) and adam.defaults["eps"] == 1e-9
    adamw = make_optimizer(model, lr=0.1, weight_decay=0.01)
    assert type(adamw) is torch.optim.AdamW
    decayed = {id(p) for g in adamw.param_groups if g["weight_decay"] == 0.01 for p in g["params"]}
    assert decayed == {id(model[0].weight)}



@pytest.mark.parametrize("ns_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("adjust", [None, "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_batched_muon_makes_the_updates_of_torch_muon(adjust, nesterov, ns_dtype):
    """BatchedMuon against torch.optim.Muon (the reference: one matrix at a time, its iterations in bf16) on wide,
    tall and square matrices of repeated shapes, with weight decay, over several steps: the same weights within bf16
    rounding of the Newton-Schulz GEMMs, in either precision of ours, and the same momentum buffers."""
    torch.manual_seed(0)
    shapes = [(24, 24), (48, 24), (24, 48), (24, 24), (48, 24), (16, 40)]
    start = [torch.randn(s) for s in shapes]
    ours = [torch.nn.Parameter(x.clone()) for x in start]
    reference = [torch.nn.Parameter(x.clone()) for x in start]
    settings = dict(lr=2e-2, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust)
    batched, torch_muon = BatchedMuon(ours, ns_dtype=ns_dtype, **settings), torch.optim.Muon(reference, **settings)
    for _ in range(4):
        for p, q in zip(ours, reference):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        batched.step()
        torch_muon.step()
    for p, q, x in zip(ours, reference, start):
        moved = (q - x).abs().max()
        assert moved > 1e-2
        # float32 iterations differ from torch's bf16 ones by torch's rounding alone, a little more than two bf16
        # runs differ by
        assert (p - q).abs().max() <= (1e-2 if ns_dtype == torch.bfloat16 else 2e-2) * moved
        torch.testing.assert_close(batched.state[p]["momentum_buffer"], torch_muon.state[q]["momentum_buffer"])


def _muon_steps(ns_dtype, steps=3) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in [(24, 24), (48, 24), (16, 40)]]
    muon = BatchedMuon(params, lr=2e-2, adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn_like(p)
        muon.step()
    return [p.detach() for p in params]


def test_batched_muon_iterates_in_the_precision_the_device_multiplies_natively(monkeypatch):
    """The Newton-Schulz precision: bf16 where the CPU multiplies it in hardware (AVX512-BF16 or AMX), float32
    elsewhere (emulated bf16 GEMMs are many times slower); float32 iterations match float64 ones to float32 rounding,
    where bf16 ones are off by bf16 rounding, so the precision chosen is the one used."""
    from vaswani.training.schedule import native_bf16

    for avx512_bf16, amx, expected in ((True, False, torch.bfloat16), (False, True, torch.bfloat16),
                                       (False, False, torch.float32)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert native_bf16("cpu") == (expected == torch.bfloat16)
        assert BatchedMuon([torch.nn.Parameter(torch.ones(2, 2))])._ns_dtype(torch.device("cpu")) == expected
    assert not native_bf16("meta")
    exact = _muon_steps(torch.float64)
    for ns_dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        worst = max(((p - q).abs().max() / (q.abs().max())).item() for p, q in zip(_muon_steps(ns_dtype), exact))
        assert (worst < tolerance) and (worst > tolerance / 1e3 or ns_dtype == torch.float32), (ns_dtype, worst)
    assert max((p - q).abs().max().item() for p, q in zip(_muon_steps(torch.bfloat16), exact)) > 1e-4


def test_muon_with_adam_splits_the_model_as_muon_prescribes():
    """The layers' weight matrices go to Muon; the shared embedding (= the output projection), biases and norms to
    Adam; a scheduler's lr reaches both; the card names both."""
    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani.training.model_card import describe_optimizer

    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=24))
    optimizer = make_optimizer(model, lr=1e-3, kind="muon")
    assert isinstance(optimizer, MuonWithAdam)
    muon = {id(p) for g in optimizer.muon.param_groups for p in g["params"]}
    adam = {id(p) for g in optimizer.adam.param_groups for p in g["params"]}
    linear = {id(m.weight) for m in model.model.modules() if isinstance(m, torch.nn.Linear)}
    assert muon == linear and id(model.lm_head.weight) not in muon and id(model.model.shared.weight) in adam
    assert muon | adam == {id(p) for p in model.parameters()} and not muon & adam
    scheduler = make_scheduler(optimizer, warmup_steps=4)
    assert [g["lr"] for g in optimizer.muon.param_groups + optimizer.adam.param_groups] == [2.5e-4, 2.5e-4]
    scheduler.step()
    assert [g["lr"] for g in optimizer.muon.param_groups + optimizer.adam.param_groups] == [5e-4, 5e-4]
    assert describe_optimizer(optimizer) == ("Muon(momentum 0.95, Nesterov) for the layers' weight matrices, "
                                             "Adam(0.9, 0.98, eps 1e-9) for the rest")
    assert describe_optimizer(make_optimizer(model, lr=1e-3, kind="muon", weight_decay=0.1)) == (
        "Muon(momentum 0.95, Nesterov, weight decay 0.1) for the layers' weight matrices, AdamW(0.9, 0.98, eps 1e-9, "
        "weight decay 0.1) for the rest")
    with pytest.raises(ValueError, match=r"optimizer 'sgd' is not one of \('adam', 'muon'\)"):
        make_optimizer(model, lr=1e-3, kind="sgd")
    with pytest.raises(ValueError, match=r"no trainable nn.Linear weights \(use the adam optimizer\)"):
        make_optimizer(torch.nn.LayerNorm(3), lr=1e-3, kind="muon")


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_make_optimizer_is_fused_and_updates_as_the_plain_loop_does(weight_decay):
    """The fused Adam/AdamW that make_optimizer picks on CPU makes the updates of torch's plain per-parameter loop
    (same groups and hyperparameters) within float32 rounding, over several steps with changing gradients."""
    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    plain_model = copy.deepcopy(fused_model)
    start = [p.detach().clone() for p in fused_model.parameters()]
    fused = make_optimizer(fused_model, lr=1e-2, weight_decay=weight_decay)
    plain = make_optimizer(plain_model, lr=1e-2, weight_decay=weight_decay)
    assert all(group["fused"] for group in fused.param_groups)
    for group in plain.param_groups:  # step() reads these per group: the single-tensor loop
        group["fused"], group["foreach"] = None, False
    for _ in range(5):
        x = torch.randn(8, 16)
        for model, optimizer in ((fused_model, fused), (plain_model, plain)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for a, b, before in zip(fused_model.parameters(), plain_model.parameters(), start):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert (a - before).abs().max() > 1e-3  # the steps did move every parameter


def test_budget_factor_by_hand():
    from vaswani.training.schedule import budget_factor

    # linear: the lower of the warmup line and 1 - progress
    assert budget_factor("linear", 1, 10, 0.0) == pytest.approx(0.1)
    assert budget_factor("linear", 10, 10, 0.05) == pytest.approx(0.95)
    assert budget_factor("linear", 50, 10, 0.5) == pytest.approx(0.5)
    assert budget_factor("linear", 99, 10, 1.0) == 0.0
    assert budget_factor("linear", 99, 10, 1.5) == 0.0  # past the budget: never negative
    # cosine: (1 + cos(pi p)) / 2
    assert budget_factor("cosine", 50, 10, 0.5) == pytest.approx(0.5)
    assert budget_factor("cosine", 50, 10, 0.25) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert budget_factor("cosine", 50, 10, 1.0) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="budget schedule"):
        budget_factor("inverse_sqrt", 5, 10, 0.5)
    with pytest.raises(ValueError, match="warmup_steps"):
        budget_factor("linear", 5, 0, 0.5)


def test_linear_schedule_over_max_steps_uses_progress_before_each_update():
    # update n of N sees progress (n - 1) / N: the first at warmup's 1/warmup, the last above zero
    steps, warmup, peak = 20, 4, 1e-3
    optimizer = make_optimizer(torch.nn.Linear(2, 2), lr=peak)
    scheduler = make_scheduler(optimizer, warmup_steps=warmup, schedule="linear", progress=lambda done: done / steps)
    lrs = _lrs(scheduler, optimizer, steps)
    expected = [peak * min(n / warmup, 1 - (n - 1) / steps) for n in range(1, steps + 1)]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert lrs[-1] == pytest.approx(peak / steps) and min(lrs) > 0
    assert max(lrs) == pytest.approx(peak * (1 - 3 / steps))  # the lines meet at the end of warmup


def test_budget_schedule_state_round_trip_continues_the_curve():
    steps = 30
    model = torch.nn.Linear(2, 2)
    optimizer = make_optimizer(model, lr=1e-3)
    scheduler = make_scheduler(optimizer, warmup_steps=5, schedule="cosine", progress=lambda done: done / steps)
    first = _lrs(scheduler, optimizer, 12)
    state = (copy.deepcopy(optimizer.state_dict()), copy.deepcopy(scheduler.state_dict()))
    rest = _lrs(scheduler, optimizer, 18)
    optimizer2 = make_optimizer(model, lr=1e-3)
    scheduler2 = make_scheduler(optimizer2, warmup_steps=5, schedule="cosine", progress=lambda done: done / steps)
    optimizer2.load_state_dict(state[0])
    scheduler2.load_state_dict(state[1])
    assert _lrs(scheduler2, optimizer2, 18) == rest
    assert first[0] == pytest.approx(1e-3 / 5)


def test_budget_schedule_needs_progress_and_the_peak_form():
    optimizer = make_optimizer(torch.nn.Linear(2, 2), lr=1e-3)
    with pytest.raises(ValueError, match="progress"):
        make_scheduler(optimizer, 4, schedule="linear")
    with pytest.raises(ValueError, match="choose one of"):
        make_scheduler(optimizer, 4, schedule="step")
