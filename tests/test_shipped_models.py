"""The models the repository ships (models/): small Hub-ready folders that load with `from_pretrained`, with or
without the package, do their task, and whose model cards give figures that scoring them again reproduces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import REFUSE_VASWANI
from safetensors import safe_open

G2P = Path(__file__).resolve().parent.parent / "models" / "vaswani-g2p"
# Common dictionary words with one pronunciation in the shipped CMUdict split; any decent G2P model gets them right.
WORDS = {"WORLD": "W ER L D", "COMPUTER": "K AH M P Y UW T ER", "PHONE": "F OW N", "MUSIC": "M Y UW Z IH K",
         "SPEECH": "S P IY CH", "WATER": "W AO T ER"}


def test_the_words_have_one_pronunciation_in_cmudict():
    from vaswani.training.data import default_g2p_file, read_g2p

    lexicon = read_g2p(default_g2p_file())
    assert {word: lexicon[word] for word in WORDS} == {word: [p] for word, p in WORDS.items()}


def _pronounce(model, tokenizer, words):
    batch = tokenizer(list(words), return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch)
    return [" ".join(p.split()) for p in tokenizer.batch_decode(out, skip_special_tokens=True)]


def test_the_g2p_folder_is_small_and_stores_16_bit_weights():
    files = [f for f in G2P.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) < 20e6
    assert not {"checkpoints", "runs", "train_log.jsonl", "training_args.json"} & {f.name for f in G2P.iterdir()}
    with safe_open(G2P / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert json.loads((G2P / "config.json").read_text(encoding="utf-8"))["dtype"] == "float32"


def test_the_g2p_model_pronounces_words():
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani  # noqa: F401  registers the classes: the Auto API without remote code

    model = AutoModelForSeq2SeqLM.from_pretrained(G2P).eval()
    tokenizer = AutoTokenizer.from_pretrained(G2P)
    assert model.dtype == torch.float32
    assert _pronounce(model, tokenizer, WORDS) == list(WORDS.values())


CLEAN_LOAD = REFUSE_VASWANI + textwrap.dedent(
    """
    import json

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder, words = sys.argv[1], sys.argv[2:]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert model.__class__.__module__.startswith("transformers_modules."), model.__class__.__module__
    out = model.generate(**tokenizer(words, return_tensors="pt", padding=True))
    print(json.dumps([" ".join(p.split()) for p in tokenizer.batch_decode(out, skip_special_tokens=True)]))
    """
)


def test_the_g2p_model_loads_with_its_own_code_where_vaswani_is_not_installed(tmp_path):
    script = tmp_path / "load.py"
    script.write_text(CLEAN_LOAD)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script), str(G2P), *WORDS], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == list(WORDS.values())


def test_the_g2p_card_gives_the_figures_of_the_shipped_weights():
    """Scored again here on the dev set the card names (beam and length limit from the folder's generation
    config), the shipped weights give the card's WER and PER."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani  # noqa: F401
    from vaswani.training.tasks import load_task_data

    metrics = json.loads((G2P / "metrics.json").read_text(encoding="utf-8"))
    card = (G2P / "README.md").read_text(encoding="utf-8")
    assert f"| WER (%) | {metrics['dev']['wer']:.2f} |" in card and f"| PER (%) | {metrics['dev']['per']:.2f} |" in card
    assert metrics["stored_dtype"] == "float16" and "stored in float16" in card
    data = load_task_data("g2p")
    assert len(data.dev_sources) == metrics["dev"]["examples"]
    model = AutoModelForSeq2SeqLM.from_pretrained(G2P).eval()
    tokenizer = AutoTokenizer.from_pretrained(G2P)
    predictions = []
    for start in range(0, len(data.dev_sources), 512):
        predictions += _pronounce(model, tokenizer, data.dev_sources[start : start + 512])
    wrong = sum(p not in refs for p, refs in zip(predictions, data.dev_references))
    assert 100 * wrong / len(predictions) == pytest.approx(metrics["dev"]["wer"], abs=0.05)


PARAGRAPH = G2P.parent / "vaswani-g2p-paragraph"
# 64 everyday words with one pronunciation each in the shipped CMUdict split: a 64-word line.
LINE = ("PEOPLE WORLD WATER MUSIC PHONE SPEECH COMPUTER HOUSE GARDEN EVENING SUMMER WINTER MOUNTAIN RIVER FOREST CITY "
        "STREET SCHOOL STUDENT MOTHER FATHER SISTER BROTHER FRIEND HOSPITAL KITCHEN TABLE WINDOW DOOR PAPER PENCIL "
        "LETTER NUMBER MONEY MARKET COFFEE BUTTER CHEESE APPLE ORANGE BANANA DINNER LUNCH TRAIN PLANE TICKET STATION "
        "ISLAND OCEAN BEACH CLOUD THUNDER LIGHTNING ANSWER STORY SCIENCE LANGUAGE NATURE ELEPHANT TIGER MONKEY RABBIT "
        "TURTLE DRAGON").split()


def test_the_line_has_64_words_of_one_pronunciation():
    from vaswani.training.data import default_g2p_file, read_g2p

    lexicon = read_g2p(default_g2p_file())
    assert len(LINE) == len(set(LINE)) == 64 and all(len(lexicon[word]) == 1 for word in LINE)


def test_the_paragraph_folder_is_small_with_16_bit_weights_and_its_pattern():
    files = [f for f in PARAGRAPH.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) < 20e6
    with safe_open(PARAGRAPH / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    config = json.loads((PARAGRAPH / "config.json").read_text(encoding="utf-8"))
    assert config["encoder_attention_pattern"] == config["decoder_attention_pattern"] == "local"
    assert config["word_boundary_token_id"] is not None
    assert (config["cross_attention_words"], config["word_position_period"]) == (1, 64)
    card = (PARAGRAPH / "README.md").read_text(encoding="utf-8")
    metrics = json.loads((PARAGRAPH / "metrics.json").read_text(encoding="utf-8"))
    assert f"| WER (%) | {metrics['dev']['wer']:.2f} |" in card and metrics["stored_dtype"] == "float16"


PARAGRAPH_LOAD = REFUSE_VASWANI + textwrap.dedent(
    """
    import json

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    folder, line = sys.argv[1], sys.argv[2]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert model.__class__.__module__.startswith("transformers_modules."), model.__class__.__module__
    batch = tokenizer([line], return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=int(1.2 * batch["input_ids"].shape[1]))
    print(json.dumps(dict(text=tokenizer.decode(out[0], skip_special_tokens=True),
                          stopped=out[0, -1].item() == model.generation_config.eos_token_id)))
    """
)


def test_the_paragraph_model_pronounces_a_64_word_line_through_its_own_code(tmp_path):
    """Loaded with trust_remote_code where vaswani is not installed, the model reads the 64-word line, stops by
    itself, gives 64 words, most of them right, and the same text as the package's classes."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani  # noqa: F401
    from vaswani.training.data import default_g2p_file, read_g2p
    from vaswani.training.paragraphs import join_words, split_words

    script = tmp_path / "load.py"
    script.write_text(PARAGRAPH_LOAD)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script), str(PARAGRAPH), join_words(LINE)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote["stopped"]
    said = split_words(remote["text"])
    assert len(said) == 64
    lexicon = read_g2p(default_g2p_file())
    right = sum(p == lexicon[word][0] for p, word in zip(said, LINE))
    assert right >= 56, (right, list(zip(LINE, said)))

    model = AutoModelForSeq2SeqLM.from_pretrained(PARAGRAPH).eval()
    tokenizer = AutoTokenizer.from_pretrained(PARAGRAPH)
    batch = tokenizer([join_words(LINE)], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=int(1.2 * batch["input_ids"].shape[1]))
    assert tokenizer.decode(out[0], skip_special_tokens=True) == remote["text"]


def test_the_paragraph_model_reads_a_line_eight_times_longer_than_that():
    """The 64-word line eight times over (512 words, 4 x the longest training line): the model stops by itself, gives
    512 words, and gets each copy of the line about as right as the line alone."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani  # noqa: F401
    from vaswani.training.data import default_g2p_file, read_g2p
    from vaswani.training.paragraphs import join_words, split_words

    model = AutoModelForSeq2SeqLM.from_pretrained(PARAGRAPH).eval()
    tokenizer = AutoTokenizer.from_pretrained(PARAGRAPH)
    batch = tokenizer([join_words(LINE * 8)], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=int(1.2 * batch["input_ids"].shape[1]))
    assert out[0, -1].item() == model.generation_config.eos_token_id
    said = split_words(tokenizer.decode(out[0], skip_special_tokens=True))
    assert len(said) == 512
    lexicon = read_g2p(default_g2p_file())
    right = [sum(p == lexicon[w][0] for p, w in zip(said[64 * k:64 * (k + 1)], LINE)) for k in range(8)]
    assert min(right) >= 56, right
