"""Long-input self-attention: local, block-sparse and linear attention, each at the cost its name promises.

Full attention costs O(n^2). The three patterns here are the ways out that "Attention Is All You Need" and its
successors name; the config picks one per stack (`encoder_attention_pattern`, `decoder_attention_pattern`), and
cross-attention stays full.

- `local`: an encoder query sees the keys within `attention_window` positions on either side; a decoder query the
  last `attention_window` positions, itself included. Queries go in chunks, each against the keys of its own
  stretch (O(n w) time and memory).
- `block_sparse`: a block of `sparse_block_size` queries sees its own block and the neighbouring blocks (in the
  decoder: its own, causally, and the previous one); the first `sparse_global_tokens` positions see all positions
  and are seen by all (Longformer's and BigBird's global tokens). O(n (b + g)).
- `linear`: softmax(q k^T) is replaced by phi(q) phi(k)^T with phi(x) = elu(x) + 1, normalised by the sum over the
  keys (Katharopoulos et al., 2020): out_i = phi(q_i) S / (phi(q_i) z + eps) with S = sum_j phi(k_j) v_j^T and
  z = sum_j phi(k_j). In the decoder the sums run over j <= i: prefix sums, chunk by chunk. O(n d^2).

Each function has the backend contract of modeling_vaswani.py (`fn(module, q, k, v, mask, scaling, dropout, **kw)
-> (out (B, T, H, D), weights or None)`) and takes as mask the (B, Tk) padding mask (True = a real key), never an
n x n one. Under `eager` the softmax is written out; under `sdpa` each chunk goes through torch's
scaled_dot_product_attention. On a GPU, local attention also runs as flash attention with a window, and local and
block-sparse attention as flex attention with a block mask (`self_attention_mask` builds it). Linear attention has no
softmax to hand to a kernel: eager and sdpa run the same formula.

With `output_attentions=True` under eager, the dense (B, H, Tq, Tk) weights of the pattern come back (zero outside
it; linear attention's implied weights phi(q_i) phi(k_j) / sum): O(n^2), for plots of short inputs.

Cached decoding: `self_attention_cache` gives the decoder's self-attention cache of each pattern: a rolling window of
`attention_window - 1` positions (local), each layer's running sums S and z (linear), the global positions and the
last two blocks (block-sparse: what its step reads, constant in the length), or all keys (full).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    sliding_window_bidirectional_overlay,
    sliding_window_overlay,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PATTERNS = ("local", "block_sparse", "linear")
# The attention implementations that run each pattern (the first ones on the CPU).
BACKENDS = {
    "local": ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"),
    "block_sparse": ("eager", "sdpa", "flex_attention"),
    "linear": ("eager", "sdpa"),
}
LINEAR_EPS = 1e-6  # in the denominator of linear attention, as in Katharopoulos et al.'s code
_MIN_CHUNK = 32  # local attention's query chunk: the window, or this many queries if the window is smaller
_LINEAR_CHUNK = 64  # causal linear attention: queries per chunk of the prefix sums


def _windows(x: torch.Tensor, start: int, count: int, stride: int, span: int, dim: int) -> torch.Tensor:
    """Stretches of `x` along `dim`: positions start + n * stride + [0, span) for n < count, zero (False) where they
    fall outside `x`. A view with the stretch number at `dim` and the position in the stretch as a new last dim."""
    length = x.shape[dim]
    end = start + (count - 1) * stride + span
    x = x.narrow(dim, max(start, 0), max(min(end, length) - max(start, 0), 0))
    pad = [0, 0] * (x.dim() - 1 - dim) + [max(-start, 0), max(end - length, 0)]
    return F.pad(x, pad).unfold(dim, span, stride)


def _key_stretches(x: torch.Tensor, start: int, count: int, stride: int, span: int) -> torch.Tensor:
    """(B, H, Tk, D) -> (B, H, count, span, D)."""
    return _windows(x, start, count, stride, span, dim=2).transpose(-1, -2)


def _key_padding(attention_mask: torch.Tensor | None, query: torch.Tensor, key_length: int) -> torch.Tensor:
    """The (B, Tk) boolean padding mask of the keys, True = real, from what the stack passes."""
    if attention_mask is None:
        return torch.ones(1, key_length, dtype=torch.bool, device=query.device)
    if attention_mask.dim() != 2:
        raise ValueError(f"a {attention_mask.dim()}D attention mask was given to a long-input attention pattern, "
                         f"which takes the (batch, length) padding mask only; pass attention_mask as 0/1 per token")
    if attention_mask.shape[1] < key_length:
        raise ValueError(f"the padding mask covers {attention_mask.shape[1]} positions but attention has "
                         f"{key_length} keys; pass a mask over the past and the new tokens")
    return attention_mask[:, -key_length:].bool()  # a cache may hold fewer positions than the mask covers


def _softmax_attention(module, query, key, value, mask, scaling: float, dropout: float):
    """softmax(q k^T * scaling, masked) v over stretches: q (..., Tq, D), k/v (..., S, D), mask broadcastable to
    (..., Tq, S), True = attend. Under sdpa, torch's kernel (4D: the leading dims folded into the batch)."""
    if module.config._attn_implementation == "sdpa":
        lead = query.shape[:-3]
        fold = (lambda t: t.reshape(-1, *t.shape[-3:]))
        mask = mask.expand(*lead, mask.shape[-3] if mask.shape[-3] == 1 else query.shape[-3], *mask.shape[-2:])
        out = F.scaled_dot_product_attention(fold(query), fold(key), fold(value), attn_mask=fold(mask),
                                             dropout_p=dropout if module.training else 0.0, scale=scaling)
        return out.view(*lead, *out.shape[-3:]), None
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    full_precision = scores.dtype in (torch.float32, torch.float64)
    weights = (scores if full_precision else scores.float()).softmax(-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value), weights


def _scatter_dense(weights: torch.Tensor, key_index: torch.Tensor, key_length: int) -> torch.Tensor:
    """Stretch weights (..., Q, S) whose key positions are `key_index` (broadcastable, may fall outside
    [0, key_length)) -> dense (..., Q, key_length) weights."""
    inside = (key_index >= 0) & (key_index < key_length)
    index = key_index.clamp(0, key_length - 1).expand(weights.shape)
    dense = weights.new_zeros(*weights.shape[:-1], key_length)
    return dense.scatter_add_(-1, index, weights * inside)


def _one_query(module, query, key, value, attention_mask, seen: torch.Tensor, scaling: float, dropout: float,
               total: int | None = None, **kwargs):
    """One decoding step against the keys at the (sorted) positions `seen`, the last of them its own. `key` holds
    every position, or (a cache that keeps only what a step sees: `total` positions so far) exactly the `seen` ones."""
    key_length = key.shape[2] if total is None else total
    contiguous = seen.numel() == 0 or int(seen[-1] - seen[0]) + 1 == seen.numel()
    if key.shape[2] == seen.numel():
        pick = (lambda x: x)
    else:
        pick = (lambda x: x[:, :, int(seen[0]):]) if contiguous else (lambda x: x.index_select(2, seen))
    mask = _key_padding(attention_mask, query, key_length).index_select(1, seen)
    mask = (mask | (seen == key_length - 1))[:, None, None, :]  # a query always sees itself
    out, weights = _softmax_attention(module, query, pick(key), pick(value), mask, scaling, dropout)
    if weights is not None and kwargs.get("output_attentions"):
        weights = _scatter_dense(weights, seen, key_length)
    else:
        weights = None
    return out.transpose(1, 2).contiguous(), weights


def _covered(module, query, key, value, attention_mask, scaling: float, dropout: float, **kwargs):
    """Every query against every key (causally in the decoder), as the pattern is where it covers the input."""
    query_length, key_length = query.shape[2], key.shape[2]
    mask = _key_padding(attention_mask, query, key_length)[:, None, None, :]
    if module.is_causal:
        mask = mask & torch.ones(query_length, key_length, dtype=torch.bool, device=query.device).tril(
            key_length - query_length)
    mask = mask | _diagonal(query_length, key_length, query.device)  # a query always sees itself
    out, weights = _softmax_attention(module, query, key, value, mask, scaling, dropout)
    return out.transpose(1, 2).contiguous(), weights if kwargs.get("output_attentions") else None


def _diagonal(query_length: int, key_length: int, device) -> torch.Tensor:
    """(Tq, Tk): True where a query meets its own key (the queries are the last Tq keys)."""
    return torch.arange(key_length, device=device) == torch.arange(query_length, device=device)[:, None] + (
        key_length - query_length)


def local_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """Each query against the keys of its window: encoder |i - j| <= w, decoder i - w < j <= i. q (B, H, Tq, D),
    k/v (B, H, Tk, D) with the queries as the last Tq keys (a cache holds the ones before)."""
    query_length = query.shape[2]
    key_length = key.shape[2]
    window = module.config.attention_window
    if module.is_causal and query_length == 1:  # a decoding step: the last `window` keys are its window
        return _one_query(module, query, key, value, attention_mask, torch.arange(max(key_length - window, 0),
                          key_length, device=query.device), scaling, dropout, **kwargs)
    if window >= key_length:  # the window covers every key: one block, no stretches (short inputs)
        return _covered(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    left, right = (window - 1, 0) if module.is_causal else (window, window)
    chunk = min(query_length, max(window, _MIN_CHUNK))
    count = math.ceil(query_length / chunk)
    span = chunk + left + right
    first = key_length - query_length - left  # the key index where the first chunk's stretch starts

    queries = F.pad(query, (0, 0, 0, count * chunk - query_length)).unflatten(2, (count, chunk))
    keys, values = (_key_stretches(x, first, count, chunk, span) for x in (key, value))
    real = _windows(_key_padding(attention_mask, query, key_length), first, count, chunk, span, dim=1)
    # key index - query index + left, for each (query, key) of a chunk and its stretch
    offset = torch.arange(span, device=query.device) - torch.arange(chunk, device=query.device)[:, None]
    band = (offset >= 0) & (offset <= left + right)
    mask = (band & real[:, None, :, None, :]) | (offset == left)  # a query always sees itself: no empty row

    out, weights = _softmax_attention(module, queries, keys, values, mask, scaling, dropout)
    out = out.flatten(2, 3)[:, :, :query_length]
    if weights is not None and kwargs.get("output_attentions"):
        stretch_start = first + chunk * torch.arange(count, device=query.device)
        key_index = (stretch_start[:, None, None] + torch.arange(span, device=query.device)).unsqueeze(-2)
        weights = _scatter_dense(weights, key_index, key_length).flatten(2, 3)[:, :, :query_length]
    else:
        weights = None
    return out.transpose(1, 2).contiguous(), weights


def block_sparse_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """Each block of queries against its own and the neighbouring blocks (decoder: its own, causally, and the previous
    one) and the global keys; global queries against every key. q (B, H, Tq, D), k/v (B, H, Tk, D) holding every
    position from 0 (a full cache), the queries the last Tq of them."""
    config = module.config
    block, causal = config.sparse_block_size, module.is_causal
    query_length = query.shape[2]
    if causal and query_length == 1:  # a decoding step: the globals, the previous block and its own, up to itself
        layer = _layer(kwargs.get("linear_state"), module)
        total = layer.get_seq_length() if isinstance(layer, BlockSparseLayer) else key.shape[2]
        seen = torch.arange(total, device=query.device)[_seen_by_step(total - 1, block, config.sparse_global_tokens)]
        return _one_query(module, query, key, value, attention_mask, seen, scaling, dropout, total=total, **kwargs)
    globals_ = min(config.sparse_global_tokens, key.shape[2])
    key_length = key.shape[2]
    position = key_length - query_length  # of the first query
    lead = position % block  # queries before it in its block
    count = math.ceil((lead + query_length) / block)
    span = (2 if causal else 3) * block
    first = position - lead - block  # the key index where the first block's stretch starts
    device = query.device

    queries = F.pad(query, (0, 0, lead, count * block - lead - query_length)).unflatten(2, (count, block))
    keys, values = (_key_stretches(x, first, count, block, span) for x in (key, value))
    padding = _key_padding(attention_mask, query, key_length)
    real = _windows(padding, first, count, block, span, dim=1)[:, None, :, None, :]  # (B, 1, count, 1, span)
    offset = torch.arange(span, device=device) - torch.arange(block, device=device)[:, None]  # key - query + block
    mask = (real & (offset <= block)) if causal else real.expand(-1, -1, -1, block, -1)
    mask = mask | (offset == block)  # a query always sees itself
    if globals_:
        # the global keys, for each block that does not already hold them in its stretch
        stretch_start = first + block * torch.arange(count, device=device)[:, None]
        index = torch.arange(globals_, device=device)
        elsewhere = (index < stretch_start) | (index >= stretch_start + span)  # (count, g)
        seen = padding[:, None, None, None, :globals_] & elsewhere[:, None, :]  # (B, 1, count, 1, g)
        if causal:
            query_position = position - lead + block * torch.arange(count, device=device)[:, None] + torch.arange(
                block, device=device)
            seen = seen & (index <= query_position[..., None])  # (B, 1, count, block, g)
        mask = torch.cat((seen.expand(*mask.shape[:-1], globals_), mask), dim=-1)
        global_keys, global_values = (x[:, :, None, :globals_].expand(-1, -1, count, -1, -1) for x in (key, value))
        keys, values = torch.cat((global_keys, keys), dim=3), torch.cat((global_values, values), dim=3)

    out, weights = _softmax_attention(module, queries, keys, values, mask, scaling, dropout)
    out = out.flatten(2, 3)[:, :, lead : lead + query_length]
    dense = None
    if weights is not None and kwargs.get("output_attentions"):
        stretch_start = first + block * torch.arange(count, device=device)
        key_index = (stretch_start[:, None] + torch.arange(span, device=device)).unsqueeze(-2)  # (count, 1, span)
        if globals_:
            key_index = torch.cat((torch.arange(globals_, device=device).expand(count, 1, -1), key_index), dim=-1)
        dense = _scatter_dense(weights, key_index, key_length).flatten(2, 3)[:, :, lead : lead + query_length]

    global_queries = min(max(globals_ - position, 0), query_length)  # queries at positions below the global count
    if global_queries:
        global_mask = padding[:, None, None, :] | (
            torch.arange(key_length, device=device) == torch.arange(global_queries, device=device)[:, None] + position)
        if causal:
            global_mask = global_mask & (torch.arange(key_length, device=device)
                                         <= torch.arange(global_queries, device=device)[:, None] + position)
        global_out, global_weights = _softmax_attention(module, query[:, :, :global_queries], key, value,
                                                        global_mask, scaling, dropout)
        out = torch.cat((global_out, out[:, :, global_queries:]), dim=2)
        if dense is not None:
            dense = torch.cat((global_weights, dense[:, :, global_queries:]), dim=2)
    return out.transpose(1, 2).contiguous(), dense


def _first_local(position: int, block: int, global_tokens: int) -> int:
    """The first position of the previous block of a block-sparse decoding step at `position` (0 while the step is a
    global one): it sees the global positions and everything from here on."""
    return 0 if position < global_tokens else max(position // block - 1, 0) * block


def _seen_by_step(position: int, block: int, global_tokens: int) -> slice | torch.Tensor:
    """What a block-sparse decoding step at `position` sees of positions 0..position: the global positions, the
    previous block and its own block up to itself (an index into arange(position + 1))."""
    start = _first_local(position, block, global_tokens)
    if start <= global_tokens:
        return slice(None)
    return torch.cat((torch.arange(global_tokens), torch.arange(start, position + 1)))


def _layer(cache: Cache | None, module):
    """The layer of `cache` that belongs to `module` (None without a cache)."""
    if cache is None or module.layer_idx >= len(cache.layers):
        return None
    return cache.layers[module.layer_idx]


class BlockSparseLayer(DynamicLayer):
    """The block-sparse decoder's cache layer: the global positions and the keys from the start of the block before
    the newest one, exactly what the next decoding step sees; at most `sparse_global_tokens + 2 * sparse_block_size`
    positions, whatever the length. A forward of several new tokens needs every earlier key: it is taken while
    nothing has been dropped (the first forward), refused after."""

    is_croppable = False

    def __init__(self, block_size: int, global_tokens: int, **kwargs):
        super().__init__()
        self.block_size, self.global_tokens = block_size, global_tokens
        self.cumulative_length = 0  # positions seen, the dropped ones included
        self.kept_positions = torch.zeros(0, dtype=torch.long)  # which positions the stored keys are

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[-2]
        if new > 1 and self.kept_positions.numel() < self.cumulative_length:
            raise ValueError(f"a block-sparse decoder's cache keeps only what a one-token step sees (the "
                             f"{self.global_tokens} global positions and the last two blocks of {self.block_size}); "
                             f"{new} new tokens at once need every earlier key: feed one token at a time after the "
                             "first forward, or pass a DynamicCache")
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.kept_positions = torch.cat((self.kept_positions, torch.arange(self.cumulative_length,
                                                                           self.cumulative_length + new)))
        self.cumulative_length += new
        # keep what the next step (at position cumulative_length) will see
        start = _first_local(self.cumulative_length, self.block_size, self.global_tokens)
        keep = (self.kept_positions < min(self.global_tokens, start)) | (self.kept_positions >= start)
        if not bool(keep.all()):
            index = keep.nonzero().squeeze(1).to(self.keys.device)
            self.keys, self.values = self.keys.index_select(-2, index), self.values.index_select(-2, index)
            self.kept_positions = self.kept_positions[keep]
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2] + query_length if self.keys is not None else query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.global_tokens + 2 * self.block_size

    def reset(self) -> None:
        super().reset()
        self.cumulative_length = 0
        self.kept_positions = torch.zeros(0, dtype=torch.long)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a block-sparse decoder's cache has dropped the positions a crop would return to "
                                  "(assisted decoding); pass a DynamicCache")


def _feature_map(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


class LinearAttentionState(CacheLayerMixin):
    """One decoder layer's cache under causal linear attention: the running sums S = sum_j phi(k_j) v_j^T
    (B, H, D, D) and z = sum_j phi(k_j) (B, H, D) over the positions so far, and their count. O(1) in the length."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, **kwargs):
        super().__init__()
        self.sums = self.normalizer = None
        self.cumulative_length = 0

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise TypeError("a linear-attention cache keeps running sums, not keys and values: it is read and written "
                        "by linear_attention (attention_patterns_vaswani.py)")

    def read(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.sums, self.normalizer

    def write(self, sums: torch.Tensor, normalizer: torch.Tensor, new_positions: int) -> None:
        if not self.is_initialized:
            self.lazy_initialization(sums, sums)
        self.sums, self.normalizer = sums, normalizer
        self.cumulative_length += new_positions

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, self.cumulative_length

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.sums = self.normalizer = None
        self.cumulative_length = 0

    def _map(self, fn) -> None:
        if self.sums is not None:
            self.sums, self.normalizer = fn(self.sums), fn(self.normalizer)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

    def offload(self) -> None:
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        self._map(lambda t: t.to(self.device, non_blocking=True))

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a linear-attention state cannot forget positions (assisted decoding, crop)")


def linear_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                     linear_state: Cache | None = None, **kwargs):
    """phi(q) S / (phi(q) z + eps), S and z summed over the real keys (decoder: over j <= i, continuing the cache's
    sums). No softmax, so neither `scaling` nor attention dropout applies. Half-precision inputs are summed in
    float32."""
    dtype = query.dtype
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    real = _key_padding(attention_mask, query, key.shape[2])[:, None, :, None].to(work)
    queries, keys = _feature_map(query.to(work)), _feature_map(key.to(work)) * real
    values = value.to(work)
    if not module.is_causal:
        sums = torch.matmul(keys.transpose(-1, -2), values)  # (B, H, D, D)
        normalizer = keys.sum(2)
        numerator, denominator = torch.matmul(queries, sums), torch.matmul(queries, normalizer.unsqueeze(-1))
        weights = torch.matmul(queries, keys.transpose(-1, -2)) if kwargs.get("output_attentions") else None
    else:
        layer = None
        if linear_state is not None:
            layer = linear_state.layers[module.layer_idx] if module.layer_idx < len(linear_state.layers) else None
            if not isinstance(layer, LinearAttentionState):
                raise ValueError("decoder_attention_pattern='linear' needs its own cache of running sums: leave the "
                                 "cache to the model (cache=None, use_cache=True) or pass "
                                 "attention_patterns_vaswani.self_attention_cache(config)")
        start_sums, start_normalizer = layer.read() if layer is not None else (None, None)
        numerator, denominator, sums, normalizer = _causal_linear(queries, keys, values, start_sums, start_normalizer)
        if layer is not None:
            layer.write(sums, normalizer, query.shape[2])
        weights = None
        if kwargs.get("output_attentions") and start_sums is None:
            weights = torch.matmul(queries, keys.transpose(-1, -2)).tril()
    out = (numerator / (denominator + LINEAR_EPS)).to(dtype)
    if weights is not None:  # the implied attention weights, O(n^2): only when asked for
        weights = (weights / (weights.sum(-1, keepdim=True) + LINEAR_EPS)).to(dtype)
    return out.transpose(1, 2).contiguous(), weights


def _causal_linear(queries, keys, values, start_sums=None, start_normalizer=None):
    """Prefix sums chunk by chunk: inside a chunk the (c x c) lower triangle of phi(q) phi(k)^T, across chunks the
    sums of the chunks before (and of the cache). Returns numerator (B, H, T, D), denominator (B, H, T, 1) and the
    sums S, z over everything."""
    length = queries.shape[2]
    chunk = min(length, _LINEAR_CHUNK)
    count = math.ceil(length / chunk)
    pad = (0, 0, 0, count * chunk - length)  # padded keys are zero: they add nothing
    q, k, v = (F.pad(x, pad).unflatten(2, (count, chunk)) for x in (queries, keys, values))  # (B, H, N, c, D)
    inside = torch.matmul(q, k.transpose(-1, -2)).tril()  # (B, H, N, c, c)
    chunk_sums = torch.matmul(k.transpose(-1, -2), v)  # (B, H, N, D, D)
    chunk_normalizers = k.sum(3)  # (B, H, N, D)
    before_sums = chunk_sums.cumsum(2) - chunk_sums  # the chunks before each one
    before_normalizers = chunk_normalizers.cumsum(2) - chunk_normalizers
    if start_sums is not None:
        before_sums = before_sums + start_sums[:, :, None]
        before_normalizers = before_normalizers + start_normalizer[:, :, None]
    numerator = torch.matmul(inside, v) + torch.matmul(q, before_sums)
    denominator = inside.sum(-1, keepdim=True) + torch.matmul(q, before_normalizers.unsqueeze(-1))
    sums = before_sums[:, :, -1] + chunk_sums[:, :, -1]
    normalizer = before_normalizers[:, :, -1] + chunk_normalizers[:, :, -1]
    unpad = (lambda t: t.flatten(2, 3)[:, :, :length])
    return unpad(numerator), unpad(denominator), sums, normalizer


def _flash_local(module, query, key, value, attention_mask, **kwargs):
    """Local attention as flash attention's sliding window (window_size = (w, w) in the encoder, (w - 1, 0) causal):
    transformers passes `sliding_window - 1` to each side."""
    window = module.config.attention_window
    if torch.is_tensor(attention_mask):
        attention_mask = _key_padding(attention_mask, query, key.shape[2])
    attend = ALL_ATTENTION_FUNCTIONS[module.config._attn_implementation]
    return attend(module, query, key, value, attention_mask, sliding_window=window if module.is_causal else window + 1,
                  **kwargs)


_FUNCTIONS = {"local": local_attention, "block_sparse": block_sparse_attention, "linear": linear_attention}


def pattern_attention(pattern: str, implementation: str):
    """The attention function of `pattern` under the attention implementation `implementation`."""
    if implementation not in BACKENDS[pattern]:
        raise ValueError(f"attn_implementation={implementation!r} cannot run {pattern!r} attention; use one of "
                         f"{BACKENDS[pattern]} (model.set_attn_implementation(...) or from_pretrained(..., "
                         f"attn_implementation=...))")
    if implementation.startswith("flash"):
        return _flash_local
    if implementation == "flex_attention":  # over the pattern's block mask (`self_attention_mask`)
        return ALL_ATTENTION_FUNCTIONS["flex_attention"]
    return _FUNCTIONS[pattern]


def mask_function(config, pattern: str, causal: bool):
    """The pattern as a mask function (batch, head, q_idx, kv_idx) -> bool over absolute positions, for flex
    attention's block mask and for dense references. Padding and causality come on top (transformers' masks)."""
    if pattern == "local":
        window = config.attention_window
        return sliding_window_overlay(window) if causal else sliding_window_bidirectional_overlay(window)
    if pattern != "block_sparse":
        raise ValueError(f"{pattern!r} attention has no mask function")
    block, globals_ = config.sparse_block_size, config.sparse_global_tokens

    def block_sparse(batch_idx, head_idx, q_idx, kv_idx):
        return (abs(q_idx // block - kv_idx // block) <= 1) | (q_idx < globals_) | (kv_idx < globals_)

    return block_sparse


def self_attention_mask(config, pattern: str, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                        causal: bool, cache: Cache | None = None):
    """What a stack passes its self-attention layers, built once: full attention's masks from transformers (the
    form each backend wants); for a long-input pattern the (B, T) padding mask (None without padding), never an
    n x n one, or under flex attention the pattern's block mask."""
    if pattern == "full" and causal:
        return create_causal_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                  cache=cache)
    if pattern == "full":
        return create_bidirectional_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
    if config._attn_implementation == "flex_attention" and pattern in ("local", "block_sparse"):
        overlay = mask_function(config, pattern, causal)
        if causal:
            return create_causal_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                      cache=cache, and_mask_function=overlay)
        return create_bidirectional_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                         and_mask_function=overlay)
    if not torch.is_tensor(attention_mask):
        return attention_mask
    if attention_mask.dim() != 2:
        raise ValueError(f"{pattern!r} attention takes the (batch, length) padding mask, not a "
                         f"{attention_mask.dim()}D mask: an n x n mask is what it avoids")
    return None if bool(attention_mask.all()) else attention_mask.bool()


class RollingWindowLayer(DynamicSlidingWindowLayer):
    """The local decoder's cache layer: the last `sliding_window - 1` keys and values (with a new one, the
    `sliding_window` positions a query sees). transformers' layer keeps everything for a window of 1 (`[-0:]`)."""

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if self.sliding_window == 1 and not self.record_past:
            self.keys, self.values = self.keys[..., :0, :], self.values[..., :0, :]
        return keys, values


class PatternCache(DynamicCache):
    """A DynamicCache built from given layers (rolling windows, linear-attention sums)."""

    def __init__(self, layers: list):
        Cache.__init__(self, layers=layers)


def self_attention_cache(config, cache_implementation: str | None = None) -> Cache:
    """The decoder's self-attention cache for its pattern: a rolling window (local), running sums (linear), the
    globals and the last two blocks (block-sparse; every key under flex attention, whose block mask covers them), or
    every key (full). A static cache (`cache_implementation`) holds full attention's keys only."""
    pattern = config.decoder_attention_pattern
    if pattern != "full" and cache_implementation not in (None, "dynamic"):
        raise ValueError(f"cache_implementation={cache_implementation!r} holds full attention's keys; "
                         f"decoder_attention_pattern={pattern!r} keeps a cache of its own: leave cache_implementation "
                         f"unset")
    if pattern == "local":
        return PatternCache([RollingWindowLayer(sliding_window=config.attention_window)
                             for _ in range(config.decoder_layers)])
    if pattern == "linear":
        return PatternCache([LinearAttentionState() for _ in range(config.decoder_layers)])
    if pattern == "block_sparse" and config._attn_implementation != "flex_attention":  # flex's block mask reads all
        return PatternCache([BlockSparseLayer(config.sparse_block_size, config.sparse_global_tokens)
                             for _ in range(config.decoder_layers)])
    return DynamicCache(config=config)


__all__ = [
    "BACKENDS",
    "PATTERNS",
    "BlockSparseLayer",
    "LinearAttentionState",
    "PatternCache",
    "RollingWindowLayer",
    "block_sparse_attention",
    "linear_attention",
    "local_attention",
    "mask_function",
    "pattern_attention",
    "self_attention_cache",
    "self_attention_mask",
]
