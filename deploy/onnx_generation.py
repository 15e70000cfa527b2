"""Generation over the ONNX export: `OnnxGenerator(folder)`, its search in numpy over onnxruntime sessions.

The encoder runs once; the first decoder step runs `decoder_model.onnx` on the start tokens and returns the cache;
every later step runs `decoder_with_past_model.onnx` on the last token and the cache. Greedy search and beam
search follow transformers' `generate` step for step (its beam search keeps 2 x num_beams candidates, finishes a
hypothesis when an end token ranks among the top num_beams, scores it by sum of log-probabilities / generated
length ** length_penalty, and stops a batch item by the same early-stop heuristic), so that both give the same
tokens; `generate_lines` gives the strings that vaswani's `generate_lines` gives.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np

from . import LineGenerator, require, saved_generation_config
from .onnx_export import DECODER_FILE, DECODER_WITH_PAST_FILE, ENCODER_FILE, cache_names

NEG = -1.0e9  # transformers' "impossible" score


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


class OnnxGenerator(LineGenerator):
    """Three onnxruntime sessions over an export folder (see onnx_export), with its config and tokenizer.

    threads: onnxruntime's intra-op threads (0: its default). `generate` works on id arrays, `generate_lines` on
    text."""

    def __init__(self, folder: str | os.PathLike, threads: int = 0,
                 providers: Sequence[str] = ("CPUExecutionProvider",)):
        ort = require("onnxruntime", "ONNX Runtime inference")
        from vaswani import VaswaniTokenizer

        folder = Path(folder)
        missing = [name for name in (ENCODER_FILE, DECODER_FILE, DECODER_WITH_PAST_FILE, "config.json")
                   if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: not a folder written by vaswani-export onnx")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.encoder, self.decoder, self.decoder_with_past = (
            ort.InferenceSession(str(folder / name), options, providers=list(providers))
            for name in (ENCODER_FILE, DECODER_FILE, DECODER_WITH_PAST_FILE))
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.generation_config = saved_generation_config(folder)
        self.layers = config["decoder_layers"]
        self.start_id, self.eos_id = config["decoder_start_token_id"], config["eos_token_id"]
        self.pad_id = config["pad_token_id"] if config["pad_token_id"] is not None else self.eos_id
        penalty = self.generation_config.length_penalty
        self.length_penalty = 1.0 if penalty is None else penalty  # transformers' default
        self.tokenizer = VaswaniTokenizer.from_pretrained(folder)
        self._past_names = cache_names("past_key_values", self.layers)

    # -- the three graphs ------------------------------------------------------------------------------------------
    def _first_step(self, tokens, hidden, mask):
        logits, *presents = self.decoder.run(None, {"input_ids": tokens, "encoder_hidden_states": hidden,
                                                   "encoder_attention_mask": mask})
        return logits[:, -1], presents  # presents: per layer self key, self value, cross key, cross value

    def _next_step(self, tokens, mask, past):
        feeds = {"input_ids": tokens, "encoder_attention_mask": mask, **dict(zip(self._past_names, past))}
        logits, *own = self.decoder_with_past.run(None, feeds)
        for layer in range(self.layers):  # the new self-attention cache; the cross-attention one stays
            past[4 * layer], past[4 * layer + 1] = own[2 * layer], own[2 * layer + 1]
        return logits[:, -1], past

    def _encode(self, input_ids, attention_mask, group: int):
        (hidden,) = self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        return np.repeat(hidden, group, axis=0), np.repeat(attention_mask, group, axis=0)

    # -- search ------------------------------------------------------------------------------------------------------
    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None, num_beams: int = 1,
                 max_new_tokens: int = 20) -> np.ndarray:
        """Token ids (B, T) of the best sequence per input, the start token first and padding after the end, as
        vaswani's `generate(..., do_sample=False)` returns them."""
        input_ids = np.asarray(input_ids, dtype=np.int64)
        attention_mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask, np.int64)
        if num_beams < 1 or max_new_tokens < 1:
            raise ValueError(f"num_beams={num_beams} and max_new_tokens={max_new_tokens} must be >= 1")
        search = self._greedy if num_beams == 1 else partial(self._beam_search, num_beams=num_beams)
        return search(input_ids, attention_mask, max_new_tokens)

    def _greedy(self, input_ids, attention_mask, max_new_tokens):
        hidden, mask = self._encode(input_ids, attention_mask, 1)
        sequences = np.full((len(input_ids), 1), self.start_id, dtype=np.int64)
        unfinished = np.ones(len(input_ids), dtype=bool)
        logits, past = self._first_step(sequences, hidden, mask)
        for _ in range(max_new_tokens):
            tokens = np.where(unfinished, logits.argmax(-1), self.pad_id)
            sequences = np.concatenate([sequences, tokens[:, None]], axis=1)
            unfinished &= tokens != self.eos_id
            if not unfinished.any() or sequences.shape[1] > max_new_tokens:
                break
            logits, past = self._next_step(tokens[:, None], mask, past)
        return sequences

    def _beam_search(self, input_ids, attention_mask, max_new_tokens, num_beams):
        batch, beams, keep = len(input_ids), num_beams, 2 * num_beams
        max_length = max_new_tokens + 1  # counting the start token, as transformers' max_length does
        hidden, mask = self._encode(input_ids, attention_mask, beams)
        fill = self.pad_id or self.eos_id  # transformers' fill after the end (the end token when pad is id 0)
        running = np.full((batch, beams, max_length), fill, dtype=np.int64)
        running[:, :, 0] = self.start_id
        running_scores = np.zeros((batch, beams), dtype=np.float32)
        running_scores[:, 1:] = NEG
        finished = np.full((batch, beams, max_length), fill, dtype=np.int64)
        finished_scores = np.full((batch, beams), NEG, dtype=np.float32)
        finished_lengths = np.zeros((batch, beams), dtype=np.int64)
        is_finished = np.zeros((batch, beams), dtype=bool)
        improvable = np.ones(batch, dtype=bool)
        rows = np.arange(batch)[:, None]

        logits, past = self._first_step(running[:, :, 0].reshape(-1, 1), hidden, mask)
        cur_len = 1
        while True:
            log_probs = _log_softmax(logits.astype(np.float32)).reshape(batch, beams, -1)
            vocab = log_probs.shape[-1]
            scores = (log_probs + running_scores[:, :, None]).reshape(batch, -1)
            top = np.argsort(-scores, axis=1, kind="stable")[:, :keep]  # the 2 x num_beams best continuations
            top_scores = np.take_along_axis(scores, top, axis=1)
            origin, token = top // vocab, top % vocab
            candidates = running[rows, origin].copy()
            candidates[:, :, cur_len] = token
            ends = (token == self.eos_id) | (cur_len + 1 >= max_length)

            # finished: an ending among the top num_beams, length-normalised, merged with the best so far
            normalised = top_scores / (cur_len ** self.length_penalty)  # generated tokens, the end included
            eligible = ends & (np.arange(keep) < beams)[None, :] & improvable[:, None]
            normalised = np.where(eligible, normalised, normalised + NEG)
            merged_scores = np.concatenate([finished_scores, normalised], axis=1)
            best = np.argsort(-merged_scores, axis=1, kind="stable")[:, :beams]
            finished = np.concatenate([finished, candidates], axis=1)[rows, best]
            finished_lengths = np.concatenate(
                [finished_lengths, np.full((batch, keep), cur_len + 1)], axis=1)[rows, best]
            is_finished = np.concatenate([is_finished, eligible], axis=1)[rows, best]
            finished_scores = merged_scores[rows, best]

            # running: the best continuations that did not end
            open_scores = np.where(ends, top_scores + NEG, top_scores)
            chosen = np.argsort(-open_scores, axis=1, kind="stable")[:, :beams]
            running = candidates[rows, chosen]
            running_scores = open_scores[rows, chosen]
            beam_origin = origin[rows, chosen]

            cur_len += 1
            best_possible = running_scores[:, 0] / ((cur_len - 1) ** self.length_penalty)
            # the worst of the num_beams finished, or NEG while fewer than num_beams have finished
            worst_finished = np.where(is_finished.all(1), finished_scores.min(1), NEG)
            improvable &= best_possible > worst_finished
            if not improvable.any() or ends.all():
                break
            flat_origin = (beam_origin + np.arange(batch)[:, None] * beams).reshape(-1)
            for layer in range(self.layers):  # the self-attention cache follows its beams
                past[4 * layer] = past[4 * layer][flat_origin]
                past[4 * layer + 1] = past[4 * layer + 1][flat_origin]
            logits, past = self._next_step(running[:, :, cur_len - 1].reshape(-1, 1), mask, past)

        best = finished[:, 0]
        return best[:, : int(finished_lengths[:, 0].max())]

    # -- ids of a batch (generate_lines comes from LineGenerator) -------------------------------------------------
    def decode(self, sources: list[list[int]], limit: int, num_beams: int = 1) -> list[list[int]]:
        """Generated ids (start token excluded) for token id lists `sources`, at most `limit` new tokens each."""
        width = max(len(ids) for ids in sources)
        input_ids = np.full((len(sources), width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(sources), width), dtype=np.int64)
        for row, ids in enumerate(sources):
            input_ids[row, : len(ids)], attention_mask[row, : len(ids)] = ids, 1
        return [list(ids[1:]) for ids in self.generate(input_ids, attention_mask, num_beams, limit)]
