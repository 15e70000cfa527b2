"""`vaswani.data`: the files that ship inside the package, read with `importlib.resources` (so they are found the
same way in a checkout, an editable install and an installed wheel; no code finds them by a repository path).

    cmudict-g2p/g014b2b.train.tsv   the default training data of `vaswani-train` (CMUdict G2P split)
    cmudict-g2p/SOURCE.md           where that file comes from, and its license
    model_card.md                   the template of a trained model's README.md (training/model_card.py): a link to
                                    the repository's top-level model_card.md, its one source
"""

from importlib.resources import files
from importlib.resources.abc import Traversable


def data_file(*parts: str) -> Traversable:
    """A shipped file, e.g. `data_file("cmudict-g2p", "g014b2b.train.tsv")`; `.open()`, `.read_text()` and
    `.read_bytes()` work on it wherever the package is installed."""
    return files(__name__).joinpath(*parts)
