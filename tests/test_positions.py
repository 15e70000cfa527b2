"""Sinusoidal positions (modeling/positions_vaswani.py) against the paper's formula evaluated in float64, and
word-aligned positions against a loop."""

import math

import pytest
import torch
from helpers import make_model, padded_batch

import vaswani
from vaswani.positions_vaswani import SinusoidalPositions, word_position_ids


@pytest.mark.parametrize("layout", ["sinusoidal_interleaved", "sinusoidal_split"])
def test_positions_equal_float64_formula(layout):
    d_model, positions = 32, torch.arange(0, 3000, 7)
    got = SinusoidalPositions(d_model, layout)(positions, torch.float64)
    expected = torch.empty(len(positions), d_model, dtype=torch.float64)
    for row, pos in enumerate(positions.tolist()):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            if layout == "sinusoidal_interleaved":
                expected[row, 2 * i], expected[row, 2 * i + 1] = math.sin(angle), math.cos(angle)
            else:
                expected[row, i], expected[row, d_model // 2 + i] = math.sin(angle), math.cos(angle)
    assert (got - expected).abs().max() < 1e-12
    assert (SinusoidalPositions(d_model, layout)(positions, torch.float32).double() - expected).abs().max() < 1e-6


def test_cached_position_table_equals_the_formula_as_it_grows(tiny_config):
    positions = SinusoidalPositions(16, "sinusoidal_split")
    for start, length in [(0, 3), (60, 10), (1000, 5), (5, 2)]:
        expected = positions(torch.arange(start, start + length), torch.float32)
        assert torch.equal(positions.range(start, length, torch.float32, torch.device("cpu")), expected)
    model = make_model(tiny_config)
    model.init_weights()  # re-initialising the model cannot touch computed positions
    table = model.model.encoder.embed_positions.range(0, 8, torch.float64, torch.device("cpu"))
    assert table[3, 1].item() == pytest.approx(math.cos(3.0), abs=1e-12)


# Word-aligned positions (config.word_boundary_token_id): the position ids against a loop written token by token,
# the model's embedding against the formula at those positions, and decoding with a cache against decoding without.
BOUNDARY = 5


def word_positions_by_loop(row: list[int], boundary: int, stride: int) -> list[int]:
    positions, word, offset = [], 0, 0
    for index, token in enumerate(row):
        if token == boundary and index > 0:
            word, offset = word + 1, 0
        elif token == boundary:  # a line that opens with a boundary: the second word starts at once
            word, offset = 1, 0
        positions.append(word * stride + offset)
        offset += 1
    return positions


def test_word_position_ids_equal_a_loop():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 9, (6, 40), generator=g)  # token 5 is the boundary: about one token in five
    ids[0, 0] = BOUNDARY
    ids[1, 5:7] = BOUNDARY  # an empty word between two boundaries
    got = word_position_ids(ids, BOUNDARY, 16)
    assert got.tolist() == [word_positions_by_loop(row, BOUNDARY, 16) for row in ids.tolist()]
    assert word_position_ids(torch.tensor([[7, 8, 5, 9, 10]]), 5, 64).tolist() == [[0, 1, 64, 65, 66]]
    plain = torch.randint(6, 9, (2, 7), generator=g)  # no boundary: the index in the sequence
    assert torch.equal(word_position_ids(plain, BOUNDARY, 16), torch.arange(7).expand(2, 7))


def word_model(tiny_config, **fields):
    tiny_config.word_boundary_token_id = BOUNDARY
    tiny_config.word_position_stride = 16
    for name, value in fields.items():
        setattr(tiny_config, name, value)
    return make_model(tiny_config)


def test_both_stacks_embed_tokens_at_their_word_positions(tiny_config):
    model = word_model(tiny_config).double()
    ids = torch.tensor([[7, 8, BOUNDARY, 9, 10, BOUNDARY, 11]])
    expected_positions = torch.tensor([word_positions_by_loop(ids[0].tolist(), BOUNDARY, 16)])
    for stack in (model.model.encoder, model.model.decoder):
        expected = stack.embed_tokens(ids) * stack.embed_scale + SinusoidalPositions(
            tiny_config.d_model, tiny_config.position_encoding)(expected_positions, torch.float64)
        assert (stack.embed(ids) - expected).abs().max() < 1e-12
    # without a boundary in the input, the model is the plain one
    plain = make_model(vaswani.VaswaniConfig.from_preset("tiny", dropout=0.0)).double()
    plain.load_state_dict(model.state_dict())
    batch = {k: v for k, v in padded_batch(1).items()}
    for key in ("input_ids", "labels"):
        batch[key] = batch[key].masked_fill(batch[key] == BOUNDARY, 6)
    assert torch.equal(model(**batch).logits, plain(**batch).logits)


def test_one_token_at_a_time_gives_the_logits_of_one_forward(tiny_config):
    model = word_model(tiny_config).double()
    source = torch.tensor([[7, 8, BOUNDARY, 9, 10, BOUNDARY, 11, 3]])
    target = torch.tensor([[2, 12, 13, BOUNDARY, 14, BOUNDARY, 15, 16]])
    whole = model(input_ids=source, decoder_input_ids=target).logits
    encoder_outputs = model.get_encoder()(input_ids=source)
    cache, steps = None, []
    positions = word_position_ids(target, BOUNDARY, 16)
    for t in range(target.shape[1]):
        out = model(encoder_outputs=encoder_outputs, decoder_input_ids=target[:, t:t + 1], cache=cache,
                    use_cache=True, decoder_position_ids=positions[:, t:t + 1])
        cache = out.cache
        steps.append(out.logits)
    assert (torch.cat(steps, 1) - whole).abs().max() < 1e-10
    with pytest.raises(ValueError, match="pass decoder_position_ids"):
        model(encoder_outputs=encoder_outputs, decoder_input_ids=target[:, :1], cache=cache, use_cache=True)


def check_generation_with_and_without_cache(model, how: dict) -> None:
    """`model` (a word model with a final logits bias) generates the same lines with and without a cache, every line
    crossing words, so that the positions were continued from the whole prefix."""
    with torch.no_grad():
        model.final_logits_bias[0, BOUNDARY] = 4.5  # so that generated lines hold many words
    batch = padded_batch(2)
    batch["input_ids"][:, 2::3] = BOUNDARY
    batch["input_ids"] *= batch["attention_mask"]
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(0)
        outputs.append(model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      max_new_tokens=20, use_cache=use_cache, **how))
    assert torch.equal(outputs[0], outputs[1])
    assert (outputs[0] == BOUNDARY).sum(-1).min() >= 2


@pytest.mark.parametrize("how", [dict(do_sample=True, temperature=2.0), dict(num_beams=3)])
def test_generation_with_a_cache_equals_generation_without(tiny_config, how):
    tiny_config.final_logits_bias = True
    check_generation_with_and_without_cache(word_model(tiny_config), how)


def test_word_positions_are_served_by_transformers_loop_and_refused_by_exports(tiny_config):
    from vaswani.decoding_vaswani import config_blocker
    from vaswani.deploy import UnsupportedExport, check_exportable

    model = word_model(tiny_config)
    assert config_blocker(model.config) == f"word_boundary_token_id={BOUNDARY}"
    with pytest.raises(UnsupportedExport, match="word_boundary_token_id=5.*serve this model with PyTorch"):
        check_exportable(model.config, "ONNX")
    with pytest.raises(ValueError, match="word_position_stride=0 must be a positive integer"):
        vaswani.VaswaniConfig.from_preset("tiny", word_position_stride=0)
    with pytest.raises(ValueError, match="word_boundary_token_id=100 is outside the vocabulary"):
        vaswani.VaswaniConfig.from_preset("tiny", word_boundary_token_id=100)


def test_training_shifts_both_stacks_of_each_row_by_one_whole_number_of_words(tiny_config):
    """With word_position_shift, each training row equals the model in eval mode fed both stacks' word positions
    moved by the same k words, k in 0 .. shift; some rows move; eval mode never does."""
    shift = 3
    model = word_model(tiny_config, word_position_shift=shift).double()
    batch = padded_batch(3, batch=8)
    batch["input_ids"][:, 2::3] = BOUNDARY
    batch["input_ids"] *= batch["attention_mask"]
    torch.manual_seed(0)
    trained = model.train()(**batch).logits
    model.eval()
    assert torch.equal(model(**batch).logits, model(**batch).logits)
    decoder_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    moved = []
    for row in range(8):
        one = {k: v[row:row + 1] for k, v in batch.items()}
        found = []
        for k in range(shift + 1):
            encoder_positions = word_position_ids(one["input_ids"], BOUNDARY, 16) + 16 * k
            encoder_outputs = model.get_encoder()(input_ids=one["input_ids"], attention_mask=one["attention_mask"],
                                                  position_ids=encoder_positions)
            logits = model(encoder_outputs=encoder_outputs, attention_mask=one["attention_mask"],
                           decoder_input_ids=decoder_ids[row:row + 1],
                           decoder_attention_mask=one["decoder_attention_mask"],
                           decoder_position_ids=word_position_ids(decoder_ids[row:row + 1], BOUNDARY, 16) + 16 * k
                           ).logits
            if (logits - trained[row:row + 1]).abs().max() < 1e-10:
                found.append(k)
        assert len(found) == 1, (row, found)
        moved.append(found[0])
    assert max(moved) > 0
    with pytest.raises(ValueError, match="word_position_shift moves the positions of both stacks"):
        model.train()(encoder_outputs=model.get_encoder()(input_ids=batch["input_ids"]), labels=batch["labels"])
    with pytest.raises(ValueError, match="word_position_shift=-1 must be 0 or more"):
        vaswani.VaswaniConfig.from_preset("tiny", word_position_shift=-1)
