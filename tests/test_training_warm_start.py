"""vaswani.training.warm_start and `vaswani-train --init_from`: a run started from a word-level G2P model folder with
a tokenizer that gained the paragraph task's word boundary."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import make_tiny_checkpoint, run_group

from vaswani.training import cli
from vaswani.training.warm_start import warm_start

ROOT = Path(__file__).resolve().parent.parent
# A word-level model of its own kind (no preset has these), so a config that came from the folder shows.
WORD_MODEL = dict(d_model=24, encoder_ffn_dim=40, decoder_ffn_dim=40, normalize_before=True, final_logits_bias=True)


@pytest.fixture(scope="module")
def word_model(tmp_path_factory, g2p_sample):
    """A word-level G2P folder (tokenizer of one piece per letter and phoneme) with a random final logits bias."""
    import vaswani

    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("word_model"), g2p_sample, **WORD_MODEL)
    model = vaswani.VaswaniForConditionalGeneration.from_pretrained(folder)
    with torch.no_grad():
        model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(0))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def paragraph_tokenizer(tmp_path_factory, g2p_sample):
    from vaswani.training.tasks import build_tokenizer, load_task_data

    data = load_task_data("g2p-paragraph", str(g2p_sample), paragraph_words=(3, 6), paragraph_lines=(40, 2))
    return build_tokenizer(data, tmp_path_factory.mktemp("paragraph_tokenizer"))


def _fresh(folder, vocab_size, **overrides):
    import vaswani

    config = vaswani.VaswaniConfig.from_pretrained(folder)
    return vaswani.VaswaniForConditionalGeneration(vaswani.VaswaniConfig.from_dict(
        {**config.to_dict(), "vocab_size": vocab_size, **overrides}))


def test_token_rows_are_copied_by_piece_and_the_rest_whole(word_model, paragraph_tokenizer):
    import vaswani

    source = vaswani.VaswaniForConditionalGeneration.from_pretrained(word_model)
    source_pieces = vaswani.VaswaniTokenizer.from_pretrained(word_model).convert_ids_to_tokens(
        list(range(source.config.vocab_size)))
    model = _fresh(word_model, len(paragraph_tokenizer))
    fresh_boundary = model.model.shared.weight[paragraph_tokenizer.convert_tokens_to_ids("\u2581|")].clone()
    started = warm_start(model, paragraph_tokenizer, word_model)
    assert started == {"copied": len(paragraph_tokenizer) - 1, "new": ["\u2581|"]}
    pieces = paragraph_tokenizer.convert_ids_to_tokens(list(range(len(paragraph_tokenizer))))
    assert pieces[:4] == source_pieces[:4] and pieces[4:] != source_pieces[4:]  # the ids moved: a copy would be wrong
    for i, piece in enumerate(pieces):
        if piece in source_pieces:
            j = source_pieces.index(piece)
            assert torch.equal(model.model.shared.weight[i], source.model.shared.weight[j]), piece
            assert model.final_logits_bias[0, i] == source.final_logits_bias[0, j], piece
        else:
            assert torch.equal(model.model.shared.weight[i], fresh_boundary)
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()  # still tied
    theirs = source.state_dict()
    by_token = ("final_logits_bias", "lm_head.weight", "model.shared.weight", "model.encoder.embed_tokens.weight",
                "model.decoder.embed_tokens.weight")
    for name, tensor in model.state_dict().items():
        assert name in by_token or torch.equal(tensor, theirs[name]), name


def test_a_different_model_or_folder_is_refused(word_model, paragraph_tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"encoder\.layers\.0\..*shape"):
        warm_start(_fresh(word_model, len(paragraph_tokenizer), encoder_ffn_dim=48), paragraph_tokenizer, word_model)
    with pytest.raises(ValueError, match="no model.safetensors"):
        warm_start(_fresh(word_model, len(paragraph_tokenizer)), paragraph_tokenizer, tmp_path)


def test_init_from_takes_the_folder_config_with_overrides(word_model, capsys):
    args = cli.parse_args(["--task", "g2p-paragraph", "--init_from", str(word_model), "--config_overrides",
                           "max_position_embeddings=2048,encoder_attention_pattern=local,attention_window=64"])
    assert args.preset is None
    config = cli.build_config(args, 60)
    assert (config.d_model, config.normalize_before, config.final_logits_bias) == (24, True, True)
    assert config.vocab_size == 60
    assert (config.encoder_attention_pattern, config.attention_window, config.max_position_embeddings) == \
        ("local", 64, 2048)
    with pytest.raises(SystemExit):
        cli.parse_args(["--task", "g2p-paragraph", "--init_from", str(word_model), "--preset", "tiny"])
    assert "drop --preset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["--init_from", str(word_model / "nowhere")])
    assert "not a saved model folder" in capsys.readouterr().err


def test_train_warm_started_paragraph_model(word_model, g2p_sample, tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    result = run_group([sys.executable, str(ROOT / "scripts" / "train.py"), "--task", "g2p-paragraph", "--train_file",
                        str(g2p_sample), "--dev_percent", "10", "--init_from", str(word_model), "--paragraph_words",
                        "3", "6", "--paragraph_lines", "40", "2", "--max_steps", "2", "--no_progress_bar",
                        "--no_tensorboard", "--output_dir", str(out)],
                       240, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"warm start from {word_model}: " in result.stdout and "new pieces ['\u2581|']" in result.stdout
    config = json.loads((out / "config.json").read_text())
    assert (config["d_model"], config["normalize_before"], config["final_logits_bias"]) == (24, True, True)
    assert json.loads((out / "training_args.json").read_text())["init_from"] == str(word_model)
