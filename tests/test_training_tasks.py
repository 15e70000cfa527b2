"""vaswani.training.tasks: the shipped G2P vocabulary, and the translation task on a user's table (with and without
a header row), trained end to end by scripts/train.py (tests/helpers.py)."""

from __future__ import annotations

import json

from helpers import run_train


def test_shipped_g2p_vocabulary_is_54():
    from vaswani.training.tasks import G2P_VOCAB_SIZE, load_task_data

    data = load_task_data("g2p")
    symbols = {ch for s, _ in data.train_pairs for ch in s} | {p for _, t in data.train_pairs for p in t.split()}
    assert len(symbols) + 4 == G2P_VOCAB_SIZE == 54


def test_translation_task_trains_on_a_headerless_two_column_tsv(train_workspace, tmp_path):
    """A TSV without a header (two columns, as the shipped G2P file) is source and target, for any task."""
    out = tmp_path / "headerless"
    result = run_train(["--train_file", str(train_workspace / "g2p.tsv"), "--tokenizer", str(train_workspace / "tokenizer"),
                   "--preset", "tiny", "--max_steps", "2", "--max_tokens", "150", "--num_beams", "1",
                   "--no_progress_bar", "--no_tensorboard", "--eval_every", "0", "--save_every", "0",
                   "--output_dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "translation" and metrics["steps"] == 2 and {"bleu", "chrf"} <= set(metrics["dev"])


def test_translation_task_on_a_user_tsv_reports_bleu_and_chrf(tmp_path):
    """--train_file with a header (columns named by --source_column/--target_column): BLEU/chrF, a word tokenizer."""
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(12)]
    rows = ["src\ttgt"]
    for _ in range(300):
        sentence = [rng.choice(words) for _ in range(rng.randint(2, 6))]
        rows.append(" ".join(sentence) + "\t" + " ".join(reversed(sentence)))
    data = tmp_path / "pairs.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "mt"
    result = run_train(["--train_file", str(data), "--source_column", "src", "--target_column", "tgt", "--preset", "tiny",
                   "--tokenizer_model_type", "word", "--tokenizer_vocab_size", "16", "--max_steps", "4",
                   "--max_tokens", "200", "--no_progress_bar", "--no_tensorboard", "--num_beams", "2",
                   "--output_dir", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "translation" and {"bleu", "chrf"} <= set(metrics["dev"])
    assert json.loads((out / "generation_config.json").read_text())["num_beams"] == 2
    from huggingface_hub import ModelCard

    results = ModelCard.load(out / "README.md").data.to_dict()["model-index"][0]["results"][0]["metrics"]
    assert {m["type"] for m in results} == {"bleu", "chrf"}
