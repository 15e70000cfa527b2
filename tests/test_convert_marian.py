"""MarianMT <-> vaswani conversion: exact parity on random Marian checkpoints (no downloads), the reverse, refusals.

The Marian checkpoints are built here: random MarianMTModel weights (larger than Marian's init, so that every
tensor matters; a non-zero final_logits_bias), a real MarianTokenizer over two tiny SentencePiece models trained
on the sentences below, and opus-mt's generation settings (beam 4, pad banned, forced eos).
"""

import io
import json
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, MarianConfig, MarianMTModel

import vaswani
from vaswani.positions_vaswani import SinusoidalPositions
from vaswani.training.convert_marian import ConversionError, marian_to_vaswani, vaswani_to_marian

# MarianTokenizer asks for sacremoses (punctuation normalisation) on every load; not needed for these checks.
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
_SUBJECTS = ["the cat", "a small dog", "my old friend", "the teacher", "our neighbour", "the little bird"]
_VERBS = ["sees", "likes", "helps", "calls", "follows"]
_OBJECTS = ["the house", "a red ball", "the green garden", "his brother", "the river"]
_SUBJEKTE = ["die Katze", "ein kleiner Hund", "mein alter Freund", "der Lehrer", "unser Nachbar", "der kleine Vogel"]
_VERBEN = ["sieht", "mag", "hilft", "ruft", "folgt"]
_OBJEKTE = ["das Haus", "einen roten Ball", "den gruenen Garten", "seinen Bruder", "dem Fluss"]
ENGLISH = [f"{s} {v} {o}." for s in _SUBJECTS for v, o in zip(_VERBS, _OBJECTS)]
GERMAN = [f"{s} {v} {o}." for s in _SUBJEKTE for v, o in zip(_VERBEN, _OBJEKTE)]
SOURCES = ["the cat sees the house.", "my old friend helps the little bird by the river.", "a dog."]
TARGETS = ["die Katze sieht das Haus.", "mein Freund hilft.", "ein Hund ruft den kleinen Vogel am Fluss."]
# The two models run the same operations in the same order (measured: 0.0 on CPU), so the bound is tight: at
# 1e-5 a layer_norm_eps of 1e-6 instead of Marian's 1e-5 slips through (measured 1.7e-6 to 5.4e-6).
PARITY_RTOL = 1e-6


def _train_piece_model(lines: list[str]) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=40, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2,
    )
    return model.getvalue()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """Marian's tokenizer files as opus-mt ships them: source.spm, target.spm, one vocab.json covering both (</s> 0,
    <unk> 1, <pad> last) and a tokenizer_config.json that, like opus-mt's, does not name the tokenizer class."""
    folder = tmp_path_factory.mktemp("marian-tokenizer")
    vocab = {"</s>": 0, "<unk>": 1}
    for name, lines in (("source.spm", ENGLISH), ("target.spm", GERMAN)):
        (folder / name).write_bytes(_train_piece_model(lines))
        processor = spm.SentencePieceProcessor(model_file=str(folder / name))
        for i in range(processor.get_piece_size()):
            if not (processor.is_control(i) or processor.is_unknown(i)):
                vocab.setdefault(processor.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    return folder


def _vocab_size(tokenizer_dir: Path) -> int:
    return len(json.loads((tokenizer_dir / "vocab.json").read_text()))


def _opus_generation_config(pad: int, eos: int = 0) -> GenerationConfig:
    return GenerationConfig(
        num_beams=4, max_length=16, bad_words_ids=[[pad]], forced_eos_token_id=eos, decoder_start_token_id=pad,
        pad_token_id=pad, eos_token_id=eos, bos_token_id=eos, renormalize_logits=True,
    )


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights far from Marian's init (std 0.02 would make every logit ~0 and hide mistakes); positions kept."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:
                continue
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1.0 + 0.2 * noise if "layer_norm.weight" in name else 0.3 * noise)
        if getattr(model, "final_logits_bias", None) is not None:
            model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))


def make_marian(folder: Path, tokenizer_dir: Path, seed: int = 0, legacy: bool = False, **overrides) -> Path:
    """A random MarianMTModel checkpoint folder with tokenizer and generation settings. `legacy` writes it the way
    old opus-mt repositories are: pytorch_model.bin with position tables and tied copies, generation keys in
    config.json, no generation_config.json."""
    vocab_size = _vocab_size(tokenizer_dir)
    pad = vocab_size - 1
    settings = dict(
        vocab_size=vocab_size, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        activation_function="swish", scale_embedding=True, dropout=0.0, pad_token_id=pad, eos_token_id=0,
        bos_token_id=None, decoder_start_token_id=pad, forced_eos_token_id=0,
    )
    settings.update(overrides)
    model = MarianMTModel(MarianConfig(**settings)).eval()
    _randomise(model, seed)
    with torch.no_grad():  # transformers 5 unties everything when tie_word_embeddings=False: keep one table
        model.model.encoder.embed_tokens.weight.copy_(model.model.shared.weight)
        model.model.decoder.embed_tokens.weight.copy_(model.model.shared.weight)
    generation_config = _opus_generation_config(pad)
    folder.mkdir(parents=True)
    if legacy:
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
        config = {**model.config.to_dict(), **generation_config.to_diff_dict()}
        config.pop("transformers_version", None)
        config["architectures"] = ["MarianMTModel"]
        config.update(normalize_before=False, add_final_layer_norm=False, normalize_embedding=False,
                      static_position_embeddings=True, add_bias_logits=False, extra_pos_embeddings=vocab_size)
        (folder / "config.json").write_text(json.dumps(config))
    else:
        model.generation_config = generation_config
        model.save_pretrained(folder)
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, folder / name)
    return folder


def make_vaswani(folder: Path, vocab_size: int, seed: int = 0, **overrides) -> Path:
    pad = vocab_size - 1
    config = vaswani.VaswaniConfig.from_preset(
        "tiny", vocab_size=vocab_size, dropout=0.0, position_encoding="sinusoidal_split", pad_token_id=pad,
        max_position_embeddings=64,
        eos_token_id=0, bos_token_id=None, decoder_start_token_id=pad, **overrides,
    )
    model = vaswani.VaswaniForConditionalGeneration(config).eval()
    _randomise(model, seed)
    model.generation_config = _opus_generation_config(pad)
    model.save_pretrained(folder)
    return folder


def _batch(tokenizer_dir: Path) -> dict:
    """A padded batch (source and target lengths differ per row); the decoder inputs are the targets shifted right
    after the start token (= pad in Marian), with their own padding mask."""
    from transformers import MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(tokenizer_dir)
    batch = tokenizer(SOURCES, text_target=TARGETS, padding=True, return_tensors="pt")
    labels, pad = batch.pop("labels"), tokenizer.pad_token_id
    decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], pad), labels[:, :-1]], dim=1)
    decoder_attention_mask = torch.cat([torch.ones_like(labels[:, :1]), (labels[:, :-1] != pad).long()], dim=1)
    assert not batch["attention_mask"].all() and not decoder_attention_mask.all(), "the batch must be padded"
    return dict(batch, decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask)


def assert_parity(reference_dir: Path, converted_dir: Path, batch: dict, label: str) -> dict:
    """Logits within PARITY_RTOL (max abs difference over max abs logit) and identical greedy and beam outputs,
    under eager and sdpa, each model with its own folder's generation config. Returns the measured differences."""
    measured = {}
    for implementation in ("eager", "sdpa"):
        reference = AutoModelForSeq2SeqLM.from_pretrained(reference_dir, attn_implementation=implementation).eval()
        converted = AutoModelForSeq2SeqLM.from_pretrained(converted_dir, attn_implementation=implementation).eval()
        assert type(reference) is not type(converted)
        with torch.no_grad():
            expected = reference(**batch).logits
            actual = converted(**batch).logits
        relative = ((actual - expected).abs().max() / expected.abs().max()).item()
        measured[implementation] = relative
        print(f"parity {label} {implementation}: max relative logit difference {relative:.2e}")
        assert relative <= PARITY_RTOL, f"{label} {implementation}: {relative:.2e}"
        source = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        for beams in (1, 4):
            expected_ids = reference.generate(**source, num_beams=beams)
            actual_ids = converted.generate(**source, num_beams=beams)
            assert torch.equal(expected_ids, actual_ids), f"{label} {implementation} beams={beams}"
    return measured


def _generation_settings(folder: Path) -> dict:
    config = GenerationConfig.from_pretrained(folder).to_diff_dict()
    config.pop("transformers_version", None)
    return config


MARIAN_SHAPES = {
    "d16-enc1-dec2-heads2/4-swish": dict(encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                                         decoder_attention_heads=4, activation_function="swish"),
    "d32-enc3-dec1-heads4/2-gelu-untied": dict(d_model=32, encoder_layers=3, decoder_layers=1, encoder_ffn_dim=48,
                                               decoder_ffn_dim=24, encoder_attention_heads=4,
                                               decoder_attention_heads=2, activation_function="gelu",
                                               tie_word_embeddings=False, scale_embedding=False),
    "d16-enc2-dec2-heads4-relu-layerdrop": dict(activation_function="relu", encoder_layerdrop=0.1,
                                                decoder_layerdrop=0.2),
}


@pytest.mark.parametrize("shape", list(MARIAN_SHAPES))
def test_marian_to_vaswani_parity(tmp_path, tokenizer_dir, shape):
    source = make_marian(tmp_path / "marian", tokenizer_dir, seed=len(shape), **MARIAN_SHAPES[shape])
    converted = marian_to_vaswani(source, tmp_path / "vaswani")

    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "vaswani" and "AutoModelForSeq2SeqLM" in config["auto_map"]
    assert config["position_encoding"] == "sinusoidal_split" and config["final_logits_bias"]
    assert config["layer_norm_eps"] == 1e-5 and not config["normalize_before"]
    assert (converted / "modeling_vaswani.py").is_file()
    assert _generation_settings(converted) == _generation_settings(source)
    assert_parity(source, converted, _batch(tokenizer_dir), shape)


def test_converted_folder_loads_marians_tokenizer(tmp_path, tokenizer_dir):
    source = make_marian(tmp_path / "marian", tokenizer_dir)
    converted = marian_to_vaswani(source, tmp_path / "vaswani")
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert type(tokenizer).__name__ == "MarianTokenizer"
    assert json.loads((converted / "tokenizer_config.json").read_text())["tokenizer_class"] == "MarianTokenizer"
    reference = AutoTokenizer.from_pretrained(source)
    assert tokenizer(SOURCES, text_target=TARGETS)["input_ids"] == reference(SOURCES, text_target=TARGETS)["input_ids"]
    assert tokenizer(SOURCES, text_target=TARGETS)["labels"] == reference(SOURCES, text_target=TARGETS)["labels"]


def test_legacy_bin_checkpoint_with_position_tables(tmp_path, tokenizer_dir):
    """Old opus-mt layout: pytorch_model.bin (with tied copies and position tables, which are checked against the
    formula) and generation settings only in config.json."""
    source = make_marian(tmp_path / "marian", tokenizer_dir, legacy=True, encoder_layers=1, decoder_layers=1)
    assert "model.encoder.embed_positions.weight" in torch.load(source / "pytorch_model.bin", weights_only=True)
    converted = marian_to_vaswani(source, tmp_path / "vaswani")
    settings = _generation_settings(converted)
    assert settings["num_beams"] == 4 and settings["bad_words_ids"] == [[_vocab_size(tokenizer_dir) - 1]]
    assert settings["forced_eos_token_id"] == 0
    assert_parity(source, converted, _batch(tokenizer_dir), "legacy-bin")


def test_round_trip_gives_identical_weights(tmp_path, tokenizer_dir):
    for name, shape in (("tied", {}), ("untied", dict(tie_word_embeddings=False))):
        source = make_marian(tmp_path / name / "marian", tokenizer_dir, seed=3, **shape)
        middle = marian_to_vaswani(source, tmp_path / name / "vaswani")
        back = vaswani_to_marian(middle, tmp_path / name / "marian-again")
        original, returned = load_file(source / "model.safetensors"), load_file(back / "model.safetensors")
        assert original.keys() == returned.keys()
        for key in original:
            assert torch.equal(original[key], returned[key]), key
        assert _generation_settings(back) == _generation_settings(source)
        assert type(AutoTokenizer.from_pretrained(back)).__name__ == "MarianTokenizer"


VASWANI_SHAPES = {
    "untied-no-bias": dict(tie_word_embeddings=False, final_logits_bias=False),
    "tied-bias-relu-heads4/2-unscaled": dict(final_logits_bias=True, scale_embedding=False, decoder_attention_heads=2,
                                             encoder_layers=1, decoder_layers=3),
}


@pytest.mark.parametrize("shape", list(VASWANI_SHAPES))
def test_vaswani_to_marian_parity(tmp_path, tokenizer_dir, shape):
    source = make_vaswani(tmp_path / "vaswani", _vocab_size(tokenizer_dir), seed=7, **VASWANI_SHAPES[shape])
    converted = vaswani_to_marian(source, tmp_path / "marian")
    assert json.loads((converted / "config.json").read_text())["model_type"] == "marian"
    if not VASWANI_SHAPES[shape]["final_logits_bias"]:
        assert torch.equal(load_file(converted / "model.safetensors")["final_logits_bias"],
                           torch.zeros(1, _vocab_size(tokenizer_dir)))
    assert_parity(source, converted, _batch(tokenizer_dir), f"reverse-{shape}")


# ------------------------------------------------------------------------------------------------ refusals


def _marian_config_only(folder: Path, **overrides) -> Path:
    folder.mkdir(parents=True)
    MarianConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=49,
                 decoder_start_token_id=49, **overrides).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(share_encoder_decoder_embeddings=False), "share_encoder_decoder_embeddings=False"),
        (dict(decoder_vocab_size=60), "decoder_vocab_size=60"),
        (dict(activation_function="tanh"), "activation_function='tanh'"),
        (dict(eos_token_id=[0, 1]), "eos_token_id=[0, 1]"),
    ],
)
def test_unrepresentable_marian_configs_are_refused(tmp_path, overrides, message):
    source = _marian_config_only(tmp_path / "marian", **overrides)
    with pytest.raises(ConversionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        marian_to_vaswani(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_inputs_are_refused(tmp_path, tokenizer_dir):
    with pytest.raises(ConversionError, match="is not a folder"):
        marian_to_vaswani(tmp_path / "missing", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConversionError, match="no config.json"):
        marian_to_vaswani(tmp_path / "empty", tmp_path / "out")
    no_weights = _marian_config_only(tmp_path / "no-weights")
    with pytest.raises(ConversionError, match="no weights"):
        marian_to_vaswani(no_weights, tmp_path / "out")
    native = make_vaswani(tmp_path / "vaswani", 50)
    with pytest.raises(ConversionError, match="model_type='vaswani', expected 'marian'"):
        marian_to_vaswani(native, tmp_path / "out")
    with pytest.raises(ConversionError, match="model_type='marian', expected 'vaswani'"):
        vaswani_to_marian(no_weights, tmp_path / "out")
    with pytest.raises(ConversionError, match="not an empty folder"):
        marian_to_vaswani(make_marian(tmp_path / "marian", tokenizer_dir), native)


def test_separate_embeddings_and_foreign_position_tables_are_refused(tmp_path, tokenizer_dir):
    untied = make_marian(tmp_path / "untied", tokenizer_dir, tie_word_embeddings=False)
    weights = load_file(untied / "model.safetensors")
    weights["model.decoder.embed_tokens.weight"] = weights["model.decoder.embed_tokens.weight"] + 1.0
    from safetensors.torch import save_file

    save_file(weights, untied / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="vaswani shares one embedding"):
        marian_to_vaswani(untied, tmp_path / "out")

    legacy = make_marian(tmp_path / "legacy", tokenizer_dir, legacy=True)
    state_dict = torch.load(legacy / "pytorch_model.bin", weights_only=True)
    table = state_dict["model.encoder.embed_positions.weight"]
    interleaved = SinusoidalPositions(16, "sinusoidal_interleaved")(torch.arange(table.shape[0]), table.dtype)
    state_dict["model.encoder.embed_positions.weight"] = interleaved
    torch.save(state_dict, legacy / "pytorch_model.bin")
    with pytest.raises(ConversionError, match="model.encoder.embed_positions.weight .* is not the split-sinusoid"):
        marian_to_vaswani(legacy, tmp_path / "out")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(normalize_before=True), "normalize_before=True"),
        (dict(position_encoding="sinusoidal_interleaved"), "position_encoding='sinusoidal_interleaved'"),
        (dict(layer_norm_eps=1e-6), "layer_norm_eps=1e-06"),
        (dict(decoder_start_token_id=None), "decoder_start_token_id=None"),
    ],
)
def test_unrepresentable_vaswani_configs_are_refused(tmp_path, overrides, message):
    folder = tmp_path / "vaswani"
    settings = dict(position_encoding="sinusoidal_split", pad_token_id=99, decoder_start_token_id=99)
    vaswani.VaswaniConfig.from_preset("tiny", **{**settings, **overrides}).save_pretrained(folder)
    with pytest.raises(ConversionError, match=message):
        vaswani_to_marian(folder, tmp_path / "out")


def test_script_converts_and_reports_bad_input_in_one_line(tmp_path, tokenizer_dir, capsys):
    # In-process (a fresh interpreter costs seconds of imports): main() returns the exit status and prints
    # ConversionError as one line, so anything that would have become a traceback fails this test instead.
    from vaswani.training import convert_marian as script

    source = make_marian(tmp_path / "marian", tokenizer_dir, encoder_layers=1, decoder_layers=1)
    assert script.main([str(source), str(tmp_path / "vaswani")]) == 0
    assert script.main([str(tmp_path / "vaswani"), str(tmp_path / "back"), "--to-marian"]) == 0
    assert (tmp_path / "back" / "model.safetensors").is_file()

    capsys.readouterr()
    for argv, message in (
        ([str(tmp_path / "missing"), str(tmp_path / "x")], f"{tmp_path / 'missing'} is not a folder"),
        ([str(source), str(tmp_path / "vaswani")], "exists and is not an empty folder"),
        ([str(source), str(tmp_path / "x"), "--to-marian"], "model_type='marian', expected 'vaswani'"),
    ):
        assert script.main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vaswani-convert-marian: error: ") and message in lines[0]
