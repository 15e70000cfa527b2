"""Inference from a saved checkpoint folder: load it, and generate for many lines in batches.

A checkpoint folder is what `save_pretrained` writes for the model and its tokenizer (the training
loop's output, `vaswani-finetune`'s output, or any Hub seq2seq folder). `load_checkpoint`
goes through the Auto classes; `import vaswani` has registered ours, so no remote code is run.

`generate_lines` sorts the lines by token length so that each batch holds similar lengths (little
padding), generates, and hands the outputs back in input order, one string per line.

`main` is the command line `vaswani-generate` (also `python scripts/generate.py`):
    echo TRANSFORMER | vaswani-generate OUT             # G2P: prints T R AE N S F AO R M ER
    vaswani-generate OUT --input words.txt --num_beams 5 --batch_size 64 > phonemes.txt
Lines come from --input FILE or stdin and are printed in input order (a blank line prints a blank line).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-generate",
        description="Generate with a trained checkpoint: one input per line in, one output per line out, in order. "
                    "Greedy by default, beam search with --num_beams.")
    parser.add_argument("checkpoint", help="a folder written by save_pretrained (model + tokenizer), or a Hub id")
    parser.add_argument("--input", metavar="FILE", help="UTF-8 text, one input per line (default: stdin)")
    parser.add_argument("--batch_size", type=int, default=64, help="lines per generate call")
    parser.add_argument("--num_beams", type=int, default=1, help="1: greedy; more: beam search")
    parser.add_argument("--max_new_tokens", type=int, default=None,
                        help="default: the checkpoint's generation config, else 2 x source tokens + 10")
    parser.add_argument("--max_source_length", type=int, default=None, help="truncate longer inputs (tokens)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="int8: torchao's dynamic int8 linear layers (CPU; needs pip install \"vaswani[export]\")")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for torch (default: all)")
    return parser


def main(argv=None) -> int:
    """`vaswani-generate`: prints one output line per input line; a bad checkpoint or input ends with one line
    `error: ...` on stderr (exit status 1)."""
    import transformers

    args = build_parser().parse_args(argv)
    transformers.logging.disable_progress_bar()  # stderr stays for errors
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.input is not None:
        try:
            with open(args.input, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            sys.exit(f"error: cannot read --input {args.input!r}: {getattr(error, 'strerror', None) or error}")
    else:
        lines = sys.stdin.read().splitlines()
    try:
        model, tokenizer = load_checkpoint(args.checkpoint, device=args.device)
        if args.quantize == "int8":
            from vaswani.deploy.quantization import quantize_int8

            quantize_int8(model)
        outputs = generate_lines(model, tokenizer, lines, batch_size=args.batch_size, num_beams=args.num_beams,
                                 max_new_tokens=args.max_new_tokens, max_source_length=args.max_source_length)
    except (CheckpointError, ValueError, ImportError) as error:
        sys.exit(f"error: {error}")
    sys.stdout.write("".join(output + "\n" for output in outputs))
    sys.stdout.flush()
    return 0
