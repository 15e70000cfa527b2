"""Inference from a saved checkpoint folder: load it, and generate for many lines in batches.

A checkpoint folder is what `save_pretrained` writes for the model and its tokenizer (the training
loop's output, `scripts/finetune.py`'s output, or any Hub seq2seq folder). `load_checkpoint`
goes through the Auto classes; `import vaswani` has registered ours, so no remote code is run.

`generate_lines` sorts the lines by token length so that each batch holds similar lengths (little
padding), generates, and hands the outputs back in input order, one string per line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message is one line meant for the user."""


def load_checkpoint(path: str | os.PathLike, device: str | torch.device | None = None,
                    attn_implementation: str | None = None):
    """(model, tokenizer) from a checkpoint folder or Hub id, the model in eval mode on `device`.

    device: default cuda when available, else cpu. attn_implementation: e.g. "eager" when
    attention weights are wanted (see the model's `output_attentions`).
    Raises CheckpointError for a missing folder, or one without a model or a tokenizer.
    """
    import vaswani  # noqa: F401  registers the Auto classes: our folders load without trust_remote_code
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    name = os.fspath(path)
    local = Path(name)
    if not local.is_dir() and not re.fullmatch(r"[\w.-]+/[\w.-]+", name) or local.is_file():
        # only "owner/name" goes to the Hub; anything else was meant as a local folder
        raise CheckpointError(f"checkpoint folder {name!r} does not exist; pass the output_dir of a training run")
    if local.is_dir() and not (local / "config.json").is_file():
        raise CheckpointError(f"{name!r} has no config.json: not a saved model (pass the folder that "
                              "save_pretrained wrote, e.g. a training run's output_dir)")
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(name, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as error:  # transformers' messages run over several lines
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = "" if local.is_dir() else " (no such local folder; tried the Hub)"
        raise CheckpointError(f"cannot load {name!r}{where}: {first}") from None
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device).eval(), tokenizer


def _default_max_new_tokens(model, source_length: int) -> int | None:
    """The checkpoint's own limit when its generation config sets one; otherwise enough for the
    longest source in the batch (2 x its length + 10, in tokens) instead of the library's 20."""
    config = model.generation_config
    if config.max_new_tokens is not None or config.max_length is not None:
        return None  # generate() uses the checkpoint's setting
    return 2 * source_length + 10


def generate_lines(
    model,
    tokenizer,
    lines: Sequence[str],
    batch_size: int = 32,
    num_beams: int = 1,
    max_new_tokens: int | None = None,
    max_source_length: int | None = None,
    max_length: int | None = None,
) -> list[str]:
    """Generate one output string per input line, in input order (greedy when num_beams == 1).

    Lines are batched by token length (longest first, so memory problems show at once). A blank
    line gives an empty output without running the model. Outputs have special tokens removed
    and any newline replaced by a space, so that printing them keeps one output per line.
    max_new_tokens: default the checkpoint's generation config, else 2 x source tokens + 10.
    max_source_length: truncate longer sources (tokens, eos kept); default no truncation.
    max_length: instead of max_new_tokens, a limit on decoder tokens counting the start token.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if num_beams < 1:
        raise ValueError(f"num_beams={num_beams} must be >= 1")
    outputs = [""] * len(lines)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    if not todo:
        return outputs
    truncate = {"truncation": True, "max_length": max_source_length} if max_source_length else {}
    encoded = tokenizer([lines[i] for i in todo], **truncate)["input_ids"]
    lengths = {i: len(ids) for i, ids in zip(todo, encoded)}
    todo.sort(key=lambda i: -lengths[i])  # stable: equal lengths keep input order
    device = model.device
    with torch.inference_mode():
        for start in range(0, len(todo), batch_size):
            batch_indices = todo[start : start + batch_size]
            batch = tokenizer([lines[i] for i in batch_indices], padding=True, return_tensors="pt", **truncate)
            batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
            limit = None if max_length else max_new_tokens or _default_max_new_tokens(model, lengths[batch_indices[0]])
            lengths_kwargs = {"max_length": max_length} if max_length else {"max_new_tokens": limit} if limit else {}
            generated = model.generate(**batch, num_beams=num_beams, do_sample=False, **lengths_kwargs)
            for i, ids in zip(batch_indices, generated.tolist()):
                if max_new_tokens is None and max_length is None and limit is not None:
                    # each line's own default limit, so that its output does not depend on its batch
                    # (exact for greedy: a longer run only appends); ids[0] is the decoder start token
                    ids = ids[: 1 + _default_max_new_tokens(model, lengths[i])]
                text = tokenizer.decode(ids, skip_special_tokens=True)
                outputs[i] = " ".join(text.splitlines()).strip()
    return outputs
