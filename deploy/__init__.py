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
from collections.abc import Sequence
from functools import partial

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
    if getattr(config, "word_boundary_token_id", None) is not None:
        raise UnsupportedExport(
            f"word_boundary_token_id={config.word_boundary_token_id}: the {engine} export places tokens at their "
            "index in the sequence, not at word-aligned positions; serve this model with PyTorch"
        )


class LineGenerator:
    """`generate_lines` for an engine: vaswani's batching and length limits (`generate_in_batches`) over the
    engine's `decode(sources, limit, num_beams)`. The engine sets `tokenizer` and `generation_config` (the
    checkpoint's, saved beside the export)."""

    tokenizer = None
    generation_config = None

    def generate_lines(self, lines: Sequence[str], num_beams: int = 1, batch_size: int = 32,
                       max_new_tokens: int | None = None) -> list[str]:
        """One output per line, in input order, as vaswani's `generate_lines` gives them; greedy when
        num_beams == 1. max_new_tokens: default the checkpoint's generation config, else 2 x source tokens + 10."""
        from vaswani.training.generation import default_max_new_tokens, generate_in_batches

        config = self.generation_config
        own = config.max_new_tokens or (config.max_length - 1 if config.max_length else None)

        def limit_for(source_length: int) -> int:
            return max_new_tokens or default_max_new_tokens(config, source_length) or own

        return generate_in_batches(partial(self.decode, num_beams=num_beams), self.tokenizer, lines, limit_for,
                                   batch_size)

    def decode(self, sources: list[list[int]], limit: int, num_beams: int = 1) -> list[list[int]]:
        raise NotImplementedError


def saved_generation_config(folder):
    """The generation config saved in an export folder, or transformers' defaults where there is none."""
    from pathlib import Path

    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(folder) if Path(folder, "generation_config.json").is_file() \
        else GenerationConfig()
