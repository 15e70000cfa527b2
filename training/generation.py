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
from collections.abc import Callable, Sequence
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


def default_max_new_tokens(generation_config, source_length: int) -> int | None:
    """The checkpoint's own limit when its generation config sets one (None: the decoder uses it); otherwise enough
    for a source of `source_length` tokens (2 x its length + 10) instead of the library's 20."""
    if generation_config.max_new_tokens is not None or generation_config.max_length is not None:
        return None
    return 2 * source_length + 10


def generate_in_batches(decode_batch: Callable, tokenizer, lines: Sequence[str], limit_for: Callable,
                        batch_size: int = 32, max_source_length: int | None = None) -> list[str]:
    """One output string per line, in input order, with any decoder (vaswani's `generate`, or the engines of
    vaswani.deploy). Lines are batched by token length (longest first, so memory problems show at once); a blank
    line gives an empty output without decoding. `limit_for(source_tokens)` is a line's limit on new tokens (None:
    the decoder's own); a batch runs with its longest line's limit and each output is cut to its own line's, so that
    it does not depend on its batch (exact for greedy: a longer run only appends). `decode_batch(sources, limit)`
    takes the batch's token id lists and returns the generated ids, start token excluded. Outputs have special
    tokens removed and newlines replaced by spaces."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    outputs = [""] * len(lines)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    if not todo:
        return outputs
    truncate = {"truncation": True, "max_length": max_source_length} if max_source_length else {}
    sources = dict(zip(todo, tokenizer([lines[i] for i in todo], **truncate)["input_ids"]))
    todo.sort(key=lambda i: -len(sources[i]))  # stable: equal lengths keep input order
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        generated = decode_batch([sources[i] for i in batch], limit_for(len(sources[batch[0]])))
        for i, ids in zip(batch, generated):
            own = limit_for(len(sources[i]))
            text = tokenizer.decode(list(ids)[:own] if own is not None else list(ids), skip_special_tokens=True)
            outputs[i] = " ".join(text.splitlines()).strip()
    return outputs


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
    """Generate one output string per input line, in input order (greedy when num_beams == 1), in batches by
    token length (see `generate_in_batches`).

    max_new_tokens: default the checkpoint's generation config, else 2 x source tokens + 10.
    max_source_length: truncate longer sources (tokens, eos kept); default no truncation.
    max_length: instead of max_new_tokens, a limit on decoder tokens counting the start token.
    """
    if num_beams < 1:
        raise ValueError(f"num_beams={num_beams} must be >= 1")

    def limit_for(source_length: int) -> int | None:
        if max_length:
            return None
        return max_new_tokens or default_max_new_tokens(model.generation_config, source_length)

    def decode_batch(sources: list[list[int]], limit: int | None) -> list[list[int]]:
        batch = tokenizer.pad({"input_ids": sources}, return_tensors="pt")
        lengths = {"max_length": max_length} if max_length else {"max_new_tokens": limit} if limit else {}
        generated = model.generate(input_ids=batch["input_ids"].to(model.device),
                                   attention_mask=batch["attention_mask"].to(model.device), num_beams=num_beams,
                                   do_sample=False, **lengths)
        return [ids[1:] for ids in generated.tolist()]  # ids[0] is the decoder start token

    with torch.inference_mode():
        return generate_in_batches(decode_batch, tokenizer, lines, limit_for, batch_size, max_source_length)


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
