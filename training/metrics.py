"""Evaluation metrics: G2P word and phoneme error rates (of words and of lines of words), and BLEU / chrF for text.

G2P (phonemes are whitespace-separated tokens):
- WER: a word is right if its prediction equals ANY of its references; WER = wrong / words.
- PER: for each word, the Levenshtein distance (substitutions, insertions, deletions; all cost
  1) to the CLOSEST reference, i.e. the one with the fewest edits (ties: the first listed).
  Corpus PER = total edits / total phonemes of the chosen references: the standard corpus
  rate, so long words weigh more than in an average of per-word rates.
Both are fractions in [0, 1] (PER can exceed 1 with many insertions); multiply by 100 for %.

Paragraph G2P (`paragraph_scores`; lines of words joined by `paragraphs.WORD_BOUNDARY`, vaswani.training.paragraphs):
- WER: the word-level Levenshtein distance between the predicted words (the prediction split on the boundary) and
  the reference words, where a predicted word equals a reference word if it is ANY of its pronunciations;
  corpus WER = total word edits / total reference words (a dropped or extra boundary costs a word edit or two).
- PER: the phoneme-level distance (boundaries left out) to the CLOSEST reference line, any pronunciation of each
  word allowed (exact: a dynamic programme over the words' alternatives, ties to the shorter line); corpus PER =
  total edits / total phonemes of those closest lines.

BLEU and chrF come from sacrebleu's corpus_bleu / corpus_chrf with default settings and are on
its 0-100 scale. Each prediction may have any number (>= 1) of references.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .paragraphs import split_words


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


@dataclass
class ParagraphScores:
    wer: float  # word edits / reference words
    per: float  # phoneme edits / phonemes of the closest reference lines
    lines: int
    words: int  # reference words
    word_edits: int
    phoneme_edits: int
    reference_phonemes: int


def _reference_words(references: Sequence[str], i: int) -> list[list[tuple[str, ...]]]:
    """The pronunciations of each word position of a line's reference lines (all name the same words)."""
    if isinstance(references, str) or not references:
        raise ValueError(f"references[{i}] must be a non-empty list of reference lines")
    lines = [split_words(line) for line in references]
    if len({len(words) for words in lines}) != 1 or not lines[0]:
        raise ValueError(f"references[{i}]: reference lines of {sorted({len(w) for w in lines})} words; the "
                         "references of a line must name the same words (one per position), at least one")
    positions = []
    for variants in zip(*lines):
        prons = list(dict.fromkeys(tuple(v.split()) for v in variants))
        if not all(prons):
            raise ValueError(f"references[{i}] has an empty word; every reference word needs phonemes")
        positions.append(prons)
    return positions


def _word_edits(predicted: list[tuple[str, ...]], reference: list[list[tuple[str, ...]]]) -> int:
    """Levenshtein distance over words; a predicted word equals a reference position holding it as a variant."""
    previous = list(range(len(reference) + 1))
    for i, word in enumerate(predicted, 1):
        current = [i]
        for j, variants in enumerate(reference, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word not in variants)))
        previous = current
    return previous[-1]


_LENGTH_UNIT = 1 << 24  # a cell holds edits * _LENGTH_UNIT + reference phonemes: one min() orders by both


def _closest_line(hypothesis: list[str], reference: list[list[tuple[str, ...]]]) -> tuple[int, int]:
    """(edits, phonemes) of the reference line closest to `hypothesis`, each word any of its pronunciations.

    A row-by-row Levenshtein table over the hypothesis, run through every pronunciation of a word from the row the
    word starts at and min-merged at its end; insertions along a row are a running minimum (numpy)."""
    ids = {p: k for k, p in enumerate(dict.fromkeys(hypothesis))}
    hyp = np.array([ids[p] for p in hypothesis], dtype=np.int64)
    unit, columns = _LENGTH_UNIT, np.arange(len(hyp) + 1, dtype=np.int64)
    row = columns * unit  # the empty reference: every hypothesis phoneme inserted
    for variants in reference:
        ends = None
        for pronunciation in variants:
            cells = row
            for phoneme in pronunciation:
                same = hyp == ids.get(phoneme, -1)
                step = np.empty_like(cells)
                step[0] = cells[0] + unit + 1  # deletion: one edit, one reference phoneme more
                step[1:] = np.minimum(cells[:-1] + unit * ~same + 1, cells[1:] + unit + 1)
                cells = np.minimum.accumulate(step - columns * unit) + columns * unit  # insertions
            ends = cells if ends is None else np.minimum(ends, cells)
        row = ends
    return int(row[-1] // unit), int(row[-1] % unit)


def paragraph_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> ParagraphScores:
    """Word and phoneme error rates of predicted lines (see the module docstring).

    `references[i]`: the reference lines of line i, all naming the same words, position by position; a word's
    pronunciations are what its position holds across them (`paragraphs.build_lines` makes such lists).
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    if not predictions:
        raise ValueError("no predictions to score")
    words = word_edits = phoneme_edits = reference_phonemes = 0
    for i, (prediction, refs) in enumerate(zip(predictions, references)):
        positions = _reference_words(refs, i)
        predicted = [tuple(word.split()) for word in split_words(prediction)]
        words += len(positions)
        word_edits += _word_edits(predicted, positions)
        edits, phonemes = _closest_line([p for word in predicted for p in word], positions)
        phoneme_edits += edits
        reference_phonemes += phonemes
    return ParagraphScores(wer=word_edits / words, per=phoneme_edits / reference_phonemes, lines=len(predictions),
                           words=words, word_edits=word_edits, phoneme_edits=phoneme_edits,
                           reference_phonemes=reference_phonemes)


def wer_by_length(predictions: Sequence[str], references: Sequence[Sequence[str]],
                  edges: Sequence[int] = (32, 64, 96, 128)) -> dict[str, ParagraphScores]:
    """`paragraph_scores` of the lines in each length bin: "32-63", "64-95", "96-128" for the default edges (bin k
    holds lines of edges[k] to edges[k+1] - 1 reference words, the last bin edges[-1] too). Lines outside the edges
    and empty bins are left out."""
    if len(edges) < 2 or list(edges) != sorted(set(edges)):
        raise ValueError(f"edges={list(edges)}: give at least two increasing word counts, e.g. (32, 64, 96, 128)")
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference lists")
    spans = [(low, high, k == len(edges) - 2) for k, (low, high) in enumerate(zip(edges, edges[1:]))]
    bins: dict[str, list[int]] = {f"{low}-{high if last else high - 1}": [] for low, high, last in spans}
    for i, refs in enumerate(references):
        n = len(_reference_words(refs, i))
        for rows, (low, high, last) in zip(bins.values(), spans):
            if low <= n < high or (last and n == high):
                rows.append(i)
    return {label: paragraph_scores([predictions[i] for i in rows], [references[i] for i in rows])
            for label, rows in bins.items() if rows}


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
