"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vaswani import VaswaniConfig
from .decoding_vaswani import lean_beam_blocker, lean_beam_search, lean_decoding_blocker, lean_sample
from .kernels_vaswani import (
    Linear,
    Packing,
    additive_mask,
    cross_entropy,
    headwise_applies,
    headwise_attention,
    keep_fully_padded_rows_finite,
    input_gradient,
    linear,
    packing,
    relu_feed_forward,
    short_attention_applies,
    softmax,
)
from .positions_vaswani import SinusoidalPositions


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: prepend the start token, drop the last label, turn -100 into padding."""
    shifted = labels.new_empty(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


_MASK_LEVELS = 2**16  # the CPU dropout mask compares uniform 16-bit integers: p is resolved to 2**-16


def _dropped_levels(p: float) -> int:
    """How many of the 2**16 equally likely mask values drop an element: the realised drop rate is this / 2**16."""
    return round(p * _MASK_LEVELS)


def _keep_scale(p: float) -> float:
    """1 / the realised keep rate: the kept elements' scale, so that dropout leaves every element's mean unchanged."""
    return _MASK_LEVELS / (_MASK_LEVELS - _dropped_levels(p))


def _keep_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """A Bernoulli mask shaped like `x` that keeps each element with probability 1 - round(p * 2**16) / 2**16, drawn
    from torch's default CPU generator (so `torch.manual_seed`, checkpointed RNG states and activation checkpointing
    replay it).

    `F.dropout` on CPU draws one 32-bit word per element in a serial loop and builds a float mask (about 10 ms for
    a 3072 x 256 activation on this project's first machine); here each 64-bit draw of `random_()` over the full int64
    range (64 uniform bits) serves four elements with 16 bits each, and one comparison makes a one-byte mask: a
    quarter of the generator's work. The drop rate moves from p by at most 2**-17 (7.6e-6; torch's own CPU Bernoulli
    resolves p to 2**-24), and `_keep_scale` uses the realised rate, so the output stays unbiased.
    """
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits uniform
    values = words.view(torch.int16)[:n]  # four uniform integers in [-2**15, 2**15) per draw
    return values.ge(_dropped_levels(p) - _MASK_LEVELS // 2).view(x.shape)


def _fast_dropout_applies(x: torch.Tensor, p: float) -> bool:
    # CUDA's dropout is one fused kernel already, and a compiled graph brings its own random numbers. Rates below
    # 2**-8 (or above 1 - 2**-8) keep F.dropout, where 2**-16 steps would be more than 0.2 % of p (or of 1 - p).
    return x.device.type == "cpu" and 2**-8 <= p <= 1 - 2**-8 and not torch.compiler.is_compiling()


class _MaskedResidual(torch.autograd.Function):
    """`residual + branch * keep * scale` with a boolean `keep` mask, saved for backward as it is (one byte an
    element). torch's elementwise kernels are slow on bool operands (multiplying by a bool mask took 40x the time of
    multiplying by a float one, measured); a bool viewed as uint8 converts to a float mask in one fast pass, so the
    mask is converted that way, forward and backward, and never kept as floats."""

    @staticmethod
    def forward(ctx, residual: torch.Tensor | None, branch: torch.Tensor, keep: torch.Tensor, scale: float):
        ctx.save_for_backward(keep)
        ctx.scale, ctx.has_residual = scale, residual is not None
        masked = branch.mul(keep.view(torch.uint8).to(branch.dtype))
        return masked.mul_(scale) if residual is None else residual.add(masked, alpha=scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        (keep,) = ctx.saved_tensors
        grad_branch = grad_output.mul(keep.view(torch.uint8).to(grad_output.dtype)).mul_(ctx.scale)
        return (grad_output if ctx.has_residual else None), grad_branch, None, None


def _plain_layer(module: nn.Module) -> bool:
    """Whether `module` is a linear layer whose call is `linear(x, weight, bias)` and nothing else (no hooks), so
    that calling `linear` with more fused into it skips nothing."""
    return type(module) in (Linear, nn.Linear) and not (module._forward_hooks or module._forward_pre_hooks)


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with its mask drawn by `_keep_mask` on CPU. F.dropout with p=0 still runs a
    kernel in training mode; skipping it is free speed."""
    if not training or p == 0:
        return x
    if not _fast_dropout_applies(x, p):
        return F.dropout(x, p=p, training=True)
    return _MaskedResidual.apply(None, x, _keep_mask(x, p), _keep_scale(p))


def _add_dropout(residual: torch.Tensor, branch: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`residual + dropout(branch)`; on CPU the scaling rides on the addition (`add(..., alpha=)`), so dropout
    costs its mask and one multiplication, forward and backward."""
    if not training or p == 0:
        return residual + branch
    if not _fast_dropout_applies(branch, p):
        return residual + F.dropout(branch, p=p, training=True)
    return _MaskedResidual.apply(residual, branch, _keep_mask(branch, p), _keep_scale(p))


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
    """q (B, H, Tq, D), k/v (B, H, Tk, D); the mask additive (float) or as SDPA takes it (bool, True = attend),
    broadcast to (B, H, Tq, Tk), or None: causal when the module is and there is more than one query -> out
    (B, Tq, H, D), weights (B, H, Tq, Tk). The softmax runs in float32 for half-precision inputs. A row that may attend
    to nothing gets uniform weights (finite), not NaN. Without a graph, on CPU, views of the projections' output run
    head by head (`headwise_attention`: no copies into head-major memory)."""
    if attention_mask is None and module.is_causal and query.shape[2] > 1:
        # No mask was built (nothing padded): the causal structure must still hold. Added as floats (0 or the
        # minimum): torch's elementwise kernels are far slower with a bool mask operand.
        future = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device)
        attention_mask = additive_mask(future.triu(key.shape[2] - query.shape[2] + 1), query.dtype)
    if not (module.training and dropout) and headwise_applies(query, key, value):
        mask = attention_mask
        if mask is not None:
            mask = additive_mask(~mask, query.dtype) if mask.dtype == torch.bool else mask.to(query.dtype)
        return headwise_attention(query, key, value, mask, scaling)
    scores = torch.matmul(query, key.transpose(2, 3)).mul_(scaling)  # in place: the product's backward needs no output
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores.add_(attention_mask) if attention_mask.dtype == scores.dtype else scores + attention_mask
    full_precision = scores.dtype in (torch.float32, torch.float64)
    weights = softmax(scores if full_precision else scores.float()).to(query.dtype)
    weights = _dropout(weights, dropout, module.training)
    out = torch.matmul(weights, value)
    return out.transpose(1, 2).contiguous(), weights


def _sdpa_by_matmuls(*args, **kwargs) -> tuple[torch.Tensor, None]:
    """What `sdpa_attention_forward` computes (bool masks, None meaning causal for causal modules), through
    `eager_attention_forward`, without returning the weights, as SDPA does not."""
    return eager_attention_forward(*args, **kwargs)[0], None


class _FusedLinear(torch.autograd.Function):
    """`x @ cat(weights).T + cat(biases)` as one GEMM that saves for backward only `x` and the parameters themselves.

    Through autograd, `F.linear(x, torch.cat(weights), ...)` would keep the concatenated weight alive until backward:
    a weight-sized copy per attention module, activation memory that separate projections do not use. Here the
    concatenation is rebuilt in backward instead (a small copy next to the GEMMs). Under autocast the GEMMs run in
    the dtype of the incoming gradient, as autocast's own linear does; gradients come back in each input's dtype.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, *weights_and_biases: torch.Tensor) -> torch.Tensor:
        n = len(weights_and_biases) // 2
        weights, biases = weights_and_biases[:n], weights_and_biases[n:]
        ctx.save_for_backward(x, *weights)
        ctx.sizes = [w.shape[0] for w in weights]
        ctx.bias_dtypes = [b.dtype for b in biases]
        return linear(x, torch.cat(weights), torch.cat(biases))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        x, *weights = ctx.saved_tensors
        dtype = grad_output.dtype
        n = len(weights)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = input_gradient(grad_output, torch.cat(weights).to(dtype)).to(x.dtype)
        flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
        grad_weights = grad_biases = [None] * n
        if any(ctx.needs_input_grad[1 : 1 + n]):
            grad_weight = flat_grad.t() @ x.reshape(-1, x.shape[-1]).to(dtype)
            grad_weights = [g.to(w.dtype) for g, w in zip(grad_weight.split(ctx.sizes), weights)]
        if any(ctx.needs_input_grad[1 + n :]):
            grad_biases = [g.to(d) for g, d in zip(flat_grad.sum(0).split(ctx.sizes), ctx.bias_dtypes)]
        return grad_x, *grad_weights, *grad_biases


def _unpad_keys_for_flash(key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor, query_length: int):
    """
    Flash cross-attention with padding in the source: transformers' generic path derives the query padding from the
    key mask (right only when queries and keys are the same sequence; transformers#35032). Here the keys are packed by
    their own mask, the queries are left whole (padded queries are masked downstream), and the flash kernel gets
    separate cumulative lengths for the two sides. Returns packed k/v as (1, H, N, D) and the varlen kwargs.
    """
    batch = key.shape[0]
    lengths = key_mask.sum(-1, dtype=torch.int32)
    keep = key_mask.flatten().nonzero().squeeze(-1)
    packed_key = key.transpose(0, 1).flatten(1, 2)[:, keep].unsqueeze(0)  # (1, H, N, D)
    packed_value = value.transpose(0, 1).flatten(1, 2)[:, keep].unsqueeze(0)
    cu_seq_lens_k = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    cu_seq_lens_q = torch.arange(0, (batch + 1) * query_length, query_length, dtype=torch.int32, device=key.device)
    kwargs = dict(
        cu_seq_lens_q=cu_seq_lens_q,
        cu_seq_lens_k=cu_seq_lens_k,
        max_length_q=query_length,
        max_length_k=int(lengths.max()),
    )
    return packed_key, packed_value, kwargs


class VaswaniAttention(nn.Module):
    """
    Multi-head attention. One class serves encoder self-, decoder self- and cross-attention: the caller passes
    `key_value_states` (the encoder output) for cross-attention. Projections -> backend function -> output projection.
    """

    def __init__(self, config: VaswaniConfig, num_heads: int, is_causal: bool = False, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        # SDPA and flash read this when the mask is None; if it were absent they would assume causal.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.q_proj = Linear(config.d_model, config.d_model)
        self.k_proj = Linear(config.d_model, config.d_model)
        self.v_proj = Linear(config.d_model, config.d_model)
        self.o_proj = Linear(config.d_model, config.d_model)
        self._fused_cache: dict = {}  # not state: rebuilt from the parameters when they change

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def _fused_output(self, x: torch.Tensor, projections: tuple[nn.Linear, ...]) -> torch.Tensor:
        """Several projections of the same input as one GEMM, side by side in its output (..., sum of their sizes).
        The parameters stay separate (checkpoints, the Marian converter). While training, `_FusedLinear`
        concatenates them per call and saves no copy for backward; otherwise the concatenation is cached, keyed by
        the parameters' version counters, which every in-place update bumps."""
        weights = [p.weight for p in projections]
        biases = [p.bias for p in projections]
        if torch.is_grad_enabled() and any(w.requires_grad for w in weights):
            return _FusedLinear.apply(x, *weights, *biases)
        key = tuple((t.data_ptr(), t._version) for t in (*weights, *biases))
        cached = self._fused_cache.get(len(projections))
        if cached is None or cached[0] != key:
            with torch.no_grad():
                cached = (key, torch.cat(weights), torch.cat(biases))
            self._fused_cache[len(projections)] = cached
        return linear(x, cached[1], cached[2])

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        packing: Packing | None = None,
        source_packing: Packing | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, d), or with `packing` only the batch's real tokens (N, d): the projections run on them
        and the backend sees them unpacked (zeros at the padding), the output is packed again. `source_packing`: the
        real tokens of `key_value_states` (B, S, d), which alone go through the key/value projection."""
        is_cross = key_value_states is not None
        layer_cache = cache
        if isinstance(cache, EncoderDecoderCache):
            layer_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
        unpack = packing.unpack if packing is not None else (lambda x: x)

        if not is_cross:  # one unpacking of the three projections side by side
            projected = unpack(self._fused_output(hidden_states, (self.q_proj, self.k_proj, self.v_proj)))
            query, key, value = map(self._split_heads, projected.chunk(3, dim=-1))
        else:
            query = self._split_heads(unpack(self.q_proj(hidden_states)))
        if is_cross and cache is not None and cache.is_updated.get(self.layer_idx):
            # Cross-attention keys/values depend only on the encoder output: computed once per generate.
            key = layer_cache.layers[self.layer_idx].keys
            value = layer_cache.layers[self.layer_idx].values
        else:
            if is_cross:
                key, value = map(self._split_heads, self._source_projection(key_value_states, source_packing))
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross:
                    cache.is_updated[self.layer_idx] = True

        implementation = self.config._attn_implementation
        if is_cross and "flash" in implementation and torch.is_tensor(attention_mask) and attention_mask.dim() == 2:
            key, value, varlen_kwargs = _unpad_keys_for_flash(key, value, attention_mask.bool(), query.shape[2])
            kwargs = {**kwargs, **varlen_kwargs}
            attention_mask = None

        attend: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        if implementation == "sdpa" and short_attention_applies(query, key):
            attend = _sdpa_by_matmuls  # SDPA's result; its CPU kernel costs 1.4-2.5x more at these lengths
        out, weights = attend(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.config.attention_dropout if self.training else 0.0,
            **kwargs,
        )
        out = out.reshape(*out.shape[:2], -1)  # (B, T, d)
        return self.o_proj(out if packing is None else packing.pack(out)), weights

    def _source_projection(self, states: torch.Tensor, source_packing: Packing | None) -> tuple[torch.Tensor, ...]:
        """Cross-attention keys and values of the encoder output (B, S, d), projected for its real tokens only when
        `source_packing` is given (zeros at the padding, which the mask hides)."""
        if source_packing is None:
            return self._fused_output(states, (self.k_proj, self.v_proj)).chunk(2, dim=-1)
        packed = self._fused_output(source_packing.pack(states), (self.k_proj, self.v_proj))
        return source_packing.unpack(packed).chunk(2, dim=-1)


class VaswaniFeedForward(nn.Module):
    def __init__(self, config: VaswaniConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = Linear(config.d_model, ffn_dim)
        self.fc2 = Linear(ffn_dim, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if type(self.activation) is nn.ReLU and _plain_layer(self.fc1):  # the ReLU inside fc1's kernel
            if _plain_layer(self.fc2) and not (self.training and self.activation_dropout):
                return relu_feed_forward(hidden_states, self.fc1.weight, self.fc1.bias, self.fc2.weight,
                                         self.fc2.bias)
            hidden_states = linear(hidden_states, self.fc1.weight, self.fc1.bias, relu=True)
        else:
            hidden_states = self.activation(self.fc1(hidden_states))
        hidden_states = _dropout(hidden_states, self.activation_dropout, self.training)
        return self.fc2(hidden_states)


class _SublayerMixin:
    """Residual connection around a sub-layer, with the norm before (pre-LN) or after (post-LN, the paper)."""

    def _residual(self, norm: nn.LayerNorm, hidden_states: torch.Tensor, sublayer: Callable) -> torch.Tensor:
        if self.normalize_before:
            branch = sublayer(norm(hidden_states))
            return _add_dropout(hidden_states, branch, self.dropout, self.training)
        branch = sublayer(hidden_states)
        return norm(_add_dropout(hidden_states, branch, self.dropout, self.training))


class VaswaniEncoderLayer(_SublayerMixin, GradientCheckpointingLayer):
    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout
        self.self_attn = VaswaniAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VaswaniFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                packing: Packing | None = None, **kwargs):
        """hidden_states (B, S, d) -> (B, S, d); with `packing`, every position-wise step runs on the real tokens only
        and the padding comes out as zeros."""
        x = hidden_states if packing is None else packing.pack(hidden_states)
        x = self._residual(
            self.self_attn_layer_norm,
            x,
            lambda h: self.self_attn(h, attention_mask=attention_mask, packing=packing, **kwargs)[0],
        )
        x = self._residual(self.final_layer_norm, x, self.ffn)
        return x if packing is None else packing.unpack(x)


class VaswaniDecoderLayer(_SublayerMixin, GradientCheckpointingLayer):
    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout
        heads = config.decoder_attention_heads
        self.self_attn = VaswaniAttention(config, heads, is_causal=True, layer_idx=layer_idx)
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
        packing: Packing | None = None,
        source_packing: Packing | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """hidden_states (B, T, d) -> (B, T, d); `packing`: the target's real tokens, on which every position-wise
        step runs (the padding comes out as zeros); `source_packing`: the encoder output's real tokens, which alone
        go through the cross-attention key/value projection."""
        kwargs.pop("use_cache", None)
        x = hidden_states if packing is None else packing.pack(hidden_states)
        x = self._residual(
            self.self_attn_layer_norm,
            x,
            lambda h: self.self_attn(h, attention_mask=attention_mask, cache=cache, packing=packing, **kwargs)[0],
        )
        x = self._residual(
            self.encoder_attn_layer_norm,
            x,
            lambda h: self.encoder_attn(
                h,
                attention_mask=encoder_attention_mask,
                key_value_states=encoder_hidden_states,
                cache=cache,
                packing=packing,
                source_packing=source_packing,
                **kwargs,
            )[0],
        )
        x = self._residual(self.final_layer_norm, x, self.ffn)
        return x if packing is None else packing.unpack(x)


class VaswaniPreTrainedModel(PreTrainedModel):
    config: VaswaniConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]

    def _init_weights(self, module: nn.Module):
        """All initialisation of the model: Xavier-uniform projections with zero biases, normal embeddings with
        std init_std (default d_model ** -0.5, which `scale_embedding` brings back to unit scale), unit norms.
        Sinusoidal positions are computed, never initialised."""
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


class VaswaniEncoder(VaswaniPreTrainedModel):
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

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        """input_ids (B, S); attention_mask (B, S) with 1 for real tokens, or a prepared 4D mask."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds to the encoder")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds * self.embed_scale
        positions = self.embed_positions.range(0, inputs_embeds.shape[1], inputs_embeds.dtype, inputs_embeds.device)
        hidden_states = inputs_embeds + positions
        hidden_states = _dropout(hidden_states, self.config.dropout, self.training)

        attention_mask = keep_fully_padded_rows_finite(attention_mask)
        real_tokens = packing(attention_mask)  # position-wise layers skip the padding; its outputs are zeros
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, real_tokens, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VaswaniDecoder(VaswaniPreTrainedModel):
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
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """input_ids (B, T) decoder inputs (labels shifted right); attention_mask (B, T) target padding, or a
        prepared 4D mask; encoder_hidden_states (B, S, d); encoder_attention_mask (B, S) source padding."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of decoder_input_ids or decoder_inputs_embeds to the decoder")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds * self.embed_scale

        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        self_attn_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        past_length = cache.get_seq_length() if cache is not None else 0
        positions = self.embed_positions.range(
            past_length, inputs_embeds.shape[1], inputs_embeds.dtype, inputs_embeds.device
        )
        hidden_states = inputs_embeds + positions
        hidden_states = _dropout(hidden_states, self.config.dropout, self.training)

        attention_mask = keep_fully_padded_rows_finite(attention_mask)
        encoder_attention_mask = keep_fully_padded_rows_finite(encoder_attention_mask)
        # Position-wise layers skip the padding: the target's when there is no cache (incremental decoding has one
        # new token per row), the source's for the cross-attention keys/values until the cache holds them.
        real_tokens = packing(attention_mask) if cache is None else None
        cross_cached = isinstance(cache, EncoderDecoderCache) and bool(cache.is_updated) and all(
            cache.is_updated.values()
        )
        real_source_tokens = None if cross_cached or encoder_hidden_states is None else packing(encoder_attention_mask)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=self_attn_cache,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                packing=real_tokens,
                source_packing=real_source_tokens,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)


class VaswaniModel(VaswaniPreTrainedModel):
    """Encoder + decoder over one token embedding shared by source and target (the paper's shared vocabulary).
    Returns the decoder's hidden states."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VaswaniEncoder(config, self.shared)
        self.decoder = VaswaniDecoder(config, self.shared)
        self.post_init()

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
        **kwargs,
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
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
    # Greedy search and sampling run the lean loop of decoding_vaswani.py where it gives the same result
    # (eval mode, SDPA, tokens only); False always takes GenerationMixin's loop.
    lean_decoding: bool = True

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False)
        if config.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        else:
            self.final_logits_bias = None
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear):
        self.lm_head = new_embeddings

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head and the logits bias. The bias goes into the head's matrix multiplication when the head is a
        plain linear layer without hooks: a separate addition wrote a second (tokens, vocab) buffer, fresh memory that
        cost 45 ms of a 1.9 s training step at the base size in page faults (profiled)."""
        head, bias = self.lm_head, self.final_logits_bias
        if bias is None:
            return head(hidden)
        if _plain_layer(head) and head.bias is None:
            return linear(hidden, head.weight, bias.view(-1).to(hidden.dtype))
        logits = head(hidden)
        return logits + bias.to(logits.dtype)

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
        sentence hold the same cross-attention keys/values, so reordering those (a copy of every layer's encoder
        keys and values at every step) would change nothing."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                streamer=None, **model_kwargs):
        """Greedy search and sampling (`generate` calls this): the lean loop when `lean_decoding_blocker` finds
        nothing against it, else GenerationMixin's loop."""
        if lean_decoding_blocker(self, input_ids, generation_config, synced_gpus, streamer, model_kwargs) is None:
            return lean_sample(self, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs)
        return super()._sample(input_ids, logits_processor, stopping_criteria, generation_config,
                               synced_gpus=synced_gpus, streamer=streamer, **model_kwargs)

    def _beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                     **model_kwargs):
        """Beam search and beam sampling (`generate` calls this): the lean loop when `lean_beam_blocker` finds nothing
        against it, else GenerationMixin's loop."""
        if lean_beam_blocker(self, input_ids, generation_config, synced_gpus, model_kwargs) is None:
            return lean_beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config,
                                    **model_kwargs)
        return super()._beam_search(input_ids, logits_processor, stopping_criteria, generation_config,
                                    synced_gpus=synced_gpus, **model_kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        """Token-mean cross-entropy over labels != -100 (labels are aligned with the decoder inputs: no shift), with
        `config.label_smoothing`. Under Trainer with gradient accumulation, `num_items_in_batch` is the number of
        label tokens in the whole accumulated batch: the sum is divided by it instead."""
        total = cross_entropy(
            logits.float().view(-1, logits.shape[-1]),
            labels.view(-1).to(logits.device),
            self.config.label_smoothing,
            reduction="sum" if num_items_in_batch is not None else "mean",  # mean: over labels != -100
        )
        if num_items_in_batch is None:
            return total
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

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
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """labels (B, T): target ids with -100 where ignored; decoder inputs default to labels shifted right."""
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits = self._logits(outputs.last_hidden_state)
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
    "VaswaniDecoder",
    "VaswaniModel",
    "VaswaniForConditionalGeneration",
    "shift_tokens_right",
]
