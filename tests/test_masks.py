"""The masks (modeling/masks_vaswani.py): the one rule for a query with no real key, checked in every pattern, every
CPU backend and the decoding loop."""

import pytest
import torch
from helpers import make_model, padded_batch

from vaswani import VaswaniConfig
from vaswani.masks_vaswani import additive_key_mask, attend_somewhere

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
