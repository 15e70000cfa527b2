"""The decoder's self-attention caches of the long-input patterns, beside transformers' own.

`self_attention_cache` gives the cache of each `decoder_attention_pattern`: a rolling window of `attention_window - 1`
positions (local), each layer's running sums S and z (linear), the global positions and the last two blocks
(block-sparse: what its step reads, constant in the length), or all keys (full). The attention functions that read
them are in attention_patterns_vaswani.py; the modeling file's attention updates every cache the same way
(`layer.update(keys, values)`) and hands each attention function its own layer of it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer


def first_local(position: int, block: int, global_tokens: int) -> int:
    """The first position of the previous block of a block-sparse decoding step at `position` (0 while the step is a
    global one): it sees the global positions and everything from here on."""
    return 0 if position < global_tokens else max(position // block - 1, 0) * block


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
        start = first_local(self.cumulative_length, self.block_size, self.global_tokens)
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
        """The new positions' keys and values pass through: linear_attention (attention_patterns_vaswani.py) adds
        them to the sums it reads here, and writes the new sums."""
        return key_states, value_states

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
    "BlockSparseLayer",
    "LinearAttentionState",
    "PatternCache",
    "RollingWindowLayer",
    "first_local",
    "self_attention_cache",
]
