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
n x n one. Under `eager` the softmax is eager attention's; under `sdpa` each chunk goes through torch's
scaled_dot_product_attention. On a GPU, local attention also runs as flash attention with a window, and local and
block-sparse attention as flex attention with a block mask (masks_vaswani.self_attention_mask builds it). Linear
attention has no softmax to hand to a kernel: eager and sdpa run the same formula.

With `output_attentions=True` under eager, the dense (B, H, Tq, Tk) weights of the pattern come back (zero outside
it; linear attention's implied weights phi(q_i) phi(k_j) / sum): O(n^2), for plots of short inputs.

A query with no real key in its stretch follows the one rule of masks_vaswani.py (`attend_somewhere`): it attends
to every key its pattern allows. The eager softmax is eager attention's (`masked_softmax`). Cached decoding reads the
caches of caches_vaswani.py: each function gets its module's layer of the cache as `cache_layer`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .caches_vaswani import BlockSparseLayer, LinearAttentionState, first_local
from .masks_vaswani import attend_somewhere, key_padding, masked_softmax

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
    weights = masked_softmax(scores, mask, dropout, module.training)  # eager attention's softmax
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
    mask = attend_somewhere(key_padding(attention_mask, query, key_length).index_select(1, seen))[:, None, None, :]
    out, weights = _softmax_attention(module, query, pick(key), pick(value), mask, scaling, dropout)
    if weights is not None and kwargs.get("output_attentions"):
        weights = _scatter_dense(weights, seen, key_length)
    else:
        weights = None
    return out.transpose(1, 2).contiguous(), weights


def _covered(module, query, key, value, attention_mask, scaling: float, dropout: float, **kwargs):
    """Every query against every key (causally in the decoder), as the pattern is where it covers the input."""
    query_length, key_length = query.shape[2], key.shape[2]
    causal = None
    if module.is_causal:
        causal = torch.ones(query_length, key_length, dtype=torch.bool, device=query.device).tril(
            key_length - query_length)
    mask = attend_somewhere(key_padding(attention_mask, query, key_length)[:, None, None, :], causal)
    out, weights = _softmax_attention(module, query, key, value, mask, scaling, dropout)
    return out.transpose(1, 2).contiguous(), weights if kwargs.get("output_attentions") else None


def _in_range(padding: torch.Tensor, start: int, count: int, stride: int, span: int) -> torch.Tensor:
    """(1, count, span): which positions of each stretch are keys at all (the others lie outside the sequence)."""
    return _windows(torch.ones_like(padding[:1]), start, count, stride, span, dim=1)


def _grid_rows(count: int, size: int, lead: int, length: int, device) -> torch.Tensor:
    """(count, size, 1): which rows of a query grid are queries; the grid's padding rows (before `lead`, after
    `lead + length`) are not, and see their whole stretch (their outputs are dropped)."""
    row = torch.arange(count * size, device=device).view(count, size, 1)
    return (row >= lead) & (row < lead + length)


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
    padding = key_padding(attention_mask, query, key_length)
    real = _windows(padding, first, count, chunk, span, dim=1)[:, None, :, None, :]  # (B, 1, count, 1, span)
    # key index - query index + left, for each (query, key) of a chunk and its stretch
    offset = torch.arange(span, device=query.device) - torch.arange(chunk, device=query.device)[:, None]
    band = (offset >= 0) & (offset <= left + right) & _in_range(padding, first, count, chunk, span)[:, :, None, :]
    rows = _grid_rows(count, chunk, 0, query_length, query.device)
    mask = attend_somewhere(real, (band | ~rows)[:, None])

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
        layer = kwargs.get("cache_layer")
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
    padding = key_padding(attention_mask, query, key_length)
    real = _windows(padding, first, count, block, span, dim=1)[:, None, :, None, :]  # (B, 1, count, 1, span)
    offset = torch.arange(span, device=device) - torch.arange(block, device=device)[:, None]  # key - query + block
    allowed = _in_range(padding, first, count, block, span)[0][:, None, :] & ((offset <= block) if causal else True)
    allowed = allowed.expand(count, block, span)  # (count, block, span)
    if globals_:
        # the global keys, for each block that does not already hold them in its stretch
        stretch_start = first + block * torch.arange(count, device=device)[:, None]
        index = torch.arange(globals_, device=device)
        elsewhere = (index < stretch_start) | (index >= stretch_start + span)  # (count, g)
        seen = elsewhere[:, None, :].expand(count, block, globals_)
        if causal:
            query_position = position - lead + block * torch.arange(count, device=device)[:, None] + torch.arange(
                block, device=device)
            seen = seen & (index <= query_position[..., None])  # (count, block, g)
        global_real = padding[:, None, None, None, :globals_].expand(-1, -1, count, -1, -1)
        real, allowed = torch.cat((global_real, real), dim=-1), torch.cat((seen, allowed), dim=-1)
        global_keys, global_values = (x[:, :, None, :globals_].expand(-1, -1, count, -1, -1) for x in (key, value))
        keys, values = torch.cat((global_keys, keys), dim=3), torch.cat((global_values, values), dim=3)
    rows = _grid_rows(count, block, lead, query_length, device)
    mask = attend_somewhere(real, allowed | ~rows)

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
        sees = None
        if causal:
            sees = torch.arange(key_length, device=device) <= torch.arange(global_queries, device=device)[:, None] + \
                position
        global_mask = attend_somewhere(padding[:, None, None, :], sees)
        global_out, global_weights = _softmax_attention(module, query[:, :, :global_queries], key, value,
                                                        global_mask, scaling, dropout)
        out = torch.cat((global_out, out[:, :, global_queries:]), dim=2)
        if dense is not None:
            dense = torch.cat((global_weights, dense[:, :, global_queries:]), dim=2)
    return out.transpose(1, 2).contiguous(), dense


def _seen_by_step(position: int, block: int, global_tokens: int) -> slice | torch.Tensor:
    """What a block-sparse decoding step at `position` sees of positions 0..position: the global positions, the
    previous block and its own block up to itself (an index into arange(position + 1))."""
    start = first_local(position, block, global_tokens)
    if start <= global_tokens:
        return slice(None)
    return torch.cat((torch.arange(global_tokens), torch.arange(start, position + 1)))


def _feature_map(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1  # positive: a row's denominator is zero exactly when it has no real key

def linear_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                     cache_layer=None, **kwargs):
    """phi(q) S / (phi(q) z + eps), S and z summed over the real keys (decoder: over j <= i, continuing the cache's
    sums). No softmax, so neither `scaling` nor attention dropout applies. Half-precision inputs are summed in
    float32. A row with no real key follows the masks' rule: it sums over every key it may see (in the decoder,
    those of this call)."""
    dtype = query.dtype
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    padding = key_padding(attention_mask, query, key.shape[2])
    if not module.is_causal:
        padding = attend_somewhere(padding)
    queries, keys = _feature_map(query.to(work)), _feature_map(key.to(work))
    values = value.to(work)
    masked_keys = keys * padding[:, None, :, None].to(work)
    if not module.is_causal:
        sums = torch.matmul(masked_keys.transpose(-1, -2), values)  # (B, H, D, D)
        normalizer = masked_keys.sum(2)
        numerator, denominator = torch.matmul(queries, sums), torch.matmul(queries, normalizer.unsqueeze(-1))
        weights = torch.matmul(queries, masked_keys.transpose(-1, -2)) if kwargs.get("output_attentions") else None
    else:
        layer = cache_layer
        if layer is not None:
            if not isinstance(layer, LinearAttentionState):
                raise ValueError("decoder_attention_pattern='linear' needs its own cache of running sums: leave the "
                                 "cache to the model (cache=None, use_cache=True) or pass "
                                 "caches_vaswani.self_attention_cache(config)")
        start_sums, start_normalizer = layer.read() if layer is not None else (None, None)
        numerator, denominator, sums, normalizer = _causal_linear(queries, masked_keys, values, start_sums,
                                                                  start_normalizer)
        if layer is not None:
            layer.write(sums, normalizer, query.shape[2])
        empty = denominator == 0  # (B, H, T, 1): rows with no real key so far
        if not bool(padding.all()) and bool(empty.any()):
            numerator_all, denominator_all = _causal_linear(queries, keys, values)[:2]
            numerator, denominator = numerator.where(~empty, numerator_all), denominator.where(~empty, denominator_all)
        weights = None
        if kwargs.get("output_attentions") and start_sums is None:
            weights = torch.matmul(queries, masked_keys.transpose(-1, -2)).tril()
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
        attention_mask = key_padding(attention_mask, query, key.shape[2])
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


__all__ = [
    "BACKENDS",
    "PATTERNS",
    "block_sparse_attention",
    "linear_attention",
    "local_attention",
    "pattern_attention",
]
