"""Long-input attention patterns (modeling/attention_patterns_vaswani.py) against independent references.

- local and block-sparse attention: float64 dense attention over the explicit band / block mask, built here position
  by position (and through transformers' mask functions for the flex block masks);
- linear attention: the formula of Katharopoulos et al. written as a loop over positions, in float64;
- a window or block that covers the whole input gives full attention's result (the model's own full path);
- locality (a token beyond layers x window changes nothing), causality, padding invariance, finite all-padding rows;
- cached decoding: incremental forward == full forward, greedy / beam / sampling with the cache == without it,
  and the caches' sizes (rolling window, running sums).
"""

from types import SimpleNamespace

import pytest
import torch
from helpers import make_model, padded_batch

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.attention_patterns_vaswani import (
    block_sparse_attention,
    linear_attention,
    local_attention,
    pattern_attention,
)
from vaswani.caches_vaswani import BlockSparseLayer, LinearAttentionState, RollingWindowLayer
from vaswani.masks_vaswani import mask_function

PATTERNS = ("local", "block_sparse", "linear")


def _module(causal, implementation="eager", **config):
    config = {"attention_window": 3, "sparse_block_size": 4, "sparse_global_tokens": 0, **config}
    return SimpleNamespace(config=SimpleNamespace(_attn_implementation=implementation, **config), is_causal=causal,
                           training=False, layer_idx=0)


def _qkv(batch=3, heads=2, length=23, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=g, dtype=torch.float64) for _ in range(3)]


def _padding(batch=3, length=23):
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, 17:] = False
    mask[2, 4:] = False
    return mask


def _allowed(pattern, causal, length, padding, window=3, block=4, globals_=0):
    """The pattern as a dense (B, T, T) boolean matrix, position by position, over the real keys; a query with no
    real key among those the pattern lets it see sees all of them (the masks' rule for rows with no real keys)."""
    pattern_keys = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            if causal and j > i:
                continue
            if pattern == "local":
                inside = (i - j < window) if causal else abs(i - j) <= window
            else:
                inside = abs(i // block - j // block) <= 1 or i < globals_ or j < globals_
            pattern_keys[i, j] = inside
    allowed = pattern_keys & padding[:, None, :]
    no_real_key = ~allowed.any(-1, keepdim=True)
    return allowed | (pattern_keys & no_real_key)


def _dense(query, key, value, allowed):
    scores = (query @ key.transpose(-1, -2)) * query.shape[-1] ** -0.5
    weights = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
    return (weights @ value).transpose(1, 2), weights


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 3, 40])
def test_local_attention_equals_dense_band(implementation, causal, window):
    query, key, value = _qkv()
    padding = _padding()
    module = _module(causal, implementation, attention_window=window)
    out, weights = local_attention(module, query, key, value, padding, scaling=8**-0.5, output_attentions=True)
    expected, expected_weights = _dense(query, key, value, _allowed("local", causal, 23, padding, window=window))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    if implementation == "eager":  # the dense weights for plots: zero outside the band
        torch.testing.assert_close(weights, expected_weights, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block,globals_", [(4, 0), (4, 2), (3, 7), (1, 1), (30, 0)])
def test_block_sparse_attention_equals_dense_blocks(implementation, causal, block, globals_):
    query, key, value = _qkv()
    padding = _padding()
    module = _module(causal, implementation, sparse_block_size=block, sparse_global_tokens=globals_)
    out, weights = block_sparse_attention(module, query, key, value, padding, scaling=8**-0.5, output_attentions=True)
    allowed = _allowed("block_sparse", causal, 23, padding, block=block, globals_=globals_)
    expected, expected_weights = _dense(query, key, value, allowed)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    if implementation == "eager":
        torch.testing.assert_close(weights, expected_weights, rtol=1e-12, atol=1e-12)


def test_mask_functions_are_the_patterns():
    """The mask functions (flex attention's block masks) say what the dense references say."""
    padding = torch.ones(1, 23, dtype=torch.bool)
    config = SimpleNamespace(attention_window=3, sparse_block_size=4, sparse_global_tokens=2)
    for pattern in ("local", "block_sparse"):
        for causal in (False, True):
            function = mask_function(config, pattern, causal)
            q, kv = torch.arange(23)[:, None], torch.arange(23)[None, :]
            dense = function(0, 0, q, kv) & ((kv <= q) if causal else True)
            expected = _allowed(pattern, causal, 23, padding, window=3, block=4, globals_=2)[0]
            assert torch.equal(dense, expected), (pattern, causal)


def _linear_reference(query, key, value, padding, causal):
    """out_i = sum_j phi(q_i).phi(k_j) v_j / (sum_j phi(q_i).phi(k_j) + eps), j over real keys (and j <= i); a row
    with no real key sums over all its keys."""
    phi = lambda x: torch.nn.functional.elu(x) + 1  # noqa: E731
    out = torch.zeros_like(query)
    for b in range(query.shape[0]):
        for i in range(query.shape[2]):
            seen = [j for j in range(key.shape[2]) if not causal or j <= i]
            keys = [j for j in seen if padding[b, j]] or seen  # no real key: every key it may see (the masks' rule)
            similarity = torch.stack([(phi(query[b, :, i]) * phi(key[b, :, j])).sum(-1) for j in keys], -1)
            values = value[b][:, keys]  # (H, J, D)
            out[b, :, i] = (similarity[..., None] * values).sum(1) / (similarity.sum(-1, keepdim=True) + 1e-6)
    return out.transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [23, 150])  # 150: over two chunks of the prefix sums
def test_linear_attention_equals_formula(causal, length):
    query, key, value = _qkv(length=length)
    padding = torch.ones(3, length, dtype=torch.bool)
    padding[1, length - 6:] = False
    padding[2, :] = False  # all padding: every key, as if none were padding
    out, _ = linear_attention(_module(causal), query, key, value, padding, scaling=1.0)
    torch.testing.assert_close(out, _linear_reference(query, key, value, padding, causal), rtol=1e-10, atol=1e-12)
    assert torch.isfinite(out).all()


def test_linear_attention_state_continues_the_sums():
    """Feeding the positions in pieces through the running sums gives the outputs of one pass."""
    query, key, value = _qkv(length=70)
    module = _module(True)
    whole, _ = linear_attention(module, query, key, value, None, scaling=1.0)
    state = SimpleNamespace(layers=[LinearAttentionState()])
    pieces = [linear_attention(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, scaling=1.0,
                               cache_layer=state.layers[0])[0] for a, b in ((0, 33), (33, 34), (34, 70))]
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-12, atol=1e-12)
    assert state.layers[0].get_seq_length() == 70 and state.layers[0].sums.shape == (3, 2, 8, 8)


def _config(pattern, **overrides):
    base = dict(dropout=0.0, encoder_attention_pattern=pattern, decoder_attention_pattern=pattern,
                attention_window=2, sparse_block_size=3, sparse_global_tokens=1)
    return VaswaniConfig.from_preset("tiny", **{**base, **overrides})


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("pattern,cover", [("local", dict(attention_window=64)),
                                           ("block_sparse", dict(sparse_block_size=32)),
                                           ("block_sparse", dict(sparse_block_size=2, sparse_global_tokens=64))])
def test_covering_pattern_is_full_attention(attn, pattern, cover):
    """A window or block that covers the whole input gives the full model's logits, within float64 rounding."""
    batch = padded_batch(src_len=13, tgt_len=9)
    full = make_model(VaswaniConfig.from_preset("tiny", dropout=0.0), attn).double()
    patterned = make_model(_config(pattern, **cover), attn).double()
    expected, got = full(**batch).logits, patterned(**batch).logits
    real = batch["decoder_attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-11, atol=1e-11)


def test_local_encoder_sees_no_further_than_layers_times_window():
    """Encoder outputs change only within encoder_layers x attention_window positions of an edited token."""
    config = _config("local", attention_window=2, encoder_layers=2)
    model = make_model(config).double()
    ids = torch.randint(4, 100, (1, 20), generator=torch.Generator().manual_seed(1))
    edited = ids.clone()
    edited[0, 10] = 5 if ids[0, 10] != 5 else 6
    before, after = (model.get_encoder()(input_ids=x).last_hidden_state[0] for x in (ids, edited))
    changed = (before - after).abs().amax(-1) > 1e-12
    assert changed.nonzero().flatten().tolist() == list(range(6, 15))  # 10 +- 2 x 2


@pytest.mark.parametrize("pattern", PATTERNS)
def test_decoder_patterns_are_causal(pattern):
    model = make_model(_config(pattern)).double()
    batch = padded_batch(seed=2, batch=2, src_len=8, tgt_len=10)
    batch["decoder_attention_mask"][:] = 1
    labels = batch.pop("labels").clamp(min=4)
    changed = labels.clone()
    changed[:, 7] = 9
    first, second = (model(**batch, decoder_input_ids=x).logits for x in (labels, changed))
    torch.testing.assert_close(first[:, :7], second[:, :7], rtol=0, atol=0)
    assert not torch.allclose(first[:, 7:], second[:, 7:])


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_padding_invariance_and_finite_rows(attn, pattern):
    """Each sentence of a padded batch gets the logits it gets alone; an all-padding source row stays finite."""
    model = make_model(_config(pattern), attn).double()
    batch = padded_batch(seed=3, batch=4, src_len=11, tgt_len=8)
    logits = model(**batch).logits
    for row in range(4):
        source, target = batch["attention_mask"][row].bool(), batch["decoder_attention_mask"][row].bool()
        alone = model(input_ids=batch["input_ids"][row : row + 1, source],
                      labels=batch["labels"][row : row + 1, target]).logits
        torch.testing.assert_close(logits[row, target], alone[0], rtol=1e-10, atol=1e-10)
    batch["attention_mask"][1] = 0
    assert torch.isfinite(model(**batch).logits).all()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_incremental_decoding_equals_full_forward(pattern):
    """Feeding the target one token at a time through the pattern's cache gives the logits of one full forward."""
    model = make_model(_config(pattern)).double()
    batch = padded_batch(seed=4, batch=2, src_len=9, tgt_len=12)
    batch["decoder_attention_mask"][:] = 1
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch.pop("labels").clamp(min=4))
    full = model(**batch, decoder_input_ids=decoder_input_ids, use_cache=False).logits
    encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    cache, steps = None, []
    for t in range(12):
        out = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"],
                    decoder_input_ids=decoder_input_ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = out.cache
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    layer = cache.self_attention_cache.layers[0]
    if pattern == "local":  # the rolling window: attention_window - 1 positions kept
        assert isinstance(layer, RollingWindowLayer) and layer.keys.shape[2] == 1
    elif pattern == "linear":  # running sums, whatever the length
        assert isinstance(layer, LinearAttentionState) and layer.sums.shape == (2, 4, 4, 4)
    else:  # the global position 0 and the block 9-11 that the next step (position 12) sees
        assert isinstance(layer, BlockSparseLayer) and layer.keys.shape[2] == 4 and layer.get_seq_length() == 12
        assert layer.kept_positions.tolist() == [0, 9, 10, 11]


@pytest.mark.parametrize("pattern", ["local", "block_sparse"])
def test_a_plain_dynamic_cache_gives_the_same_steps(pattern):
    """A caller's own DynamicCache (every key kept) gives the logits of the pattern's cache: a decoding step reads
    its window or blocks out of whatever the cache holds."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    model = make_model(_config(pattern, attention_window=3)).double()
    source = torch.randint(4, 100, (2, 9), generator=torch.Generator().manual_seed(9))
    targets = torch.randint(4, 100, (2, 12), generator=torch.Generator().manual_seed(10))
    encoder_outputs = model.get_encoder()(input_ids=source)
    runs = []
    for cache in (None, EncoderDecoderCache(DynamicCache(), DynamicCache())):
        steps = []
        for t in range(12):
            out = model(encoder_outputs=encoder_outputs, decoder_input_ids=targets[:, t : t + 1], cache=cache,
                        use_cache=True)
            cache = out.cache
            steps.append(out.logits)
        runs.append(torch.cat(steps, 1))
    assert cache.self_attention_cache.layers[0].keys.shape[2] == 12  # the caller's cache kept everything
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("mode", [dict(num_beams=1), dict(num_beams=3, num_return_sequences=2),
                                  dict(do_sample=True, top_k=5)])
def test_generate_with_cache_equals_without(pattern, mode):
    model = make_model(_config(pattern, attention_window=3)).double()
    batch = padded_batch(seed=5, batch=3, src_len=10)
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(0)
        outputs.append(model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      max_new_tokens=12, min_new_tokens=12, use_cache=use_cache, **mode))
    assert outputs[0].shape[1] == 13 and torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("window", [1, 4])
def test_local_decoder_cache_stays_within_the_window(window):
    model = make_model(_config("local", attention_window=window))
    seen = []
    model.register_forward_hook(lambda m, args, out: seen.append(out.cache.self_attention_cache.layers[1].keys.shape[2]))
    model.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=20, min_new_tokens=20)
    assert max(seen) == window - 1 and len(seen) == 20


@pytest.mark.parametrize("block,globals_", [(3, 1), (4, 0), (2, 5)])
def test_block_sparse_decoder_cache_holds_the_globals_and_two_blocks(block, globals_):
    """Constant memory: after every step the cache holds what the next step sees (the globals, the previous block,
    the current one), at most globals + 2 blocks; the tokens equal those of a run whose cache keeps every key."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    model = make_model(_config("block_sparse", sparse_block_size=block, sparse_global_tokens=globals_)).double()
    sizes = []
    hook = model.register_forward_hook(lambda m, args, out: sizes.append(
        (out.cache.self_attention_cache.layers[1].keys.shape[2], out.cache.get_seq_length())))
    source = torch.tensor([[5, 6, 7, 8]])
    tokens = model.generate(input_ids=source, max_new_tokens=30, min_new_tokens=30)
    hook.remove()
    every_key = model.generate(input_ids=source, max_new_tokens=30, min_new_tokens=30,
                               cache=EncoderDecoderCache(DynamicCache(), DynamicCache()))
    assert torch.equal(tokens, every_key)
    for kept, seen in sizes:  # the next step at position `seen` sees [0, min(g, start)) and [start, seen]
        start = 0 if seen < globals_ else max(seen // block - 1, 0) * block
        assert kept == min(globals_, start) + seen - start
    assert max(kept for kept, _ in sizes) <= globals_ + 2 * block and sizes[-1][1] == 30


def test_block_sparse_decoder_cache_refuses_several_tokens_after_dropping_keys():
    model = make_model(_config("block_sparse", sparse_block_size=2, sparse_global_tokens=0)).double()
    encoder_outputs = model.get_encoder()(input_ids=torch.tensor([[5, 6, 7]]))
    first = model(encoder_outputs=encoder_outputs, decoder_input_ids=torch.tensor([[2, 5, 6, 7, 8, 9]]), use_cache=True)
    layer = first.cache.self_attention_cache.layers[0]
    assert layer.kept_positions.tolist() == [4, 5]  # the first forward took every key, then kept the last 2 blocks
    with pytest.raises(ValueError, match="feed one token at a time after the first forward"):
        model(encoder_outputs=encoder_outputs, decoder_input_ids=torch.tensor([[10, 11]]), cache=first.cache,
              use_cache=True)
    with pytest.raises(NotImplementedError, match="pass a DynamicCache"):
        layer.crop(1)


def test_backend_that_cannot_run_a_pattern_names_one_that_can():
    with pytest.raises(ValueError, match=r"flash_attention_2.*cannot run 'block_sparse'.*'eager', 'sdpa', 'flex"):
        pattern_attention("block_sparse", "flash_attention_2")
    with pytest.raises(ValueError, match=r"flex_attention.*cannot run 'linear'.*'eager', 'sdpa'"):
        pattern_attention("linear", "flex_attention")
    assert pattern_attention("local", "flash_attention_2") is not None


def test_four_dimensional_mask_is_refused_by_a_pattern():
    model = make_model(_config("local"))
    with pytest.raises(ValueError, match="padding mask"):
        model(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 1, 3, 3, dtype=torch.bool),
              labels=torch.tensor([[5, 6]]))


def test_static_cache_is_refused_for_a_pattern_decoder():
    model = make_model(_config("local"))
    with pytest.raises(ValueError, match="cache_implementation='static'.*leave cache_implementation unset"):
        model.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=3, cache_implementation="static")


def test_flash_local_bookkeeping(monkeypatch):
    """Local attention under flash attention passes a sliding window that, read as transformers' flash path reads
    it (window_size = (sliding_window - 1) on each side, causal for the decoder), is the pattern; the flash kernel
    is played by dense float64 attention over that window."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    calls = []

    def flash_standin(module, query, key, value, attention_mask, sliding_window=None, **kwargs):
        if sliding_window is None:  # cross-attention: keys packed by their padding (cu_seq_lens_k), full attention
            bounds = kwargs["cu_seq_lens_k"].tolist()
            rows = [_dense(query[b : b + 1], key[:, :, s:e], value[:, :, s:e],
                           torch.ones(1, query.shape[2], e - s, dtype=torch.bool))[0]
                    for b, (s, e) in enumerate(zip(bounds, bounds[1:]))]
            return torch.cat(rows), None
        calls.append((module.is_causal, sliding_window))
        size = sliding_window - 1
        tq, tk = query.shape[2], key.shape[2]
        i, j = torch.arange(tq)[:, None] + tk - tq, torch.arange(tk)[None, :]
        allowed = ((i - j).abs() <= size) & ((j <= i) if module.is_causal else True)
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, :].bool()
        else:
            allowed = allowed[None]
        allowed = allowed | (i == j)  # flash drops padded queries; here they see themselves, so nothing is NaN
        return _dense(query, key, value, allowed)[0], None

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flash_attention_2", flash_standin)
    model = make_model(_config("local", attention_window=2)).double()
    batch = padded_batch(seed=6, src_len=12, tgt_len=9)
    expected = model(**batch).logits
    model.config._attn_implementation = "flash_attention_2"
    got = model(**batch).logits
    real = batch["decoder_attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-11, atol=1e-11)
    assert {(False, 3), (True, 2)} == set(calls)


def test_flex_attention_block_masks_on_cpu():
    """Flex attention over the patterns' block masks gives eager's logits (forward only: flex has no backward on
    the CPU)."""
    batch = padded_batch(seed=7, batch=2, src_len=40, tgt_len=9)
    for pattern in ("local", "block_sparse"):
        model = make_model(_config(pattern, attention_window=5, sparse_block_size=4, sparse_global_tokens=2), "eager")
        with torch.no_grad():
            expected = model(**batch).logits
            model.set_attn_implementation("flex_attention")
            got = model(**batch).logits
        real = batch["decoder_attention_mask"].bool()
        torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_lean_decoding_steps_aside_for_a_pattern_decoder(pattern, monkeypatch):
    import vaswani.decoding_vaswani as decoding

    model = make_model(_config(pattern))
    monkeypatch.setattr(decoding, "lean_sample", lambda *a, **k: pytest.fail("the lean loop ran"))
    with torch.no_grad():
        model.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=4)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_train(pattern):
    """Every parameter of a pattern model gets a finite gradient."""
    model = make_model(_config(pattern)).train()
    model(**padded_batch(seed=8)).loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())


def test_pattern_survives_save_and_remote_code_load(tmp_path):
    model = make_model(_config("linear", encoder_attention_pattern="local", attention_window=3))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "attention_patterns_vaswani.py").exists()
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert (loaded.config.encoder_attention_pattern, loaded.config.decoder_attention_pattern) == ("local", "linear")
    batch = padded_batch()
    torch.testing.assert_close(loaded.eval()(**batch).logits, model(**batch).logits)
