"""Paragraph-level G2P: lines of 32 to 128 CMUdict words in, their pronunciations out, a long-input task.

A source line is the words joined by `WORD_BOUNDARY` ("WORD | WORD | ..."; the G2P tokenizer spells it out letter
by letter and keeps the boundary as one piece), its target the pronunciations joined the same way
("W ER D | W ER D | ..."), so that source and target words pair up one to one and a prediction splits into words.

Lines are drawn by a seeded generator from one side of the CMUdict split only (`build_lines`): training lines from
the training words, dev lines from the dev words, so no dev word is ever trained on. Words are taken in a shuffled
order without replacement (reshuffled when all are used), so a pool of lines covers the words evenly. A training line
takes one pronunciation of each word at random; a dev line keeps them all: its references are K lines, the k-th
taking each word's k-th pronunciation (its last when it has fewer), so position i of every reference is word i and
every pronunciation appears in some reference (`metrics.paragraph_scores` reads them back per word).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

WORD_BOUNDARY = "|"  # between words, in sources and targets: not a CMUdict letter or phoneme
PARAGRAPH_WORDS = (32, 128)  # words per line, both bounds included
# Lines per pool: the training pool holds each training word of the shipped split about twice (the loop trains epochs
# over it); the dev lines are decoded at every evaluation, so they are few (about 4,000 of the 5,356 dev words).
TRAIN_LINES = 2500
DEV_LINES = 50
DEV_SEED = 0  # dev lines do not depend on the run's seed: runs with different seeds are scored on the same lines


def join_words(words: Sequence[str]) -> str:
    """["HELLO", "WORLD"] -> "HELLO | WORLD"; the same for pronunciations ("HH AH L OW | W ER L D")."""
    return f" {WORD_BOUNDARY} ".join(" ".join(word.split()) for word in words)


def split_words(line: str) -> list[str]:
    """The words of a line (each with single spaces), the inverse of `join_words`; an empty line has none, while an
    empty piece between two boundaries is a word (an empty prediction, which matches no reference)."""
    if not line.strip():
        return []
    return [" ".join(word.split()) for word in line.split(WORD_BOUNDARY)]


def _word_stream(words: list[str], rng: random.Random):
    """The words in a shuffled order, again and again (reshuffled each pass), so lines use them evenly."""
    while True:
        order = list(words)
        rng.shuffle(order)
        yield from order


def build_lines(lexicon: dict[str, list[str]], count: int, words: tuple[int, int] = PARAGRAPH_WORDS, seed: int = 0,
                all_references: bool = False) -> list[tuple[str, list[str]]]:
    """`count` lines of `words[0]..words[1]` words of `lexicon` (word -> pronunciations), as (source, references).

    all_references=False (training): one reference, each word's pronunciation drawn at random. True (dev): every
    pronunciation kept, as the K reference lines of the module docstring. The same arguments give the same lines.
    """
    low, high = words
    if not 1 <= low <= high:
        raise ValueError(f"paragraph words {low}..{high}: need 1 <= min <= max words per line (e.g. 32 128)")
    if count < 1:
        raise ValueError(f"{count} paragraph lines asked for; ask for at least 1")
    if not lexicon:
        raise ValueError("no words to build paragraph lines from: the G2P data holds none on this side of the split")
    rng = random.Random(seed)
    stream = _word_stream(sorted(lexicon), rng)  # sorted: the lines do not depend on the file's order
    lines = []
    for _ in range(count):
        chosen = [next(stream) for _ in range(rng.randint(low, high))]
        if all_references:
            width = max(len(lexicon[w]) for w in chosen)
            references = [join_words([lexicon[w][min(k, len(lexicon[w]) - 1)] for w in chosen]) for k in range(width)]
        else:
            references = [join_words([rng.choice(lexicon[w]) for w in chosen])]
        lines.append((join_words(chosen), references))
    return lines
