"""Export to CTranslate2: `vaswani-export ctranslate2 MODEL OUT [--quantization int8]`.

The model is described with CTranslate2's own Transformer specs (`TransformerEncoderSpec`, `TransformerDecoderSpec`)
and written by its converter, so `ctranslate2.Translator(OUT)` loads it. What carries over:
- pre-LN or post-LN (`normalize_before`; the final norm of each stack when pre-LN), the layer norm epsilon;
- the positions as an explicit table computed by vaswani's own `SinusoidalPositions`, so both layouts (interleaved
  and split) give vaswani's encodings; the table holds `max_positions` rows (default: the larger of 1024 and
  `max_position_embeddings`), which bounds source and output length in CTranslate2;
- the scaled, shared embeddings (CTranslate2 stores a weight that appears several times once), the tied output
  projection and the final logits bias as the projection's bias;
- q/k/v projections fused as CTranslate2 expects (q|k|v for self-attention, q and k|v for cross-attention).

The vocabulary is the tokenizer's pieces by id (`convert_ids_to_tokens`), shared by source and target; ids the
model has beyond the tokenizer get placeholder pieces that the tokenizer never produces. The tokenizer is saved in
OUT beside the model, so `Ctranslate2Generator(OUT)` encodes and decodes as vaswani does.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from . import LineGenerator, UnsupportedExport, check_exportable, require, saved_generation_config

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16")
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_new": "GELUTanh", "silu": "SWISH", "swish": "SWISH"}


def _numpy(tensor: torch.Tensor):
    return tensor.detach().to(torch.float32).cpu().numpy()


def _linear(spec, *modules: torch.nn.Linear) -> None:
    """Sets a CTranslate2 LinearSpec from one Linear, or from several fused along the output dimension."""
    spec.weight = _numpy(torch.cat([m.weight for m in modules]))
    spec.bias = _numpy(torch.cat([m.bias for m in modules]))


def _norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _numpy(norm.weight), _numpy(norm.bias)


def _attention(spec, attention, cross: bool) -> None:
    if cross:  # CTranslate2's cross-attention: the query alone, then keys and values fused
        _linear(spec.linear[0], attention.q_proj)
        _linear(spec.linear[1], attention.k_proj, attention.v_proj)
    else:
        _linear(spec.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
    _linear(spec.linear[-1], attention.o_proj)


def _stack(spec, stack, positions, scale_embedding: bool, encoder: bool) -> None:
    embeddings = spec.embeddings[0] if encoder else spec.embeddings
    embeddings.weight = _numpy(stack.embed_tokens.weight)
    spec.scale_embeddings = scale_embedding
    spec.position_encodings.encodings = positions
    if stack.layer_norm is not None:
        _norm(spec.layer_norm, stack.layer_norm)
    for layer_spec, layer in zip(spec.layer, stack.layers):
        _attention(layer_spec.self_attention, layer.self_attn, cross=False)
        _norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        if not encoder:
            _attention(layer_spec.attention, layer.encoder_attn, cross=True)
            _norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
        _linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
        _norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)


def vocabulary(tokenizer, vocab_size: int) -> list[str]:
    """The pieces of ids 0 .. vocab_size-1: the tokenizer's, then unique placeholders for ids it never produces."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    if len(pieces) > vocab_size:
        raise UnsupportedExport(f"the tokenizer has {len(pieces)} pieces but the model's vocab_size is {vocab_size}; "
                                "export a model trained with this tokenizer")
    return pieces + [f"<vaswani_unused_{i}>" for i in range(len(pieces), vocab_size)]


def build_spec(model, tokenizer, max_positions: int | None = None):
    """The CTranslate2 TransformerSpec of a VaswaniForConditionalGeneration (weights as float32 numpy arrays)."""
    require("ctranslate2", "the CTranslate2 export")
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    check_exportable(config, "CTranslate2")
    max_positions = max_positions or max(1024, config.max_position_embeddings)
    activation = getattr(common_spec.Activation, ACTIVATIONS[config.activation_function])
    sides = {}
    for side, spec_class in (("encoder", transformer_spec.TransformerEncoderSpec),
                             ("decoder", transformer_spec.TransformerDecoderSpec)):
        sides[side] = spec_class(getattr(config, f"{side}_layers"), getattr(config, f"{side}_attention_heads"),
                                 pre_norm=config.normalize_before, activation=activation)
    spec = transformer_spec.TransformerSpec(sides["encoder"], sides["decoder"])

    base = model.get_encoder().embed_positions
    positions = _numpy(base(torch.arange(max_positions), torch.float32))
    with torch.no_grad():
        _stack(spec.encoder, model.model.encoder, positions, config.scale_embedding, encoder=True)
        _stack(spec.decoder, model.model.decoder, positions, config.scale_embedding, encoder=False)
        spec.decoder.projection.weight = _numpy(model.lm_head.weight)
        bias = model.final_logits_bias
        spec.decoder.projection.bias = _numpy(bias[0] if bias is not None else torch.zeros(config.vocab_size))

    pieces = vocabulary(tokenizer, config.vocab_size)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.config.unk_token = tokenizer.unk_token
    spec.config.bos_token = pieces[config.bos_token_id]
    spec.config.eos_token = pieces[config.eos_token_id]
    spec.config.decoder_start_token = pieces[config.decoder_start_token_id]
    spec.config.add_source_bos = spec.config.add_source_eos = False  # the tokenizer's ids already end with </s>
    return spec


def export_ctranslate2(model_dir: str | os.PathLike, output_dir: str | os.PathLike, quantization: str = "float32",
                       max_positions: int | None = None, force: bool = False) -> Path:
    """Writes the CTranslate2 model of the checkpoint folder `model_dir` (and its tokenizer) into `output_dir`."""
    ctranslate2 = require("ctranslate2", "the CTranslate2 export")
    from vaswani.training.generation import load_checkpoint

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is unknown; choose one of {QUANTIZATIONS}")
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()) and not force:
        raise FileExistsError(f"{output_dir} exists and is not empty; choose a new folder or pass --force")
    model, tokenizer = load_checkpoint(model_dir, device="cpu")
    spec = build_spec(model, tokenizer, max_positions)

    class _FromSpec(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    _FromSpec().convert(str(output_dir), quantization=quantization, force=True)
    tokenizer.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)  # length_penalty and limits for Ctranslate2Generator
    return output_dir


class Ctranslate2Generator(LineGenerator):
    """Decodes lines with an exported CTranslate2 model, encoding and decoding them with its saved tokenizer.

    `compute_type` is CTranslate2's ("default": the type the model was saved in). Greedy search is CTranslate2's
    and transformers' alike. Their beam searches differ: CTranslate2 stops once beam_size x patience hypotheses
    have finished and normalises scores by the length without the end token; transformers keeps a hypothesis set of
    num_beams and stops by its early-stop heuristic. With `transformers_beam` (the default) CTranslate2 runs with
    patience 2 and returns 2 x num_beams hypotheses with their summed log-probabilities, and the best is chosen by
    transformers' score (sum / (length with the end token) ** length_penalty); otherwise CTranslate2's own first
    hypothesis is taken (length_penalty as in the checkpoint's generation config)."""

    def __init__(self, folder: str | os.PathLike, device: str = "cpu", compute_type: str = "default",
                 intra_threads: int = 0, transformers_beam: bool = True):
        ctranslate2 = require("ctranslate2", "CTranslate2 inference")
        from vaswani import VaswaniTokenizer

        self.translator = ctranslate2.Translator(str(folder), device=device, compute_type=compute_type,
                                                 intra_threads=intra_threads)
        self.tokenizer = VaswaniTokenizer.from_pretrained(folder)
        self.generation_config = saved_generation_config(folder)
        penalty = self.generation_config.length_penalty
        self.length_penalty = 1.0 if penalty is None else penalty  # transformers' default
        self.transformers_beam = transformers_beam

    def decode(self, sources: list[list[int]], limit: int, num_beams: int = 1) -> list[list[int]]:
        """Generated ids (start token excluded) for token id lists `sources`, at most `limit` new tokens each."""
        tokens = [self.tokenizer.convert_ids_to_tokens(ids) for ids in sources]
        options = dict(beam_size=num_beams, max_decoding_length=limit, max_input_length=0)
        rerank = self.transformers_beam and num_beams > 1
        if rerank:
            options.update(patience=2, num_hypotheses=2 * num_beams, length_penalty=0, return_scores=True)
        else:
            options.update(length_penalty=self.length_penalty)
        results = self.translator.translate_batch(tokens, **options)
        end = self.tokenizer.eos_token
        chosen = []
        for result in results:
            best = result.hypotheses[0]
            if rerank:  # transformers' score: its length counts the end token, where there is one
                scores = [total / (len(tokens) + (len(tokens) < limit)) ** self.length_penalty
                          for tokens, total in zip(result.hypotheses, result.scores)]
                best = result.hypotheses[scores.index(max(scores))]
            chosen.append(self.tokenizer.convert_tokens_to_ids(best + ([end] if len(best) < limit else [])))
        return chosen
