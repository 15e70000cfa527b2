"""The model's contracts, each checked against an independent reference (another backend, a float64 formula, a
hand-computed loss, the same computation without cache or without padding)."""

import math
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForSeq2SeqLM, EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import vaswani
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani.modeling_vaswani import flash_cross_attention
from helpers import VOCAB, make_model, padded_batch, rel_err  # noqa: F401

@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("layout", ["sinusoidal_interleaved", "sinusoidal_split"])
def test_eager_and_sdpa_agree_on_padded_batches(tiny_config, normalize_before, layout):
    tiny_config.normalize_before = normalize_before
    tiny_config.position_encoding = layout
    model = make_model(tiny_config, "sdpa")
    for seed in range(3):
        batch = padded_batch(seed)
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            sdpa = model(**batch).logits
            model.set_attn_implementation("eager")
            eager = model(**batch).logits
        real = batch["decoder_attention_mask"].bool()
        assert rel_err(sdpa[real], eager[real]) <= 1e-5


def test_backend_chosen_at_load_and_switchable(tmp_path, tiny_config):
    make_model(tiny_config).save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    assert "attn_implementation" not in (tmp_path / "config.json").read_text()


def test_flash_attention_2_without_package_or_gpu_gives_transformers_error(tiny_config):
    pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine could run flash attention")
    with pytest.raises((ImportError, ValueError), match="(?i)flash"):
        VaswaniForConditionalGeneration._from_config(tiny_config, attn_implementation="flash_attention_2")


def test_flex_attention_forward_matches_eager(tiny_config):
    """flex_attention compiles on first use (tens of seconds on CPU), so one test covers it: agreement with eager on
    a padded batch whose last row is all padding, which must stay finite. (No backward on CPU: GPU only.)"""
    model = make_model(tiny_config, "eager")
    batch = padded_batch(1)
    batch["attention_mask"][3] = 0
    batch["decoder_attention_mask"][3] = 0
    with torch.no_grad():
        eager = model(**batch).logits
        model.set_attn_implementation("flex_attention")
        flex = model(**batch).logits
    assert torch.isfinite(flex).all()
    real = batch["decoder_attention_mask"].bool()
    assert rel_err(flex[real], eager[real]) <= 1e-5


def test_padding_invariance(tiny_config):
    """A sentence alone and inside a padded batch give the same logits at its real positions."""
    for attn in ("eager", "sdpa"):
        model = make_model(tiny_config, attn)
        batch = padded_batch(2)
        with torch.no_grad():
            together = model(**batch).logits
            for row in range(4):
                n_src = int(batch["attention_mask"][row].sum())
                n_tgt = int(batch["decoder_attention_mask"][row].sum())
                alone = model(
                    input_ids=batch["input_ids"][row : row + 1, :n_src],
                    labels=batch["labels"][row : row + 1, :n_tgt],
                ).logits
                assert rel_err(together[row, :n_tgt], alone[0]) <= 1e-5, (attn, row)


def test_decoder_is_causal_and_encoder_is_bidirectional(tiny_config):
    model = make_model(tiny_config, "sdpa")
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, VOCAB, (1, 8), generator=g)
    decoder_input_ids = torch.randint(4, VOCAB, (1, 6), generator=g)
    with torch.no_grad():
        base = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits
        edited = decoder_input_ids.clone()
        edited[0, 3] = (edited[0, 3] + 1 - 4) % (VOCAB - 4) + 4
        changed = model(input_ids=input_ids, decoder_input_ids=edited).logits
        assert torch.equal(base[:, :3], changed[:, :3])  # before t: untouched
        assert not torch.allclose(base[:, 3:], changed[:, 3:])  # from t on: it matters

        encoder = model.get_encoder()
        enc = encoder(input_ids=input_ids).last_hidden_state
        last_edited = input_ids.clone()
        last_edited[0, -1] = (last_edited[0, -1] + 1 - 4) % (VOCAB - 4) + 4
        enc_edited = encoder(input_ids=last_edited).last_hidden_state
        # editing the last source token changes the encoding of the first: the encoder looks both ways
        assert not torch.allclose(enc[0, 0], enc_edited[0, 0])


def test_encoder_masks_padding_without_causal_structure_under_sdpa(tiny_config):
    """No padding means no mask: SDPA would treat a module without is_causal=False as causal."""
    model = make_model(tiny_config, "sdpa")
    input_ids = torch.randint(4, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        sdpa = model.get_encoder()(input_ids=input_ids).last_hidden_state
        model.set_attn_implementation("eager")
        eager = model.get_encoder()(input_ids=input_ids).last_hidden_state
    assert rel_err(sdpa, eager) <= 1e-5


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_incremental_decoding_with_cache_equals_full_forward(tiny_config, attn):
    model = make_model(tiny_config, attn)
    batch = padded_batch(4)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    with torch.no_grad():
        full = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids
        ).logits
        encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=batch["attention_mask"],
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            steps.append(out.logits)
    assert isinstance(cache, EncoderDecoderCache)
    assert cache.self_attention_cache.get_seq_length() == decoder_input_ids.shape[1]
    assert cache.cross_attention_cache.get_seq_length() == batch["input_ids"].shape[1]
    assert rel_err(torch.cat(steps, 1), full) <= 1e-5


def test_cross_attention_keys_computed_once_per_generate(tiny_config):
    """transformers' loop (the lean one projects them once by construction): the cross-attention key projection runs
    on the encoder output once per generate, not at every step."""
    model = make_model(tiny_config)
    model.set_fast_paths({"lean_decoding": False})
    calls = []
    cross = model.model.decoder.layers[0].encoder_attn
    cross.k_proj.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    batch = padded_batch(5)
    model.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5, min_new_tokens=5
    )
    assert calls == [torch.Size([*batch["input_ids"].shape, 16])]


def test_past_key_values_still_accepted(tiny_config):
    model = make_model(tiny_config)
    batch = padded_batch(6)
    dec = torch.full((4, 1), tiny_config.decoder_start_token_id)
    with torch.no_grad():
        first = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=dec,
                      use_cache=True)
        second = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=dec,
                       past_key_values=first.cache, use_cache=True)
    assert second.cache.self_attention_cache.get_seq_length() == 2


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_generation_with_and_without_cache_and_static_cache(tiny_config, attn):
    model = make_model(tiny_config, attn, seed=1)
    batch = padded_batch(7)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=8)
    greedy = model.generate(**inputs, do_sample=False)
    assert torch.equal(greedy, model.generate(**inputs, do_sample=False, use_cache=False))
    assert torch.equal(greedy, model.generate(**inputs, do_sample=False, cache_implementation="static"))
    beam = model.generate(**inputs, num_beams=4, num_return_sequences=2)
    assert torch.equal(beam, model.generate(**inputs, num_beams=4, num_return_sequences=2, use_cache=False))
    torch.manual_seed(3)
    sampled = model.generate(**inputs, do_sample=True, top_k=20)
    torch.manual_seed(3)
    assert torch.equal(sampled, model.generate(**inputs, do_sample=True, top_k=20, use_cache=False))
    assert (greedy[:, 0] == tiny_config.decoder_start_token_id).all()


def test_greedy_generate_equals_hand_written_argmax_loop(tiny_config):
    model = make_model(tiny_config, seed=2)
    batch = padded_batch(8, batch=1)
    generated = model.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6, min_new_tokens=6
    )
    ids = torch.tensor([[tiny_config.decoder_start_token_id]])
    with torch.no_grad():
        for _ in range(6):
            logits = model(input_ids=batch["input_ids"], decoder_input_ids=ids).logits[:, -1]
            logits[:, tiny_config.eos_token_id] = -math.inf  # min_new_tokens
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, ids)


def test_positions_are_not_in_the_state_dict_and_survive_init(tiny_config):
    model = make_model(tiny_config)
    assert not [k for k in model.state_dict() if "position" in k]
    model.init_weights()
    positions = model.model.encoder.embed_positions(torch.arange(3), torch.float64)
    assert positions[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-12)


def test_source_three_times_max_position_embeddings(tiny_config):
    model = make_model(tiny_config)
    long_source = torch.randint(4, VOCAB, (2, 3 * tiny_config.max_position_embeddings))
    with torch.no_grad():
        out = model(input_ids=long_source, decoder_input_ids=torch.full((2, 3), 2))
    assert torch.isfinite(out.logits).all()
    # the positions past the cap are the formula's, not a repeat of earlier ones
    pe = model.model.encoder.embed_positions(torch.arange(96), torch.float32)
    assert not torch.allclose(pe[95], pe[95 - 32])


def test_decoder_positions_continue_from_cache_length(tiny_config):
    model = make_model(tiny_config)
    seen = []
    positions = model.model.decoder.embed_positions
    lookup = positions.range
    positions.range = lambda start, length, *args: seen.append((start, length)) or lookup(start, length, *args)
    model.generate(input_ids=torch.randint(4, VOCAB, (1, 5)), max_new_tokens=3, min_new_tokens=3)
    assert seen == [(0, 1), (1, 1), (2, 1)]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_padded_rows_stay_finite(tiny_config, attn, dtype):
    model = make_model(tiny_config, attn).to(dtype)
    batch = padded_batch(9)
    batch["attention_mask"][1] = 0
    batch["decoder_attention_mask"][2] = 0
    batch["attention_mask"][3] = 0
    batch["decoder_attention_mask"][3] = 0
    with torch.no_grad():
        out = model(**batch)
    assert torch.isfinite(out.logits).all()
    assert torch.isfinite(out.loss)
    # the real rows are untouched by the all-padding ones
    with torch.no_grad():
        alone = model(input_ids=batch["input_ids"][:1], labels=batch["labels"][:1]).logits
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(out.logits[0].float(), alone[0].float()) <= tol


def test_user_4d_mask_passes_through(tiny_config):
    model = make_model(tiny_config, "eager")
    batch = padded_batch(10)
    with torch.no_grad():
        expected = model(**batch).logits
        mask_2d = batch["attention_mask"]
        # an additive 4D encoder mask equal to the padding mask gives the same result
        mask_4d = (1.0 - mask_2d[:, None, None, :].float()) * torch.finfo(torch.float32).min
        mask_4d = mask_4d.expand(-1, 1, mask_2d.shape[1], -1)
        encoder_out = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=mask_4d)
        got = model(encoder_outputs=encoder_out, attention_mask=mask_2d, labels=batch["labels"],
                    decoder_attention_mask=batch["decoder_attention_mask"]).logits
        # and a 4D mask that hides everything but the first token changes the result
        only_first = torch.full_like(mask_4d, torch.finfo(torch.float32).min)
        only_first[..., 0] = 0
        hidden = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=only_first).last_hidden_state
    real = batch["decoder_attention_mask"].bool()
    assert rel_err(got[real], expected[real]) <= 1e-6
    assert not torch.allclose(hidden, encoder_out.last_hidden_state)


def test_flash_cross_attention_packing_matches_padded_attention(monkeypatch):
    """The packing used for flash cross-attention (keys by their own mask, queries whole, separate cumulative
    lengths), evaluated with a plain varlen reference on CPU, equals masked attention."""
    g = torch.Generator().manual_seed(0)
    batch, heads, tq, tk, dim = 3, 2, 4, 6, 8
    q, k, v = (torch.randn(batch, heads, t, dim, generator=g) for t in (tq, tk, tk))
    key_mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] * 4 + [0] * 2]).bool()
    seen = {}

    def varlen_flash(module, query, packed_k, packed_v, attention_mask, **kw):  # a plain varlen kernel on the CPU
        assert attention_mask is None
        seen.update(kw)
        flat_q = query.transpose(1, 2).reshape(-1, heads, dim)  # what the varlen path does with (B, Tq, H, D)
        flat_k, flat_v = packed_k[0].transpose(0, 1), packed_v[0].transpose(0, 1)  # (N, H, D)
        outs = []
        for b in range(batch):
            qs = flat_q[kw["cu_seq_lens_q"][b] : kw["cu_seq_lens_q"][b + 1]]
            ks = flat_k[kw["cu_seq_lens_k"][b] : kw["cu_seq_lens_k"][b + 1]]
            vs = flat_v[kw["cu_seq_lens_k"][b] : kw["cu_seq_lens_k"][b + 1]]
            weights = torch.softmax(torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(dim), -1)
            outs.append(torch.einsum("hqk,khd->qhd", weights, vs))
        return torch.stack(outs), None  # (B, Tq, H, D)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flash_attention_2", varlen_flash)
    module = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    varlen, _ = flash_cross_attention(module, q, k, v, key_mask.long())
    kw = seen
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :]).transpose(1, 2)
    assert kw["max_length_k"] == 6 and kw["max_length_q"] == tq
    assert torch.allclose(varlen, reference, atol=1e-6)


def test_loss_equals_hand_computed_cross_entropy(tiny_config):
    model = make_model(tiny_config)
    batch = padded_batch(11)
    out = model(**batch)
    logits, labels = out.logits.double(), batch["labels"]
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            if labels[b, t] != -100:
                total -= torch.log_softmax(logits[b, t], -1)[labels[b, t]].item()
                count += 1
    assert out.loss.item() == pytest.approx(total / count, rel=1e-5)
    # labels are aligned with the decoder inputs: the loss does not shift them
    decoder_inputs = model.prepare_decoder_input_ids_from_labels(labels)
    assert torch.equal(decoder_inputs[:, 1:][labels[:, :-1] != -100], labels[:, :-1][labels[:, :-1] != -100])
    assert (decoder_inputs[:, 0] == tiny_config.decoder_start_token_id).all()
    assert (decoder_inputs[:, 1:][labels[:, :-1] == -100] == tiny_config.pad_token_id).all()


def test_label_smoothing_value(tiny_config):
    eps = 0.1
    tiny_config.label_smoothing = eps
    model = make_model(tiny_config)
    batch = padded_batch(12)
    out = model(**batch)
    logp = torch.log_softmax(out.logits.double(), -1)
    real = batch["labels"] != -100
    nll = -logp[real].gather(-1, batch["labels"][real][:, None]).squeeze(-1)
    uniform = -logp[real].mean(-1)
    expected = ((1 - eps) * nll + eps * uniform).mean()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_num_items_in_batch_makes_accumulated_loss_a_token_mean(tiny_config):
    """Under Trainer's gradient accumulation, each micro-batch's loss is its sum over all label tokens of the
    accumulated batch: the sum of the micro losses equals the token mean over the whole batch."""
    model = make_model(tiny_config)
    batch = padded_batch(13)
    whole = model(**batch).loss
    n_items = (batch["labels"] != -100).sum()
    parts = [model(**{k: v[i : i + 2] for k, v in batch.items()}, num_items_in_batch=n_items).loss for i in (0, 2)]
    assert sum(parts).item() == pytest.approx(whole.item(), rel=1e-6)


def test_outputs_attentions_hidden_states_and_tuples(tiny_config):
    model = make_model(tiny_config, "eager")
    batch = padded_batch(14)
    out = model(**batch, output_attentions=True, output_hidden_states=True)
    B, S = batch["input_ids"].shape
    T = batch["labels"].shape[1]
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == 2
    assert out.encoder_attentions[0].shape == (B, 4, S, S)
    assert out.decoder_attentions[0].shape == (B, 4, T, T)
    assert out.cross_attentions[0].shape == (B, 4, T, S)
    assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == 3
    # weights are probabilities that respect the masks
    assert torch.allclose(out.cross_attentions[0].sum(-1), torch.ones(B, 4, T), atol=1e-5)
    assert out.cross_attentions[1][1, :, :, batch["attention_mask"][1] == 0].abs().max() == 0
    assert out.decoder_attentions[0][0].triu(1).abs().max() == 0
    assert torch.equal(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)
    as_tuple = model(**batch, return_dict=False)
    assert isinstance(as_tuple, tuple)
    assert torch.equal(as_tuple[0], out.loss) and torch.equal(as_tuple[1], out.logits)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_config):
    tiny_config.dropout = 0.1  # with dropout: the recomputation must replay the same random masks
    batch = padded_batch(15)
    grads = []
    for checkpointing in (False, True):
        model = make_model(tiny_config).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        torch.manual_seed(7)
        model(**batch).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_tied_and_untied_embeddings(tiny_config, tmp_path):
    model = make_model(tiny_config)
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared

    tiny_config.tie_word_embeddings = False
    untied = make_model(tiny_config)
    assert untied.lm_head.weight is not untied.model.shared.weight
    # source and target still share one embedding
    assert untied.model.encoder.embed_tokens.weight is untied.model.shared.weight
    assert untied.model.decoder.embed_tokens.weight is untied.model.shared.weight
    untied.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.lm_head.weight, untied.lm_head.weight)
    assert loaded.model.decoder.embed_tokens.weight is loaded.model.shared.weight


def test_resize_token_embeddings_keeps_the_ties(tiny_config):
    tiny_config.final_logits_bias = True
    model = make_model(tiny_config)
    old = model.model.shared.weight.detach().clone()
    model.resize_token_embeddings(120)
    shared = model.model.shared.weight
    assert shared.shape == (120, 16) and torch.equal(shared[:100], old)
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared
    assert model.config.vocab_size == 120 and model.final_logits_bias.shape == (1, 120)
    out = model(input_ids=torch.tensor([[110, 5]]), decoder_input_ids=torch.tensor([[2, 119]]))
    assert out.logits.shape[-1] == 120


def test_final_logits_bias_is_added_and_saved(tiny_config, tmp_path):
    tiny_config.final_logits_bias = True
    model = make_model(tiny_config)
    batch = padded_batch(16)
    with torch.no_grad():
        before = model(**batch).logits
        model.final_logits_bias.normal_()
        after = model(**batch).logits
    assert torch.allclose(after - before, model.final_logits_bias.expand_as(after), atol=1e-5)
    model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.final_logits_bias, model.final_logits_bias)


def test_save_load_round_trip_exact(tiny_config, tmp_path):
    model = make_model(tiny_config)
    model.save_pretrained(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json"} <= names
    assert {"configuration_vaswani.py", "modeling_vaswani.py", "positions_vaswani.py", "fast_paths_vaswani.py",
            "decoding_vaswani.py", "onednn_vaswani.py", "attention_patterns_vaswani.py", "masks_vaswani.py",
            "caches_vaswani.py"} <= names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pkl"))]
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is VaswaniForConditionalGeneration
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.lm_head.weight is loaded.model.shared.weight
    batch = padded_batch(17)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)


@pytest.mark.parametrize("model_class, key", [(VaswaniForConditionalGeneration, "model.shared.weight"),
                                              (VaswaniModel, "shared.weight")])
def test_checkpoint_without_the_shared_embedding_reports_it_missing(tiny_config, tmp_path, caplog, model_class, key):
    """The embedding is one module under three names: a file without it must say so (loading info and the load
    report), not load silently with a random embedding; a file with only a tied copy loads that copy."""
    import logging

    from safetensors.torch import load_file, save_file

    model_class(tiny_config).save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    embedding = weights.pop(key)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(caplog.handler)
    try:
        loaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    finally:
        transformers_logger.removeHandler(caplog.handler)
    assert key in info["missing_keys"]
    report = "\n".join(r.getMessage() for r in caplog.records if "LOAD REPORT" in r.getMessage())
    assert key in report and "MISSING" in report
    shared = loaded.get_input_embeddings().weight
    assert torch.isfinite(shared).all() and shared.std() > 0  # initialised like any missing weight, and still tied
    base = loaded.model if model_class is VaswaniForConditionalGeneration else loaded
    assert base.encoder.embed_tokens.weight is shared and base.decoder.embed_tokens.weight is shared

    weights[key.replace("shared", "encoder.embed_tokens")] = embedding
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    loaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() and torch.equal(loaded.get_input_embeddings().weight, embedding)


def test_auto_classes(tiny_config):
    base = AutoModel.from_config(tiny_config)
    assert type(base) is VaswaniModel
    lm = AutoModelForSeq2SeqLM.from_config(tiny_config)
    assert type(lm) is VaswaniForConditionalGeneration
    assert vaswani.VaswaniConfig is type(lm.config)


def test_base_model_returns_decoder_hidden_states(tiny_config):
    torch.manual_seed(0)
    base = VaswaniModel(tiny_config).eval()
    lm = make_model(tiny_config)
    lm.model.load_state_dict(base.state_dict())
    batch = padded_batch(18)
    decoder_input_ids = lm.prepare_decoder_input_ids_from_labels(batch["labels"])
    with torch.no_grad():
        hidden = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      decoder_input_ids=decoder_input_ids).last_hidden_state
        logits = lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    decoder_input_ids=decoder_input_ids).logits
    assert torch.allclose(hidden @ lm.lm_head.weight.T, logits, atol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "swish"])
def test_activation_by_name_is_the_one_the_feed_forward_runs(tiny_config, activation):
    """Through the layer's forward: fc2(activation(fc1(x))) with the named function, fast paths on (the default)."""
    tiny_config.activation_function = activation
    model = make_model(tiny_config)
    ffn = model.model.encoder.layers[0].ffn
    x = torch.randn(2, 5, 16)
    function = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "swish": F.silu}[activation]
    with torch.no_grad():
        expected = F.linear(function(F.linear(x, ffn.fc1.weight, ffn.fc1.bias)), ffn.fc2.weight, ffn.fc2.bias)
        assert torch.allclose(ffn(x), expected, atol=1e-5)
        others = [F.relu, F.gelu, F.silu, torch.tanh]
        assert not any(torch.allclose(ffn(x), F.linear(other(F.linear(x, ffn.fc1.weight, ffn.fc1.bias)),
                                                        ffn.fc2.weight, ffn.fc2.bias), atol=1e-5)
                       for other in others if other is not function)


def test_pre_ln_applies_its_final_norms_and_post_ln_has_none(tiny_config):
    """Pre-LN: each stack's output is its final layer norm applied to the last layer's output (checked against the
    norm applied by hand); post-LN stacks have no final norm."""
    assert make_model(tiny_config).model.encoder.layer_norm is None
    tiny_config.normalize_before = True
    model = make_model(tiny_config)
    batch = padded_batch(6)
    for stack in (model.model.encoder, model.model.decoder):
        assert stack.layer_norm is not None
    seen = {}
    for name in ("encoder", "decoder"):
        getattr(model.model, name).layers[-1].register_forward_hook(
            lambda module, args, out, name=name: seen.__setitem__(name, out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    encoder_norm, decoder_norm = model.model.encoder.layer_norm, model.model.decoder.layer_norm
    torch.testing.assert_close(out.encoder_last_hidden_state, encoder_norm(seen["encoder"]))
    decoder_out = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              decoder_input_ids=model.prepare_decoder_input_ids_from_labels(batch["labels"]))
    torch.testing.assert_close(decoder_out.last_hidden_state, decoder_norm(seen["decoder"]))
    assert not torch.allclose(decoder_out.last_hidden_state, seen["decoder"], atol=1e-3)


def test_dropout_is_active_in_training_only(tiny_config):
    tiny_config.dropout = 0.3
    model = make_model(tiny_config)
    batch = padded_batch(19)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, model(**batch).logits)
        model.train()
        assert not torch.equal(model(**batch).logits, model(**batch).logits)


def test_scale_embedding_multiplies_by_sqrt_d_model(tiny_config):
    model = make_model(tiny_config)
    seen = []
    hook = model.model.encoder.layers[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        model.get_encoder()(input_ids=ids)
    hook.remove()
    positions = model.model.encoder.embed_positions(torch.arange(3), torch.float32)
    expected = model.model.shared(ids) * math.sqrt(16) + positions
    assert torch.allclose(seen[0], expected, atol=1e-6)


def test_beam_search_leaves_the_cross_attention_cache_alone(tiny_config):
    """Skipping the cross-attention reorder is exact: compare with a model that reorders everything."""
    model = make_model(tiny_config, seed=4)
    batch = padded_batch(20)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=8,
                  num_beams=4, num_return_sequences=4, output_scores=True, return_dict_in_generate=True)
    ours = model.generate(**inputs)

    def reorder_everything(cache, beam_idx):
        cache.reorder_cache(beam_idx)
        return cache

    model._reorder_cache = reorder_everything
    reference = model.generate(**inputs)
    assert torch.equal(ours.sequences, reference.sequences)
    assert torch.equal(ours.sequences_scores, reference.sequences_scores)


@pytest.mark.parametrize("implementation, calls", [("sdpa", 2 + 2 * 2), ("eager", 0)])
def test_sdpa_is_torchs_kernel_in_every_attention_module(tiny_config, implementation, calls):
    """`sdpa` runs torch's scaled_dot_product_attention in each of the 6 attention modules (2 encoder self-, 2 decoder
    self- and 2 cross-attentions), whatever the length; `eager` never calls it."""
    model = make_model(tiny_config, implementation)
    kernel = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", wraps=kernel) as sdpa, torch.no_grad():
        model(**padded_batch(21))
    assert sdpa.call_count == calls
