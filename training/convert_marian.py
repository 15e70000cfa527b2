"""Convert MarianMT (opus-mt) checkpoints to vaswani checkpoints and back, with exact parity.

Marian's models are the paper's post-LN encoder-decoder with split sinusoids ([sin | cos], tensor2tensor's
layout), one embedding shared by encoder, decoder (and, when tied, the output projection) and a fixed bias
added to the logits: everything `VaswaniConfig` can express with `position_encoding="sinusoidal_split"`,
`final_logits_bias=True`, `normalize_before=False` and `layer_norm_eps=1e-5` (Marian hard-codes the
nn.LayerNorm default). What vaswani cannot express is refused with a `ConversionError` naming the field.

    marian_to_vaswani("opus-mt-en-de", "opus-mt-en-de-vaswani")    # weights, config, generation config, tokenizer
    vaswani_to_marian("opus-mt-en-de-vaswani", "back-to-marian")    # the reverse, for a representable model

Weight names (Marian -> vaswani; N is a layer index; vaswani -> Marian is the inverse):
    model.shared.weight                          model.shared.weight (encoder and decoder embed_tokens are tied to it)
    model.{encoder,decoder}.embed_tokens.weight  checked equal to model.shared, then dropped (tied in vaswani)
    model.{encoder,decoder}.embed_positions.weight  checked against the split-sinusoid formula, then dropped
    ...layers.N.{self_attn,encoder_attn}.{q,k,v}_proj  same name
    ...layers.N.{self_attn,encoder_attn}.out_proj      ...layers.N.{self_attn,encoder_attn}.o_proj
    ...layers.N.fc1, ...layers.N.fc2                   ...layers.N.ffn.fc1, ...layers.N.ffn.fc2
    ...layers.N.{self_attn,encoder_attn,final}_layer_norm  same name
    lm_head.weight                               lm_head.weight (only read when tie_word_embeddings=False)
    final_logits_bias                            final_logits_bias (zeros when a checkpoint lacks it)

The tokenizer stays Marian's: its files (source.spm, target.spm, vocab.json, ...) are copied and
tokenizer_config.json names `MarianTokenizer`, which `AutoTokenizer` reads before the model type.

`main` is the command line `vaswani-convert-marian` (also `python scripts/convert_marian.py`):
    vaswani-convert-marian opus-mt-en-de opus-mt-en-de-vaswani
    vaswani-convert-marian opus-mt-en-de-vaswani opus-mt-en-de-again --to-marian
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import GenerationConfig, MarianConfig, MarianMTModel
from transformers.activations import ACT2FN

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.positions_vaswani import SinusoidalPositions

logger = logging.getLogger(__name__)

MARIAN_LAYER_NORM_EPS = 1e-5  # Marian's layers use nn.LayerNorm(d_model): eps is not configurable there
TOKENIZER_FILES = (
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
_EMBEDDING_KEYS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
_POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
# Layer-level renames, applied to the part after `model.{encoder,decoder}.layers.N.`: Marian -> vaswani, and back.
_TO_VASWANI = (
    (re.compile(r"^(self_attn|encoder_attn)\.out_proj\."), r"\1.o_proj."),
    (re.compile(r"^(fc1|fc2)\."), r"ffn.\1."),
)
_TO_MARIAN = (
    (re.compile(r"^(self_attn|encoder_attn)\.o_proj\."), r"\1.out_proj."),
    (re.compile(r"^ffn\.(fc1|fc2)\."), r"\1."),
)
_LAYER_KEY = re.compile(r"^(model\.(?:encoder|decoder)\.layers\.\d+\.)(.+)$")


# Keys that old opus-mt config.json files carry from BART's config and MarianMTModel never reads, with the value
# that describes what it computes. Another value is reported, and converted as Marian computes it.
_LEGACY_KEYS = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
    "add_bias_logits": False,
}


class ConversionError(ValueError):
    """The input is not a checkpoint of the expected kind, or has a feature the other side cannot represent."""


# ----------------------------------------------------------------------------------------------- configs


def marian_config_to_vaswani(marian: MarianConfig) -> VaswaniConfig:
    """The VaswaniConfig computing what `marian` computes; ConversionError for what vaswani can't represent."""
    if not marian.share_encoder_decoder_embeddings:
        raise ConversionError(
            "share_encoder_decoder_embeddings=False: this Marian model has separate encoder and decoder "
            "vocabularies, vaswani shares one embedding between source and target"
        )
    if marian.decoder_vocab_size not in (None, marian.vocab_size):
        raise ConversionError(
            f"decoder_vocab_size={marian.decoder_vocab_size} differs from vocab_size={marian.vocab_size}: "
            f"vaswani has one vocabulary for source and target"
        )
    if marian.is_decoder:
        raise ConversionError("is_decoder=True: a decoder-only MarianForCausalLM, not an encoder-decoder model")
    if isinstance(marian.eos_token_id, list):
        raise ConversionError(
            f"eos_token_id={marian.eos_token_id} is a list; vaswani's config takes one id (put extra stop ids "
            f"into generation_config.json)"
        )
    for side in ("encoder", "decoder"):
        if getattr(marian, f"{side}_layerdrop"):
            # LayerDrop only acts in training; inference and the converted weights are unaffected.
            logger.warning("%s_layerdrop=%s is dropped: vaswani has no LayerDrop (training only)",
                           side, getattr(marian, f"{side}_layerdrop"))
    try:
        return VaswaniConfig(
            vocab_size=marian.vocab_size,
            d_model=marian.d_model,
            encoder_layers=marian.encoder_layers,
            decoder_layers=marian.decoder_layers,
            encoder_attention_heads=marian.encoder_attention_heads,
            decoder_attention_heads=marian.decoder_attention_heads,
            encoder_ffn_dim=marian.encoder_ffn_dim,
            decoder_ffn_dim=marian.decoder_ffn_dim,
            activation_function=marian.activation_function,
            dropout=marian.dropout,
            attention_dropout=marian.attention_dropout,
            activation_dropout=marian.activation_dropout,
            normalize_before=False,  # MarianMTModel is post-LN only (its config has no such switch)
            layer_norm_eps=MARIAN_LAYER_NORM_EPS,
            scale_embedding=marian.scale_embedding,
            tie_word_embeddings=marian.tie_word_embeddings,
            max_position_embeddings=marian.max_position_embeddings,
            position_encoding="sinusoidal_split",
            final_logits_bias=True,
            init_std=marian.init_std,
            pad_token_id=marian.pad_token_id,
            bos_token_id=marian.bos_token_id,
            eos_token_id=marian.eos_token_id,
            decoder_start_token_id=marian.decoder_start_token_id,
            use_cache=marian.use_cache,
            dtype=marian.dtype,
        )
    except ValueError as error:  # e.g. an activation vaswani does not offer, an odd d_model
        raise ConversionError(f"vaswani cannot represent this Marian config: {error}") from None


def vaswani_config_to_marian(config: VaswaniConfig) -> MarianConfig:
    """The MarianConfig computing what `config` computes; ConversionError for what Marian can't represent."""
    if config.normalize_before:
        raise ConversionError("normalize_before=True (pre-LN): MarianMTModel is post-LN only")
    if config.position_encoding != "sinusoidal_split":
        raise ConversionError(
            f"position_encoding={config.position_encoding!r}: Marian computes split sinusoids [sin | cos] only "
            f"(sinusoidal_split)"
        )
    if config.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        raise ConversionError(
            f"layer_norm_eps={config.layer_norm_eps}: Marian's layers hard-code nn.LayerNorm's {MARIAN_LAYER_NORM_EPS}"
        )
    if config.activation_function not in ACT2FN:
        raise ConversionError(f"activation_function={config.activation_function!r} is not one Marian can look up")
    if config.decoder_start_token_id is None:
        raise ConversionError("decoder_start_token_id=None: Marian needs a start id (opus-mt uses the pad id)")
    if config.label_smoothing:
        logger.warning("label_smoothing=%s is dropped: MarianMTModel's loss has none (training only)",
                       config.label_smoothing)
    return MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        max_position_embeddings=config.max_position_embeddings,
        encoder_layers=config.encoder_layers,
        encoder_ffn_dim=config.encoder_ffn_dim,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_layers=config.decoder_layers,
        decoder_ffn_dim=config.decoder_ffn_dim,
        decoder_attention_heads=config.decoder_attention_heads,
        use_cache=config.use_cache,
        activation_function=config.activation_function,
        d_model=config.d_model,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        init_std=config.init_std if config.init_std is not None else config.d_model**-0.5,
        decoder_start_token_id=config.decoder_start_token_id,
        scale_embedding=config.scale_embedding,
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        bos_token_id=config.bos_token_id,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=config.tie_word_embeddings,
        dtype=config.dtype,
    )


# ----------------------------------------------------------------------------------------------- weights


def _check_positions(state_dict: dict, d_model: int) -> None:
    """Old checkpoints carry Marian's position tables; vaswani computes them, so they must equal the formula."""
    for key in _POSITION_KEYS:
        if key not in state_dict:
            continue
        table = state_dict[key]
        expected = SinusoidalPositions(d_model, "sinusoidal_split")(torch.arange(table.shape[0]), torch.float64)
        # Marian builds the table in float64 and casts it to the weight's dtype: allow that rounding only.
        tolerance = 4 * torch.finfo(table.dtype).eps if table.dtype.is_floating_point else 0.0
        error = (table.double() - expected).abs().max().item() if table.shape == expected.shape else float("inf")
        if not error <= tolerance:
            raise ConversionError(
                f"{key} (shape {tuple(table.shape)}) is not the split-sinusoid table Marian computes "
                f"(max difference {error:.3g}); vaswani computes positions and cannot carry a learned or other table"
            )


def _shared_embedding(state_dict: dict, tie_word_embeddings: bool) -> torch.Tensor:
    """The one embedding table Marian uses for source and target, checked to be one table."""
    present = {key: state_dict[key] for key in _EMBEDDING_KEYS if key in state_dict}
    if not tie_word_embeddings and _EMBEDDING_KEYS[1] in present and _EMBEDDING_KEYS[2] in present:
        # transformers 5 drops every tie when tie_word_embeddings=False: Marian then embeds with the encoder's and
        # the decoder's own tables and never reads model.shared.
        present.pop(_EMBEDDING_KEYS[0], None)
    if not present:
        raise ConversionError(f"no token embedding in the checkpoint (looked for {', '.join(_EMBEDDING_KEYS)})")
    (first_key, table), *others = present.items()
    for key, other in others:
        if other.shape != table.shape or not torch.equal(other, table):
            raise ConversionError(
                f"{key} differs from {first_key}: this model embeds source and target with different tables, "
                f"vaswani shares one embedding between encoder and decoder"
            )
    return table


def _rename_layer_key(match: re.Match, renames: tuple) -> str:
    prefix, rest = match.groups()
    for pattern, replacement in renames:
        rest = pattern.sub(replacement, rest)
    return prefix + rest


def marian_state_dict_to_vaswani(state_dict: dict, marian: MarianConfig) -> dict:
    """Marian's tensors under vaswani's names (tied copies included, so that a strict load can check them all)."""
    _check_positions(state_dict, marian.d_model)
    shared = _shared_embedding(state_dict, marian.tie_word_embeddings)
    converted = {
        "model.shared.weight": shared,
        "model.encoder.embed_tokens.weight": shared,
        "model.decoder.embed_tokens.weight": shared,
    }
    if marian.tie_word_embeddings:
        converted["lm_head.weight"] = shared
    elif "lm_head.weight" in state_dict:
        converted["lm_head.weight"] = state_dict["lm_head.weight"]
    else:
        raise ConversionError("tie_word_embeddings=False but the checkpoint has no lm_head.weight")
    bias = state_dict.get("final_logits_bias")
    converted["final_logits_bias"] = bias if bias is not None else shared.new_zeros(1, shared.shape[0])

    unknown = []
    for key, tensor in state_dict.items():
        match = _LAYER_KEY.match(key)
        if match is None:
            if key not in (*_EMBEDDING_KEYS, *_POSITION_KEYS, "lm_head.weight", "final_logits_bias"):
                unknown.append(key)
            continue
        converted[_rename_layer_key(match, _TO_VASWANI)] = tensor
    if unknown:
        raise ConversionError(f"tensors vaswani has no place for: {', '.join(sorted(unknown)[:5])}")
    return converted


def vaswani_state_dict_to_marian(state_dict: dict, config: VaswaniConfig) -> dict:
    """vaswani's tensors under Marian's names; embed_positions are left to Marian, which computes them at init."""
    shared = state_dict["model.shared.weight"]
    converted = {key: shared for key in _EMBEDDING_KEYS}
    converted["lm_head.weight"] = shared if config.tie_word_embeddings else state_dict["lm_head.weight"]
    bias = state_dict.get("final_logits_bias")
    converted["final_logits_bias"] = bias if bias is not None else shared.new_zeros(1, shared.shape[0])
    for key, tensor in state_dict.items():
        match = _LAYER_KEY.match(key)
        if match is None:
            continue
        converted[_rename_layer_key(match, _TO_MARIAN)] = tensor
    return converted


# ----------------------------------------------------------------------------------------------- folders


def _read_config(folder: Path, model_type: str) -> dict:
    if not folder.is_dir():
        raise ConversionError(f"{folder} is not a folder")
    path = folder / "config.json"
    if not path.is_file():
        raise ConversionError(f"{folder} has no config.json: not a {model_type} checkpoint folder")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConversionError(f"{path} is not valid JSON: {error}") from None
    if config.get("model_type") != model_type:
        raise ConversionError(
            f"{path} has model_type={config.get('model_type')!r}, expected {model_type!r}"
        )
    return config


def _weight_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder: safetensors first, else pytorch_model.bin; shards through their
    index."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
        index = folder / f"{name}.index.json"
        if index.is_file():
            return [folder / shard for shard in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    raise ConversionError(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")


def _load_state_dict(folder: Path) -> dict:
    state_dict = {}
    for path in _weight_files(folder):
        if path.name.endswith(".safetensors"):
            state_dict.update(load_file(path))
        else:  # weights_only refuses pickled code: a .bin can't run anything while it loads
            state_dict.update(torch.load(path, map_location="cpu", weights_only=True))
    return state_dict


def _generation_config(folder: Path) -> GenerationConfig:
    """What `from_pretrained` would use: generation_config.json, else the generation keys that old checkpoints
    (opus-mt among them) keep in config.json (num_beams, max_length, bad_words_ids, ...)."""
    if (folder / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(folder)
    else:
        generation_config = GenerationConfig.from_pretrained(
            folder, config_file_name="config.json", _from_model_config=True
        )
    # A fresh object, so that saving it does not mark it as derived from a model config.
    return GenerationConfig.from_dict(
        {k: v for k, v in generation_config.to_diff_dict().items() if k != "transformers_version"}
    )


def _copy_tokenizer(src: Path, dst: Path) -> None:
    """Copies Marian's tokenizer files and names MarianTokenizer in tokenizer_config.json: the converted folder's
    model_type no longer says marian, and AutoTokenizer reads tokenizer_class before the model type."""
    if not (src / "source.spm").is_file() or not (src / "vocab.json").is_file():
        logger.warning("%s has no Marian tokenizer (source.spm, vocab.json): only the model is converted", src)
        return
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    path = dst / "tokenizer_config.json"
    tokenizer_config = json.loads(path.read_text()) if path.is_file() else {}
    tokenizer_config["tokenizer_class"] = "MarianTokenizer"
    path.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")


def _prepare_destination(src: Path, dst: Path) -> None:
    if dst.resolve() == src.resolve():
        raise ConversionError(f"destination {dst} is the source folder; choose a new folder")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ConversionError(f"destination {dst} exists and is not an empty folder; choose a new folder")
    dst.mkdir(parents=True, exist_ok=True)


def marian_to_vaswani(src_dir: str | Path, dst_dir: str | Path) -> Path:
    """
    Reads a MarianMT checkpoint folder (config.json, model.safetensors or pytorch_model.bin, Marian's tokenizer
    files) and writes a vaswani checkpoint folder: safetensors weights, config with code files and auto_map,
    Marian's generation settings in generation_config.json, Marian's tokenizer. Returns the destination.
    Raises ConversionError for a missing or non-Marian folder and for features vaswani can't represent.
    """
    src, dst = Path(src_dir), Path(dst_dir)
    config_dict = _read_config(src, "marian")
    try:
        marian = MarianConfig.from_dict(config_dict)
    except (TypeError, ValueError) as error:
        raise ConversionError(f"{src / 'config.json'} is not a valid Marian config: {error}") from None
    architectures = config_dict.get("architectures") or []
    if any("CausalLM" in name for name in architectures):
        raise ConversionError(f"architectures={architectures}: a decoder-only Marian model, not MarianMTModel")
    for key, computed in _LEGACY_KEYS.items():
        if key in config_dict and config_dict[key] != computed:
            logger.warning("config.json sets %s=%s, which MarianMTModel ignores (it computes %s=%s); converted as "
                           "MarianMTModel computes it", key, config_dict[key], key, computed)
    config = marian_config_to_vaswani(marian)
    state_dict = marian_state_dict_to_vaswani(_load_state_dict(src), marian)
    model = VaswaniForConditionalGeneration(config).to(state_dict["model.shared.weight"].dtype)
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as error:  # missing tensors or wrong shapes: a checkpoint inconsistent with its config
        raise ConversionError(f"the weights do not fit the config: {error}") from None
    model.generation_config = _generation_config(src)

    _prepare_destination(src, dst)
    model.save_pretrained(dst)
    _copy_tokenizer(src, dst)
    return dst


def vaswani_to_marian(src_dir: str | Path, dst_dir: str | Path) -> Path:
    """
    Reads a vaswani checkpoint folder and writes a MarianMT folder that `MarianMTModel.from_pretrained` loads with
    the same outputs; generation_config.json and Marian tokenizer files (when present) go along. Returns the
    destination. Raises ConversionError for what Marian can't represent (pre-LN, interleaved positions,
    layer_norm_eps other than 1e-5, no decoder start id).
    """
    src, dst = Path(src_dir), Path(dst_dir)
    _read_config(src, "vaswani")
    try:
        config = VaswaniConfig.from_pretrained(src)
    except ValueError as error:  # a config VaswaniConfig refuses
        raise ConversionError(f"{src / 'config.json'} is not a valid vaswani config: {error}") from None
    marian = vaswani_config_to_marian(config)  # refuses before the weights are read
    _weight_files(src)  # a clear error when there are none
    model = VaswaniForConditionalGeneration.from_pretrained(src)
    state_dict = vaswani_state_dict_to_marian(model.state_dict(), model.config)
    marian_model = MarianMTModel(marian).to(model.dtype)
    result = marian_model.load_state_dict(state_dict, strict=False)
    leftover = [key for key in result.missing_keys if key not in _POSITION_KEYS] + list(result.unexpected_keys)
    if leftover:
        raise ConversionError(f"weights without a place in MarianMTModel: {', '.join(leftover[:5])}")
    marian_model.generation_config = model.generation_config

    _prepare_destination(src, dst)
    marian_model.save_pretrained(dst)
    _copy_tokenizer(src, dst)
    return dst


__all__ = [
    "ConversionError",
    "marian_config_to_vaswani",
    "marian_state_dict_to_vaswani",
    "marian_to_vaswani",
    "vaswani_config_to_marian",
    "vaswani_state_dict_to_marian",
    "vaswani_to_marian",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-convert-marian",
        description="Convert a MarianMT (opus-mt) checkpoint folder to a vaswani checkpoint folder, or back with "
                    "--to-marian. The weights give the same logits; the generation settings and Marian's tokenizer "
                    "go along. What the other side cannot represent is refused, naming the field.")
    parser.add_argument("src_dir", metavar="SRC_DIR", help="checkpoint folder to read")
    parser.add_argument("dst_dir", metavar="DST_DIR", help="new (or empty) folder to write")
    parser.add_argument("--to-marian", action="store_true", help="read a vaswani folder, write a MarianMT folder")
    return parser


def main(argv=None) -> int:
    """`vaswani-convert-marian`: 0, or 2 after one line `vaswani-convert-marian: error: ...` on stderr."""
    args = build_parser().parse_args(argv)
    convert = vaswani_to_marian if args.to_marian else marian_to_vaswani
    try:
        dst = convert(args.src_dir, args.dst_dir)
    except ConversionError as error:
        print(f"vaswani-convert-marian: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {dst}")
    return 0
