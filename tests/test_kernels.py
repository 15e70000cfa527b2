"""The CPU kernels (modeling/kernels_vaswani.py) against independent references: float64 `F.linear` and SDPA, the plain
path of the same model, and transformers' decoding loops. oneDNN is forced on (and off) where a test needs one
path, so that these run the same on every machine, whatever `ONEDNN_LINEAR=None` picks there."""

import pytest
import torch
import torch.nn.functional as F

from vaswani import kernels_vaswani as kernels
from vaswani.kernels_vaswani import (
    FrozenLinear,
    linear,
    onednn_applies,
    relu_feed_forward,
    short_attention_applies,
    single_query_attention,
)

from vaswani.modeling_vaswani import _sdpa_by_matmuls
from test_decoding import beam_both, generate_both
from test_modeling import make_model, padded_batch

needs_onednn = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")),
    reason="this torch build has no oneDNN",
)


@pytest.fixture
def onednn(monkeypatch):
    monkeypatch.setattr(kernels, "ONEDNN_LINEAR", True)


@pytest.fixture
def no_onednn(monkeypatch):
    monkeypatch.setattr(kernels, "ONEDNN_LINEAR", False)


def _linear_inputs(seed=0, rows=(4, 7), k=32, n=48):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*rows, k, generator=g)
    weight = torch.randn(n, k, generator=g) / k**0.5
    bias = torch.randn(n, generator=g)
    return x, weight, bias


def _float64_linear_and_grads(x, weight, bias, grad_output):
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    out = F.linear(*leaves)
    out.backward(grad_output.double())
    return out.detach(), [t.grad for t in leaves]


@needs_onednn
def test_onednn_linear_forward_and_gradients_match_float64(onednn):
    x, weight, bias = _linear_inputs()
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    assert onednn_applies(leaves[0], leaves[1])
    out = linear(*leaves)
    assert type(out.grad_fn).__name__ == "_OneDNNLinearBackward"  # the oneDNN path ran, under autograd
    grad_output = torch.randn_like(out)
    out.backward(grad_output)
    expected, expected_grads = _float64_linear_and_grads(x, weight, bias, grad_output)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    for leaf, grad in zip(leaves, expected_grads):
        torch.testing.assert_close(leaf.grad.double(), grad, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_linear_partial_gradients_and_no_bias(onednn):
    x, weight, _ = _linear_inputs(seed=1, rows=(9,))
    w = weight.clone().requires_grad_()
    out = linear(x, w)  # only the weight needs a gradient, and there is no bias
    out.sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(9, 48).t() @ x, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(linear(x, weight), x @ weight.t(), rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("path", ["onednn", "plain"])
def test_linear_with_relu_matches_float64(path, monkeypatch):
    monkeypatch.setattr(kernels, "ONEDNN_LINEAR", path == "onednn")
    x, weight, bias = _linear_inputs(seed=4)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out = linear(*leaves, relu=True)
    assert (type(out.grad_fn).__name__ == "_OneDNNLinearBackward") == (path == "onednn")
    assert 0.3 < (out == 0).float().mean() < 0.7  # both sides of the ReLU are exercised
    grad_output = torch.randn_like(out)
    out.backward(grad_output)
    doubles = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    expected = F.relu(F.linear(*doubles))
    expected.backward(grad_output.double())
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    for leaf, double in zip(leaves, doubles):
        torch.testing.assert_close(leaf.grad.double(), double.grad, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # no graph: oneDNN's kernel with the ReLU fused, equal to the separate ReLU bit for bit
        assert torch.equal(linear(x, weight, bias, relu=True), linear(x, weight, bias).relu())


@needs_onednn
@pytest.mark.parametrize("wanted", ["all", "weights only", "input only"])
def test_relu_feed_forward_node_equals_the_two_layers_bit_for_bit(onednn, wanted):
    """The feed-forward as one autograd node (the ReLU's backward in place on the node's own buffer) against the two
    oneDNN layers as separate nodes: the same output and gradients bit for bit, also when only some of them are
    wanted; and against float64 `F.linear`."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 32, generator=g)
    weight1, bias1 = torch.randn(64, 32, generator=g) / 32**0.5, torch.randn(64, generator=g)
    weight2, bias2 = torch.randn(32, 64, generator=g) / 8, torch.randn(32, generator=g)
    grad_output = torch.randn(3, 7, 32, generator=g)
    wants = {"all": [True] * 5, "weights only": [False, True, True, True, True],
             "input only": [True, False, False, False, False]}[wanted]

    def run(fn, dtype=torch.float32):
        leaves = [t.detach().to(dtype).requires_grad_(w) for t, w in zip((x, weight1, bias1, weight2, bias2), wants)]
        out = fn(*leaves)
        out.backward(grad_output.to(dtype))
        return out, [leaf.grad for leaf in leaves]

    out, grads = run(relu_feed_forward)
    assert type(out.grad_fn).__name__ == "_ReLUFeedForwardBackward"
    separate, separate_grads = run(lambda x, w1, b1, w2, b2: linear(linear(x, w1, b1, relu=True), w2, b2))
    assert type(separate.grad_fn).__name__ == "_OneDNNLinearBackward"
    assert torch.equal(out, separate)
    expected, expected_grads = run(lambda x, w1, b1, w2, b2: F.linear(F.relu(F.linear(x, w1, b1)), w2, b2),
                                   torch.float64)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    for grad, separate_grad, expected_grad, want in zip(grads, separate_grads, expected_grads, wants):
        assert (grad is not None) == want
        if want:
            assert torch.equal(grad, separate_grad)
            torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert torch.equal(relu_feed_forward(x, weight1, bias1, weight2, bias2), separate)


def test_linear_takes_the_plain_path_where_onednn_does_not_apply(onednn):
    x, weight, bias = _linear_inputs(seed=2)
    assert torch.equal(linear(x.double(), weight.double(), bias.double()), F.linear(x.double(), weight.double(),
                                                                                   bias.double()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_applies(x, weight)
        assert linear(x, weight, bias).dtype == torch.bfloat16  # autocast's own linear
    kernels.ONEDNN_LINEAR = False
    assert not onednn_applies(x, weight)
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))


@needs_onednn
def test_frozen_linear_is_the_plain_layer_bit_for_bit(onednn):
    x, weight, bias = _linear_inputs(seed=3, rows=(64,), k=64, n=96)
    other = torch.randn(64, 96)
    dense = kernels._onednn_linear(x, weight, bias)
    frozen = FrozenLinear(weight, bias, rows=64)
    assert frozen.onednn
    assert torch.equal(frozen(x), dense)  # the packed weight computes what the dense one does
    assert torch.equal(frozen.plus(x, other), dense + other)
    assert torch.equal(FrozenLinear(weight, bias, rows=64, relu=True)(x), dense.relu())
    small = FrozenLinear(weight, bias, rows=FrozenLinear.MIN_ROWS - 1)
    assert not small.onednn and torch.equal(small(x[:2]), F.linear(x[:2], weight, bias))
    assert torch.equal(FrozenLinear(weight, bias, rows=2, relu=True).plus(x[:2], other[:2]),
                       other[:2] + F.linear(x[:2], weight, bias).relu())


def _attention_inputs(batch=3, heads=2, queries=5, keys=6, size=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, size, generator=g, dtype=dtype)
            for length in (queries, keys, keys)]


class _Module:
    def __init__(self, is_causal):
        self.is_causal, self.training = is_causal, False


@pytest.mark.parametrize("case", ["none", "causal", "causal_offset", "bool", "float"])
def test_sdpa_by_matmuls_equals_sdpa_in_float64_with_gradients(case):
    queries = 4 if case == "causal_offset" else 6
    q, k, v = (t.requires_grad_() for t in _attention_inputs(queries=queries, keys=6))
    mask, sdpa_kwargs = None, {}
    if case == "causal":
        sdpa_kwargs = dict(is_causal=True)
    elif case == "causal_offset":  # 4 new queries after 2 cached positions: query i sees keys 0 .. 2 + i
        sdpa_kwargs = dict(attn_mask=torch.ones(4, 6, dtype=torch.bool).tril(2))
    elif case == "bool":
        mask = torch.rand(3, 1, queries, 6, generator=torch.Generator().manual_seed(1)) > 0.4
        mask[..., 0] = True
        sdpa_kwargs = dict(attn_mask=mask)
    elif case == "float":
        mask = torch.randn(3, 1, queries, 6, dtype=torch.float64)
        sdpa_kwargs = dict(attn_mask=mask)
    module = _Module(is_causal=case.startswith("causal"))
    out, weights = _sdpa_by_matmuls(module, q, k, v, mask, scaling=0.3)
    assert weights is None and out.shape == (3, queries, 2, 8)
    expected = F.scaled_dot_product_attention(q, k, v, scale=0.3, **sdpa_kwargs).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", ["none", "causal", "causal_offset", "bool", "float", "fully_masked"])
def test_headwise_attention_on_projection_views_equals_sdpa_in_float64(case):
    """Without a graph, views of a fused projection's output (heads side by side) run head by head; the result,
    weights included, is SDPA's / the softmax's."""
    from unittest import mock

    import vaswani.modeling_vaswani as modeling

    g = torch.Generator().manual_seed(5)
    queries, keys = (4, 6) if case == "causal_offset" else (6, 6)
    projected = torch.randn(3, keys, 3, 2, 8, generator=g, dtype=torch.float64)  # (B, T, q|k|v, H, D)
    q, k, v = (x.transpose(1, 2) for x in projected.unbind(2))
    q = q[:, :, keys - queries:]
    mask, sdpa_kwargs = None, {}
    if case == "causal":
        sdpa_kwargs = dict(is_causal=True)
    elif case == "causal_offset":
        sdpa_kwargs = dict(attn_mask=torch.ones(4, 6, dtype=torch.bool).tril(2))
    elif case in ("bool", "fully_masked"):
        mask = torch.rand(3, 1, queries, keys, generator=g) > 0.4
        mask[..., 0] = True
        reference = mask.clone()
        if case == "fully_masked":  # sequence 1 may attend to nothing: uniform weights over all its keys (below)
            mask[1] = False
        sdpa_kwargs = dict(attn_mask=reference)
    elif case == "float":
        mask = torch.randn(3, 1, queries, keys, generator=g, dtype=torch.float64)
        sdpa_kwargs = dict(attn_mask=mask)
    spy = mock.Mock(wraps=modeling.headwise_attention)
    with torch.no_grad(), mock.patch.object(modeling, "headwise_attention", spy):
        out, weights = modeling.eager_attention_forward(_Module(case.startswith("causal")), q, k, v, mask, scaling=0.3)
    assert spy.call_count == 1
    expected = F.scaled_dot_product_attention(q, k, v, scale=0.3, **sdpa_kwargs)
    if case == "fully_masked":
        expected[1] = v[1].mean(-2, keepdim=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-12, atol=1e-12)
    scores = q @ k.transpose(-1, -2) * 0.3
    if case == "float":
        scores = scores + mask
    elif "attn_mask" in sdpa_kwargs:
        scores = scores.masked_fill(~sdpa_kwargs["attn_mask"], float("-inf"))
    elif case == "causal":
        scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    if case == "fully_masked":
        scores[1] = 0
    torch.testing.assert_close(weights, scores.softmax(-1), rtol=1e-12, atol=1e-12)
    # with a graph, or with contiguous keys and values (a cache's), the batched matmuls run
    with mock.patch.object(modeling, "headwise_attention", spy):
        modeling.eager_attention_forward(_Module(False), q.requires_grad_(), k, v, None, scaling=0.3)
        with torch.no_grad():
            modeling.eager_attention_forward(_Module(False), q, k.contiguous(), v.contiguous(), None, scaling=0.3)
    assert spy.call_count == 1


def test_sdpa_by_matmuls_keeps_a_fully_masked_row_finite():
    q, k, v = _attention_inputs(dtype=torch.float32)
    mask = torch.ones(3, 1, 5, 6, dtype=torch.bool)
    mask[1] = False
    out, _ = _sdpa_by_matmuls(_Module(False), q, k, v, mask, scaling=0.3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1], v[1].mean(-2, keepdim=True).expand(2, 5, 8).transpose(0, 1))


def test_short_attention_rule():
    q, k, _ = _attention_inputs(keys=8, size=8, dtype=torch.float32)
    assert short_attention_applies(q, k)  # keys <= head size: the matmuls keep no more than the kernel
    q, k, _ = _attention_inputs(keys=9, size=8, dtype=torch.float32)
    assert not short_attention_applies(q, k)
    q, k, _ = _attention_inputs(keys=4, size=8, dtype=torch.float32)
    assert not short_attention_applies(q.bfloat16(), k.bfloat16())


def test_single_query_attention_equals_sdpa_in_float64():
    g = torch.Generator().manual_seed(4)
    query, keys, values = (torch.randn(6, length, 8, generator=g, dtype=torch.float64) for length in (3, 7, 7))
    keep = torch.rand(6, 1, 7, generator=g) > 0.3
    keep[..., 0] = True
    additive = torch.zeros(6, 1, 7, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)
    got = single_query_attention(query, keys, values, additive, 0.25)
    expected = F.scaled_dot_product_attention(query, keys, values, attn_mask=keep, scale=0.25)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(single_query_attention(query, keys, values, None, 0.25),
                               F.scaled_dot_product_attention(query, keys, values, scale=0.25), rtol=1e-12, atol=1e-12)


@needs_onednn
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_model_with_onednn_equals_the_plain_model(tiny_config, attn, monkeypatch):
    """The whole model, forward and every parameter's gradient (fused projections included), with oneDNN on against
    the plain path (MKL), in float32 on a padded batch."""
    model = make_model(tiny_config, seed=5)
    model.set_attn_implementation(attn)
    batch = padded_batch(3)
    results = {}
    for on in (True, False):
        monkeypatch.setattr(kernels, "ONEDNN_LINEAR", on)
        model.zero_grad(set_to_none=True)
        out = model(**batch)
        out.loss.backward()
        results[on] = (out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (logits_on, grads_on), (logits_off, grads_off) = results[True], results[False]
    real = batch["decoder_attention_mask"].bool()
    torch.testing.assert_close(logits_on[real], logits_off[real], rtol=1e-5, atol=1e-5)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@needs_onednn
@pytest.mark.parametrize("on", [True, False])
def test_lean_decoding_with_and_without_onednn_gives_transformers_tokens(tiny_config, on, monkeypatch):
    monkeypatch.setattr(kernels, "ONEDNN_LINEAR", on)
    model = make_model(tiny_config, seed=6)
    for seed in range(2):
        batch = padded_batch(seed, batch=6)
        inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=10)
        lean, reference, ran = generate_both(model, **inputs)
        assert ran and torch.equal(lean, reference)
        lean, reference, ran = beam_both(model, **inputs, num_beams=3)
        assert ran and torch.equal(lean, reference)


def test_packing_round_trip_and_when_it_applies():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    real = kernels.packing(mask)
    x = torch.arange(2 * 3 * 2.0).view(2, 3, 2)
    packed = real.pack(x)
    assert torch.equal(packed, x[mask.bool()])  # (N, d): the real tokens in order
    unpacked = real.unpack(packed)
    assert torch.equal(unpacked[mask.bool()], packed) and (unpacked[~mask.bool()] == 0).all()
    # the padding is written as zeros, not left as whatever the new buffer held
    for _ in range(3):
        dirty = torch.full((64, 6, 2), float("nan"))
        del dirty
        again = real.unpack(packed)
        assert torch.equal(again[mask.bool()], packed) and (again[~mask.bool()] == 0).all()
    lengths = torch.ones(64, 64).tril().bool()  # (4096, 8): padding in every sequence but the last
    big = kernels.packing(lengths)
    dirty = torch.full((4096, 8), float("nan"))
    del dirty
    values = torch.randn(int(lengths.sum()), 8, requires_grad=True)
    out = big.unpack(values)
    assert torch.equal(out[lengths], values) and (out[~lengths] == 0).all()
    weights = torch.randn(out.shape)
    (out * weights).sum().backward()  # the real tokens get their gradient, in order
    assert torch.equal(values.grad, weights[lengths])
    assert kernels.packing(torch.ones(2, 3)) is None  # nothing padded
    assert kernels.packing(None) is None and kernels.packing(torch.ones(2, 1, 3, 3)) is None  # no 2D mask


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_model_equals_the_padded_model_in_float64(tiny_config, normalize_before, attn, monkeypatch):
    """Position-wise layers on the real tokens only: the logits at real positions, the loss and every gradient equal
    those of the model run over the padding too (float64); the encoder's output is zero at the padding; the encoder's
    and the decoder's FFNs see only the real tokens."""
    tiny_config.normalize_before = normalize_before
    model = make_model(tiny_config, attn=attn, seed=11).double().train()  # dropout is 0 in the tiny config
    batch = padded_batch(5, batch=5)
    seen_rows = {}
    hooks = [module.register_forward_hook(lambda m, args, out, name=name: seen_rows.update({name: args[0].shape}))
             for name, module in (("encoder", model.model.encoder.layers[0].ffn),
                                  ("decoder", model.model.decoder.layers[0].ffn))]
    results = {}
    for packed in (True, False):
        if not packed:
            monkeypatch.setattr("vaswani.modeling_vaswani.packing", lambda mask: None)
        model.zero_grad(set_to_none=True)
        out = model(**batch, output_hidden_states=True)
        out.loss.backward()
        results[packed] = out, {n: p.grad.clone() for n, p in model.named_parameters()}
        if packed:
            for hook in hooks:
                hook.remove()
    (packed_out, packed_grads), (plain_out, plain_grads) = results[True], results[False]
    assert seen_rows["encoder"][0] == batch["attention_mask"].sum()  # (N, d), not (B, S, d)
    assert seen_rows["decoder"][0] == batch["decoder_attention_mask"].sum()
    real = batch["decoder_attention_mask"].bool()
    torch.testing.assert_close(packed_out.logits[real], plain_out.logits[real], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(packed_out.loss, plain_out.loss, rtol=1e-12, atol=1e-12)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-10, atol=1e-10, msg=name)
    source_real = batch["attention_mask"].bool()
    encoder_out = packed_out.encoder_last_hidden_state
    torch.testing.assert_close(encoder_out[source_real], plain_out.encoder_last_hidden_state[source_real],
                               rtol=1e-10, atol=1e-10)
    if not normalize_before:  # pre-LN ends with a norm over every position: LN(0) is its bias there
        assert (encoder_out[~source_real] == 0).all()
    assert all(h.shape == (5, 9, tiny_config.d_model) for h in packed_out.encoder_hidden_states)


def test_short_softmax_equals_torch_softmax_with_gradients():
    g = torch.Generator().manual_seed(12)
    x = torch.randn(16, 8, 12, 12, generator=g, dtype=torch.float64, requires_grad=True)
    y = kernels.softmax(x)
    assert type(y.grad_fn).__name__ == "_ShortSoftmaxBackward"  # many rows of 12: the elementwise path ran
    torch.testing.assert_close(y, x.softmax(-1), rtol=1e-14, atol=1e-14)
    assert torch.autograd.gradcheck(kernels._ShortSoftmax.apply, (x[:1, :1],))
    masked = torch.tensor([[0.0, torch.finfo(torch.float32).min, 1.0], [torch.finfo(torch.float32).min] * 3])
    torch.testing.assert_close(kernels.softmax(masked), masked.softmax(-1))  # a fully masked row: uniform, finite
    wide = torch.randn(2048, 16, dtype=torch.float64, requires_grad=True)
    assert type(kernels.softmax(wide).grad_fn).__name__ != "_ShortSoftmaxBackward"  # torch's kernel from 16 on
    few = torch.randn(256, 1, 12, dtype=torch.float64, requires_grad=True)
    assert type(kernels.softmax(few).grad_fn).__name__ != "_ShortSoftmaxBackward"  # and for few rows


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_equals_torch_with_gradients(smoothing, reduction):
    g = torch.Generator().manual_seed(14)
    logits = torch.randn(37, 11, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (37,), generator=g)
    labels[::5] = -100
    ours = kernels.cross_entropy(logits, labels, smoothing, reduction)
    assert type(ours.grad_fn).__name__ == "_CrossEntropyBackward"
    reference = F.cross_entropy(logits, labels, ignore_index=-100, reduction=reduction, label_smoothing=smoothing)
    torch.testing.assert_close(ours, reference, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(torch.autograd.grad(2 * ours, logits)[0], torch.autograd.grad(2 * reference, logits)[0],
                               rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: kernels.cross_entropy(x, labels[:6], smoothing, reduction), (logits[:6],))
    wide = torch.randn(300, 5000, dtype=torch.float32)  # several blocks of rows
    wide_labels = torch.randint(0, 5000, (300,))
    torch.testing.assert_close(kernels.cross_entropy(wide, wide_labels, smoothing, reduction),
                               F.cross_entropy(wide, wide_labels, reduction=reduction, label_smoothing=smoothing),
                               rtol=1e-5, atol=1e-3)
    assert kernels.cross_entropy(logits, torch.full((37,), -100), smoothing).isnan()  # nothing to average, as torch


def test_reusable_buffer_is_handed_out_again_only_when_nothing_refers_to_it():
    like = torch.empty(3, 5)
    first = kernels.reusable_like(like)
    assert first.shape == (3, 5) and first.is_contiguous()
    address = first.data_ptr()
    view = first[1:]  # still referred to (through a view): the next call must not hand out the same memory
    del first
    second = kernels.reusable_like(like)
    assert second.data_ptr() != address
    second.fill_(7.0)
    assert view.data_ptr() != second.data_ptr() and not bool((view == 7.0).all())
    address = second.data_ptr()
    del second, view
    assert kernels.reusable_like(like).data_ptr() == address  # nothing refers to it: the same memory again
    assert kernels.reusable_like(torch.empty(2, 4)).data_ptr() == address  # smaller: a view of the same
    assert kernels.reusable_like(torch.empty(4, 5)).shape == (4, 5)  # larger: new memory
    assert kernels.reusable_like(torch.empty(2, 2, dtype=torch.float64)).dtype == torch.float64


def test_cross_entropy_gradients_stay_when_the_user_keeps_them():
    """The logits gradient reuses memory between backward passes; one the user still holds is never overwritten."""
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 50, (20,), generator=g)
    grads = []
    for seed in range(3):
        logits = torch.randn(20, 50, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        kernels.cross_entropy(logits, labels).backward()  # logits.grad is the gradient buffer itself
        grads.append((logits, logits.grad.clone()))
    for logits, grad in grads:
        torch.testing.assert_close(logits.grad, grad)
        expected = (logits.detach().softmax(-1) - F.one_hot(labels, 50)) / 20
        torch.testing.assert_close(logits.grad, expected)


def test_cross_entropy_refuses_labels_outside_the_vocabulary():
    for bad in (11, -3):
        with pytest.raises(ValueError, match="vocab_size"):
            kernels.cross_entropy(torch.randn(4, 11), torch.tensor([1, bad, 2, -100]))


@pytest.mark.parametrize("on", [True, False])
def test_fused_logits_bias_and_relu_equal_the_separate_layers_and_respect_hooks(tiny_config, on, monkeypatch):
    """The logits bias inside the LM head's GEMM and the FFN's ReLU inside fc1's: the same logits and gradients as
    the head, the bias addition and the ReLU as separate modules (taken when a hook is on the layer, so that a hook
    still sees and changes what it would)."""
    monkeypatch.setattr(kernels, "ONEDNN_LINEAR", on and kernels.onednn_available())
    tiny_config.final_logits_bias = True
    model = make_model(tiny_config, seed=7)
    with torch.no_grad():
        model.final_logits_bias.normal_()
    batch = padded_batch(4)

    def run():
        model.zero_grad(set_to_none=True)
        out = model(**batch)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    fused_logits, fused_grads = run()
    identity = lambda module, args, output: output  # noqa: E731 - a hook that changes nothing forces the module call
    handles = [model.lm_head.register_forward_hook(identity)]
    handles += [layer.ffn.fc1.register_forward_hook(identity)
                for stack in (model.model.encoder, model.model.decoder) for layer in stack.layers]
    separate_logits, separate_grads = run()
    torch.testing.assert_close(fused_logits, separate_logits, rtol=1e-5, atol=1e-5)
    for name, grad in separate_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    for handle in handles:
        handle.remove()
    seen = []  # a hook that changes the output is honoured: the fused path is not taken under it
    model.lm_head.register_forward_hook(lambda module, args, output: seen.append(1) or output * 0)
    model.model.encoder.layers[0].ffn.fc1.register_forward_hook(lambda module, args, output: seen.append(2))
    logits = model(**batch).logits
    assert sorted(seen) == [1, 2]
    torch.testing.assert_close(logits, model.final_logits_bias.expand_as(logits))


@needs_onednn
def test_feed_forward_runs_as_one_node_unless_activation_dropout_runs(tiny_config, onednn):
    """In training the model's ReLU feed-forward is the one-node path; with activation dropout (which sits between
    its two layers) it keeps the separate layers, and the dropout really runs."""
    from vaswani.modeling_vaswani import VaswaniFeedForward

    x = torch.randn(3, 5, tiny_config.d_model)
    ffn = VaswaniFeedForward(tiny_config, 32).train()
    assert type(ffn(x.requires_grad_()).grad_fn).__name__ == "_ReLUFeedForwardBackward"
    ffn.activation_dropout = 0.5
    torch.manual_seed(0)
    dropped = ffn(x)
    assert type(dropped.grad_fn).__name__ == "_OneDNNLinearBackward"
    with torch.no_grad():
        inner = linear(x, ffn.fc1.weight, ffn.fc1.bias, relu=True)
        assert not torch.allclose(dropped, linear(inner, ffn.fc2.weight, ffn.fc2.bias))  # some units dropped
        assert torch.equal(ffn.eval()(x), linear(inner, ffn.fc2.weight, ffn.fc2.bias))  # eval: no dropout
