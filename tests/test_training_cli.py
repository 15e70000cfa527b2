"""vaswani.training.cli (vaswani-train's command line): parsing, the errors it names, the config it builds, the
settings it makes from the task's recipe, and the words it shows at the end."""

from __future__ import annotations

import pytest
from helpers import QUIET, REPO, run_train

from vaswani.training import cli
from vaswani.training.data import default_g2p_file, read_g2p

SHIPPED = REPO / "models" / "vaswani-g2p"


def test_unknown_train_file_format_names_the_formats_taken(tmp_path, capsys):
    data = tmp_path / "pairs.txt"
    data.write_text("a\tb\n")
    with pytest.raises(SystemExit) as error:
        cli.parse_args(["--train_file", str(data)])
    err = capsys.readouterr().err
    assert error.value.code == 2 and "pairs.txt" in err
    assert all(f in err for f in (".tsv", ".csv", ".jsonl", "Hub dataset")), err


def test_missing_train_file_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as error:
        cli.main(["--train_file", "no/such/file.tsv"])
    assert error.value.code == 2
    assert "--train_file 'no/such/file.tsv' does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config_overrides", "d_model"], "is not key=value"),
        (["--config_overrides", "vocab_size=10"], "vocab_size comes from the tokenizer"),
        (["--time_budget", "soon"], "--time_budget"),
        (["--push_to_hub"], "--push_to_hub needs --hub_model_id"),
        (["--tokenizer", "no/such/dir"], "is not a folder"),
        (["--label_smoothing", "1.5"], "must be in [0, 1)"),
        (["--average_last", "3"], "--average_last 3 averages the last 3 checkpoints: keep that many (--keep_last 2)"),
        (["--average_last", "0"], "--average_last 0 must be >= 1"),
        (["--ema_decay", "1"], "--ema_decay 1.0 must be in [0, 1)"),
        (["--max_tokens", "0"], "--max_tokens 0 must be >= 1"),
        (["--mixed_precision", "auto", "--lr", "-1"], "--lr -1.0 must be > 0"),
        (["--teachers", "no/such/model"], "--teachers 'no/such/model' is not a saved model folder"),
        (["--teachers", str(SHIPPED), "--distill_alpha", "0"], "--distill_alpha 0.0 must be in (0, 1]"),
        (["--distill_top_k", "0"], "--distill_top_k 0 must be >= 1"),
    ],
)
def test_bad_arguments_are_clear_errors(args, message, capsys):
    with pytest.raises(SystemExit) as error:
        cli.parse_args(args)
    assert error.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_config_override_names_the_field(train_workspace, tmp_path):
    result = run_train(["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"), *QUIET,
                   "--config_overrides", "d_model=30", "--max_steps", "1", "--output_dir", str(tmp_path / "o")],
                  tmp_path)
    assert result.returncode != 0
    assert "bad model config" in result.stderr and "d_model=30" in result.stderr


def test_a_new_run_over_an_older_one_is_refused_before_its_tokenizer_is_touched(train_workspace, tmp_path):
    state = tmp_path / "o" / "checkpoints"
    (state / "checkpoint-5").mkdir(parents=True)
    (state / "tokenizer").mkdir()
    (state / "tokenizer" / "spm.model").write_bytes(b"the older run's")
    result = run_train(["--train_file", str(train_workspace / "g2p.tsv"), *QUIET, "--max_steps", "1", "--output_dir",
                        str(tmp_path / "o")], tmp_path)
    assert result.returncode != 0
    assert "vaswani-train: error:" in result.stderr and "already holds checkpoints; pass --resume" in result.stderr
    assert (state / "tokenizer" / "spm.model").read_bytes() == b"the older run's"


def test_parse_overrides():
    assert cli.parse_overrides("d_model=128, encoder_layers=2,normalize_before=true,init_std=none,"
                               "activation_function=gelu,dropout=0.25") == {
        "d_model": 128, "encoder_layers": 2, "normalize_before": True, "init_std": None,
        "activation_function": "gelu", "dropout": 0.25}


def test_default_model_is_the_g2p_small_preset():
    """train.py without arguments builds the named preset (the main job's model) with nothing over it."""
    from vaswani import VaswaniConfig
    from vaswani.training.tasks import G2P_VOCAB_SIZE

    args = cli.parse_args([])
    assert args.task == "g2p" and args.preset == "g2p-small" and args.overrides == {}
    config = cli.build_config(args, G2P_VOCAB_SIZE)
    assert config.to_dict() == VaswaniConfig.from_preset("g2p-small", vocab_size=G2P_VOCAB_SIZE).to_dict()
    assert (config.d_model, config.encoder_layers, config.encoder_ffn_dim, config.decoder_ffn_dim) == (128, 3, 512, 512)
    assert config.dropout == 0.0 and config.label_smoothing == 0.1


def test_flag_defaults_are_the_settings_defaults_except_the_task_recipe():
    from vaswani.training.loop import TrainingSettings, resolve_mixed_precision

    for task, argv in (("g2p", []), ("translation", ["--task", "translation"]),
                       ("g2p-paragraph", ["--task", "g2p-paragraph"])):
        settings = vars(cli.make_settings(cli.parse_args(argv)))
        plain = vars(TrainingSettings(output_dir="outputs/g2p"))
        recipe = {k: v for k, v in cli.TASK_DEFAULTS[task].items() if k in plain}
        recipe["mixed_precision"] = resolve_mixed_precision(recipe["mixed_precision"])  # "auto", as this machine has it
        assert settings == {**plain, **recipe}, task
        assert recipe.keys() == cli.TASK_DEFAULTS[task].keys() - {"preset"}


def test_words_shown_after_g2p_training_are_not_in_the_training_file():
    lexicon = read_g2p(default_g2p_file())
    assert [w for w in cli.G2P_NEW_WORDS if w in lexicon] == []


def test_paragraph_task_recipe_and_overrides():
    args = cli.parse_args(["--task", "g2p-paragraph", "--config_overrides",
                           "encoder_attention_pattern=local,attention_window=64"])
    assert args.preset == "g2p-paragraph" and args.max_tokens >= args.max_source_length > 1300
    config = cli.build_config(args, 55)
    assert (config.encoder_attention_pattern, config.attention_window) == ("local", 64)
    assert config.max_position_embeddings >= 1300 and config.d_model == 128
    assert cli.make_settings(args).max_source_length == args.max_source_length


@pytest.mark.parametrize("argv, message", [
    (["--paragraph_words", "9", "3"], "--paragraph_words 9 3"),
    (["--paragraph_lines", "10", "0"], "--paragraph_lines 10 0"),
])
def test_bad_paragraph_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--task", "g2p-paragraph", *argv])
    assert message in capsys.readouterr().err
