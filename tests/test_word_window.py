"""Cross-attention within a window of words (`cross_attention_words`) and word indices modulo a period
(`word_position_period`): the mask against a loop, what a target word can read, cached decoding against one forward,
generation with and without a cache, and the period's positions."""

import pytest
import torch
from helpers import padded_batch
from test_positions import BOUNDARY, check_generation_with_and_without_cache, word_model, word_positions_by_loop

import vaswani
from vaswani.masks_vaswani import cross_attention_mask, read_span, word_window_mask
from vaswani.positions_vaswani import word_position_ids

STRIDE = 16  # test_positions.word_model's


def window_by_loop(word_ids, encoder_word_ids, real, window):
    """(B, T, S) lists: the target token of word i sees the real source tokens of words within `window` of i, i
    taken between the first and the last real source word."""
    mask = []
    for words, source, keep in zip(word_ids, encoder_word_ids, real):
        first, last = min(w for w, k in zip(source, keep) if k), max(w for w, k in zip(source, keep) if k)
        mask.append([[k and abs(s - max(min(w, last), first)) <= window for s, k in zip(source, keep)]
                     for w in words])
    return mask


def test_word_window_mask_equals_a_loop():
    g = torch.Generator().manual_seed(0)
    source = torch.randint(4, 9, (4, 30), generator=g)  # token 5 is the boundary
    source[3, 0] = BOUNDARY  # a line that opens with a boundary has no word 0
    target = torch.randint(4, 9, (4, 25), generator=g)
    real = torch.ones(4, 30, dtype=torch.long)
    real[1, 20:] = 0  # right padding
    real[2, :3] = 0  # left padding
    source_words, target_words = (word_position_ids(x, BOUNDARY, STRIDE) // STRIDE for x in (source, target))
    for window in (0, 1, 3):
        got = word_window_mask(target_words, source_words, real, window)
        assert got.shape == (4, 1, 25, 30)
        expected = window_by_loop(target_words.tolist(), source_words.tolist(), real.bool().tolist(), window)
        assert got[:, 0].tolist() == expected
        assert got.any(-1).all()  # every query reads at least one real key (words past the end read the last)
        for step in range(25):  # a decoding step's stretch of keys: every key it reads, starting and ending on one
            span = read_span(got[:, :, step:step + 1])
            read = got[:, 0, step].any(0)
            assert read[span][0] and read[span][-1] and not read[:span.start].any() and not read[span.stop:].any()
    no_padding = word_window_mask(target_words, source_words, None, 1)
    assert torch.equal(no_padding, word_window_mask(target_words, source_words, torch.ones_like(real), 1))
    all_padding = word_window_mask(target_words[:1], source_words[:1], torch.zeros_like(real[:1]), 1)
    assert all_padding.any(-1).all()  # the rule: a source of padding alone is read as real


def window_model(tiny_config, attn="sdpa", **fields):
    fields = {"cross_attention_words": 1, "encoder_attention_pattern": "local", "decoder_attention_pattern": "local",
              "attention_window": 4, **fields}
    model = word_model(tiny_config, **fields)
    model.config._attn_implementation = attn
    return model


def line(words: list[list[int]]) -> list[int]:
    """Token ids of a line: the words joined by the boundary."""
    ids = []
    for index, word in enumerate(words):
        ids += ([BOUNDARY] if index else []) + word
    return ids


@pytest.mark.parametrize("window", [1, None])
def test_a_target_word_reads_only_its_window_of_source_words(tiny_config, window):
    """Changing the last source word leaves the first target word's logits as they were with the window (the
    encoder's local attention, 4 positions, 2 layers, cannot carry it that far), and changes them without it."""
    model = window_model(tiny_config, attn="eager", cross_attention_words=window).double()
    words = [[7, 8], [9, 10, 11], [12, 13], [14, 15], [16, 17, 18], [19, 20], [21, 22, 23], [24, 25]]
    source = torch.tensor([line(words), line(words[:-1] + [[30, 31]])])
    target = torch.tensor([[2] + line([[40, 41], [42, 43], [44]])] * 2)
    out = model(input_ids=source, decoder_input_ids=target, output_attentions=True)
    first_word = slice(0, 3)  # the start token and the first word's two tokens
    same = torch.equal(out.logits[0, first_word], out.logits[1, first_word])
    assert same == (window is not None)
    if window is not None:  # the weights outside the window are zero in every layer and head
        source_words = word_position_ids(source, BOUNDARY, STRIDE) // STRIDE
        target_words = word_position_ids(target, BOUNDARY, STRIDE) // STRIDE
        outside = ~word_window_mask(target_words, source_words, None, window)
        for weights in out.cross_attentions:
            assert weights.masked_select(outside).abs().max() == 0


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_one_token_at_a_time_gives_the_logits_of_one_forward(tiny_config, attn):
    model = window_model(tiny_config, attn=attn, word_position_period=3).double()
    source = torch.tensor([line([[7, 8], [9, 10], [11], [12, 13], [14]]) + [3],
                           line([[7, 8], [9]]) + [3] + [0] * 8])
    attention_mask = (source != 0).long()
    target = torch.tensor([[2] + line([[12, 13], [14], [15, 16], [17], [18], [19]]),
                           [2] + line([[12, 13], [14], [15, 16], [17], [18], [19]])])
    whole = model(input_ids=source, attention_mask=attention_mask, decoder_input_ids=target).logits
    encoder_outputs = model.get_encoder()(input_ids=source, attention_mask=attention_mask)
    assert encoder_outputs.word_ids.tolist()[1][:6] == [0, 0, 1, 1, 1, 1]  # padding continues the last word
    positions = word_position_ids(target, BOUNDARY, STRIDE)
    cache, steps = None, []
    for t in range(target.shape[1]):
        out = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask,
                    decoder_input_ids=target[:, t:t + 1], cache=cache, use_cache=True,
                    decoder_position_ids=positions[:, t:t + 1])
        cache = out.cache
        steps.append(out.logits)
    assert (torch.cat(steps, 1) - whole).abs().max() < 1e-10
    with pytest.raises(ValueError, match="cross_attention_words needs the word indices of both sides"):
        model(encoder_outputs=(encoder_outputs.last_hidden_state,), decoder_input_ids=target)


@pytest.mark.parametrize("how", [dict(do_sample=True, temperature=2.0), dict(num_beams=3), dict()])
def test_generation_with_a_cache_equals_generation_without(tiny_config, how):
    """The cached steps read the window's stretch of keys (`read_span`); without a cache, the whole source."""
    tiny_config.final_logits_bias = True
    check_generation_with_and_without_cache(window_model(tiny_config, word_position_period=2), how)


@pytest.mark.parametrize("period", [3, None])
def test_word_indices_count_modulo_the_period(tiny_config, period):
    """A line of one repeated word: with a period of 3 words, word k and word k + 3 get the same embedding in both
    stacks (and only those); without one, every word its own. (Word 0 has no boundary before it: from word 1 on.)"""
    model = word_model(tiny_config, word_position_period=period).double()
    ids = torch.tensor([line([[7, 8]] * 8)])
    assert word_positions_by_loop(ids[0].tolist(), BOUNDARY, STRIDE)[3 * 7] == 7 * STRIDE + 1  # ids themselves: whole
    for stack in (model.model.encoder, model.model.decoder):
        embedded = stack.embed(ids)
        words = {k: embedded[0, 3 * k] for k in range(1, 8)}  # each word's first letter
        for k in words:
            for j in words:
                equal = torch.equal(words[k], words[j])
                assert equal == (k == j or (period is not None and (k - j) % period == 0)), (k, j)


def test_the_config_names_what_each_field_needs():
    with pytest.raises(ValueError, match="cross_attention_words=1 counts words.*--word_positions"):
        vaswani.VaswaniConfig.from_preset("tiny", cross_attention_words=1)
    with pytest.raises(ValueError, match="word_position_period=64 counts words"):
        vaswani.VaswaniConfig.from_preset("tiny", word_position_period=64)
    with pytest.raises(ValueError, match="word_position_period=0 must be a number of words \\(1 or more\\)"):
        vaswani.VaswaniConfig.from_preset("tiny", word_boundary_token_id=5, word_position_period=0)
    with pytest.raises(ValueError, match="cross_attention_words=-1 must be a number of words \\(0 or more\\)"):
        vaswani.VaswaniConfig.from_preset("tiny", word_boundary_token_id=5, cross_attention_words=-1)
    config = vaswani.VaswaniConfig.from_preset("tiny", word_boundary_token_id=5, cross_attention_words=1)
    config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="runs under eager or sdpa attention, not 'flex_attention'"):
        cross_attention_mask(config, torch.zeros(1, 2, 16), None, torch.zeros(1, 3, 16),
                                                   torch.zeros(1, 2, dtype=torch.long),
                                                   torch.zeros(1, 3, dtype=torch.long))


def test_a_saved_model_keeps_its_window_and_period(tiny_config, tmp_path):
    model = window_model(tiny_config, word_position_period=3)
    model.save_pretrained(tmp_path)
    loaded = vaswani.VaswaniForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert (loaded.config.cross_attention_words, loaded.config.word_position_period) == (1, 3)
    batch = padded_batch(4)
    batch["input_ids"][:, 2::3] = BOUNDARY
    batch["input_ids"] *= batch["attention_mask"]
    assert torch.equal(loaded(**batch).logits, model(**batch).logits)
