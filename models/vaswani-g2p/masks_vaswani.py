"""The masks, built in one place, and the one rule for a query with no real key.

A stack calls `self_attention_mask` (its self-attention) and `cross_attention_mask` (the decoder's cross-attention)
once per forward and passes the result to every layer. Full attention's masks come from `transformers.masking_utils`
in the form each backend wants (additive float for eager, bool or None for SDPA, 2D or None for flash, a block mask
for flex); a long-input pattern gets the (B, T) padding mask (None without padding), never an n x n one, or under
flex attention the pattern's block mask.

The rule (`attend_somewhere`): a query that may attend to no real key (all of its keys are padding) attends to every
key its pattern allows, as if none of them were padding. Its output is never used, but it must stay finite in every
backend and dtype (a row of -inf is NaN after the softmax, and SDPA gives NaN for a row with nothing to attend to).
For full attention such a row is a sequence that is all padding: its padding mask is read as all real. A pattern
applies the same function to its stretches; the decoding loop to its source mask.

Dropout's masks are drawn here too (`dropout`, every dropout of the model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    sliding_window_bidirectional_overlay,
    sliding_window_overlay,
)


def attend_somewhere(real: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The rule for rows with no real keys. `real` marks the real keys (True or 1) along the last dim; `allowed`
    (broadcastable boolean, None = every key) the keys the pattern lets the row see. Returns what each row attends
    to: its allowed real keys, or, if it has none, all its allowed keys. A non-boolean `real` (a 0/1 padding mask)
    comes back in its own dtype."""
    visible = real.bool() if allowed is None else real.bool() & allowed
    empty = ~visible.any(-1, keepdim=True)
    rescued = visible | (empty if allowed is None else empty & allowed)
    return rescued if real.dtype == torch.bool else rescued.to(real.dtype)


DROPOUT_LEVELS = 1 << 16  # a CPU dropout mask compares 16-bit random numbers with round(p * DROPOUT_LEVELS)


class _Dropout(torch.autograd.Function):
    """x times the boolean `keep` times `scale`; the backward is the same on the gradient. Saves the one-byte mask
    only, as `F.dropout` does; multiplies by its uint8 view (torch's elementwise kernels are many times slower with a
    bool operand)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep.view(torch.uint8)).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep.view(torch.uint8)).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Every dropout of the model: in training, each element zeroed with probability p and the rest scaled by
    1 / (1 - p); otherwise x itself. On the CPU the mask is four 16-bit numbers from each 64-bit random word of
    torch's generator (`torch.randint`), kept where a number is at or above round(p * 65536) of the 65,536 levels, so
    p is rounded to a multiple of 1 / 65536 and the scale is exactly the inverse of the kept share: one random draw
    for four elements, where `F.dropout` on the CPU draws one per element, many times slower. Elsewhere (CUDA draws
    its masks fast), under `torch.compile` (which fuses its own), and for a p that rounds to no level or to all of
    them, it is `F.dropout`. Seeds, resumed generator states and activation checkpointing replay the masks."""
    if not training or p == 0:
        return x
    cut = round(p * DROPOUT_LEVELS)
    if x.device.type != "cpu" or not 0 < cut < DROPOUT_LEVELS or torch.compiler.is_compiling():
        return F.dropout(x, p=p, training=True)
    n = x.numel()
    words = torch.randint(torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max, ((n + 3) // 4,),
                          dtype=torch.int64)
    keep = words.view(torch.int16)[:n].view(x.shape) >= cut - DROPOUT_LEVELS // 2  # int16 runs from -32,768
    return _Dropout.apply(x, keep, DROPOUT_LEVELS / (DROPOUT_LEVELS - cut))


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, p: float, training: bool) -> torch.Tensor:
    """Attention weights from scores (..., Tq, Tk): the mask additive (float) or boolean (True = attend), applied with
    the dtype's finite minimum (not -inf, so a row that attends to nothing stays finite); half-precision scores are
    softmaxed in float32; then `dropout` with probability p. Eager attention and the patterns' eager path both use
    it."""
    dtype = scores.dtype  # the queries' (an additive mask of another dtype may promote the sum)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    elif mask is not None:
        scores = scores + mask
    return dropout(attention_softmax(scores, dtype), p, training)


def attention_softmax(scores: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax over the keys (last dim), in float32 for half-precision scores, returned in `dtype` (default: the
    scores'). The decoding loop's single-query attention uses it on its own (masked) scores."""
    if scores.dtype in (torch.float32, torch.float64):
        weights = scores.softmax(-1)
    else:
        weights = scores.float().softmax(-1)
    return weights if dtype is None or weights.dtype == dtype else weights.to(dtype)


def _padding_rule(attention_mask):
    """A (B, S) padding mask under the rule (an all-padding row attends everywhere); anything else as it is."""
    if not torch.is_tensor(attention_mask) or attention_mask.dim() != 2:
        return attention_mask
    return attend_somewhere(attention_mask)


def key_padding(attention_mask: torch.Tensor | None, query: torch.Tensor, key_length: int) -> torch.Tensor:
    """The (B, Tk) boolean padding mask of the keys, True = real, from what a stack passes a pattern."""
    if attention_mask is None:
        return torch.ones(1, key_length, dtype=torch.bool, device=query.device)
    if attention_mask.dim() != 2:
        raise ValueError(f"a {attention_mask.dim()}D attention mask was given to a long-input attention pattern, "
                         f"which takes the (batch, length) padding mask only; pass attention_mask as 0/1 per token")
    if attention_mask.shape[1] < key_length:
        raise ValueError(f"the padding mask covers {attention_mask.shape[1]} positions but attention has "
                         f"{key_length} keys; pass a mask over the past and the new tokens")
    return attention_mask[:, -key_length:].bool()  # a cache may hold fewer positions than the mask covers


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
                        causal: bool, cache=None):
    """What a stack passes its self-attention layers, built once from the (B, T) padding mask (or a prepared 4D
    mask, which passes through): full attention's masks from transformers; for a long-input pattern the padding mask
    (None without padding), or under flex attention the pattern's block mask."""
    attention_mask = _padding_rule(attention_mask)
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


def cross_attention_mask(config, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                         encoder_hidden_states: torch.Tensor, word_ids: torch.Tensor | None = None,
                         encoder_word_ids: torch.Tensor | None = None):
    """What the decoder passes its cross-attention layers: the source padding (B, S) in the backend's form; with
    `cross_attention_words`, the window of words (`word_window_mask`) from the target's and the source's word
    indices (B, T) and (B, S)."""
    if config.cross_attention_words is not None:
        if config._attn_implementation not in ("eager", "sdpa"):
            raise ValueError(f"cross_attention_words runs under eager or sdpa attention, not "
                             f"{config._attn_implementation!r}: load the model with attn_implementation='sdpa'")
        if word_ids is None or encoder_word_ids is None:
            raise ValueError("cross_attention_words needs the word indices of both sides: pass input_ids (the "
                             "encoder computes its own) and the decoder's input_ids or position_ids")
        return word_window_mask(word_ids, encoder_word_ids, attention_mask, config.cross_attention_words)
    return create_bidirectional_mask(config=config, inputs_embeds=inputs_embeds,
                                     attention_mask=_padding_rule(attention_mask),
                                     encoder_hidden_states=encoder_hidden_states)


def word_window_mask(word_ids: torch.Tensor, encoder_word_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     window: int) -> torch.Tensor:
    """Cross-attention within a window of words: the target token of word i (word_ids (B, T)) sees the source
    tokens of words i - window .. i + window (encoder_word_ids (B, S)), with i clamped to the source's real words (a
    target word past the end reads the last ones), so that every query has real keys (a source of padding alone is
    read as real, the rule). Returns a boolean (B, 1, T, S) mask, True = attend."""
    if attention_mask is None:
        real = torch.ones_like(encoder_word_ids, dtype=torch.bool)
    else:
        real = attend_somewhere(attention_mask.bool())  # an all-padding source is read as all real
    bounds = torch.iinfo(encoder_word_ids.dtype)
    first = encoder_word_ids.masked_fill(~real, bounds.max).amin(-1, keepdim=True)
    last = encoder_word_ids.masked_fill(~real, bounds.min).amax(-1, keepdim=True)
    query = torch.maximum(torch.minimum(word_ids, last), first)  # (B, T): every query reads a real word
    allowed = (encoder_word_ids[:, None, :] - query[:, :, None]).abs() <= window
    return (allowed & real[:, None, :])[:, None]


def read_span(mask: torch.Tensor) -> slice:
    """The stretch of keys that a boolean mask (..., Tq, S) lets any query read, from the first such key to the last:
    attention over that stretch alone (the mask cut to it) gives the same output. A decoding step under a window of
    words reads a few words of a source of any length."""
    read = mask.flatten(0, -2).any(0).nonzero()
    return slice(int(read[0]), int(read[-1]) + 1) if read.numel() else slice(0, mask.shape[-1])


def additive_key_mask(attention_mask: torch.Tensor | None, heads: int, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, S) source padding (1 = real) under the rule -> an additive mask (B * heads, 1, S) in `dtype` (0 where
    attended, the dtype's minimum elsewhere), or None when nothing is masked: the decoding loop's cross-attention."""
    if attention_mask is None:
        return None
    keep = attend_somewhere(attention_mask.bool())
    if bool(keep.all()):
        return None
    additive = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)
    return additive.repeat_interleave(heads, 0)[:, None, :]


__all__ = [
    "additive_key_mask",
    "attend_somewhere",
    "attention_softmax",
    "cross_attention_mask",
    "key_padding",
    "mask_function",
    "masked_softmax",
    "read_span",
    "self_attention_mask",
    "word_window_mask",
]
