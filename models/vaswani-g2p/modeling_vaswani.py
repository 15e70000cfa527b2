"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Read top to bottom: attention (projections -> a backend from transformers' registry -> output projection), the
position-wise feed-forward, the encoder and decoder layers (residual connection and layer norm around each sub-layer),
the two stacks with their embeddings and sinusoidal positions, the two models, and the generation glue.

This file is the reference. The CPU fast paths of fast_paths_vaswani.py enter at visible lines (`@fast.kernels` on
the forwards, greedy search/sampling and beam search), each only where it gives this file's result.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .attention_patterns_vaswani import pattern_attention
from .caches_vaswani import self_attention_cache
from .configuration_vaswani import VaswaniConfig
from .masks_vaswani import cross_attention_mask, dropout, masked_softmax, read_span, self_attention_mask
from .positions_vaswani import SinusoidalPositions, word_position_ids

logger = logging.get_logger(__name__)


class _ReferenceOnly:
    """Stands in for fast_paths_vaswani.py where it cannot be imported: every fast path steps aside."""

    def __init__(self, error: Exception):
        self.error = error  # why, for whoever asks
        self.applies, self.resolve, self.kernels = (lambda *args, **kwargs: False), (lambda *args: {}), (lambda f: f)


try:  # a checkpoint must load even where its fast-path files cannot be imported (another torch, a missing kernel)
    from .fast_paths_vaswani import fast
except Exception as error:  # noqa: BLE001
    fast = _ReferenceOnly(error)
    logger.warning(f"vaswani: the CPU fast paths could not be imported ({type(error).__name__}: {error}); the model "
                   "runs on its reference path (same results, without the fast paths' speed)")


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: prepend the start token, drop the last label, turn -100 into padding."""
    shifted = labels.new_empty(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scaling + mask) v. q (B, H, Tq, D), k/v (B, H, Tk, D); the mask additive (float) or boolean
    (True = attend), broadcastable to (B, H, Tq, Tk), or None (then causal for a causal module) -> out (B, Tq, H, D),
    weights (B, H, Tq, Tk). The softmax is masks_vaswani.masked_softmax (float32 for half precision; the dtype's
    finite minimum where masked, so a row that may attend to nothing stays finite)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is None and module.is_causal and query.shape[2] > 1:
        attention_mask = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device)
        attention_mask = attention_mask.tril(key.shape[2] - query.shape[2])  # True on and below the diagonal
    weights = masked_softmax(scores, attention_mask, dropout, module.training)
    out = torch.matmul(weights, value)
    return out.transpose(1, 2).contiguous(), weights


def flash_cross_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """Flash cross-attention with padding in the source. transformers' generic path derives the query padding from
    the key mask (right only when queries and keys are one sequence; transformers#35032): here the keys are packed by
    their own (B, S) mask, the queries stay whole, and the kernel gets separate cumulative lengths for the two sides
    (packed k/v (1, H, N, D)). Without padding, the registered flash function as it is."""
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)
    if not (torch.is_tensor(attention_mask) and attention_mask.dim() == 2):
        return attend(module, query, key, value, attention_mask, **kwargs)
    key_mask, batch, query_length = attention_mask.bool(), key.shape[0], query.shape[2]
    lengths = key_mask.sum(-1, dtype=torch.int32)
    keep = key_mask.flatten().nonzero().squeeze(-1)
    packed_key = key.transpose(0, 1).flatten(1, 2)[:, keep].unsqueeze(0)
    packed_value = value.transpose(0, 1).flatten(1, 2)[:, keep].unsqueeze(0)
    cu_seq_lens_k = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    cu_seq_lens_q = torch.arange(0, (batch + 1) * query_length, query_length, dtype=torch.int32, device=key.device)
    varlen = dict(cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k, max_length_q=query_length,
                  max_length_k=int(lengths.max()))
    return attend(module, query, packed_key, packed_value, None, **{**kwargs, **varlen})


def attention_function(module: nn.Module, cross: bool) -> Callable:
    """The one dispatch: the function `module` attends with under the current attention implementation. A long-input
    pattern's own function, flash cross-attention's unpadding, or the registered backend (our eager by default)."""
    implementation = module.config._attn_implementation
    if module.pattern != "full":
        return pattern_attention(module.pattern, implementation)
    if cross and "flash" in implementation:
        return flash_cross_attention
    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)


class VaswaniAttention(nn.Module):
    """Multi-head attention. One class serves encoder self-, decoder self- and cross-attention: the caller passes
    `key_value_states` (the encoder output) for cross-attention. What attends is `attention_function`'s choice (a
    long-input `pattern` has its own functions)."""

    def __init__(self, config: VaswaniConfig, num_heads: int, is_causal: bool = False, layer_idx: int | None = None,
                 pattern: str = "full"):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = is_causal  # SDPA and flash read this when the mask is None; if absent they assume causal
        self.layer_idx = layer_idx
        self.pattern = pattern
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.o_proj = nn.Linear(config.d_model, config.d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, d); key_value_states (B, S, d) for cross-attention -> (B, T, d), weights or None.
        The attention function gets this module's layer of the cache as `cache_layer` (a pattern's state)."""
        is_cross = key_value_states is not None
        layer_cache = cache
        if isinstance(cache, EncoderDecoderCache):
            layer_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache

        query = self._split_heads(self.q_proj(hidden_states))
        if is_cross and cache is not None and cache.is_updated.get(self.layer_idx):
            # cross-attention keys/values depend only on the encoder output: computed once per generate
            key = layer_cache.layers[self.layer_idx].keys
            value = layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross else hidden_states
            key = self._split_heads(self.k_proj(source))
            value = self._split_heads(self.v_proj(source))
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross:
                    cache.is_updated[self.layer_idx] = True

        if is_cross and self.config.cross_attention_words is not None and query.shape[2] == 1 and not kwargs.get(
                "output_attentions"):  # a decoding step under a window of words: only the keys it can read
            span = read_span(attention_mask)
            key, value, attention_mask = key[:, :, span], value[:, :, span], attention_mask[..., span]
        attend = attention_function(self, is_cross)
        dropout = self.config.attention_dropout if self.training else 0.0
        cache_layer = layer_cache.layers[self.layer_idx] if layer_cache is not None and self.layer_idx < len(
            layer_cache.layers) else None
        out, weights = attend(self, query, key, value, attention_mask, scaling=self.scaling, dropout=dropout,
                              cache_layer=cache_layer, **kwargs)
        return self.o_proj(out.reshape(*out.shape[:2], -1)), weights


class VaswaniFeedForward(nn.Module):
    """FFN(x) = fc2(dropout(activation(fc1(x)))), applied to each position separately."""

    def __init__(self, config: VaswaniConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation(self.fc1(hidden_states))
        hidden_states = dropout(hidden_states, self.activation_dropout, self.training)
        return self.fc2(hidden_states)


class _Sublayers:
    """The residual connection around each sub-layer, x + dropout(sublayer(x)), with the layer norm after it (post-LN,
    the paper) or at the start of the branch (pre-LN, `normalize_before`)."""

    def _residual(self, norm: Callable, hidden_states: torch.Tensor, sublayer: Callable,
                  add: Callable | None = None) -> torch.Tensor:
        """`add(residual, branch)` makes the sum: by default `_add`; the decoding loop adds in place on its fresh
        branch output (the same sum, the same rounding)."""
        add = add or self._add
        if self.normalize_before:
            return add(hidden_states, sublayer(norm(hidden_states)))
        return norm(add(hidden_states, sublayer(hidden_states)))

    def _add(self, residual: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return residual + dropout(branch, self.dropout, self.training)


class VaswaniEncoderLayer(_Sublayers, GradientCheckpointingLayer):
    """Self-attention over the source, then the feed-forward."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout
        self.self_attn = VaswaniAttention(config, config.encoder_attention_heads, layer_idx=layer_idx,
                                          pattern=config.encoder_attention_pattern)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VaswaniFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        """hidden_states (B, S, d) -> (B, S, d)."""
        hidden_states = self._residual(
            self.self_attn_layer_norm,
            hidden_states,
            lambda x: self.self_attn(x, attention_mask=attention_mask, **kwargs)[0],
        )
        return self._residual(self.final_layer_norm, hidden_states, self.ffn)


class VaswaniDecoderLayer(_Sublayers, GradientCheckpointingLayer):
    """Causal self-attention over the target, cross-attention over the encoder output, then the feed-forward."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout
        heads = config.decoder_attention_heads
        self.self_attn = VaswaniAttention(config, heads, is_causal=True, layer_idx=layer_idx,
                                          pattern=config.decoder_attention_pattern)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VaswaniAttention(config, heads, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VaswaniFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """hidden_states (B, T, d), encoder_hidden_states (B, S, d) -> (B, T, d)."""
        kwargs.pop("use_cache", None)
        return self.sublayers(
            hidden_states,
            lambda x: self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)[0],
            lambda x: self.encoder_attn(x, attention_mask=encoder_attention_mask,
                                        key_value_states=encoder_hidden_states, cache=cache, **kwargs)[0],
            self.ffn,
        )

    @property
    def sublayer_norms(self) -> tuple[nn.LayerNorm, nn.LayerNorm, nn.LayerNorm]:
        """The norms of the three sub-layers, in their order."""
        return self.self_attn_layer_norm, self.encoder_attn_layer_norm, self.final_layer_norm

    def sublayers(self, hidden_states: torch.Tensor, self_attention: Callable, cross_attention: Callable,
                  feed_forward: Callable, norms: tuple | None = None, add: Callable | None = None) -> torch.Tensor:
        """The layer's order, written once: self-attention, cross-attention, feed-forward, each inside `_residual`.
        The forward gives its modules; the decoding loop gives its own branches (the same weights, frozen), its norms
        (the same modules' functions, `norms`) and an in-place `add`."""
        self_norm, cross_norm, ffn_norm = norms or self.sublayer_norms
        hidden_states = self._residual(self_norm, hidden_states, self_attention, add)
        hidden_states = self._residual(cross_norm, hidden_states, cross_attention, add)
        return self._residual(ffn_norm, hidden_states, feed_forward, add)


class VaswaniPreTrainedModel(PreTrainedModel):
    """Initialisation, backend flags and the fast-path switch shared by the models.

    The models take `fast_paths` (also through `from_pretrained(..., fast_paths=...)`; later `set_fast_paths`):
    True (all, the default unless the environment variable VASWANI_FAST_PATHS says otherwise), False (none), or
    {name: bool} of `fast_paths_vaswani.FAST_PATHS`. The switch belongs to the model (a model and the stacks inside
    it share one; two models never do, even over one config object) and is never saved."""

    config: VaswaniConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]

    def __init__(self, config: VaswaniConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        self.fast_paths_switch = fast.resolve()  # {name: on}; `_share_fast_paths` gives the stacks their model's

    def _share_fast_paths(self, fast_paths: bool | dict | None) -> None:
        """Set this model's switch from `fast_paths` (None: the environment's default) and hand the same dict to the
        models inside it, so that `set_fast_paths` on any of them switches the whole model."""
        switch = fast.resolve(fast_paths)
        for module in self.modules():
            if isinstance(module, VaswaniPreTrainedModel):
                module.fast_paths_switch = switch

    @property
    def fast_paths(self) -> dict[str, bool]:
        """Which fast paths are switched on (each still applies only where its rule holds)."""
        return dict(self.fast_paths_switch)

    def set_fast_paths(self, fast_paths: bool | dict) -> None:
        """Switch the fast paths at run time: True, False, or {name: bool} (names not given keep their setting)."""
        switch = self.fast_paths_switch
        new = fast.resolve(fast_paths, switch)
        switch.clear()
        switch.update(new)

    def mark_tied_weights_as_initialized(self, loading_info):
        # `shared` and encoder/decoder.embed_tokens are one module: the base class marks it loaded through the tied
        # names and drops `shared.weight` from the missing keys, so a checkpoint without any of them would load with
        # a random embedding and no word. Keep such a source missing: it is reported, and initialised like any other.
        ties, missing = self.all_tied_weights_keys, loading_info.missing_keys
        absent = {s for s in ties.values() if s in missing and all(t in missing for t in ties if ties[t] == s)}
        super().mark_tied_weights_as_initialized(loading_info)
        loading_info.missing_keys |= absent

    def _init_weights(self, module: nn.Module):
        """All initialisation: Xavier-uniform projections with zero biases, normal embeddings with std `init_std`
        (default d_model ** -0.5, which `scale_embedding` brings back to unit scale), unit norms. Sinusoidal
        positions are computed, never initialised."""
        std = self.config.init_std if self.config.init_std is not None else self.config.d_model**-0.5
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VaswaniForConditionalGeneration) and module.final_logits_bias is not None:
            init.zeros_(module.final_logits_bias)


class _Stack:
    """What the encoder and decoder stacks do around their layers, written once (the decoding loop calls these too)."""

    def embed(self, input_ids: torch.LongTensor | None, inputs_embeds: torch.Tensor | None = None,
              past_length: int = 0, position_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """The embedding step: token embeddings (x sqrt(d_model) if `scale_embedding`) + the positions, then dropout.
        input_ids (B, T) or inputs_embeds (B, T, d) -> (B, T, d). The positions: `position_ids` (B, T) when given;
        else the word-aligned ones of input_ids when the config sets `word_boundary_token_id`; else `past_length`
        on."""
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds * self.embed_scale
        dtype, device = inputs_embeds.dtype, inputs_embeds.device
        if position_ids is None and self.config.word_boundary_token_id is not None:
            position_ids = self._word_positions(input_ids, past_length)
        if position_ids is not None:
            if self.config.word_position_period is not None:  # word indices modulo the period
                position_ids = position_ids % (self.config.word_position_period * self.config.word_position_stride)
            positions = self.embed_positions(position_ids, dtype)  # from the formula: word positions run far
        else:
            positions = self.embed_positions.range(past_length, inputs_embeds.shape[1], dtype, device)
        return dropout(inputs_embeds + positions, self.config.dropout, self.training)

    def _word_positions(self, input_ids: torch.LongTensor | None, past_length: int) -> torch.LongTensor:
        if input_ids is None:
            raise ValueError("word-aligned positions (word_boundary_token_id) are computed from the token ids; pass "
                             "input_ids rather than inputs_embeds, or the position ids")
        if past_length:
            raise ValueError("word-aligned positions (word_boundary_token_id) after cached tokens depend on the whole "
                             "prefix: pass decoder_position_ids (generate computes them), or feed the prefix "
                             "without a cache")
        return word_position_ids(input_ids, self.config.word_boundary_token_id, self.config.word_position_stride)

    def word_ids(self, input_ids: torch.LongTensor | None, past_length: int,
                 position_ids: torch.LongTensor | None) -> tuple[torch.LongTensor | None, torch.LongTensor | None]:
        """(position ids, word ids) where `cross_attention_words` needs the word index of each token (B, T): its
        word-aligned position (before any period) divided by the stride, the positions computed once and handed on to
        `embed`. Otherwise (position_ids, None)."""
        if self.config.cross_attention_words is None:
            return position_ids, None
        if position_ids is None:
            position_ids = self._word_positions(input_ids, past_length)
        return position_ids, torch.div(position_ids, self.config.word_position_stride, rounding_mode="floor")

    def normalize_output(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The final layer norm of a pre-LN stack (post-LN stacks end on their last layer's norm)."""
        return hidden_states if self.layer_norm is None else self.layer_norm(hidden_states)


@dataclass
class VaswaniEncoderOutput(BaseModelOutput):
    """The encoder's output, with the word index of each source token (B, S) when the config sets
    `cross_attention_words` (the decoder's cross-attention window reads it; generation carries and expands it with the
    hidden states)."""

    word_ids: torch.LongTensor | None = None


class VaswaniEncoder(_Stack, VaswaniPreTrainedModel):
    """The encoder stack: token embedding (x sqrt(d_model) if `scale_embedding`) + positions -> dropout -> layers
    (-> final norm when pre-LN). `embed_tokens` is the model's shared embedding."""

    _can_record_outputs = {"hidden_states": VaswaniEncoderLayer, "attentions": VaswaniAttention}

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(config)
        self.embed_scale = config.d_model**0.5 if config.scale_embedding else 1.0
        self.embed_tokens = embed_tokens or nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = SinusoidalPositions(config.d_model, config.position_encoding)
        self.layers = nn.ModuleList([VaswaniEncoderLayer(config, i) for i in range(config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.post_init()

    @fast.kernels
    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        """input_ids (B, S); attention_mask (B, S) with 1 for real tokens, or a prepared 4D mask; position_ids (B, S):
        the tokens' positions, where they are not 0 .. S-1 (or the config's word-aligned ones)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds to the encoder")
        position_ids, word_ids = self.word_ids(input_ids, 0, position_ids)
        hidden_states = self.embed(input_ids, inputs_embeds, position_ids=position_ids)
        attention_mask = self_attention_mask(self.config, self.config.encoder_attention_pattern, hidden_states,
                                             attention_mask, causal=False)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return VaswaniEncoderOutput(last_hidden_state=self.normalize_output(hidden_states), word_ids=word_ids)


class VaswaniDecoder(_Stack, VaswaniPreTrainedModel):
    """The decoder stack: embeddings + positions (continuing from the cache length) -> layers of causal
    self-attention, cross-attention over the encoder output and FFN (-> final norm when pre-LN)."""

    _can_record_outputs = {
        "hidden_states": VaswaniDecoderLayer,
        "attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(config)
        self.embed_scale = config.d_model**0.5 if config.scale_embedding else 1.0
        self.embed_tokens = embed_tokens or nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = SinusoidalPositions(config.d_model, config.position_encoding)
        self.layers = nn.ModuleList([VaswaniDecoderLayer(config, i) for i in range(config.decoder_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.post_init()

    @fast.kernels
    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        encoder_word_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """input_ids (B, T) decoder inputs (labels shifted right); attention_mask (B, T) target padding, or a
        prepared 4D mask; encoder_hidden_states (B, S, d); encoder_attention_mask (B, S) source padding;
        position_ids (B, T): the inputs' positions, where they are not the cache length on (word-aligned positions
        after cached tokens); encoder_word_ids (B, S): the source's word indices (`VaswaniEncoderOutput.word_ids`), for
        `cross_attention_words`."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of decoder_input_ids or decoder_inputs_embeds to the decoder")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(self_attention_cache(self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        position_ids, word_ids = self.word_ids(input_ids, past_length, position_ids)
        hidden_states = self.embed(input_ids, inputs_embeds, past_length, position_ids)

        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        causal_mask = self_attention_mask(self.config, self.config.decoder_attention_pattern, hidden_states,
                                          attention_mask, causal=True, cache=self_cache)
        encoder_attention_mask = cross_attention_mask(self.config, hidden_states, encoder_attention_mask,
                                                      encoder_hidden_states, word_ids, encoder_word_ids)
        for layer in self.layers:  # encoder_hidden_states positional, for gradient checkpointing
            hidden_states = layer(hidden_states, causal_mask, encoder_hidden_states,
                                  encoder_attention_mask=encoder_attention_mask, cache=cache, **kwargs)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=self.normalize_output(hidden_states),
                                                         cache=cache)


class VaswaniModel(VaswaniPreTrainedModel):
    """Encoder + decoder over one token embedding shared by source and target (the paper's shared vocabulary).
    Returns the decoder's hidden states."""

    _tied_weights_keys = {f"{stack}.embed_tokens.weight": "shared.weight" for stack in ("encoder", "decoder")}

    def __init__(self, config: VaswaniConfig, fast_paths: bool | dict | None = None):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VaswaniEncoder(config, self.shared)
        self.decoder = VaswaniDecoder(config, self.shared)
        self.post_init()
        self._share_fast_paths(fast_paths)

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # Source and target always share the embedding; `tie_word_embeddings` governs only the output projection,
        # so this tie must not depend on it (the base class drops every tie when it is False).
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return dict(self._tied_weights_keys)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding):
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    def _shifted_word_positions(self, input_ids, decoder_input_ids, encoder_outputs):
        """Training with `word_position_shift`: the word-aligned positions of both stacks, each row's moved by the
        same whole number of words, drawn uniformly from 0 .. word_position_shift, so that the positions of words far
        into a long line are trained on short ones (randomized positions, Ruoss et al. 2023)."""
        if input_ids is None or decoder_input_ids is None or encoder_outputs is not None:
            raise ValueError("word_position_shift moves the positions of both stacks, computed from their token ids: "
                             "pass input_ids and decoder_input_ids (or labels) in training, not encoder_outputs or "
                             "embeddings")
        boundary, stride = self.config.word_boundary_token_id, self.config.word_position_stride
        shift = torch.randint(0, self.config.word_position_shift + 1, (input_ids.shape[0], 1), device=input_ids.device)
        return (word_position_ids(input_ids, boundary, stride) + shift * stride,
                word_position_ids(decoder_input_ids, boundary, stride) + shift * stride)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        encoder_position_ids = None
        if self.training and self.config.word_position_shift and self.config.word_boundary_token_id is not None:
            encoder_position_ids, decoder_position_ids = self._shifted_word_positions(
                input_ids, decoder_input_ids, encoder_outputs)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                position_ids=encoder_position_ids, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = VaswaniEncoderOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            cache=cache, inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, position_ids=decoder_position_ids,
            encoder_word_ids=getattr(encoder_outputs, "word_ids", None), **kwargs)
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """VaswaniModel with the output projection to the vocabulary (tied to the shared embedding when
    `tie_word_embeddings`), the loss, and generation (greedy, beam, sampling; dynamic or static cache)."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: VaswaniConfig, fast_paths: bool | dict | None = None):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        else:
            self.final_logits_bias = None
        self.post_init()
        self._share_fast_paths(fast_paths)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear):
        self.lm_head = new_embeddings

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.final_logits_bias is not None:
            old = self.final_logits_bias
            size = embeddings.weight.shape[0]
            new = old.new_zeros(1, size)
            new[:, : min(size, old.shape[1])] = old[:, :size]
            self.final_logits_bias = new
        return embeddings

    @staticmethod
    def _reorder_cache(cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search: reorder the self-attention cache only. Beams never move across sentences, and all beams of a
        sentence hold the same cross-attention keys/values, so reordering those would change nothing."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """transformers' cache, its self-attention part made for the decoder's long-input pattern, if it has one."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        cache, pattern = model_kwargs.get("cache"), self.config.decoder_attention_pattern
        if pattern != "full" and isinstance(cache, EncoderDecoderCache) and not hasattr(cache, "_is_user_defined"):
            self_cache = self_attention_cache(self.config, generation_config.cache_implementation)
            model_kwargs["cache"] = EncoderDecoderCache(self_cache, cache.cross_attention_cache)

    def prepare_inputs_for_generation(self, input_ids, *args, **kwargs):
        """transformers' preparation; with word-aligned positions, also the decoder's position ids, computed from the
        whole prefix generated so far (the base class passes on the last ones)."""
        if self.config.word_boundary_token_id is not None and kwargs.get("decoder_position_ids") is None:
            kwargs["decoder_position_ids"] = word_position_ids(input_ids, self.config.word_boundary_token_id,
                                                               self.config.word_position_stride)
        return super().prepare_inputs_for_generation(input_ids, *args, **kwargs)

    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                streamer=None, **model_kwargs):
        """Greedy search and sampling (`generate` calls this)."""
        if fast.applies("lean_decoding", self, input_ids=input_ids, generation_config=generation_config,
                        synced_gpus=synced_gpus, streamer=streamer, model_kwargs=model_kwargs):
            return fast.sample(self, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs)
        return super()._sample(input_ids, logits_processor, stopping_criteria, generation_config,
                               synced_gpus=synced_gpus, streamer=streamer, **model_kwargs)

    def _beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                     **model_kwargs):
        """Beam search and beam sampling (`generate` calls this)."""
        if fast.applies("lean_decoding", self, input_ids=input_ids, generation_config=generation_config,
                        synced_gpus=synced_gpus, model_kwargs=model_kwargs, beams=True):
            return fast.beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config,
                                    model_kwargs)
        return super()._beam_search(input_ids, logits_processor, stopping_criteria, generation_config,
                                    synced_gpus=synced_gpus, **model_kwargs)

    def output_logits(self, hidden_states: torch.Tensor, lm_head: Callable | None = None,
                      in_place: bool = False) -> torch.Tensor:
        """The output projection to the vocabulary, plus `final_logits_bias` where the model has one. The decoding
        loop gives its frozen copy of `lm_head` and adds the bias in place on the fresh logits (the same rounding)."""
        logits = (lm_head or self.lm_head)(hidden_states)
        if self.final_logits_bias is None:
            return logits
        bias = self.final_logits_bias.to(logits.dtype)
        return logits.add_(bias) if in_place else logits + bias

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        """Token-mean cross-entropy over labels != -100 (labels are aligned with the decoder inputs: no shift), with
        `config.label_smoothing`. Under Trainer with gradient accumulation, `num_items_in_batch` is the number of
        label tokens in the whole accumulated batch: the sum is divided by it instead."""
        total = F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]),
            labels.view(-1).to(logits.device),
            ignore_index=-100,
            label_smoothing=self.config.label_smoothing,
            reduction="sum" if num_items_in_batch is not None else "mean",  # mean: over labels != -100
        )
        if num_items_in_batch is None:
            return total
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    @fast.kernels
    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """labels (B, T): target ids with -100 where ignored; decoder inputs default to labels shifted right."""
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs, cache=cache,
            inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            decoder_position_ids=decoder_position_ids, **kwargs)
        logits = self.output_logits(outputs.last_hidden_state)
        loss = self.compute_loss(logits, labels, num_items_in_batch) if labels is not None else None
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "VaswaniPreTrainedModel",
    "VaswaniEncoder",
    "VaswaniEncoderOutput",
    "VaswaniDecoder",
    "VaswaniModel",
    "VaswaniForConditionalGeneration",
    "shift_tokens_right",
]
