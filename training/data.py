"""Training data: the default CMUdict G2P set with its dev split, and the user's parallel data.

Default data (`data/cmudict-g2p/g014b2b.train.tsv`, shipped with its notice `SOURCE.md`):
lines `WORD<TAB>PH PH PH`, alternate pronunciations as repeated words. `load_g2p` groups all
pronunciations of a word and carves the dev set on whole words by a fixed rule:

    a word goes to dev  iff  zlib.crc32(word.encode("utf-8")) % 100 < dev_percent   (default 5)

CRC32 depends only on the word, so the split is the same whatever the file order, the platform
or Python's hash seed. With the default 5 % on g014b2b.train (106,837 words, 113,438 lines):
101,481 train words (107,797 train pairs, one per pronunciation) and 5,356 dev words (5.01 %,
5,641 reference pronunciations).

User data: `load_parallel_data` reads TSV, CSV or JSON lines through `datasets` (offline) or
a Hub dataset by name, and returns a `datasets.Dataset` with exactly two string columns,
`source` and `target`. Problems raise `ValueError` naming the file or column and the fix.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

# training/ sits at the repository root next to data/ (editable install or a checkout).
DEFAULT_G2P_PATH = Path(__file__).resolve().parent.parent / "data" / "cmudict-g2p" / "g014b2b.train.tsv"
DEFAULT_DEV_PERCENT = 5

_FILE_FORMATS = {".tsv": "csv", ".csv": "csv", ".json": "json", ".jsonl": "json"}


@dataclass
class G2PData:
    """`train`: (word, pronunciation) pairs, one per pronunciation, in file order.
    `dev`: word -> all its reference pronunciations (a prediction is right if it equals any)."""

    train: list[tuple[str, str]]
    dev: dict[str, list[str]]


def is_dev_word(word: str, dev_percent: int = DEFAULT_DEV_PERCENT) -> bool:
    """The dev-split rule: a stable hash of the word, independent of file order and hash seed."""
    return zlib.crc32(word.encode("utf-8")) % 100 < dev_percent


def read_g2p(path: str | Path) -> dict[str, list[str]]:
    """Read a `WORD<TAB>PH PH ...` file into word -> pronunciations (file order, duplicates dropped).

    Phonemes are normalised to single spaces. Raises ValueError for a missing file, a malformed
    line (its number is given) or an empty file.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"G2P file {str(path)!r} does not exist; pass the path of a WORD<TAB>PHONEMES file")
    lexicon: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            word, tab, phonemes = line.partition("\t")
            phonemes = " ".join(phonemes.split())
            if not tab or not word.strip() or not phonemes:
                raise ValueError(f"{path}:{number}: expected 'WORD<TAB>PH PH ...', got {line!r}")
            prons = lexicon.setdefault(word.strip(), [])
            if phonemes not in prons:
                prons.append(phonemes)
    if not lexicon:
        raise ValueError(f"G2P file {str(path)!r} holds no entries; expected lines 'WORD<TAB>PH PH ...'")
    return lexicon


def load_g2p(path: str | Path | None = None, dev_percent: int = DEFAULT_DEV_PERCENT) -> G2PData:
    """Load a G2P file (default: the shipped CMUdict split) and split it into train pairs and dev words.

    Every pronunciation of a word goes to the same side (see the module docstring for the rule).
    `dev_percent=0` gives an empty dev set.
    """
    if not 0 <= dev_percent < 100:
        raise ValueError(f"dev_percent={dev_percent} must be in [0, 100)")
    if path is None:
        path = DEFAULT_G2P_PATH
        if not path.is_file():
            raise ValueError(
                f"the default G2P data {str(path)!r} is missing: it ships in the repository's data/ folder; "
                "run from a checkout (pip install -e .) or pass a path"
            )
    lexicon = read_g2p(path)
    train: list[tuple[str, str]] = []
    dev: dict[str, list[str]] = {}
    for word, prons in lexicon.items():
        if is_dev_word(word, dev_percent):
            dev[word] = prons
        else:
            train.extend((word, pron) for pron in prons)
    return G2PData(train=train, dev=dev)


def load_parallel_data(
    path_or_name: str | Path,
    source_column: str = "source",
    target_column: str = "target",
    split: str = "train",
    cache_dir: str | None = None,
):
    """Load parallel text as a `datasets.Dataset` with columns `source` and `target` (strings).

    `path_or_name`: a local `.tsv`, `.csv`, `.json` or `.jsonl` file (TSV and CSV need a header
    row naming the columns; JSON is one object per line), or a Hub dataset name (`split` chosen).
    Rows whose source or target is empty are an error, as are missing columns and empty data.
    """
    import datasets  # heavy; only the data path needs it

    path = Path(path_or_name)
    is_local = path.suffix.lower() in _FILE_FORMATS or path.exists()
    if is_local:
        if not path.is_file():
            raise ValueError(
                f"data file {str(path)!r} does not exist; pass an existing .tsv/.csv/.jsonl file or a Hub dataset name"
            )
        builder = _FILE_FORMATS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"cannot tell the format of {str(path)!r} from its extension; "
                f"rename it to one of {sorted(_FILE_FORMATS)}"
            )
        kwargs = {}
        if path.suffix.lower() == ".tsv":
            kwargs = {"delimiter": "\t", "quoting": 3}  # csv.QUOTE_NONE: quotes in text stay text
        where = str(path)
        try:
            data = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir, **kwargs)
        except (datasets.exceptions.DatasetGenerationError, ValueError) as err:
            if path.stat().st_size == 0 or not path.read_text(encoding="utf-8", errors="replace").strip():
                raise ValueError(f"data file {where!r} is empty; it needs a header and at least one row") from err
            if "no data" in str(err):
                raise ValueError(f"data file {where!r} holds no rows; add at least one source/target pair") from err
            raise ValueError(f"could not read {where!r} as {path.suffix} ({err})") from err
    else:
        where = f"Hub dataset {str(path_or_name)!r} (split {split!r})"
        data = datasets.load_dataset(str(path_or_name), split=split, cache_dir=cache_dir)

    missing = [c for c in (source_column, target_column) if c not in data.column_names]
    if missing:
        raise ValueError(
            f"{where} has no column {missing[0]!r} (columns: {data.column_names}); "
            "name the right ones with --source_column/--target_column"
        )
    if len(data) == 0:
        raise ValueError(f"{where} holds no rows; give it at least one {source_column}/{target_column} pair")
    data = data.select_columns([source_column, target_column])
    if source_column != "source" or target_column != "target":
        # two-step rename so that swapped names (source_column="target") work too
        data = data.rename_columns({source_column: "__src", target_column: "__tgt"})
        data = data.rename_columns({"__src": "source", "__tgt": "target"})
    for column, name in (("source", source_column), ("target", target_column)):
        values = data[column]
        bad = [i for i, v in enumerate(values) if v is None or not str(v).strip()]
        if bad:
            raise ValueError(
                f"{where}: {len(bad)} row(s) have an empty {name!r} (first: row {bad[0]}); remove or fill them"
            )
        if not all(isinstance(v, str) for v in values[:1000]):
            data = data.cast_column(column, datasets.Value("string"))
    return data
