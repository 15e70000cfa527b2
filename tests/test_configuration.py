import pytest
from transformers import AutoConfig

import vaswani
from vaswani import VaswaniConfig


def test_defaults_are_the_papers_base_model():
    c = VaswaniConfig()
    assert (c.d_model, c.encoder_layers, c.decoder_layers) == (512, 6, 6)
    assert (c.encoder_attention_heads, c.decoder_attention_heads) == (8, 8)
    assert (c.encoder_ffn_dim, c.decoder_ffn_dim) == (2048, 2048)
    assert c.dropout == 0.1 and c.activation_function == "relu"
    assert not c.normalize_before and c.scale_embedding and c.tie_word_embeddings
    assert c.position_encoding == "sinusoidal_interleaved"
    assert c.is_encoder_decoder and c.model_type == "vaswani"


def test_presets_and_overrides():
    big = VaswaniConfig.from_preset("big")
    assert (big.d_model, big.encoder_attention_heads, big.encoder_ffn_dim, big.dropout) == (1024, 16, 4096, 0.3)
    tiny = VaswaniConfig.from_preset("tiny", d_model=32)
    assert tiny.d_model == 32 and tiny.encoder_layers == 2
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        VaswaniConfig.from_preset("huge")
    # the main job's model: the g2p layers at half the width, pre-LN, no dropout, label smoothing
    small, g2p = VaswaniConfig.from_preset("g2p-small").to_dict(), VaswaniConfig.from_preset("g2p").to_dict()
    changed = {k: small[k] for k in small if small[k] != g2p[k]}
    assert changed == dict(d_model=128, encoder_ffn_dim=512, decoder_ffn_dim=512, normalize_before=True, dropout=0.0,
                           label_smoothing=0.1)


def test_auto_config_for_model():
    c = AutoConfig.for_model("vaswani", d_model=64, encoder_attention_heads=4, decoder_attention_heads=4)
    assert isinstance(c, VaswaniConfig) and c.d_model == 64
    # the decoder's sizes are what caches read
    text = c.get_text_config(decoder=True)
    assert text.num_hidden_layers == c.decoder_layers


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=30), "d_model=30 is not divisible by encoder_attention_heads=8"),
        (dict(d_model=32, decoder_attention_heads=5), "d_model=32 is not divisible by decoder_attention_heads=5"),
        (dict(d_model=15, encoder_attention_heads=5, decoder_attention_heads=5), "d_model=15 is odd"),
        (dict(activation_function="tanh"), "activation_function='tanh' is unknown"),
        (dict(position_encoding="learned"), "position_encoding='learned' is unknown"),
        (dict(dropout=1.0), r"dropout=1.0 is outside \[0, 1\)"),
        (dict(attention_dropout=-0.1), r"attention_dropout=-0.1 is outside \[0, 1\)"),
        (dict(activation_dropout=1.5), r"activation_dropout=1.5 is outside"),
        (dict(label_smoothing=1.0), r"label_smoothing=1.0 is outside"),
        (dict(vocab_size=0), "vocab_size=0 must be a positive integer"),
        (dict(encoder_layers=-1), "encoder_layers=-1 must be a positive integer"),
        (dict(decoder_ffn_dim=0), "decoder_ffn_dim=0 must be a positive integer"),
        (dict(vocab_size=3), r"eos_token_id=3 is outside the vocabulary \[0, 3\)"),
        (dict(pad_token_id=37000), "pad_token_id=37000 is outside the vocabulary"),
        (dict(decoder_start_token_id=-1), "decoder_start_token_id=-1 is outside the vocabulary"),
        (dict(encoder_attention_pattern="sparse"), r"encoder_attention_pattern='sparse' is unknown; choose one of "
                                                   r"\('full', 'local', 'block_sparse', 'linear'\)"),
        (dict(decoder_attention_pattern="window"), "decoder_attention_pattern='window' is unknown"),
        (dict(attention_window=0), "attention_window=0 must be a positive integer"),
        (dict(sparse_block_size=0), "sparse_block_size=0 must be a positive integer"),
        (dict(sparse_global_tokens=-2), "sparse_global_tokens=-2 must be 0 or more"),
    ],
)
def test_invalid_configs_raise_value_error_naming_field_and_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VaswaniConfig(**kwargs)


def test_generation_settings_are_not_config_fields():
    assert "num_beams" not in VaswaniConfig().to_dict()


def test_save_load_round_trip(tmp_path):
    c = VaswaniConfig.from_preset("tiny", normalize_before=True, position_encoding="sinusoidal_split",
                                  encoder_attention_pattern="block_sparse", decoder_attention_pattern="linear",
                                  attention_window=7, sparse_block_size=5, sparse_global_tokens=2)
    c.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, vaswani.VaswaniConfig)
    drop = lambda d: {k: v for k, v in d.items() if k != "_name_or_path"}  # noqa: E731
    assert drop(loaded.to_dict()) == drop(c.to_dict())
