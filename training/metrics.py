"""Evaluation metrics: G2P word and phoneme error rates, and BLEU / chrF for text.

G2P (phonemes are whitespace-separated tokens):
- WER: a word is right if its prediction equals ANY of its references; WER = wrong / words.
- PER: for each word, the Levenshtein distance (substitutions, insertions, deletions; all cost
  1) to the CLOSEST reference, i.e. the one with the fewest edits (ties: the first listed).
  Corpus PER = total edits / total phonemes of the chosen references: the standard corpus
  rate, so long words weigh more than in an average of per-word rates.
Both are fractions in [0, 1] (PER can exceed 1 with many insertions); multiply by 100 for %.

BLEU and chrF come from sacrebleu's corpus_bleu / corpus_chrf with default settings and are on
its 0-100 scale. Each prediction may have any number (>= 1) of references.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


def edit_distance(hypothesis: Sequence[Hashable], reference: Sequence[Hashable]) -> int:
    """Levenshtein distance between two token sequences (unit costs), O(len * len) time."""
    if len(hypothesis) < len(reference):
        hypothesis, reference = reference, hypothesis  # keep the row short
    previous = list(range(len(reference) + 1))
    for i, h in enumerate(hypothesis, 1):
        current = [i]
        for j, r in enumerate(reference, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (h != r)))
        previous = current
    return previous[-1]


@dataclass
class G2PScores:
    wer: float  # wrong words / words
    per: float  # edits / phonemes of the closest references
    words: int
    wrong_words: int
    edits: int
    reference_phonemes: int


def _tokens(text: str | Sequence[str]) -> tuple[str, ...]:
    return tuple(text.split()) if isinstance(text, str) else tuple(text)


def g2p_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> G2PScores:
    """WER and PER of `predictions[i]` against the reference list `references[i]`.

    Predictions and references are phoneme strings ("AA K AH N") or token sequences.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    if not predictions:
        raise ValueError("no predictions to score")
    wrong = edits = ref_phonemes = 0
    for i, (prediction, refs) in enumerate(zip(predictions, references)):
        if isinstance(refs, str):
            raise ValueError(f"references[{i}] is a string; give a list of reference pronunciations per word")
        if not refs:
            raise ValueError(f"references[{i}] is empty; every word needs at least one reference")
        hyp = _tokens(prediction)
        candidates = [_tokens(r) for r in refs]
        distance, best = min((edit_distance(hyp, r), k) for k, r in enumerate(candidates))
        wrong += distance > 0
        edits += distance
        ref_phonemes += len(candidates[best])
    if ref_phonemes == 0:
        raise ValueError("all chosen references are empty; PER is undefined")
    n = len(predictions)
    return G2PScores(wer=wrong / n, per=edits / ref_phonemes, words=n, wrong_words=wrong,
                     edits=edits, reference_phonemes=ref_phonemes)


def _reference_streams(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """sacrebleu wants one stream per reference slot; missing slots are None."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    for i, refs in enumerate(references):
        if isinstance(refs, str) or not refs:
            raise ValueError(f"references[{i}] must be a non-empty list of strings")
    width = max(len(refs) for refs in references)
    return [[refs[k] if k < len(refs) else None for refs in references] for k in range(width)]


def bleu(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenisation, 0-100)."""
    import sacrebleu

    return sacrebleu.corpus_bleu(list(predictions), _reference_streams(predictions, references)).score


def chrf(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus chrF (sacrebleu defaults: character 6-grams, beta 2, 0-100)."""
    import sacrebleu

    return sacrebleu.corpus_chrf(list(predictions), _reference_streams(predictions, references)).score
