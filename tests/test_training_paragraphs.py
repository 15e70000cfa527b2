"""The paragraph-level G2P task (vaswani.training.paragraphs and its branch of tasks): lines drawn from one side of the
CMUdict split, a tokenizer that keeps the word boundary, the dev metric the loop keeps the best checkpoint by, and a
tiny `vaswani-train --task g2p-paragraph` run end to end (the metric itself: tests/test_training_metrics.py; its
recipe and flags in vaswani-train: tests/test_training_cli.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers import run_group

from vaswani.training.paragraphs import WORD_BOUNDARY, build_lines, join_words, split_words
from vaswani.training.tasks import load_task_data

ROOT = Path(__file__).resolve().parent.parent
LEXICON = {f"W{i}": [f"P{i}"] + ([f"Q{i}"] if i % 3 == 0 else []) for i in range(50)}


@pytest.fixture(scope="module")
def paragraphs():
    """The task on the shipped split with the default 32-128 words per line, few lines."""
    return load_task_data("g2p-paragraph", paragraph_lines=(30, 8))


def test_lines_keep_their_bounds_and_depend_only_on_the_seed():
    lines = build_lines(LEXICON, 40, (3, 7), seed=1)
    assert len(lines) == 40 and {len(split_words(s)) for s, _ in lines} == set(range(3, 8))
    assert build_lines(dict(reversed(LEXICON.items())), 40, (3, 7), seed=1) == lines  # not the lexicon's order
    assert build_lines(LEXICON, 40, (3, 7), seed=2) != lines
    for source, (target,) in lines:
        words, prons = split_words(source), split_words(target)
        assert len(prons) == len(words) and all(p in LEXICON[w] for w, p in zip(words, prons))
    # words are drawn without replacement until all are used: 50 words fill the first lines with no repeat
    first = [w for s, _ in lines for w in split_words(s)][:50]
    assert sorted(first) == sorted(LEXICON)
    with pytest.raises(ValueError, match="min <= max"):
        build_lines(LEXICON, 1, (5, 4))


def test_dev_lines_carry_every_pronunciation_position_by_position():
    for source, references in build_lines(LEXICON, 20, (4, 9), seed=0, all_references=True):
        words = split_words(source)
        assert len(references) == max(len(LEXICON[w]) for w in words)
        by_position = [set(prons) for prons in zip(*(split_words(r) for r in references))]
        assert by_position == [set(LEXICON[w]) for w in words]


def test_task_lines_come_from_their_side_of_the_split(paragraphs):
    words = load_task_data("g2p")
    train_words, dev_words = {w for w, _ in words.train_pairs}, dict(zip(words.dev_sources, words.dev_references))
    assert len(paragraphs.train_pairs) == 30 and len(paragraphs.dev_sources) == 8
    trained = [w for s, _ in paragraphs.train_pairs for w in split_words(s)]
    tested = [w for s in paragraphs.dev_sources for w in split_words(s)]
    assert set(trained) <= train_words and set(tested) <= set(dev_words) and not set(trained) & set(tested)
    sources = paragraphs.dev_sources + [s for s, _ in paragraphs.train_pairs]
    assert all(32 <= len(split_words(s)) <= 128 for s in sources)
    for source, references in zip(paragraphs.dev_sources, paragraphs.dev_references):
        by_position = [set(prons) for prons in zip(*(split_words(r) for r in references))]
        assert by_position == [set(dev_words[w]) for w in split_words(source)]
    # the dev lines are the same whatever the run's seed; the training lines follow it
    other = load_task_data("g2p-paragraph", paragraph_lines=(30, 8), seed=1)
    assert other.dev_sources == paragraphs.dev_sources and other.train_pairs != paragraphs.train_pairs
    assert paragraphs.metric == "wer" and not paragraphs.greater_is_better


def test_tokenizer_keeps_the_boundary_and_round_trips_a_line(paragraphs, tmp_path):
    from vaswani.tokenizer import spell_out
    from vaswani.training.tasks import build_tokenizer, encode_pairs

    tokenizer = build_tokenizer(paragraphs, tmp_path / "tokenizer")
    assert "\u2581" + WORD_BOUNDARY in tokenizer.get_vocab()
    source, target = paragraphs.train_pairs[0]
    encoded = tokenizer(source, text_target=target)
    assert tokenizer.unk_token_id not in encoded["input_ids"] + encoded["labels"]
    assert len(encoded["input_ids"]) == len(spell_out(source).split()) + 1  # one piece per symbol, then eos
    assert len(encoded["labels"]) == len(target.split()) + 1
    assert tokenizer.decode(encoded["labels"], skip_special_tokens=True) == target
    assert tokenizer.decode(encoded["input_ids"], skip_special_tokens=True) == spell_out(source)
    example = encode_pairs(tokenizer, [(source, target)])[0]
    assert example == {"input_ids": encoded["input_ids"], "labels": encoded["labels"]}


def test_the_task_scores_lines_by_word_error_rate(paragraphs):
    from vaswani.training.evaluation import score

    references = paragraphs.dev_references
    perfect = score("g2p-paragraph", [r[0] for r in references], references)
    assert perfect["wer"] == perfect["per"] == 0 and {k for k in perfect if k.startswith("wer_")} >= {"wer_32_63"}
    shifted = [r[0] for r in references[1:]] + [references[0][0]]  # every line another line's words
    assert score("g2p-paragraph", shifted, references)["wer"] > 50


def test_join_and_split_are_inverse():
    assert join_words(["HELLO", "WORLD"]) == "HELLO | WORLD"
    assert split_words(join_words(["HH AH  L OW", "W ER L D"])) == ["HH AH L OW", "W ER L D"]
    assert split_words(" ") == [] and split_words("A | | B") == ["A", "", "B"]


def test_train_end_to_end_on_long_lines(tmp_path):
    """vaswani-train --task g2p-paragraph with the tiny preset and local encoder attention: every line trained on
    (none dropped as too long), the saved generation limit above the longest target, the line metrics in metrics.json
    and the model card."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    result = run_group([sys.executable, str(ROOT / "scripts" / "train.py"), "--task", "g2p-paragraph", "--preset",
                        "tiny", "--paragraph_lines", "12", "3", "--max_steps", "3", "--log_every", "1",
                        "--config_overrides", "encoder_attention_pattern=local,attention_window=16",
                        "--no_progress_bar", "--no_tensorboard", "--output_dir", str(out)],
                       240, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "dropped" not in result.stderr and "step 3/3: loss" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "g2p-paragraph" and metrics["steps"] == 3
    assert {"wer", "per", "loss"} <= set(metrics["dev"]) and any(k.startswith("wer_") for k in metrics["dev"])
    assert [h["step"] for h in metrics["history"]] == [3] and "wer" in metrics["history"][0]
    from vaswani import VaswaniTokenizer

    tokenizer = VaswaniTokenizer.from_pretrained(out)
    data = load_task_data("g2p-paragraph", paragraph_lines=(12, 3))
    longest = max(len(tokenizer(text_target=t)["input_ids"]) for _, t in data.train_pairs)
    assert longest > 256 and json.loads((out / "generation_config.json").read_text())["max_length"] > longest
    assert "Dev (3 lines, beam 1" in result.stdout
    config = json.loads((out / "config.json").read_text())
    assert (config["encoder_attention_pattern"], config["attention_window"]) == ("local", 16)
    card = (out / "README.md").read_text()
    assert "On the dev set (3 lines)" in card and "word-level edit distance" in card and "{{" not in card
