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
