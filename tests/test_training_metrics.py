import pytest
import sacrebleu

from vaswani.training.metrics import bleu, chrf, edit_distance, g2p_scores


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
