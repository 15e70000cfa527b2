"""`vaswani.deploy`: a trained vaswani checkpoint outside PyTorch, and quantized inside it.

- ctranslate2_export: `vaswani-export ctranslate2 MODEL OUT` writes a CTranslate2 model (float32, int8, ...) built
  with CTranslate2's own Transformer spec; `Ctranslate2Generator` decodes lines with it.
- onnx_export: `vaswani-export onnx MODEL OUT` writes optimum's seq2seq layout (encoder_model.onnx, decoder_model.onnx,
  decoder_with_past_model.onnx) with the config and tokenizer beside them.
- onnx_generation: `OnnxGenerator`, greedy and beam search over onnxruntime sessions with the key/value cache.
- quantization: torchao's dynamic int8 quantization of the linear layers, for PyTorch inference.

The engines are optional: `pip install "vaswani[export]"`. Each module imports its engine when it is used, and a
missing one raises `MissingExportDependency` naming that command.
"""

from __future__ import annotations

import importlib

EXPORT_EXTRA = 'pip install "vaswani[export]"'


class MissingExportDependency(ImportError):
    """An optional engine (ctranslate2, onnx, onnxscript, onnxruntime, torchao) is not installed."""


class UnsupportedExport(ValueError):
    """A checkpoint whose configuration the target engine cannot carry; the message names the field."""


def require(module: str, purpose: str):
    """Imports `module`, or raises MissingExportDependency naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExportDependency(
            f"{purpose} needs the Python package {module.split('.')[0]!r}, which is not installed ({error}); "
            f"install the export extra: {EXPORT_EXTRA}"
        ) from None


def check_exportable(config, engine: str) -> None:
    """Raises UnsupportedExport for a configuration that no exporter here carries (a model that is not vaswani)."""
    model_type = getattr(config, "model_type", None)
    if model_type != "vaswani":
        hint = {"marian": "; convert it first with vaswani-convert-marian, or use CTranslate2's own "
                          "ct2-transformers-converter"}.get(model_type, "")
        raise UnsupportedExport(f"model_type={model_type!r}: {engine} export takes vaswani checkpoints{hint}")
    for side in ("encoder", "decoder"):  # long-input attention patterns, where a config has them
        pattern = getattr(config, f"{side}_attention_pattern", "full")
        if pattern != "full":
            raise UnsupportedExport(
                f"{side}_attention_pattern={pattern!r}: the {engine} export carries full attention only; "
                f"train or fine-tune with {side}_attention_pattern='full', or serve this model with PyTorch"
            )


def generate_lines_with(decode_batch, tokenizer, lines, batch_size: int = 32, max_new_tokens: int | None = None):
    """One output string per line, in order, as vaswani's `generate_lines` gives them, with another engine's decoder:
    lines sorted by token length into batches, a blank line gives an empty output, and the default limit is
    2 x source tokens + 10 new tokens per line. `decode_batch(sources, limit)` takes the batch's token id lists and a
    limit on new tokens and returns the generated id lists (start token excluded)."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    outputs = [""] * len(lines)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    sources = {i: tokenizer(lines[i])["input_ids"] for i in todo}
    todo.sort(key=lambda i: -len(sources[i]))  # stable: equal lengths keep input order
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        generated = decode_batch([sources[i] for i in batch], max_new_tokens or 2 * len(sources[batch[0]]) + 10)
        for i, ids in zip(batch, generated):
            own_limit = max_new_tokens or 2 * len(sources[i]) + 10  # each line's own default, whatever its batch
            text = tokenizer.decode(list(ids)[:own_limit], skip_special_tokens=True)
            outputs[i] = " ".join(text.splitlines()).strip()
    return outputs
