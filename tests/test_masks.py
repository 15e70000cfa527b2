"""The masks (modeling/masks_vaswani.py): the one rule for a query with no real key, checked in every pattern, every
CPU backend and the decoding loop; and dropout's masks."""

import pytest
import torch
from helpers import make_model, padded_batch

from vaswani import VaswaniConfig
import vaswani.masks_vaswani as masks
import vaswani.modeling_vaswani as modeling
from vaswani.masks_vaswani import DROPOUT_LEVELS, additive_key_mask, attend_somewhere, dropout

PATTERNS = ("full", "local", "block_sparse", "linear")


def test_attend_somewhere_leaves_rows_with_a_real_key_alone():
    real = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0]]).bool()
    assert torch.equal(attend_somewhere(real), torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1]]).bool())
    allowed = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0]]).bool()  # per query row, of one sequence's keys
    real_keys = torch.tensor([0, 0, 1, 0]).bool()
    # row 0 sees keys 0-1, both padding: it attends to both; row 1 sees key 2, a real one: only it
    assert torch.equal(attend_somewhere(real_keys, allowed), torch.tensor([[1, 1, 0, 0], [0, 0, 1, 0]]).bool())
    assert attend_somewhere(torch.tensor([[0, 0]])).dtype == torch.int64  # a 0/1 padding mask keeps its dtype


def _config(pattern):
    return VaswaniConfig.from_preset("tiny", dropout=0.0, encoder_attention_pattern=pattern,
                                     decoder_attention_pattern=pattern, attention_window=2, sparse_block_size=3,
                                     sparse_global_tokens=1)


@pytest.mark.parametrize("attn, pattern", [(attn, pattern) for attn in ("eager", "sdpa") for pattern in PATTERNS]
                         + [("flex_attention", "local")])  # flex compiles for a while on the CPU: one pattern
def test_an_all_padding_row_is_read_as_unpadded(attn, pattern):
    """The rule at the stacks: a source (and a target) that is all padding attends as if nothing were padding, in
    the encoder's self-attention, the decoder's self-attention and cross-attention, under every CPU backend."""
    model = make_model(_config(pattern), attn)
    model = model if attn == "flex_attention" else model.double()
    batch = padded_batch(seed=5, batch=3, src_len=10, tgt_len=7)
    empty = {**batch, "attention_mask": batch["attention_mask"].clone(),
             "decoder_attention_mask": batch["decoder_attention_mask"].clone()}
    empty["attention_mask"][1] = 0
    empty["decoder_attention_mask"][1] = 0
    unpadded = {**batch, "attention_mask": batch["attention_mask"].clone(),
                "decoder_attention_mask": batch["decoder_attention_mask"].clone()}
    unpadded["attention_mask"][1] = 1
    unpadded["decoder_attention_mask"][1] = 1
    with torch.no_grad():
        got, expected = model(**empty).logits, model(**unpadded).logits
    assert torch.isfinite(got).all()
    tolerance = 1e-5 if attn == "flex_attention" else 1e-10  # flex attention: float32 (the model is not cast)
    torch.testing.assert_close(got[1], expected[1], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(got[[0, 2]], expected[[0, 2]], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("pattern", ["local", "block_sparse"])
def test_a_query_without_a_real_key_in_its_window_attends_to_the_whole_window(attn, pattern):
    """Inside a pattern, a padded query whose window holds no real key attends to every key of its window as if it
    were real (not to itself alone): far enough from the real tokens (two layers of windows of 2, or of blocks of
    3), the encoder's hidden states are those of the same row without padding."""
    config = _config(pattern)
    config.sparse_global_tokens = 0  # a real global token would be in every window
    model = make_model(config, attn).double()
    batch = padded_batch(seed=2, batch=3, src_len=24, tgt_len=5)
    padded = batch["attention_mask"].clone()
    padded[2, 3:] = 0
    with torch.no_grad():
        encoder = model.get_encoder()
        got = encoder(input_ids=batch["input_ids"], attention_mask=padded).last_hidden_state
        expected = encoder(input_ids=batch["input_ids"], attention_mask=torch.ones_like(padded)).last_hidden_state
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[2, 9:], expected[2, 9:], rtol=1e-10, atol=1e-10)


def test_the_decoding_loop_reads_an_all_padding_source_as_unpadded():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    additive = additive_key_mask(mask, heads=2, dtype=torch.float32)  # (B * heads, 1, S)
    assert additive.shape == (4, 1, 3)
    assert (additive[2:] == 0).all()  # row 1: every source position
    assert additive[0, 0, 2] == torch.finfo(torch.float32).min and (additive[:2, :, :2] == 0).all()
    assert additive_key_mask(torch.tensor([[0, 0]]), heads=2, dtype=torch.float32) is None  # nothing masked


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_dropout_keeps_each_element_with_the_rounded_probability_on_every_quarter_of_a_draw(p):
    """Each 64-bit draw gives four elements: each of the four must be kept at the rate, and neighbours independently
    (a draw read once for all four, or a sign bit never set, fails here)."""
    torch.manual_seed(0)
    n = 1 << 20
    kept = dropout(torch.ones(n), p, True) != 0
    rate = 1 - round(p * DROPOUT_LEVELS) / DROPOUT_LEVELS
    quarter = n // 4
    sigma = (rate * (1 - rate) / quarter) ** 0.5
    for offset in range(4):  # each 16-bit quarter of the 64-bit words
        assert abs(kept[offset::4].double().mean().item() - rate) < 5 * sigma, offset
    both = (kept[:-1] & kept[1:]).double().mean().item()  # neighbours within a word and across words
    assert abs(both - rate**2) < 5 * (rate**2 * (1 - rate**2) / n) ** 0.5


def test_dropout_scales_by_the_inverse_of_the_kept_share_and_the_gradient_takes_the_same_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)  # 2,112 elements: not a multiple of 4 words
    torch.manual_seed(2)
    y = dropout(x, 0.1, True)
    kept = y != 0
    cut = round(0.1 * DROPOUT_LEVELS)
    scale = DROPOUT_LEVELS / (DROPOUT_LEVELS - cut)
    assert 0 < kept.sum() < x.numel()
    torch.testing.assert_close(y, torch.where(kept, x * scale, 0.0), rtol=0, atol=0)
    grad = torch.randn_like(x)
    y.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(kept, grad * scale, 0.0), rtol=0, atol=0)

    def seeded(t):  # the same mask at every call, for gradcheck
        torch.manual_seed(2)
        return dropout(t, 0.1, True)

    assert torch.autograd.gradcheck(seeded, (x.detach().requires_grad_(),))
    ones = torch.ones(1 << 20, dtype=torch.float64)
    torch.manual_seed(3)
    assert abs(dropout(ones, 0.1, True).mean().item() - 1) < 5 * (0.1 / 0.9 / ones.numel()) ** 0.5  # unbiased


def test_dropout_follows_torch_s_generator_and_is_the_input_outside_training():
    x = torch.randn(1000)
    torch.manual_seed(5)
    first = dropout(x, 0.2, True)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.2, True), first)
    assert not torch.equal(dropout(x, 0.2, True), first)  # the generator moved on
    assert dropout(x, 0.2, False) is x and dropout(x, 0.0, True) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))  # no level keeps anything: F.dropout
    half = torch.randn(1000, dtype=torch.bfloat16)
    assert dropout(half, 0.2, True).dtype == torch.bfloat16


def test_every_dropout_of_the_model_is_the_one_definition(monkeypatch):
    """Embeddings, residual branches, feed-forward activations and eager attention weights all go through
    masks_vaswani.dropout in training; F.dropout is never called on the CPU."""
    calls = []

    def counted(x, p, training):
        calls.append((tuple(x.shape), p))
        return dropout(x, p, training)

    def refused(*args, **kwargs):
        raise AssertionError("F.dropout called: the model's dropout is masks_vaswani.dropout")

    monkeypatch.setattr(modeling, "dropout", counted)
    monkeypatch.setattr(masks, "dropout", counted)
    monkeypatch.setattr(torch.nn.functional, "dropout", refused)
    config = VaswaniConfig.from_preset("tiny", dropout=0.1, activation_dropout=0.2, attention_dropout=0.3)
    model = make_model(config, attn="eager").train()
    ids = torch.randint(4, config.vocab_size, (2, 5))
    model(input_ids=ids, labels=ids).loss.backward()
    layers = config.encoder_layers + config.decoder_layers
    assert sorted(p for _, p in calls) == sorted(
        [0.1] * (2 + 2 * config.encoder_layers + 3 * config.decoder_layers)  # embeddings and residual branches
        + [0.2] * layers  # feed-forward activations
        + [0.3] * (config.encoder_layers + 2 * config.decoder_layers))  # attention weights
