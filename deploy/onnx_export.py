"""Export to ONNX: `vaswani-export onnx MODEL OUT` writes optimum's seq2seq layout, config and tokenizer beside it.

- `encoder_model.onnx`: input_ids, attention_mask (batch, source) -> last_hidden_state (batch, source, d_model);
- `decoder_model.onnx`: input_ids (batch, target), encoder_hidden_states, encoder_attention_mask -> logits (batch,
  target, vocab) and the cache it starts, `present.N.decoder.{key,value}` (batch, heads, target, head_dim) and
  `present.N.encoder.{key,value}` (batch, heads, source, head_dim) for each decoder layer N;
- `decoder_with_past_model.onnx`: input_ids (batch, 1), encoder_attention_mask and
  `past_key_values.N.{decoder,encoder}.{key,value}` -> logits and `present.N.decoder.{key,value}`, one position
  longer (the encoder's keys and values do not change, so, as in optimum, they are inputs only).

Batch, source and target lengths are dynamic axes. The graphs come from torch's exporter (`torch.onnx.export` with
dynamo, through onnxscript) run on the model as it is, with eager attention (the reference formula), in float32.
optimum's own exporter would be the ecosystem's way, but its release for ONNX (optimum-onnx 0.1.0) requires
transformers < 4.58 (see docs/deploy.md).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from . import check_exportable, require

ENCODER_FILE, DECODER_FILE, DECODER_WITH_PAST_FILE = "encoder_model.onnx", "decoder_model.onnx", \
    "decoder_with_past_model.onnx"
OPSET = 18


def cache_names(prefix: str, layers: int, sides=("decoder", "encoder")) -> list[str]:
    """optimum's names of the cache tensors: `{prefix}.N.{side}.{key,value}`, layer by layer."""
    return [f"{prefix}.{n}.{side}.{kind}" for n in range(layers) for side in sides for kind in ("key", "value")]


class _Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _Decoder(nn.Module):
    """One decoder call and the logits; with `past` (the flat cache tensors, optimum's order), one step on it."""

    def __init__(self, model):
        super().__init__()
        self.decoder, self.lm_head, self.final_logits_bias = model.get_decoder(), model.lm_head, model.final_logits_bias

    def _logits(self, hidden_states):
        logits = self.lm_head(hidden_states)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        out = self.decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                           encoder_attention_mask=encoder_attention_mask, cache=cache, use_cache=True)
        presents = []
        for layer in range(len(self.decoder.layers)):
            for side in (cache.self_attention_cache, cache.cross_attention_cache):
                presents += [side.layers[layer].keys, side.layers[layer].values]
        return (self._logits(out.last_hidden_state), *presents)


class _DecoderWithPast(_Decoder):
    def forward(self, input_ids, encoder_attention_mask, *past):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        layers = len(self.decoder.layers)
        own = [(past[4 * n], past[4 * n + 1]) for n in range(layers)]
        cross = [(past[4 * n + 2], past[4 * n + 3]) for n in range(layers)]
        cache = EncoderDecoderCache(DynamicCache(own), DynamicCache(cross))
        # the encoder output only feeds the cross-attention keys and values, which come from the cache here
        placeholder = past[2].new_zeros(past[2].shape[0], past[2].shape[2], self.decoder.config.d_model)
        out = self.decoder(input_ids=input_ids, encoder_hidden_states=placeholder,
                           encoder_attention_mask=encoder_attention_mask, cache=cache, use_cache=True)
        presents = []
        for layer in cache.self_attention_cache.layers:
            presents += [layer.keys, layer.values]
        return (self._logits(out.last_hidden_state), *presents)


def _example(config, batch=2, source=5, target=3):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, config.vocab_size, (batch, source), generator=generator)
    attention_mask = torch.ones(batch, source, dtype=torch.long)
    attention_mask[1, -2:] = 0  # padding in the example, so that the mask is a real input of the graph
    decoder_ids = torch.randint(4, config.vocab_size, (batch, target), generator=generator)
    return input_ids, attention_mask, decoder_ids


def _export(module, args, path: Path, input_names, output_names, dynamic_shapes) -> None:
    with warnings.catch_warnings():  # the exporter's notes on shared axis names and its own deprecations
        warnings.filterwarnings("ignore", message=".*axis name.*", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        program = torch.onnx.export(module, args, dynamo=True, input_names=input_names, output_names=output_names,
                                    dynamic_shapes=dynamic_shapes, opset_version=OPSET, external_data=False,
                                    verbose=False, report=False)
    program.save(str(path))


def export_onnx(model_dir: str | os.PathLike, output_dir: str | os.PathLike, force: bool = False) -> Path:
    """Writes the three ONNX graphs of the checkpoint folder `model_dir`, its config and its tokenizer into
    `output_dir`."""
    for module, purpose in (("onnx", "the ONNX export"), ("onnxscript", "torch's ONNX exporter")):
        require(module, purpose)
    from torch.export import Dim

    from vaswani.training.generation import load_checkpoint

    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()) and not force:
        raise FileExistsError(f"{output_dir} exists and is not empty; choose a new folder or pass --force")
    model, tokenizer = load_checkpoint(model_dir, device="cpu", attn_implementation="eager")
    check_exportable(model.config, "ONNX")
    model = model.float().eval()
    layers = model.config.decoder_layers
    output_dir.mkdir(parents=True, exist_ok=True)

    batch, source, target, past = Dim("batch"), Dim("encoder_sequence_length"), Dim("decoder_sequence_length"), \
        Dim("past_decoder_sequence_length")
    input_ids, attention_mask, decoder_ids = _example(model.config)
    with torch.no_grad():
        encoder = _Encoder(model).eval()
        hidden = encoder(input_ids, attention_mask)
        _export(encoder, (input_ids, attention_mask), output_dir / ENCODER_FILE,
                ["input_ids", "attention_mask"], ["last_hidden_state"],
                {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}})

        decoder = _Decoder(model).eval()
        _export(decoder, (decoder_ids, hidden, attention_mask), output_dir / DECODER_FILE,
                ["input_ids", "encoder_hidden_states", "encoder_attention_mask"],
                ["logits", *cache_names("present", layers)],
                {"input_ids": {0: batch, 1: target}, "encoder_hidden_states": {0: batch, 1: source},
                 "encoder_attention_mask": {0: batch, 1: source}})

        presents = decoder(decoder_ids, hidden, attention_mask)[1:]
        step = decoder_ids[:, :1]
        past_shapes = [{0: batch, 2: past if i % 4 < 2 else source} for i in range(len(presents))]
        _export(_DecoderWithPast(model).eval(), (step, attention_mask, *presents), output_dir / DECODER_WITH_PAST_FILE,
                ["input_ids", "encoder_attention_mask", *cache_names("past_key_values", layers)],
                ["logits", *cache_names("present", layers, sides=("decoder",))],
                {"input_ids": {0: batch}, "encoder_attention_mask": {0: batch, 1: source},
                 "past": tuple(past_shapes)})

    model.config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "onnx_export.json").write_text(json.dumps({
        "files": [ENCODER_FILE, DECODER_FILE, DECODER_WITH_PAST_FILE], "opset": OPSET, "dtype": "float32",
        "exporter": f"torch {torch.__version__} (dynamo)"}, indent=1), encoding="utf-8")
    return output_dir
