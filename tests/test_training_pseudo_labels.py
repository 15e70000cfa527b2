"""`vaswani-pseudo-label` (vaswani.training.pseudo_labels): an ensemble of one model decodes as the model's own greedy
search, an ensemble of a model twice as the model once, and its search from the models' caches as the whole decoder
run again at each step; the neighbour words are new words one edit from a training word on the training side of the
dev rule; the training file written with them keeps the shipped dev set, is written whole or not at all, and bad
arguments are one clear line."""

import sys

import pytest
import torch
from helpers import REPO

from vaswani.training import pseudo_labels
from vaswani.training.distillation import load_teachers

SHIPPED = str(REPO / "models" / "vaswani-g2p")


def _load(paths):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(paths[0])
    return load_teachers(paths, tokenizer), tokenizer


def _one_edit_apart(a: str, b: str) -> bool:
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) <= 1
    short, long = sorted((a, b), key=len)
    return len(long) - len(short) == 1 and any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def test_an_ensemble_of_one_model_is_its_own_greedy_search():
    from vaswani.training.evaluation import generate_texts
    from vaswani.training.tasks import load_task_data

    models, tokenizer = _load([SHIPPED])
    words = load_task_data("g2p").dev_sources[::40]
    expected = generate_texts(models[0], tokenizer, words, num_beams=1)
    assert pseudo_labels.ensemble_greedy(models, tokenizer, words, batch_size=16) == expected
    twice, _ = _load([SHIPPED, SHIPPED])
    assert pseudo_labels.ensemble_greedy(twice, tokenizer, words, batch_size=64) == expected
    with torch.no_grad():  # a different second model changes some outputs: the mean is really taken
        for p in twice[1].parameters():
            p.add_(torch.randn_like(p) * 0.05)
    assert pseudo_labels.ensemble_greedy(twice, tokenizer, words) != expected



def _uncached_ensemble_greedy(models, tokenizer, word):
    """The reference: the whole decoder again at every step, one word at a time, no cache, no padding."""
    encoded = tokenizer([word], return_tensors="pt")
    tokens = torch.tensor([[models[0].config.decoder_start_token_id]])
    for _ in range(27):
        with torch.no_grad():
            log_probs = sum(torch.log_softmax(m(**encoded, decoder_input_ids=tokens).logits[:, -1].double(), -1)
                            for m in models)
        tokens = torch.cat([tokens, log_probs.argmax(-1, keepdim=True)], 1)
        if tokens[0, -1] == tokenizer.eos_token_id:
            return tokenizer.decode(tokens[0, 1:].tolist(), skip_special_tokens=True)
    return None


def test_the_cached_search_of_two_different_models_equals_the_uncached_one():
    models, tokenizer = _load([SHIPPED, SHIPPED])
    torch.manual_seed(0)
    with torch.no_grad():
        for p in models[1].parameters():
            p.add_(torch.randn_like(p) * 0.03)
    words = pseudo_labels.neighbour_words(60, seed=7)
    found = pseudo_labels.ensemble_greedy(models, tokenizer, words, batch_size=16)
    assert found == [_uncached_ensemble_greedy(models, tokenizer, w) for w in words]
    assert found != pseudo_labels.ensemble_greedy(models[:1], tokenizer, words)  # the second model counts

def test_neighbour_words_are_new_and_the_file_with_them_keeps_the_dev_set(tmp_path):
    from vaswani.training.data import default_g2p_file, is_dev_word, load_g2p, read_g2p

    lexicon = read_g2p(default_g2p_file())
    train_words = {w for w, _ in load_g2p().train}
    words = pseudo_labels.neighbour_words(40, seed=3)
    assert words == sorted(words) and len(set(words)) == 40
    assert pseudo_labels.neighbour_words(40, seed=3) == words != pseudo_labels.neighbour_words(40, seed=4)
    for word in words:
        assert word not in lexicon and not is_dev_word(word)
        assert any(_one_edit_apart(word, w) for w in train_words if abs(len(w) - len(word)) <= 1), word
    output = tmp_path / "data" / "plus.tsv"
    written = pseudo_labels.write_pseudo_labelled(40, output, [SHIPPED], log=lambda _: None)
    assert [p.name for p in output.parent.iterdir()] == ["plus.tsv"]  # no partial file left beside it
    plus = load_g2p(output)
    shipped = load_g2p()
    assert plus.dev == shipped.dev
    assert len(plus.train) == len(shipped.train) + written and written >= 35
    assert output.read_text(encoding="utf-8").startswith(default_g2p_file().read_text(encoding="utf-8"))


def test_the_command_writes_the_file_and_pronounces_the_words_as_the_model_does(tmp_path):
    from vaswani.training.evaluation import generate_texts

    output = tmp_path / "plus.tsv"
    assert pseudo_labels.main(["--words", "12", "--output", str(output), "--teachers", SHIPPED, "--seed", "5"]) == 0
    models, tokenizer = _load([SHIPPED])
    words = pseudo_labels.neighbour_words(12, seed=5)
    expected = generate_texts(models[0], tokenizer, words, num_beams=1)
    lines = output.read_text(encoding="utf-8").splitlines()[-12:]
    assert lines == [f"{w}\t{p}" for w, p in zip(words, expected)]


@pytest.mark.parametrize("args, message", [
    (["--words", "0"], "--words must be at least 1"),
    (["--words", "5", "--teachers", "no-such-folder"], "'no-such-folder' is not a saved model folder"),
    (["--words", "5", "--teachers", SHIPPED, "no-such-folder"], "'no-such-folder' is not a saved model folder"),
])
def test_bad_arguments_are_one_clear_line(args, message, tmp_path, capsys):
    if "--teachers" not in args:
        args = args + ["--teachers", SHIPPED]
    output = tmp_path / "plus.tsv"
    with pytest.raises(SystemExit) as error:
        pseudo_labels.main(args + ["--output", str(output)])
    assert error.value.code == 2
    assert message in capsys.readouterr().err
    assert not output.exists()


def test_the_ensemble_study_uses_the_commands_functions():
    sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ is not part of the package
    import ensemble_study

    assert ensemble_study.ensemble_greedy is pseudo_labels.ensemble_greedy
    assert ensemble_study.write_pseudo_labelled is pseudo_labels.write_pseudo_labelled
