"""The lean greedy/sampling and beam-search loops (modeling/decoding_vaswani.py, the `lean_decoding` fast path) against
transformers' own loops on the same model: the same sequences for every generation setting they serve, and a clean
fallback for the others."""

from unittest import mock

import pytest
import torch
from transformers import (
    DynamicCache,
    EncoderDecoderCache,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)

from helpers import make_model, padded_batch

from vaswani import decoding_vaswani
from vaswani.decoding_vaswani import _LeanLayer, lean_blocker

LEAN = "vaswani.fast_paths_vaswani.{}"  # where the seam calls the lean loops


def generate_both(model, lean_function="lean_sample", **kwargs):
    """(lean loop output, transformers' loop output, whether the lean loop ran) for the same call."""
    calls = []
    original = getattr(decoding_vaswani, lean_function)

    def spy(*args, **kw):
        calls.append(1)
        return original(*args, **kw)

    seed = kwargs.pop("seed", None)
    with mock.patch(LEAN.format(lean_function), spy):
        if seed is not None:
            torch.manual_seed(seed)
        lean = model.generate(**kwargs)
    model.set_fast_paths({"lean_decoding": False})
    try:
        if seed is not None:
            torch.manual_seed(seed)
        reference = model.generate(**kwargs)
    finally:
        model.set_fast_paths({"lean_decoding": True})
    return lean, reference, bool(calls)


def float64_variant(tiny_config, normalize_before: bool, final_logits_bias: bool):
    """A float64 tiny model, pre- or post-LN (with the matching position layout), with or without a logits bias."""
    tiny_config.normalize_before = normalize_before
    tiny_config.final_logits_bias = final_logits_bias
    tiny_config.position_encoding = "sinusoidal_split" if normalize_before else "sinusoidal_interleaved"
    model = make_model(tiny_config, seed=3).double()
    if final_logits_bias:
        model.final_logits_bias.normal_(0, 1.0)
    return model


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("final_logits_bias", [False, True])
def test_greedy_equals_transformers_loop_in_float64(tiny_config, normalize_before, final_logits_bias):
    model = float64_variant(tiny_config, normalize_before, final_logits_bias)
    for seed in range(3):
        batch = padded_batch(seed, batch=6)
        lean, reference, ran = generate_both(
            model, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12
        )
        assert ran
        assert torch.equal(lean, reference)
        assert lean.shape[1] > 2  # something was generated past the start token


def test_greedy_float32_scores_equal_the_full_forward(tiny_config):
    """Independent of both loops: the lean loop's tokens are the argmax of a full (uncached) forward over the prefix
    it produced, and that argmax is not a near-tie."""
    model = make_model(tiny_config, seed=4)
    batch = padded_batch(11, batch=5)
    lean, reference, ran = generate_both(
        model, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=9,
        min_new_tokens=9,
    )
    assert ran and torch.equal(lean, reference)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=lean[:, :-1]).logits
    logits[..., tiny_config.eos_token_id] = float("-inf")  # min_new_tokens
    assert torch.equal(logits.argmax(-1), lean[:, 1:])


def test_processors_and_stopping_behave_as_in_transformers(tiny_config):
    model = make_model(tiny_config, seed=5).double()
    batch = padded_batch(12, batch=6)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    # The EOS is made likely so that rows finish at different steps and get padded.
    model.model.shared.weight.data[tiny_config.eos_token_id] *= 4
    settings = [
        dict(max_new_tokens=15),
        dict(max_new_tokens=15, min_new_tokens=6),
        dict(max_length=7),
        dict(max_new_tokens=10, repetition_penalty=1.7, no_repeat_ngram_size=2),
        dict(max_new_tokens=10, forced_eos_token_id=tiny_config.eos_token_id),
        dict(max_new_tokens=10, eos_token_id=[tiny_config.eos_token_id, 7], bad_words_ids=[[9], [11]]),
        dict(max_new_tokens=10, suppress_tokens=[5, 6]),
        dict(max_new_tokens=10, do_sample=True, top_k=8, temperature=0.7, seed=0),
        dict(max_new_tokens=10, do_sample=True, top_p=0.9, seed=1),
        dict(max_new_tokens=8, num_return_sequences=2, do_sample=True, seed=2),
    ]
    finished_early = 0
    for setting in settings:
        lean, reference, ran = generate_both(model, **inputs, **setting)
        assert ran, setting
        assert torch.equal(lean, reference), setting
        finished_early += int((lean == tiny_config.pad_token_id).any())
    assert finished_early >= 3  # the EOS path (padding of finished rows) was exercised


def _spy_on_drops(monkeypatch) -> list[int]:
    """The number of rows the greedy loop keeps at each drop of finished rows, as they happen."""
    kept = []
    original = decoding_vaswani._LeanDecoder.keep

    def spy(self, rows, length):
        kept.append(rows.shape[0])
        return original(self, rows, length)

    monkeypatch.setattr(decoding_vaswani._LeanDecoder, "keep", spy)
    return kept


def _rows_that_finish_apart(tiny_config, monkeypatch, share, batch, scale):
    """(the drop spy, a float64 model whose EOS is made likely, so that rows finish at different steps, a padded
    batch), with `DROP_FINISHED` set to `share`."""
    monkeypatch.setattr(decoding_vaswani, "DROP_FINISHED", share)
    kept = _spy_on_drops(monkeypatch)
    model = make_model(tiny_config, seed=5).double()
    model.model.shared.weight.data[tiny_config.eos_token_id] *= scale
    return kept, model, padded_batch(12, batch=batch)


@pytest.mark.parametrize("share", [1e-9, 0.4])  # each finished row at once, or several at a time
def test_greedy_stops_running_finished_rows_and_gives_transformers_tokens(tiny_config, monkeypatch, share):
    """Greedy search drops rows once they finish (transformers' loop runs every row to the end): the same sequences,
    on padded sources (the cross-attention keys and mask follow their rows) and with row-wise processors, over drop
    after drop."""
    kept, model, batch = _rows_that_finish_apart(tiny_config, monkeypatch, share, batch=6, scale=4)
    assert not batch["attention_mask"].all()
    settings = [  # the length penalty makes rows finish at different steps
        dict(max_new_tokens=15, exponential_decay_length_penalty=(2, 1.3)),
        dict(max_new_tokens=15, min_new_tokens=3, repetition_penalty=1.7, no_repeat_ngram_size=2),
        dict(max_new_tokens=12, eos_token_id=[tiny_config.eos_token_id, 7], suppress_tokens=[5],
             exponential_decay_length_penalty=(1, 1.5)),
    ]
    drops = []
    for setting in settings:
        for flip in (False, True):  # the batch as it is, and upside down
            kept.clear()
            inputs = {name: batch[name].flip(0) if flip else batch[name] for name in ("input_ids", "attention_mask")}
            lean, reference, ran = generate_both(model, **inputs, **setting)
            assert ran and torch.equal(lean, reference), setting
            drops.append(list(kept))
    assert sum(map(len, drops)) >= 2, drops
    if share < 0.1:  # every finish is a drop, among them drops from a decoder that had dropped rows already
        assert all(drops) and max(map(len, drops)) >= 3, drops


class RowBonus(LogitsProcessor):
    """A user's processor that reads a row's index in the batch: row i favours token 4 + i."""

    def __call__(self, input_ids, scores):
        bonus = torch.zeros_like(scores)
        rows = torch.arange(scores.shape[0])
        bonus[rows, 4 + rows] = 0.5
        return scores + bonus


def test_greedy_runs_every_row_for_processors_it_does_not_know_and_for_sampling(tiny_config, monkeypatch):
    """A processor outside the row-wise list may depend on a row's index (RowBonus does), and sampling's draws on the
    batch: both get every row to the end, and transformers' tokens."""
    kept, model, batch = _rows_that_finish_apart(tiny_config, monkeypatch, 1e-9, batch=6, scale=4)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12,
                  exponential_decay_length_penalty=(2, 1.3))
    for setting in (dict(logits_processor=LogitsProcessorList([RowBonus()])), dict(do_sample=True, top_k=0, seed=3)):
        lean, reference, ran = generate_both(model, **inputs, **setting)
        assert ran and torch.equal(lean, reference), setting
        assert (lean == tiny_config.pad_token_id).any()  # rows did finish early
    assert kept == []


class StopAfter(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def test_user_stopping_criteria_and_unpadded_batch(tiny_config):
    model = make_model(tiny_config, seed=6).double()
    batch = padded_batch(13, batch=3)
    full = torch.ones_like(batch["attention_mask"])
    lean, reference, ran = generate_both(
        model, input_ids=batch["input_ids"], attention_mask=full, max_new_tokens=20, min_new_tokens=20,
        stopping_criteria=StoppingCriteriaList([StopAfter(5)]),
    )
    assert ran and torch.equal(lean, reference) and lean.shape[1] == 5
    lean, reference, ran = generate_both(model, input_ids=batch["input_ids"], max_new_tokens=6)
    assert ran and torch.equal(lean, reference)


def test_buffers_grow_past_their_capacity(tiny_config):
    model = make_model(tiny_config)
    layer = model.model.decoder.layers[0]
    encoder_states = torch.randn(2, 5, tiny_config.d_model)
    buffers = _LeanLayer(layer, encoder_states, rows=2, capacity=2)
    written = [torch.randn(2, 4, 4) for _ in range(5)]  # (rows, H, D) per position
    for position, keys in enumerate(written):
        new = torch.stack([keys, -keys], dim=2)  # (rows, H, 2, D): keys and values
        seen_keys, seen_values = buffers.append(new.transpose(0, 1).contiguous().transpose(0, 1), position)
    assert buffers.cache.shape[3] == 8
    expected = torch.stack(written, dim=2).flatten(0, 1)  # (rows * H, positions, D)
    assert torch.equal(seen_keys, expected) and torch.equal(seen_values, -expected)


def test_calls_it_does_not_serve_fall_back_to_transformers_loop(tiny_config):
    model = make_model(tiny_config, seed=7)
    batch = padded_batch(14)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6)
    expected = model.generate(**inputs)
    start = torch.full((4, 2), tiny_config.decoder_start_token_id)
    cases = {
        "return_dict_in_generate": dict(return_dict_in_generate=True, output_scores=True),
        "decoder prompt": dict(decoder_input_ids=start),
        "use_cache=False": dict(use_cache=False),
        "static cache": dict(cache_implementation="static"),
        "a cache passed in": dict(cache=EncoderDecoderCache(DynamicCache(config=tiny_config),
                                                             DynamicCache(config=tiny_config))),
    }
    for name, extra in cases.items():
        with mock.patch(LEAN.format("lean_sample"), side_effect=AssertionError(name)):
            out = model.generate(**inputs, **extra)
        sequences = out.sequences if name == "return_dict_in_generate" else out
        if name != "decoder prompt":
            assert torch.equal(sequences, expected), name
    handle = model.model.decoder.layers[0].ffn.fc1.register_forward_hook(lambda *args: None)  # the module contract
    with mock.patch(LEAN.format("lean_sample"), side_effect=AssertionError("a hook")):
        assert torch.equal(model.generate(**inputs), expected)
    handle.remove()
    model.train()
    with mock.patch(LEAN.format("lean_sample"), side_effect=AssertionError("training")):
        model.generate(**inputs)


def test_blocker_names_the_reason(tiny_config):
    model = make_model(tiny_config)
    ids = torch.zeros(1, 1)
    assert "training" in lean_blocker(model.train(), input_ids=ids, generation_config=mock.Mock())
    model.eval().config._attn_implementation = "flash_attention_2"
    with torch.no_grad():
        assert "flash_attention_2" in lean_blocker(model, input_ids=ids, generation_config=mock.Mock())


def _falls_back(model, **inputs):
    """Whether greedy search and beam search ran transformers' loops (the lean loops raise if called)."""
    with mock.patch(LEAN.format("lean_sample"), side_effect=AssertionError("the lean loop ran")), \
            mock.patch(LEAN.format("lean_beam_search"), side_effect=AssertionError("the lean loop ran")):
        for beams in (1, 3):
            model.generate(**inputs, num_beams=beams, max_new_tokens=3)
    return True


@pytest.mark.parametrize("field, value", [("position_encoding", "rotary"), ("activation_function", "tanh"),
                                          ("normalize_before", None)])
def test_a_config_value_outside_the_allow_list_falls_back(tiny_config, field, value):
    """A value the lean loop was not written for (here set after building, as a future option would be) sends
    generate to transformers' loop."""
    model = make_model(tiny_config)
    inputs = dict(input_ids=padded_batch(3)["input_ids"][:2])
    with torch.no_grad():
        object.__setattr__(model.config, field, value)
        assert f"{field}={value!r}" == lean_blocker(model, input_ids=torch.zeros(2, 1), generation_config=mock.Mock())
        assert _falls_back(model, **inputs)


def test_a_config_field_outside_the_allow_list_falls_back(tiny_config):
    """A config field the lean loop does not know (a subclass's new option) sends generate to transformers' loop."""
    from dataclasses import dataclass

    from vaswani import VaswaniConfig

    @dataclass(repr=False)
    class NewOption(VaswaniConfig):
        decoder_new_option: int = 1

    config = NewOption.from_preset("tiny", dropout=0.0)
    model = make_model(config)
    with torch.no_grad():
        assert "decoder_new_option" in lean_blocker(model, input_ids=torch.zeros(2, 1), generation_config=mock.Mock())
        assert _falls_back(model, input_ids=padded_batch(3)["input_ids"][:2])


def test_a_module_type_outside_the_allow_list_falls_back(tiny_config):
    """A plain torch module (one the fast paths' module contract accepts) that the lean loop was not written for."""
    model = make_model(tiny_config)
    model.model.decoder.layers[1].ffn.activation = torch.nn.Identity()
    with torch.no_grad():
        assert "Identity" in decoding_vaswani.module_blocker(model)
        assert _falls_back(model, input_ids=padded_batch(3)["input_ids"][:2])


def test_a_fully_padded_source_row_decodes_as_in_transformers(tiny_config):
    model = make_model(tiny_config, seed=8).double()
    batch = padded_batch(15, batch=4)
    attention_mask = batch["attention_mask"].clone()
    attention_mask[2] = 0  # nothing to attend to: the model lets that row attend everywhere
    lean, reference, ran = generate_both(
        model, input_ids=batch["input_ids"], attention_mask=attention_mask, max_new_tokens=8, min_new_tokens=8
    )
    assert ran and torch.equal(lean, reference)


def test_a_bfloat16_model_takes_transformers_loop(tiny_config):
    """The lean loop serves float32 and float64; a bf16 model steps aside to transformers' loop."""
    model = make_model(tiny_config, seed=3).to(torch.bfloat16)
    batch = padded_batch(0, batch=6)
    lean, reference, ran = generate_both(
        model, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12
    )
    assert not ran and torch.equal(lean, reference)


# ---- beam search -------------------------------------------------------------------------------------------------

def beam_both(model, **kwargs):
    return generate_both(model, "lean_beam_search", **kwargs)


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("final_logits_bias", [False, True])
def test_beam_search_equals_transformers_loop_in_float64(tiny_config, normalize_before, final_logits_bias):
    model = float64_variant(tiny_config, normalize_before, final_logits_bias)
    moved = []
    original = _LeanLayer.reorder

    def count(self, rows, sources, length):
        moved.append(len(rows))
        return original(self, rows, sources, length)

    with mock.patch.object(_LeanLayer, "reorder", count):
        for seed in range(3):
            batch = padded_batch(seed, batch=5)
            lean, reference, ran = beam_both(model, input_ids=batch["input_ids"],
                                             attention_mask=batch["attention_mask"], max_new_tokens=12, num_beams=4)
            assert ran and torch.equal(lean, reference)
            assert lean.shape[1] > 2
    assert sum(moved) > 0  # beams did change their histories: the buffers were reordered


def test_beam_settings_behave_as_in_transformers(tiny_config):
    model = make_model(tiny_config, seed=5).double()
    batch = padded_batch(12, batch=5)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    model.model.shared.weight.data[tiny_config.eos_token_id] *= 4  # beams finish at different steps
    eos = tiny_config.eos_token_id
    settings = [
        dict(num_beams=3, max_new_tokens=15),
        dict(num_beams=5, max_new_tokens=12, num_return_sequences=3),
        dict(num_beams=4, max_new_tokens=12, length_penalty=0.0, early_stopping="never"),
        dict(num_beams=4, max_new_tokens=12, length_penalty=2.0, early_stopping="never"),
        dict(num_beams=4, max_new_tokens=12, length_penalty=-1.0, early_stopping=True),
        dict(num_beams=4, max_new_tokens=12, early_stopping=False),
        dict(num_beams=4, max_new_tokens=15, min_new_tokens=6),
        dict(num_beams=3, max_length=7),
        dict(num_beams=4, max_new_tokens=10, repetition_penalty=1.7, no_repeat_ngram_size=2),
        dict(num_beams=4, max_new_tokens=10, forced_eos_token_id=eos),
        dict(num_beams=4, max_new_tokens=10, eos_token_id=[eos, 7], bad_words_ids=[[9], [11]]),
        dict(num_beams=4, max_new_tokens=10, do_sample=True, top_k=8, seed=0),
        dict(num_beams=3, max_new_tokens=10, do_sample=True, temperature=0.8, num_return_sequences=2, seed=1),
    ]
    shorter = 0
    for setting in settings:
        lean, reference, ran = beam_both(model, **inputs, **setting)
        assert ran, setting
        assert torch.equal(lean, reference), setting
        shorter += int((lean[:, 1:-1] == eos).any())
    assert shorter >= 3  # hypotheses finished at different lengths (and were filled up)


@pytest.mark.parametrize("share", [1e-9, 0.4])
def test_beam_search_stops_running_finished_sentences_and_gives_transformers_tokens(tiny_config, monkeypatch, share):
    """Beam search drops a sentence's beams once nothing it returns can change (transformers' loop runs them to the
    end): the same sequences for every beam setting that allows it, the batch as it is and upside down (so that
    sentences leave from the middle of those still running), over drop after drop."""
    kept, model, batch = _rows_that_finish_apart(tiny_config, monkeypatch, share, batch=8, scale=8)
    eos = tiny_config.eos_token_id
    settings = [
        dict(num_beams=3, max_new_tokens=15),
        dict(num_beams=5, max_new_tokens=12, num_return_sequences=3),
        dict(num_beams=4, max_new_tokens=12, length_penalty=2.0, early_stopping="never"),
        dict(num_beams=4, max_new_tokens=12, length_penalty=-1.0, early_stopping=True),
        dict(num_beams=2, max_new_tokens=15, min_new_tokens=3, repetition_penalty=1.7, no_repeat_ngram_size=2),
        dict(num_beams=3, max_new_tokens=12, eos_token_id=[eos, 7], exponential_decay_length_penalty=(2, 1.3)),
    ]
    drops = []
    for setting in settings:
        for flip in (False, True):
            kept.clear()
            inputs = {name: batch[name].flip(0) if flip else batch[name] for name in ("input_ids", "attention_mask")}
            lean, reference, ran = beam_both(model, **inputs, **setting)
            assert ran and torch.equal(lean, reference), (setting, flip)
            drops.append(list(kept))
    assert sum(map(bool, drops)) >= 6, drops
    if share < 0.1:
        assert max(map(len, drops)) >= 3, drops


def test_beam_search_runs_every_sentence_for_criteria_and_processors_it_does_not_know(tiny_config, monkeypatch):
    """A user's stopping criteria may stop all continuations of a sentence, which ends the loop (and changes what
    the finished sentences return), a user's processor may read a row's index, and beam sampling's draws depend on
    the batch: each keeps every sentence to the end, and gets transformers' tokens."""
    kept, model, batch = _rows_that_finish_apart(tiny_config, monkeypatch, 1e-9, batch=5, scale=4)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12,
                  num_beams=3)
    for setting in (dict(stopping_criteria=StoppingCriteriaList([StopAfter(9)])),
                    dict(logits_processor=LogitsProcessorList([RowBonus()])),
                    dict(do_sample=True, top_k=0, seed=4)):
        lean, reference, ran = beam_both(model, **inputs, **setting)
        assert ran and torch.equal(lean, reference), setting
    assert kept == []
    beam_both(model, **inputs)
    assert kept  # the same call without them drops sentences


def test_beam_search_float32_padding_user_criteria_and_bfloat16_fallback(tiny_config):
    model = make_model(tiny_config, seed=9)
    batch = padded_batch(16, batch=4)
    attention_mask = batch["attention_mask"].clone()
    attention_mask[2] = 0  # a fully padded source row
    lean, reference, ran = beam_both(model, input_ids=batch["input_ids"], attention_mask=attention_mask,
                                     max_new_tokens=10, num_beams=5)
    assert ran and torch.equal(lean, reference)
    lean, reference, ran = beam_both(model, input_ids=batch["input_ids"], max_new_tokens=20, min_new_tokens=20,
                                     num_beams=3, stopping_criteria=StoppingCriteriaList([StopAfter(6)]))
    assert ran and torch.equal(lean, reference) and lean.shape[1] == 6
    model = model.to(torch.bfloat16)
    lean, reference, ran = beam_both(model, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     max_new_tokens=10, num_beams=4)
    assert not ran and torch.equal(lean, reference)


def test_beam_cross_attention_is_projected_once_per_source(tiny_config):
    """The beams of a source share its cross-attention keys/values: projected and kept once per source (the beams
    attend to them together), equal to projecting every row; the source mask is per source too; rows that are not
    whole groups of repeats are projected one by one."""
    model = make_model(tiny_config, seed=10).double()
    layer = model.model.decoder.layers[1]
    sources = torch.randn(3, 5, tiny_config.d_model, dtype=torch.float64)
    expanded = sources.repeat_interleave(4, 0)
    generation_config = mock.Mock(max_length=6)
    source_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    kwargs = {"encoder_outputs": mock.Mock(last_hidden_state=expanded),
              "attention_mask": source_mask.repeat_interleave(4, 0)}
    heads = layer.encoder_attn.num_heads
    grouped = decoding_vaswani._start(model, generation_config, kwargs, group=4)
    assert grouped.layers[1].group == 4 and grouped.layers[1].cross_keys.shape[0] == 3 * heads
    attended = grouped.cross_mask[:, 0] == 0  # (sources * H, S): the additive mask's zeros
    assert torch.equal(attended, source_mask.bool().repeat_interleave(heads, 0))
    plain = decoding_vaswani._start(model, generation_config, kwargs, group=1)
    assert plain.layers[1].group == 1 and plain.cross_mask.shape[0] == 12 * heads

    def per_row(keys, rows):  # (rows * H, S, D) -> (rows, H, S, D)
        return keys.view(rows, heads, *keys.shape[1:])

    for name in ("cross_keys", "cross_values"):
        torch.testing.assert_close(per_row(getattr(grouped.layers[1], name), 3),
                                   per_row(getattr(plain.layers[1], name), 12)[::4], rtol=1e-12, atol=1e-12)
    shuffled = {**kwargs, "encoder_outputs": mock.Mock(last_hidden_state=expanded.flip(0).roll(1, 0))}
    ungrouped = decoding_vaswani._start(model, generation_config, shuffled, group=4)
    assert ungrouped.layers[1].group == 1  # not repeats: every row projected


def test_beam_calls_it_does_not_serve_fall_back(tiny_config):
    model = make_model(tiny_config, seed=7)
    batch = padded_batch(14)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6,
                  num_beams=3)
    expected = model.generate(**inputs)
    for name, extra in {"return_dict_in_generate": dict(return_dict_in_generate=True, output_scores=True),
                        "use_cache=False": dict(use_cache=False)}.items():
        with mock.patch(LEAN.format("lean_beam_search"), side_effect=AssertionError(name)):
            out = model.generate(**inputs, **extra)
        assert torch.equal(out.sequences if name == "return_dict_in_generate" else out, expected), name
    handle = model.model.decoder.layers[0].ffn.fc1.register_forward_hook(lambda *args: None)  # the module contract
    with mock.patch(LEAN.format("lean_beam_search"), side_effect=AssertionError("a hook")):
        assert torch.equal(model.generate(**inputs), expected)
    handle.remove()
    with mock.patch.object(type(model), "_get_top_k_continuations", None, create=True), \
            mock.patch(LEAN.format("lean_beam_search"), side_effect=AssertionError("helpers")):
        assert "beam-search helpers" in lean_blocker(model, input_ids=batch["input_ids"][:, :1],
                                                     generation_config=model.generation_config, beams=True)


@pytest.mark.parametrize("heads", [2, 4])
def test_query_scale_folded_or_not_gives_transformers_tokens(tiny_config, heads):
    """A power-of-two attention scale (head size 4: 0.5) is folded into the frozen query projections; another one
    (head size 8: 8 ** -0.5) is applied to the scores. Both give the tokens of transformers' loops."""
    tiny_config.encoder_attention_heads = tiny_config.decoder_attention_heads = heads
    model = make_model(tiny_config, seed=13).double()
    batch = padded_batch(17, batch=5)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=10)
    layer = decoding_vaswani._start(model, mock.Mock(max_length=4), {
        "encoder_outputs": mock.Mock(last_hidden_state=torch.randn(5, 9, 16, dtype=torch.float64)),
        "attention_mask": batch["attention_mask"]}).layers[0]
    assert layer.scaling == (1.0 if heads == 4 else 8**-0.5)
    for search in ("lean_sample", "lean_beam_search"):
        extra = {} if search == "lean_sample" else {"num_beams": 3}
        lean, reference, ran = generate_both(model, search, **inputs, **extra)
        assert ran and torch.equal(lean, reference)


class _Recorder(LogitsProcessor):
    """A user's logits processor: records what it is given and pushes token 7 up, so that its effect shows."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores):
        self.seen.append((input_ids.clone(), scores.clone()))
        scores = scores.clone()
        scores[:, 7] += 3.0
        return scores


class _NeedsKeywords(LogitsProcessor):
    def __call__(self, input_ids, scores, cur_len):
        return scores


@pytest.mark.parametrize("lean_function", ["lean_sample", "lean_beam_search"])
def test_the_lean_loops_call_logits_processors_as_transformers_does(tiny_config, lean_function):
    """Without the per-step signature checks of `LogitsProcessorList.__call__`: every processor, in order, with the
    same inputs at every step (a user's one after the built-in min-length one); one that needs keyword arguments
    still gets transformers' own error."""
    model = make_model(tiny_config, seed=8)
    batch = padded_batch(15, batch=3)
    beams = dict(num_beams=3) if lean_function == "lean_beam_search" else {}
    recorders = [_Recorder(), _Recorder()]

    def call(recorder):
        return dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6,
                    min_new_tokens=3, logits_processor=LogitsProcessorList([recorder]), **beams)

    calls = []
    original = getattr(decoding_vaswani, lean_function)
    with mock.patch(LEAN.format(lean_function), lambda *a, **k: calls.append(1) or original(*a, **k)):
        lean = model.generate(**call(recorders[0]))
    model.set_fast_paths({"lean_decoding": False})
    reference = model.generate(**call(recorders[1]))
    assert calls and torch.equal(lean, reference)
    assert len(recorders[0].seen) == len(recorders[1].seen) > 0
    for (ids, scores), (ref_ids, ref_scores) in zip(recorders[0].seen, recorders[1].seen):
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(scores, ref_scores)  # EOS already pushed down by the min-length processor
    with pytest.raises(ValueError, match="required parameters"):
        model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=3,
                       logits_processor=LogitsProcessorList([_NeedsKeywords()]), **beams)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_head_by_head_qkv_projection_is_the_three_projections(tiny_config, dtype):
    """The lean step's q/k/v projection runs with each head's q, k and v side by side, (rows, H, 3, D), the queries
    scaled by a power of two: each of its outputs is the plain projection's, at the same place once the heads are
    regrouped (the lean step reads the query, keys and values as views of it)."""
    model = make_model(tiny_config, seed=12).to(dtype)
    attention = model.model.decoder.layers[0].self_attn
    heads, size = attention.num_heads, attention.head_dim
    with torch.no_grad():  # initialised to zero: a misplaced bias would go unseen
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            projection.bias.normal_()
    x = torch.randn(6, tiny_config.d_model, dtype=dtype)
    frozen = decoding_vaswani._frozen(attention.q_proj, attention.k_proj, attention.v_proj, query_scale=0.25,
                                      heads=heads)
    with torch.no_grad():
        fused = frozen(x).view(6, heads, 3, size)
        plain = [attention.q_proj(x) * 0.25, attention.k_proj(x), attention.v_proj(x)]
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for index, expected in enumerate(plain):
        torch.testing.assert_close(fused[:, :, index], expected.view(6, heads, size), **tolerance)


@pytest.mark.parametrize("kind", ["min_length", "min_new_tokens"])
def test_min_length_in_place_gives_transformers_scores(kind):
    """The in-place min-length processors against transformers' own, below, at and past the minimum, with EOS ids
    outside the vocabulary (which transformers' isin ignores): the same scores, written into the input."""
    eos = [3, 7, -1, 50]
    if kind == "min_length":
        processor = MinLengthLogitsProcessor(5, eos)
    else:
        processor = MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=2, min_new_tokens=3, eos_token_id=eos)
    fast = decoding_vaswani._MinLengthInPlace(processor)
    scores = torch.randn(4, 20)
    for length in range(1, 8):
        input_ids = torch.zeros(4, length, dtype=torch.long)
        expected = processor(input_ids, scores)
        given = scores.clone()
        out = fast(input_ids, given)
        assert out is given and torch.equal(out, expected), length
        assert bool(torch.isinf(expected[:, [3, 7]]).all()) == (length < 5)
        assert not torch.isinf(expected[:, [0, 1, 2, 4, 5, 6] + list(range(8, 20))]).any()


def test_min_length_in_place_only_where_the_scores_are_fresh():
    """A min-length processor is done in place only while no processor but transformers' own has seen the scores: a
    user's processor may keep what it returns (here it does, and what it kept stays as it returned it)."""
    kept = []

    class Keeps(LogitsProcessor):
        def __call__(self, input_ids, scores):
            kept.append(scores)
            return scores

    processors = LogitsProcessorList(
        [MinLengthLogitsProcessor(5, 3), Keeps(), MinNewTokensLengthLogitsProcessor(1, 6, 5)]
    )
    apply = decoding_vaswani._processors(processors)
    assert [type(p) for p in apply.processors] == [decoding_vaswani._MinLengthInPlace, Keeps,
                                                   MinNewTokensLengthLogitsProcessor]
    scores, input_ids = torch.randn(2, 10), torch.zeros(2, 4, dtype=torch.long)  # both minimums not reached
    out = apply(input_ids, scores.clone())
    assert torch.equal(out, processors(input_ids, scores))
    assert torch.isinf(out[:, [3, 5]]).all()
    assert torch.isinf(kept[-1][:, 3]).all() and not torch.isinf(kept[-1][:, 5]).any()  # as Keeps returned it
