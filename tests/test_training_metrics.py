import itertools
import random

import pytest
import sacrebleu

from vaswani.training.metrics import bleu, chrf, edit_distance, g2p_scores, paragraph_scores, wer_by_length


def test_edit_distance():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance([], ["A", "B"]) == 2
    assert edit_distance("K AH N".split(), "AA K AH N".split()) == 1
    assert edit_distance("AK AH N".split(), "AA K AH N".split()) == 2  # a substitution and an insertion
    assert edit_distance("abc", "abc") == 0


def test_g2p_single_references():
    preds = ["AA K AH N", "K AE T", "D AO"]
    refs = [["AA K AH N"], ["K AE T S"], ["D AO G"]]
    s = g2p_scores(preds, refs)
    assert s.wrong_words == 2 and s.wer == pytest.approx(2 / 3)
    assert s.edits == 2 and s.reference_phonemes == 4 + 4 + 3
    assert s.per == pytest.approx(2 / 11)


def test_g2p_multiple_references_pick_the_closest():
    # "R EH D" equals the second reference: right word, zero edits
    # "T AH M AA T" : 1 edit from "T AH M AA T OW" (6), 2 from "T AH M EY T OW" -> closest is the first
    preds = ["R EH D", "T AH M AA T"]
    refs = [["R IY D", "R EH D"], ["T AH M EY T OW", "T AH M AA T OW"]]
    s = g2p_scores(preds, refs)
    assert s.wer == pytest.approx(1 / 2)
    assert s.edits == 1 and s.reference_phonemes == 3 + 6
    assert s.per == pytest.approx(1 / 9)
    # the closest reference decides the denominator even when it is longer: 1 edit / 5 phones
    s = g2p_scores(["A B C D"], [["X Y", "A B C D E"]])
    assert (s.edits, s.reference_phonemes) == (1, 5)


def test_g2p_errors():
    with pytest.raises(ValueError, match="list of reference"):
        g2p_scores(["A"], ["A"])
    with pytest.raises(ValueError, match="at least one reference"):
        g2p_scores(["A"], [[]])
    with pytest.raises(ValueError, match="2 predictions but 1"):
        g2p_scores(["A", "B"], [["A"]])


PREDS = ["the cat sat on the mat", "a quick brown fox jumps", "hello there"]
REFS = [["the cat sat on the mat", "a cat sat on the mat"], ["the quick brown fox jumped"], ["hello", "hi there", "hello there !"]]


def test_bleu_and_chrf_match_sacrebleu():
    streams = [[r[k] if k < len(r) else None for r in REFS] for k in range(3)]
    assert bleu(PREDS, REFS) == pytest.approx(sacrebleu.corpus_bleu(PREDS, streams).score)
    assert chrf(PREDS, REFS) == pytest.approx(sacrebleu.corpus_chrf(PREDS, streams).score)
    single = [[r[0]] for r in REFS]
    assert bleu(PREDS, single) == pytest.approx(sacrebleu.corpus_bleu(PREDS, [[r[0] for r in REFS]]).score)
    assert bleu(PREDS, REFS) > bleu(PREDS, single)  # extra references can only help here
    assert bleu(["a b c d e"] * 2, [["a b c d e"], ["z", "a b c d e"]]) == pytest.approx(100.0)


# Paragraph G2P: "THE CAT SAT", THE with two pronunciations; the two reference lines name the same words.
THE_CAT_SAT = ["DH AH | K AE T | S AE T", "DH IY | K AE T | S AE T"]


@pytest.mark.parametrize("prediction, word_edits, phoneme_edits", [
    ("DH IY | K AE T | S AE T", 0, 0),  # the second pronunciation of THE
    ("DH AH | K AA T | S AE T", 1, 1),  # a substituted word (one phoneme off)
    ("DH AH | S AE T", 1, 3),  # CAT deleted
    ("DH AH | K AE T | K AE T | S AE T", 1, 3),  # CAT inserted
    ("DH AH K AE T | S AE T", 2, 0),  # a lost boundary: a substitution and a deletion, every phoneme right
    ("", 3, 8),  # nothing predicted
])
def test_paragraph_scores_by_hand(prediction, word_edits, phoneme_edits):
    s = paragraph_scores([prediction], [THE_CAT_SAT])
    assert (s.words, s.word_edits, s.phoneme_edits, s.reference_phonemes) == (3, word_edits, phoneme_edits, 8)
    assert s.wer == pytest.approx(word_edits / 3) and s.per == pytest.approx(phoneme_edits / 8)


def test_paragraph_corpus_rates_are_total_edits_over_total_reference():
    predictions = ["DH IY | K AE T | S AE T", "DH AH | S AE T", "A B | C X"]
    references = [THE_CAT_SAT, THE_CAT_SAT, ["A B | C", "A B | C D"]]
    s = paragraph_scores(predictions, references)
    assert (s.lines, s.words, s.word_edits) == (3, 8, 2) and s.wer == pytest.approx(2 / 8)
    # "C X" is one edit from both "C" and "C D": the tie goes to the shorter line (3 phonemes, not 4)
    assert (s.phoneme_edits, s.reference_phonemes) == (0 + 3 + 1, 8 + 8 + 3) and s.per == pytest.approx(4 / 19)
    assert paragraph_scores(["A B | C D"], [["A B | C", "A B | C D"]]).reference_phonemes == 4  # the closest line


def _brute_force(prediction: str, references: list[str]) -> tuple[int, int, int]:
    """(word edits, phoneme edits, phonemes) minimised over every choice of a pronunciation per word."""
    predicted = [tuple(w.split()) for w in prediction.split("|")] if prediction.strip() else []
    positions = [list(dict.fromkeys(tuple(w.split()) for w in ws)) for ws in zip(*(r.split("|") for r in references))]
    flat = [p for w in predicted for p in w]
    best_words = min(edit_distance(predicted, list(choice)) for choice in itertools.product(*positions))
    edits, phonemes = min((edit_distance(flat, [p for w in choice for p in w]), sum(map(len, choice)))
                          for choice in itertools.product(*positions))
    return best_words, edits, phonemes


def test_paragraph_scores_equal_the_best_choice_of_pronunciations():
    """Both distances are minima over every choice of pronunciations, found without trying them all."""
    rng = random.Random(0)
    phones = ["A", "B", "C", "D"]
    for _ in range(300):
        words = [[" ".join(rng.choices(phones, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 3))]
                 for _ in range(rng.randint(1, 4))]
        references = [" | ".join(v[min(k, len(v) - 1)] for v in words) for k in range(max(map(len, words)))]
        prediction = " | ".join(" ".join(rng.choices(phones, k=rng.randint(0, 3))) for _ in range(rng.randint(0, 5)))
        s = paragraph_scores([prediction], [references])
        assert (s.word_edits, s.phoneme_edits, s.reference_phonemes) == _brute_force(prediction, references), \
            (prediction, references)


def test_paragraph_errors():
    with pytest.raises(ValueError, match="same words"):
        paragraph_scores(["A"], [["A | B", "A"]])
    with pytest.raises(ValueError, match="list of reference lines"):
        paragraph_scores(["A"], ["A | B"])
    with pytest.raises(ValueError, match="2 predictions but 1"):
        paragraph_scores(["A", "B"], [["A"]])


def test_wer_by_length_bins():
    def line(n, wrong=0):
        return " | ".join(["X"] * wrong + ["A"] * (n - wrong))

    lengths = [32, 63, 64, 96, 128, 20]
    references = [[line(n)] for n in lengths]
    predictions = [line(32, 2), line(63), line(64, 16), line(96), line(128, 32), line(20)]
    bins = wer_by_length(predictions, references)
    assert list(bins) == ["32-63", "64-95", "96-128"]  # the 20-word line is outside every bin
    assert (bins["32-63"].lines, bins["32-63"].words, bins["32-63"].word_edits) == (2, 95, 2)
    assert bins["64-95"].wer == pytest.approx(16 / 64)
    assert (bins["96-128"].lines, bins["96-128"].wer) == (2, pytest.approx(32 / 224))
    assert list(wer_by_length(predictions, references, edges=(10, 40))) == ["10-40"]
    with pytest.raises(ValueError, match="increasing"):
        wer_by_length(predictions, references, edges=(64, 32))
