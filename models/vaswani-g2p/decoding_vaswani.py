"""The lean decoding loops of the `lean_decoding` fast path: greedy search, sampling and beam search with the tokens
of `GenerationMixin._sample` / `_beam_search`, and less work per step.

Per new token, transformers' loop prepares inputs, rebuilds the decoder's masks, grows every layer's cache with
`torch.cat` and records outputs it was not asked for. For the common call (eval mode, a fresh cache, tokens only)
none of that is needed: this loop keeps each layer's keys and values in one preallocated buffer, projects the encoder
output for cross-attention once, builds the source mask once, freezes the decoder's weights for the call (the
self-attention's three projections as one), and runs each layer on one new position at a time, in the order of the
model's forward. It calls the same `logits_processor` and `stopping_criteria` objects as
transformers' loop, in the same order, so length limits, forced tokens, penalties, EOS handling and sampling (the same
`torch.multinomial` draw) behave exactly as there. Unlike transformers' loop, and like CTranslate2, it stops running
the rows (greedy search) and sentences (beam search) that have finished, where the processors and stopping criteria
allow it (`DROP_FINISHED`).

The loop borrows the model's definitions instead of copying them: each layer's order of sub-layers, residuals and
norms (`VaswaniDecoderLayer.sublayers`), the embedding step (`VaswaniDecoder.embed`), the final norm
(`normalize_output`), the output projection with its bias (`VaswaniForConditionalGeneration.output_logits`) and
the rule for a source row with no real token (masks_vaswani.py). What is its own is the kernels: frozen weights,
one buffer per layer, single-query attention.

What it serves is an allow-list (`SERVED_CONFIG`, `SERVED_MODULES`): these config values, these module types.
`lean_blocker` names the first reason a call is outside it (any other config field or value, module type, backend
or call), and that call goes to transformers' loop; fast_paths_vaswani.py checks the module contract before it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.generation import logits_process
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from .masks_vaswani import additive_key_mask, attention_softmax

# model_kwargs the lean loop understands; any other non-None entry (decoder masks, embeddings, ...) falls back.
_UNDERSTOOD_KWARGS = {"encoder_outputs", "attention_mask", "cache", "use_cache"}
# GenerationMixin's beam-search bookkeeping, reused as is so that every beam setting means what it means there.
_BEAM_HELPERS = ("_flatten_beam_dim", "_unflatten_beam_dim", "_get_top_k_continuations",
                 "_get_running_beams_for_next_iteration", "_update_finished_beams", "_check_early_stop_heuristic",
                 "_beam_search_has_unfinished_sequences")

ANY = None
# Every field VaswaniConfig declares, with the values the lean loop serves (ANY: every value, because the loop reads it
# through the modules it runs, or it changes nothing in eval mode or outside the decoder step). A field missing here
# (a new option) or a value outside its tuple sends the call to transformers' loop.
SERVED_CONFIG = {
    **dict.fromkeys(("vocab_size", "d_model", "decoder_layers", "decoder_attention_heads", "decoder_ffn_dim",
                     "layer_norm_eps", "tie_word_embeddings", "max_position_embeddings", "init_std", "pad_token_id",
                     "bos_token_id", "eos_token_id", "decoder_start_token_id", "use_cache"), ANY),
    **dict.fromkeys(("dropout", "attention_dropout", "activation_dropout", "label_smoothing"), ANY),  # training
    **dict.fromkeys(("encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "encoder_attention_pattern"),
                    ANY),  # the encoder runs in the model's own forward
    **dict.fromkeys(("attention_window", "sparse_block_size", "sparse_global_tokens"), ANY),  # patterns only
    "activation_function": ("relu", "gelu", "gelu_new", "silu", "swish"),
    "normalize_before": (False, True),
    "scale_embedding": (False, True),
    "position_encoding": ("sinusoidal_interleaved", "sinusoidal_split"),
    "final_logits_bias": (False, True),
    "decoder_attention_pattern": ("full",),
    "word_boundary_token_id": (None,),  # the loop places tokens at the cache length
    "word_position_stride": ANY,
    "word_position_shift": ANY,  # training only
    "word_position_period": (None,),  # these two need word_boundary_token_id, which the loop does not serve
    "cross_attention_words": (None,),
}
SERVED_ATTENTION = ("eager", "sdpa")
# The module types the loop runs: the model's own (by name, in its own files, so that a remote-code copy counts) and
# torch's or transformers' (these exact types).
SERVED_MODULES = ("VaswaniDecoder", "VaswaniDecoderLayer", "VaswaniAttention", "VaswaniFeedForward",
                  "SinusoidalPositions")
_OWN_FILES = ("modeling_vaswani", "positions_vaswani")
_SERVED_TYPES = (nn.Linear, nn.LayerNorm, nn.Embedding, nn.ModuleList,
                 *{type(ACT2FN[name]) for name in SERVED_CONFIG["activation_function"]})
_BASE_FIELDS = {field.name for field in dataclasses.fields(PreTrainedConfig)}


def config_blocker(config) -> str | None:
    """The first config field or value outside `SERVED_CONFIG` (or the attention backend outside
    `SERVED_ATTENTION`), or None."""
    for field in dataclasses.fields(config):
        if field.name in _BASE_FIELDS:
            continue
        if field.name not in SERVED_CONFIG:
            return f"the config field {field.name!r}, which the lean loop does not know"
        served, value = SERVED_CONFIG[field.name], getattr(config, field.name)
        if served is not ANY and value not in served:
            return f"{field.name}={value!r}"
    if config._attn_implementation not in SERVED_ATTENTION:
        return f"attn_implementation={config._attn_implementation!r} (the lean loop computes full attention)"
    return None


def module_blocker(model) -> str | None:
    """The first module of the decoder and the output projection whose type is outside `SERVED_MODULES` and
    torch's served types, or None."""
    for module in (*model.get_decoder().modules(), model.get_output_embeddings()):
        kind = type(module)
        own = kind.__name__ in SERVED_MODULES and kind.__module__.rsplit(".", 1)[-1] in _OWN_FILES
        if not own and kind not in _SERVED_TYPES:
            return f"a module the lean loop does not run ({kind.__module__}.{kind.__name__})"
    return None


def lean_blocker(model, input_ids, generation_config, synced_gpus=False, streamer=None, model_kwargs=None,
                 beams: bool = False) -> str | None:
    """Why this `_sample` (or, with `beams`, `_beam_search`) call must use transformers' loop, or None."""
    model_kwargs = model_kwargs or {}
    if beams:
        missing = [name for name in _BEAM_HELPERS if not callable(getattr(model, name, None))]
        if missing:
            return f"this transformers version lacks the beam-search helpers {missing}"
        if generation_config.low_memory:
            return "low_memory"
    if model.training or torch.is_grad_enabled():
        return "the model is in training mode or gradients are enabled"
    reason = config_blocker(model.config) or module_blocker(model)
    if reason:
        return reason
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
    states = getattr(model_kwargs.get("encoder_outputs"), "last_hidden_state", None)
    if states is None or states.device.type != "cpu" or states.dtype not in (torch.float32, torch.float64):
        return "no float32 or float64 encoder output on the CPU"
    if len(set(getattr(model, "hf_device_map", {}).values())) > 1:
        return "the model is split across devices"
    return None


def single_query_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                           additive_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Attention for G new queries per row: query (N, G, D), keys/values (N, S, D) (any row strides), additive_mask
    broadcastable to (N, G, S), or None -> (N, G, D). Batched GEMMs with the scale and the mask folded in."""
    if additive_mask is None:
        scores = torch.bmm(query, keys.transpose(1, 2))
        if scaling != 1:
            scores.mul_(scaling)
    else:
        scores = torch.baddbmm(additive_mask, query, keys.transpose(1, 2), alpha=scaling)
    return torch.bmm(attention_softmax(scores), values)


class _LeanLayer:
    """One decoder layer prepared for one `generate` call: its weights frozen for repeated use (`_FrozenLinear`; the
    self-attention's q/k/v as one projection whose output features run head
    by head, (H, 3, D), so that each of q, k and v is a (rows * H, D) view with no copy), its self-attention keys
    and values in one (rows, H, 2, capacity, D) buffer filled position by position (one copy a step) and doubled when
    full, and its cross-attention keys/values projected once from the encoder output as (sources * H, S, D).

    `group` > 1 (beam search): rows come in groups of `group` beams of one source, and `sources` holds each source
    once; the cross-attention keys/values are projected for the sources only and stay that way: a source's beams
    attend to them together, as `group` queries of one attention row (a source's keys are read once per step, not
    once per beam)."""

    def __init__(self, layer, sources: torch.Tensor, rows: int, capacity: int, linear: Callable = F.linear):
        attention, cross, ffn = layer.self_attn, layer.encoder_attn, layer.ffn
        self.layer = layer  # its `sublayers` is the order of the step
        self.norms = tuple(_layer_norm(norm) for norm in layer.sublayer_norms)
        self.heads, self.head_dim, self.scaling = attention.num_heads, attention.head_dim, attention.scaling
        # A power-of-two scale (head size 4, 16, 64, 256) goes into the query projection: exact, one kernel less.
        query_scale = self.scaling if math.frexp(self.scaling)[0] == 0.5 else 1.0
        self.scaling /= query_scale
        self.qkv = _frozen(attention.q_proj, attention.k_proj, attention.v_proj, query_scale=query_scale,
                           heads=self.heads, linear=linear)
        self.self_out = _frozen(attention.o_proj, linear=linear)
        self.cross_query = _frozen(cross.q_proj, query_scale=query_scale, linear=linear)
        self.cross_out = _frozen(cross.o_proj, linear=linear)
        relu = type(ffn.activation) is torch.nn.ReLU  # then fused into fc1
        self.fc1, self.fc2 = _frozen(ffn.fc1, relu=relu, linear=linear), _frozen(ffn.fc2, linear=linear)
        self.activation = None if relu else ffn.activation
        self.cache = sources.new_empty(rows, self.heads, 2, capacity, self.head_dim)  # keys, values
        n, length = sources.shape[:2]
        keys, values = (linear(sources, p.weight, p.bias) for p in (cross.k_proj, cross.v_proj))
        self.cross_keys, self.cross_values = (
            x.view(n, length, self.heads, self.head_dim).transpose(1, 2).reshape(n * self.heads, length, -1)
            for x in (keys, values)
        )
        self.group = rows // n

    def append(self, keys_and_values: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new position's keys and values (rows, H, 2, D) (any strides); return the keys and the values of
        positions 0..position as (rows * H, position + 1, D) views (no copy)."""
        if position == self.cache.shape[3]:
            self.cache = torch.cat([self.cache, torch.empty_like(self.cache)], dim=3)
        self.cache.select(3, position).copy_(keys_and_values)
        return self.cache[:, :, :, : position + 1].flatten(0, 1).unbind(1)

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor, length: int) -> None:
        """Beam search: positions 0..length-1 of rows[i] become those of row sources[i] (read before any is written).
        Only the rows whose beam changed are given: most beams keep their own history from one step to the next.
        The cross-attention keys/values stay: beams never move across sentences, and a sentence's beams share them."""
        filled = self.cache[:, :, :, :length]
        filled.index_copy_(0, rows, filled.index_select(0, sources))

    def keep(self, rows: torch.Tensor, sources: torch.Tensor, length: int) -> None:
        """Run only these rows from now on: their caches' positions 0..length-1, and the cross-attention keys and
        values of their `sources`, in this order."""
        cache = self.cache.new_empty(rows.shape[0], *self.cache.shape[1:])
        cache[:, :, :, :length] = self.cache[rows, :, :, :length]
        self.cache = cache
        self.cross_keys, self.cross_values = (_keep_heads(x, sources, self.heads)
                                              for x in (self.cross_keys, self.cross_values))

    def step(self, hidden: torch.Tensor, position: int, cross_mask: torch.Tensor | None) -> torch.Tensor:
        """The layer on the newest position of every row, hidden (rows, d_model): the layer's own `sublayers` (its
        order of sub-layers, residuals and norms) over this loop's branches, each residual added in place on the
        branch's fresh output."""
        return self.layer.sublayers(
            hidden,
            lambda x: self.self_out(self._self_attention(x, position)),
            lambda x: self.cross_out(self._cross_attention(x, cross_mask)),
            lambda x: self.fc2(self._inner(x)),
            norms=self.norms,
            add=_add_in_place,
        )

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward's hidden activations (a ReLU rides in fc1's kernel)."""
        inner = self.fc1(x)
        return inner if self.activation is None else self.activation(inner)

    def _self_attention(self, x: torch.Tensor, position: int) -> torch.Tensor:
        rows, heads, size = x.shape[0], self.heads, self.head_dim
        qkv = self.qkv(x).view(rows, heads, 3, size)
        keys, values = self.append(qkv[:, :, 1:], position)
        query = qkv.view(rows * heads, 3, size)[:, :1]  # (rows * H, 1, D), a view
        return single_query_attention(query, keys, values, None, self.scaling).view(rows, -1)  # sees all: no mask

    def _cross_attention(self, x: torch.Tensor, cross_mask: torch.Tensor | None) -> torch.Tensor:
        rows, heads, size, group = x.shape[0], self.heads, self.head_dim, self.group
        if group == 1:
            query = self.cross_query(x).view(rows * heads, 1, size)
            out = single_query_attention(query, self.cross_keys, self.cross_values, cross_mask, self.scaling)
            return out.view(rows, -1)
        # (rows, d_model) -> (sources * H, group, D): the beams of a source are the queries of one attention row
        query = self.cross_query(x).view(-1, group, heads, size).transpose(1, 2).reshape(-1, group, size)
        out = single_query_attention(query, self.cross_keys, self.cross_values, cross_mask, self.scaling)
        return out.view(-1, heads, group, size).transpose(1, 2).reshape(rows, -1)


def _keep_heads(x: torch.Tensor, rows: torch.Tensor, heads: int) -> torch.Tensor:
    """The entries of `rows` of x (rows * heads, ...), whose entries run head by head within a row."""
    return x.view(-1, heads, *x.shape[1:]).index_select(0, rows).flatten(0, 1)


def _add_in_place(residual: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """residual + branch, added in place on the branch (a fresh output nothing else refers to): the same sum."""
    return branch.add_(residual)


def _layer_norm(norm: torch.nn.LayerNorm):
    """`norm`'s forward without the module call (`F.layer_norm`'s own kernel, called directly)."""
    return functools.partial(torch.layer_norm, normalized_shape=norm.normalized_shape, weight=norm.weight,
                             bias=norm.bias, eps=norm.eps)


class _FrozenLinear:
    """A linear layer's weight and bias, as prepared for one `generate` call; `relu`: a ReLU follows, in place;
    `linear`: the function that multiplies (F.linear, or the oneDNN fast path's)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False,
                 linear: Callable = F.linear):
        self.weight, self.bias, self.relu, self.linear = weight, bias, relu, linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x, self.weight, self.bias)
        return out.relu_() if self.relu else out


def _frozen(*projections, relu: bool = False, query_scale: float = 1.0, heads: int = 0,
            linear: Callable = F.linear) -> _FrozenLinear:
    """`projections` (nn.Linear modules of one input) as one frozen linear layer, the first one's outputs multiplied
    by `query_scale` (a power of two: exact). `heads` > 0: the output features run head by head, (heads,
    len(projections), D), instead of projection by projection (a permutation of the weight's rows: every output is the
    same dot product). Kept on the first module between `generate` calls and rebuilt when a parameter changes (an
    in-place update bumps its version counter)."""
    parameters = [p for projection in projections for p in (projection.weight, projection.bias) if p is not None]
    key = (relu, query_scale, heads, linear, *((p.data_ptr(), p._version) for p in parameters))
    cached = projections[0].__dict__.get("_frozen_linear")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            first = projections[0]
            weights = [first.weight * query_scale, *(p.weight for p in projections[1:])]
            biases = [None if first.bias is None else first.bias * query_scale, *(p.bias for p in projections[1:])]
            weight, bias = weights[0], biases[0]
            if len(projections) > 1:
                weight, bias = torch.cat(weights), torch.cat(biases)
            if heads:
                weight = weight.view(len(projections), heads, -1, weight.shape[-1]).transpose(0, 1).reshape_as(weight)
                bias = bias.view(len(projections), heads, -1).transpose(0, 1).reshape_as(bias)
            cached = (key, _FrozenLinear(weight.contiguous(), bias, relu=relu, linear=linear))
        projections[0].__dict__["_frozen_linear"] = cached  # a plain attribute: never saved, loaded or moved
    return cached[1]


class _LeanDecoder:
    """The decoder and the LM head prepared for one `generate` call (see `_LeanLayer`)."""

    def __init__(self, model, sources: torch.Tensor, source_mask: torch.Tensor | None, rows: int, capacity: int,
                 linear: Callable = F.linear):
        self.model, self.decoder = model, model.get_decoder()
        self.layers = [_LeanLayer(layer, sources, rows, capacity, linear) for layer in self.decoder.layers]
        self.lm_head = _frozen(model.get_output_embeddings(), linear=linear)
        self.cross_mask = additive_key_mask(source_mask, model.config.decoder_attention_heads, sources.dtype)
        self.batch_rows = rows
        self.rows = None  # the batch rows it runs, in order, once it no longer runs them all (`keep_rows`)
        self.position = None  # batch row -> its index among `rows` (-1: not run)

    def local(self, rows: torch.Tensor) -> torch.Tensor:
        """The indices among the rows it runs of these batch rows (which it runs)."""
        return rows if self.rows is None else self.position[rows]

    def keep_rows(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """Run only these batch rows (in order, among those it runs) from now on; returns their indices among the
        rows it ran until now."""
        local = self.local(rows)
        self.keep(local, length)
        self.rows = rows
        self.position = torch.full((self.batch_rows,), -1, dtype=rows.dtype, device=rows.device)
        self.position[rows] = torch.arange(rows.shape[0], device=rows.device)
        return local

    def keep(self, rows: torch.Tensor, length: int) -> None:
        """Run only these rows (of those it runs now, in this order) from now on; `length` positions are filled.
        Beam search keeps a source's rows together: all its beams, in order."""
        group = self.layers[0].group
        sources = rows if group == 1 else rows[::group] // group
        for layer in self.layers:
            layer.keep(rows, sources, length)
        if self.cross_mask is not None:
            self.cross_mask = _keep_heads(self.cross_mask, sources, self.model.config.decoder_attention_heads)

    def next_token_logits(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """The decoder and the LM head (with the logits bias) on the newest tokens (B, 1) at `position`: (B, vocab),
        a new tensor nothing else refers to (the model's embedding step, final norm and output projection around
        this loop's layer steps)."""
        hidden = self.decoder.embed(tokens, past_length=position)[:, 0]
        for layer in self.layers:
            hidden = layer.step(hidden, position, self.cross_mask)
        return self.model.output_logits(self.decoder.normalize_output(hidden), self.lm_head, in_place=True)


def _repeats(x: torch.Tensor, group: int) -> bool:
    """Whether the rows of `x` are each row of `x[::group]` repeated `group` times in a row (compared in place)."""
    grouped = x.reshape(x.shape[0] // group, group, *x.shape[1:])
    return torch.equal(grouped, grouped[:, :1].expand_as(grouped))


def _start(model, generation_config, model_kwargs, group: int = 1, linear: Callable = F.linear) -> _LeanDecoder:
    """The decoder prepared for this call (cross-attention keys/values projected once, the source mask built once).
    `group`: beam search's rows repeat each source `group` times in a row (generate's expansion); checked, then each
    source is used once."""
    states = model_kwargs["encoder_outputs"].last_hidden_state
    mask = model_kwargs.get("attention_mask")
    rows = states.shape[0]
    if group > 1 and rows % group == 0 and all(x is None or _repeats(x, group) for x in (states, mask)):
        states = states[::group].contiguous()  # a strided view would make the projection a bmm
        mask = None if mask is None else mask[::group]  # the cross-attention's rows are the sources
    capacity = max(1, generation_config.max_length - 1)  # generate has set max_length; the buffers grow past it
    return _LeanDecoder(model, states, mask, rows, capacity, linear)


def _processors(logits_processor):
    """`logits_processor` as a callable (input_ids, scores) -> scores for the lean loops, which pass no keyword
    arguments and fresh scores (nothing else refers to them): a plain `LogitsProcessorList` of processors that take
    none becomes a loop over them (what its call does then, without inspecting each processor's signature again at
    every step), its min-length processors done in place (`_MinLengthInPlace`) where their input is still fresh
    (before any processor that is not transformers' own, which could keep what it returns); anything else is called
    as it is (a processor that needs keyword arguments raises transformers' own error there)."""
    if type(logits_processor) is not LogitsProcessorList:
        return logits_processor
    if any(len(inspect.signature(processor.__call__).parameters) > 2 for processor in logits_processor):
        return logits_processor
    processors, fresh = [], True  # fresh: the scores reaching this processor are referred to by nothing else
    for processor in logits_processor:
        if fresh and type(processor) in (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor):
            processor = _MinLengthInPlace(processor)
        processors.append(processor)
        # transformers' own processors return new scores, or their input changed in place, and keep no reference
        fresh = type(processor).__module__.startswith(("transformers.generation.", __name__))

    def apply(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for processor in processors:
            scores = processor(input_ids, scores)
        return scores

    apply.processors = processors
    return apply


class _MinLengthInPlace:
    """transformers' `MinLengthLogitsProcessor` or `MinNewTokensLengthLogitsProcessor` (those exact types) for scores
    that nothing else refers to: while the sequences are shorter than the minimum, the EOS scores are set to -inf in
    place with one `index_fill_`, where transformers' own builds the EOS mask, clones the scores and writes them
    again at every step. The same scores: -inf where it writes -inf, the input's values elsewhere."""

    def __init__(self, processor):
        if type(processor) is MinLengthLogitsProcessor:
            self.min_length = processor.min_length
        else:
            self.min_length = processor.prompt_length_to_skip + processor.min_new_tokens
        self.eos = processor.eos_token_id
        self.index = None  # the EOS ids inside the vocabulary (isin ignores the others), on the scores' device

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] < self.min_length:
            if self.index is None:  # one generate call: one vocabulary, one device
                eos = torch.as_tensor(self.eos, device=scores.device).flatten().long()
                self.index = eos[(eos >= 0) & (eos < scores.shape[-1])]
            scores.index_fill_(-1, self.index, -math.inf)
        return scores


# transformers' logits processors whose scores for a row depend on that row's tokens alone (not on its index in the
# batch, nor on other rows): the loops may stop running finished rows under them (see `DROP_FINISHED`).
_ROW_WISE = (_MinLengthInPlace, *(getattr(logits_process, name) for name in (
    "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor", "RepetitionPenaltyLogitsProcessor",
    "NoRepeatNGramLogitsProcessor", "NoBadWordsLogitsProcessor", "SequenceBiasLogitsProcessor",
    "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor", "SuppressTokensLogitsProcessor",
    "SuppressTokensAtBeginLogitsProcessor", "ExponentialDecayLengthPenalty", "InfNanRemoveLogitsProcessor")))


# transformers' stopping criteria that stop a row for its length or the time alone, or at its own EOS: with these, a
# beam search step whose continuations all stop is one where every row reached the length or the time (no sentence
# has only EOS continuations), so the beams of finished sentences cannot change when the loop ends.
_ROW_BLIND_STOPPING = (MaxLengthCriteria, MaxTimeCriteria, EosTokenCriteria)


def _row_wise(processors) -> bool:
    """Whether `processors` (what `_processors` made) is a loop over processors of `_ROW_WISE` types only."""
    return all(type(processor) in _ROW_WISE for processor in getattr(processors, "processors", [None]))


def lean_sample(model, input_ids, logits_processor, stopping_criteria, generation_config, linear=F.linear,
                **model_kwargs):
    """Greedy search or sampling from the decoder start token, as `GenerationMixin._sample` returns it when
    `return_dict_in_generate` is off: the sequences (B, T), start token included. `linear` multiplies the frozen
    weights (F.linear, or the oneDNN fast path's).

    Greedy search stops running finished rows (their tokens are padding from then on), as CTranslate2 does: once
    `DROP_FINISHED` of the rows the decoder runs have finished, it keeps only the others, and the logits
    processors see those rows alone. That needs row-wise processors (`_ROW_WISE`) and an EOS; otherwise, and for
    sampling (whose draws depend on the batch), every row runs to the end, as in transformers' loop."""
    logits_processor = _processors(logits_processor)
    decoder = _start(model, generation_config, model_kwargs, linear=linear)
    pad_token_id = generation_config._pad_token_tensor
    if pad_token_id is not None:
        pad_token_id = pad_token_id.to(input_ids.device)
    has_eos_stopping_criteria = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    drops = not generation_config.do_sample and has_eos_stopping_criteria and _row_wise(logits_processor)
    batch = input_ids.shape[0]
    unfinished_sequences = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
    tokens = input_ids[:, -1:]
    while True:
        logits = decoder.next_token_logits(tokens, input_ids.shape[1] - 1)  # a fresh tensor: no copy needed first
        next_token_scores = logits_processor(input_ids if decoder.rows is None else input_ids[decoder.rows],
                                             logits.float())
        if generation_config.do_sample:
            probs = F.softmax(next_token_scores, dim=-1)
            next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:
            next_tokens = torch.argmax(next_token_scores, dim=-1)
        tokens = next_tokens[:, None]  # what the decoder's rows read next (a finished row's is never used)
        if decoder.rows is not None:
            next_tokens = pad_token_id.expand(batch).index_put((decoder.rows,), next_tokens)
        if has_eos_stopping_criteria:  # finished rows get padding
            next_tokens = torch.where(unfinished_sequences, next_tokens, pad_token_id)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        unfinished_sequences = unfinished_sequences & ~stopping_criteria(input_ids, None)
        running = int(unfinished_sequences.sum())
        if not running:
            return input_ids
        if drops and tokens.shape[0] - running >= DROP_FINISHED * tokens.shape[0]:
            tokens = tokens[decoder.keep_rows(unfinished_sequences.nonzero().squeeze(1), input_ids.shape[1] - 1)]


# Both loops stop running what has finished, as CTranslate2 does, once this share of what the decoder runs has: greedy
# search its finished rows, beam search the beams of its finished sentences. Measured in docs/performance.md.
DROP_FINISHED = 0.125


def _initial_beams(model, input_ids, pad_token_id, eos_token_id, batch_size: int, num_beams: int, max_length: int):
    """The running and finished beams, as transformers' `_beam_search` initialises them."""
    cur_len, device = input_ids.shape[1], input_ids.device
    output_fill_value = (pad_token_id or eos_token_id[0]) if eos_token_id is not None else -1
    running_sequences = torch.full((batch_size, num_beams, max_length), fill_value=output_fill_value,
                                   dtype=torch.int64, device=device)
    running_sequences[:, :, :cur_len] = model._unflatten_beam_dim(input_ids, batch_size, num_beams)
    running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
    running_beam_scores[:, 1:] = -1e9
    beam_scores = torch.full((batch_size, num_beams), fill_value=-1e9, dtype=torch.float, device=device)
    is_sent_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
    is_early_stop_heuristic_unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
    running_beam_indices = torch.full((batch_size, num_beams, max_length - cur_len), fill_value=-1,
                                      dtype=torch.int32, device=device)
    return (running_sequences, running_sequences.detach().clone(), running_beam_scores, beam_scores,
            is_sent_finished, is_early_stop_heuristic_unsatisfied, running_beam_indices,
            running_beam_indices.detach().clone())


def lean_beam_search(model, input_ids, logits_processor, stopping_criteria, generation_config, linear=F.linear,
                     **model_kwargs):
    """Beam search (or beam sampling) from the decoder start token, as `GenerationMixin._beam_search` returns it when
    `return_dict_in_generate` is off: the best `num_return_sequences` sequences per input, start token included.

    Its steps and their order are transformers' own (log-softmax, the logits processors, the top-K continuations,
    the stopping criteria, the running and finished beams, the early-stop heuristic), called through the same
    helper methods; only the decoder step and the cache's reordering (the rows whose beam changed) are ours.

    A sentence is finished when nothing it returns can change any more: its finished hypotheses are full and no
    running beam can beat them (transformers' early-stop heuristic), or, with `early_stopping=True`, they are full.
    Once `DROP_FINISHED` of the sentences the decoder runs are finished, it runs the others only, and the finished
    ones' beams get placeholder scores in the bookkeeping (which still covers the whole batch). That needs row-wise
    processors (`_ROW_WISE`) and transformers' own length, time and EOS criteria (`_ROW_BLIND_STOPPING`); otherwise,
    and for beam sampling, every sentence runs to the end, as in transformers' loop.
    """
    logits_processor = _processors(logits_processor)
    pad_token_id = generation_config._pad_token_tensor
    eos_token_id = generation_config._eos_token_tensor
    do_sample, early_stopping = generation_config.do_sample, generation_config.early_stopping
    length_penalty, max_length = generation_config.length_penalty, generation_config.max_length
    num_beams, num_return_sequences = generation_config.num_beams, generation_config.num_return_sequences

    batch_size_unflattened, cur_len = input_ids.shape[:2]
    batch_size = batch_size_unflattened // num_beams
    decoder_prompt_len = cur_len
    device = input_ids.device
    n_eos_tokens = eos_token_id.shape[0] if eos_token_id is not None else 0
    beams_to_keep = max(2, 1 + n_eos_tokens) * num_beams
    top_num_beam_mask = torch.cat((torch.ones(num_beams, dtype=torch.bool),
                                   torch.zeros(beams_to_keep - num_beams, dtype=torch.bool))).to(device)

    (running_sequences, sequences, running_beam_scores, beam_scores, is_sent_finished,
     is_early_stop_heuristic_unsatisfied, running_beam_indices, beam_indices) = _initial_beams(
        model, input_ids, pad_token_id, eos_token_id, batch_size, num_beams, max_length)

    decoder = _start(model, generation_config, model_kwargs, group=num_beams, linear=linear)
    drops = not do_sample and _row_wise(logits_processor) and all(
        type(criteria) in _ROW_BLIND_STOPPING for criteria in stopping_criteria)
    identity = torch.arange(batch_size * num_beams, device=device)
    while True:
        flat_running_sequences = model._flatten_beam_dim(running_sequences[:, :, :cur_len])
        rows = decoder.rows  # the flat rows (sentence x beam) the decoder runs, once it no longer runs them all
        tokens = flat_running_sequences[:, -1:] if rows is None else flat_running_sequences[rows, -1:]
        logits = decoder.next_token_logits(tokens, cur_len - 1)
        log_probs = F.log_softmax(logits.float(), dim=-1)  # a new tensor: no copy needed first
        if rows is not None:  # the beams of a finished sentence get any scores: nothing it returns can change now
            log_probs = log_probs.new_zeros(decoder.batch_rows, log_probs.shape[1]).index_copy_(0, rows, log_probs)
        log_probs = logits_processor(flat_running_sequences, log_probs)
        log_probs = model._unflatten_beam_dim(log_probs, batch_size, num_beams) + running_beam_scores[:, :, None]
        log_probs = torch.reshape(log_probs, (batch_size, -1))

        topk_log_probs, topk_running_sequences, topk_running_beam_indices = model._get_top_k_continuations(
            accumulated_log_probs=log_probs, running_sequences=running_sequences,
            running_beam_indices=running_beam_indices, cur_len=cur_len, decoder_prompt_len=decoder_prompt_len,
            do_sample=do_sample, beams_to_keep=beams_to_keep, num_beams=num_beams, batch_size=batch_size)
        next_token_hits_stopping_criteria = model._unflatten_beam_dim(
            stopping_criteria(model._flatten_beam_dim(topk_running_sequences[:, :, : cur_len + 1]), None),
            batch_size, beams_to_keep)
        running_sequences, running_beam_scores, running_beam_indices = model._get_running_beams_for_next_iteration(
            topk_log_probs=topk_log_probs, topk_running_sequences=topk_running_sequences,
            topk_running_beam_indices=topk_running_beam_indices,
            next_token_hits_stopping_criteria=next_token_hits_stopping_criteria, num_beams=num_beams)
        sequences, beam_scores, beam_indices, is_sent_finished = model._update_finished_beams(
            sequences=sequences, topk_running_sequences=topk_running_sequences, beam_scores=beam_scores,
            topk_log_probs=topk_log_probs, beam_indices=beam_indices,
            topk_running_beam_indices=topk_running_beam_indices,
            is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
            is_sent_finished=is_sent_finished, next_token_hits_stopping_criteria=next_token_hits_stopping_criteria,
            top_num_beam_mask=top_num_beam_mask, num_beams=num_beams, cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len, length_penalty=length_penalty, early_stopping=early_stopping)

        cur_len += 1
        is_early_stop_heuristic_unsatisfied = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
            running_beam_scores=running_beam_scores, beam_scores=beam_scores, is_sent_finished=is_sent_finished,
            cur_len=cur_len, max_length=max_length, decoder_prompt_len=decoder_prompt_len,
            early_stopping=early_stopping, length_penalty=length_penalty)
        if not model._beam_search_has_unfinished_sequences(is_early_stop_heuristic_unsatisfied, is_sent_finished,
                                                           next_token_hits_stopping_criteria, early_stopping):
            break
        beam_idx = model._flatten_beam_dim(running_beam_indices[..., cur_len - 1 - decoder_prompt_len])
        if drops:
            open_sentences = is_early_stop_heuristic_unsatisfied[:, 0]
            if early_stopping is True:
                open_sentences = open_sentences & ~is_sent_finished.all(1)
            running, present = int(open_sentences.sum()), identity.shape[0] // num_beams
            if present - running >= DROP_FINISHED * present:
                decoder.keep_rows((open_sentences.nonzero() * num_beams + torch.arange(num_beams, device=device))
                                  .flatten(), cur_len - 1)
                identity = torch.arange(decoder.rows.shape[0], device=device)
        if decoder.rows is not None:  # beams never move across sentences: a running sentence's sources are running
            beam_idx = decoder.local(beam_idx[decoder.rows])
        moved = (beam_idx != identity).nonzero().squeeze(1)  # the rows whose history changes
        if moved.numel():
            sources = beam_idx.index_select(0, moved).long()
            for layer in decoder.layers:
                layer.reorder(moved, sources, cur_len - 1)

    sequences = model._flatten_beam_dim(sequences[:, :num_return_sequences, :])
    beam_indices = model._flatten_beam_dim(beam_indices[:, :num_return_sequences, :])
    max_generated_length = ((beam_indices + 1).bool()).sum(dim=1).max()
    return sequences[:, : decoder_prompt_len + max_generated_length]
