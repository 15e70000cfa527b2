"""A lean loop for greedy search and sampling: the same tokens as `GenerationMixin._sample`, with less work per step.

Per new token, transformers' loop prepares inputs, rebuilds the decoder's masks, grows every layer's cache with
`torch.cat`, records outputs it was not asked for and updates its kwargs. For the common call (eval mode, SDPA, a
fresh cache, tokens only) none of that is needed: this loop keeps each layer's keys and values in one preallocated
buffer, projects the encoder output for cross-attention once, builds the source mask once, and runs the decoder
layers' own modules (`_residual`, norms, FFN, projections) on one new position at a time. It calls the same
`logits_processor` and `stopping_criteria` objects as transformers' loop, in the same order, so length limits,
`min_new_tokens`, forced tokens, repetition penalties, EOS handling and sampling (the same `torch.multinomial`
draw) behave exactly as there.

`lean_decoding_blocker` names the first reason a call needs transformers' loop instead (eager or flash attention,
training mode, a decoder prompt, a user cache, `return_dict_in_generate`, a streamer, ...); the model then falls
back to it. Setting `model.lean_decoding = False` always takes transformers' loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# model_kwargs the lean loop understands; any other non-None entry (decoder masks, embeddings, ...) falls back.
_UNDERSTOOD_KWARGS = {"encoder_outputs", "attention_mask", "cache", "use_cache"}


def lean_decoding_blocker(model, input_ids, generation_config, synced_gpus, streamer, model_kwargs) -> str | None:
    """Why this `_sample` call must use transformers' loop, or None when the lean loop gives the same result."""
    if not getattr(model, "lean_decoding", True):
        return "model.lean_decoding is False"
    if model.training:
        return "the model is in training mode"
    if model.config._attn_implementation != "sdpa":
        return f"attn_implementation={model.config._attn_implementation!r} (the lean loop runs SDPA)"
    if synced_gpus or streamer is not None:
        return "synced_gpus or a streamer"
    if generation_config.return_dict_in_generate:
        return "return_dict_in_generate"
    if not model_kwargs.get("use_cache", True) or generation_config.cache_implementation is not None:
        return "use_cache=False or a cache_implementation"
    if input_ids.shape[1] != 1:
        return "a decoder prompt (decoder_input_ids longer than the start token)"
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _UNDERSTOOD_KWARGS)
    if extra:
        return f"inputs the lean loop does not take: {extra}"
    cache = model_kwargs.get("cache")
    if cache is not None and (getattr(cache, "_is_user_defined", False) or cache.get_seq_length() > 0):
        return "a cache passed in by the caller"
    encoder_outputs = model_kwargs.get("encoder_outputs")
    if encoder_outputs is None or getattr(encoder_outputs, "last_hidden_state", None) is None:
        return "no encoder output"
    if len(set(getattr(model, "hf_device_map", {}).values())) > 1:
        return "the model is split across devices"
    return None


class _LayerBuffers:
    """One decoder layer's self-attention keys/values, (B, H, capacity, D) each, filled position by position and
    doubled when full; and its cross-attention keys/values, projected once from the encoder output."""

    def __init__(self, layer, encoder_states: torch.Tensor, capacity: int):
        attention = layer.self_attn
        batch = encoder_states.shape[0]
        shape = (batch, attention.num_heads, capacity, attention.head_dim)
        self.keys = encoder_states.new_empty(shape)
        self.values = encoder_states.new_empty(shape)
        cross = layer.encoder_attn
        keys, values = cross._fused_projection(encoder_states, (cross.k_proj, cross.v_proj))
        self.cross_keys, self.cross_values = cross._split_heads(keys), cross._split_heads(values)

    def append(self, keys: torch.Tensor, values: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new position's keys/values; return those of positions 0..position (views, no copy)."""
        if position == self.keys.shape[2]:
            self.keys = torch.cat([self.keys, torch.empty_like(self.keys)], dim=2)
            self.values = torch.cat([self.values, torch.empty_like(self.values)], dim=2)
        self.keys[:, :, position : position + 1] = keys
        self.values[:, :, position : position + 1] = values
        return self.keys[:, :, : position + 1], self.values[:, :, : position + 1]


def _attend(attention, query, keys, values, mask) -> torch.Tensor:
    """SDPA for one new position: query (B, H, 1, D) -> (B, 1, d_model) after the output projection."""
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=attention.scaling)
    return attention.o_proj(out.transpose(1, 2).flatten(-2))


def _decoder_layer_step(layer, hidden: torch.Tensor, buffers: _LayerBuffers, position: int, cross_mask):
    """One decoder layer on the newest position (B, 1, d_model): what `VaswaniDecoderLayer.forward` computes for
    it with a cache, through the layer's own sub-modules."""

    def self_attention(x):
        attention = layer.self_attn
        query, keys, values = map(
            attention._split_heads,
            attention._fused_projection(x, (attention.q_proj, attention.k_proj, attention.v_proj)),
        )
        keys, values = buffers.append(keys, values, position)
        return _attend(attention, query, keys, values, None)  # one query sees every cached position: no mask

    def cross_attention(x):
        attention = layer.encoder_attn
        query = attention._split_heads(attention.q_proj(x))
        return _attend(attention, query, buffers.cross_keys, buffers.cross_values, cross_mask)

    hidden = layer._residual(layer.self_attn_layer_norm, hidden, self_attention)
    hidden = layer._residual(layer.encoder_attn_layer_norm, hidden, cross_attention)
    return layer._residual(layer.final_layer_norm, hidden, layer.ffn)


def _cross_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) source padding (1 = real) -> a boolean SDPA mask (B, 1, 1, S), or None when nothing is padded. A row
    that is all padding attends to every position, as in the model's forward (its outputs are never used)."""
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    keep = keep | ~keep.any(-1, keepdim=True)
    return None if bool(keep.all()) else keep[:, None, None, :]


def lean_sample(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
    """Greedy search or sampling from the decoder start token, as `GenerationMixin._sample` returns it when
    `return_dict_in_generate` is off: the sequences (B, T), start token included."""
    decoder = model.model.decoder
    encoder_states = model_kwargs["encoder_outputs"].last_hidden_state
    cross_mask = _cross_attention_mask(model_kwargs.get("attention_mask"))
    capacity = max(1, generation_config.max_length - 1)  # generate has set max_length; the buffers grow past it
    buffers = [_LayerBuffers(layer, encoder_states, capacity) for layer in decoder.layers]

    pad_token_id = generation_config._pad_token_tensor
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(input_ids.device)
    has_eos_stopping_criteria = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    unfinished_sequences = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    dtype = encoder_states.dtype
    tokens = input_ids[:, -1:]
    while True:
        position = input_ids.shape[1] - 1
        hidden = decoder.embed_tokens(tokens) * decoder.embed_scale
        hidden = hidden + decoder.embed_positions.range(position, 1, dtype, hidden.device)
        for layer, layer_buffers in zip(decoder.layers, buffers):
            hidden = _decoder_layer_step(layer, hidden, layer_buffers, position, cross_mask)
        if decoder.layer_norm is not None:
            hidden = decoder.layer_norm(hidden)
        logits = model.lm_head(hidden[:, -1])
        if model.final_logits_bias is not None:
            logits = logits + model.final_logits_bias.to(logits.dtype)

        next_token_scores = logits_processor(input_ids, logits.to(copy=True, dtype=torch.float32))
        if generation_config.do_sample:
            probs = F.softmax(next_token_scores, dim=-1)
            next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:
            next_tokens = torch.argmax(next_token_scores, dim=-1)
        if has_eos_stopping_criteria:
            next_tokens = next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        unfinished_sequences = unfinished_sequences & ~stopping_criteria(input_ids, None)
        if unfinished_sequences.max() == 0:
            return input_ids
        tokens = next_tokens[:, None]
