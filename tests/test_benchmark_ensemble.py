"""The ensemble study's tools (not its figures): an ensemble of one model decodes as the model's own greedy search,
an ensemble of a model twice as the model once; the neighbour words are new words one edit from a training word on
the training side of the dev rule, and the training file written with them keeps the shipped dev set."""

import sys

import torch
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ is not part of the package
import ensemble_study  # noqa: E402

SHIPPED = str(REPO / "models" / "vaswani-g2p")


def _one_edit_apart(a: str, b: str) -> bool:
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) <= 1
    short, long = sorted((a, b), key=len)
    return len(long) - len(short) == 1 and any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def test_an_ensemble_of_one_model_is_its_own_greedy_search():
    from vaswani.training.evaluation import generate_texts
    from vaswani.training.tasks import load_task_data

    models, tokenizer = ensemble_study.load([SHIPPED])
    words = load_task_data("g2p").dev_sources[::40]
    expected = generate_texts(models[0], tokenizer, words, num_beams=1)
    assert ensemble_study.ensemble_greedy(models, tokenizer, words, batch_size=16) == expected
    twice, _ = ensemble_study.load([SHIPPED, SHIPPED])
    assert ensemble_study.ensemble_greedy(twice, tokenizer, words, batch_size=64) == expected
    with torch.no_grad():  # a different second model changes some outputs: the mean is really taken
        for p in twice[1].parameters():
            p.add_(torch.randn_like(p) * 0.05)
    assert ensemble_study.ensemble_greedy(twice, tokenizer, words) != expected


def test_neighbour_words_are_new_and_the_file_with_them_keeps_the_dev_set(tmp_path):
    from vaswani.training.data import default_g2p_file, is_dev_word, load_g2p, read_g2p

    lexicon = read_g2p(default_g2p_file())
    train_words = {w for w, _ in load_g2p().train}
    words = ensemble_study.neighbour_words(40, seed=3)
    assert len(words) == len(set(words)) == 40
    for word in words:
        assert word not in lexicon and not is_dev_word(word)
        assert any(_one_edit_apart(word, w) for w in train_words if abs(len(w) - len(word)) <= 1), word
    output = tmp_path / "plus.tsv"
    written = ensemble_study.neighbours(40, str(output), [SHIPPED])
    plus = load_g2p(output)
    shipped = load_g2p()
    assert plus.dev == shipped.dev
    assert len(plus.train) == len(shipped.train) + written and written >= 35
