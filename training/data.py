"""Training data: the default CMUdict G2P set with its dev split, and the user's parallel data.

Default data (`default_g2p_file()`: `cmudict-g2p/g014b2b.train.tsv` of the package `vaswani.data`, the folder
data/ of the repository, shipped with its notice `SOURCE.md`):
lines `WORD<TAB>PH PH PH`, alternate pronunciations as repeated words. `load_g2p` groups all
pronunciations of a word and carves the dev set on whole words by a fixed rule:

    a word goes to dev  iff  zlib.crc32(word.encode("utf-8")) % 100 < dev_percent   (default 5)

CRC32 depends only on the word, so the split is the same whatever the file order, the platform
or Python's hash seed. With the default 5 % on g014b2b.train (106,837 words, 113,438 lines):
101,481 train words (107,797 train pairs, one per pronunciation) and 5,356 dev words (5.01 %,
5,641 reference pronunciations).

User data: `load_parallel_data` reads a local TSV or CSV file (a header row naming the columns, or two columns
and no header, as the default data), a JSON-lines file, or a Hub dataset by name, and returns a
`datasets.Dataset` with exactly two string columns, `source` and `target`. Problems raise `ValueError`
naming the file, the line and the fix.

Every shipped file is read through `importlib.resources` (`vaswani.data`), so the default data is found the same
way in a checkout and in an installed wheel.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import zlib
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_G2P_FILE = ("cmudict-g2p", "g014b2b.train.tsv")  # inside the package `vaswani.data`
DEFAULT_DEV_PERCENT = 5

FILE_FORMATS = (".tsv", ".csv", ".jsonl", ".json")
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
FORMATS_TAKEN = (".tsv or .csv (a header row naming the columns, or two columns and no header), .jsonl or .json "
                 "(one JSON object per line), or a Hub dataset name (owner/name)")


def default_g2p_file() -> Traversable:
    """The shipped CMUdict split (a resource of `vaswani.data`; `.open()` and `.read_text()` work on it)."""
    from vaswani.data import data_file

    return data_file(*DEFAULT_G2P_FILE)


@dataclass
class G2PData:
    """`train`: (word, pronunciation) pairs, one per pronunciation, in file order.
    `dev`: word -> all its reference pronunciations (a prediction is right if it equals any)."""

    train: list[tuple[str, str]]
    dev: dict[str, list[str]]


def is_dev_word(word: str, dev_percent: int = DEFAULT_DEV_PERCENT) -> bool:
    """The dev-split rule: a stable hash of the word, independent of file order and hash seed."""
    return zlib.crc32(word.encode("utf-8")) % 100 < dev_percent


def read_g2p(path: str | os.PathLike | Traversable) -> dict[str, list[str]]:
    """Read a `WORD<TAB>PH PH ...` file into word -> pronunciations (file order, duplicates dropped).

    `path`: a file name or a package resource (`default_g2p_file()`). Phonemes are normalised to single spaces.
    Raises ValueError for a missing file, a malformed line (its number is given) or an empty file.
    """
    if isinstance(path, (str, os.PathLike)):
        path = Path(path)
    if not path.is_file():
        raise ValueError(f"G2P file {str(path)!r} does not exist; pass the path of a WORD<TAB>PHONEMES file")
    lexicon: dict[str, list[str]] = {}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            word, tab, phonemes = line.partition("\t")
            if "\t" in phonemes:
                raise ValueError(f"{path}:{number}: {line.count(chr(9)) + 1} tab-separated fields; a G2P line has 2, "
                                 "'WORD<TAB>PH PH ...'")
            phonemes = " ".join(phonemes.split())
            if not tab or not word.strip() or not phonemes:
                raise ValueError(f"{path}:{number}: expected 'WORD<TAB>PH PH ...', got {line!r}")
            prons = lexicon.setdefault(word.strip(), [])
            if phonemes not in prons:
                prons.append(phonemes)
    if not lexicon:
        raise ValueError(f"G2P file {str(path)!r} holds no entries; expected lines 'WORD<TAB>PH PH ...'")
    return lexicon


def load_g2p(path: str | os.PathLike | Traversable | None = None, dev_percent: int = DEFAULT_DEV_PERCENT) -> G2PData:
    """Load a G2P file (default: the shipped CMUdict split) and split it into train pairs and dev words.

    Every pronunciation of a word goes to the same side (see the module docstring for the rule).
    `dev_percent=0` gives an empty dev set.
    """
    if not 0 <= dev_percent < 100:
        raise ValueError(f"dev_percent={dev_percent} must be in [0, 100)")
    lexicon = read_g2p(default_g2p_file() if path is None else path)
    train: list[tuple[str, str]] = []
    dev: dict[str, list[str]] = {}
    for word, prons in lexicon.items():
        if is_dev_word(word, dev_percent):
            dev[word] = prons
        else:
            train.extend((word, pron) for pron in prons)
    return G2PData(train=train, dev=dev)


def data_file_format(path: str | os.PathLike) -> str:
    """The extension of a local data file, one of FILE_FORMATS; ValueError naming the formats taken otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in FILE_FORMATS:
        kind = f"a {suffix!r} file" if suffix else "a file without an extension"
        raise ValueError(f"cannot read {str(path)!r}: {kind} is not a data format taken here; the formats taken are "
                         f"{FORMATS_TAKEN}. Rename or convert the file")
    return suffix


def load_parallel_data(
    path_or_name: str | os.PathLike,
    source_column: str = "source",
    target_column: str = "target",
    split: str = "train",
    cache_dir: str | None = None,
):
    """Load parallel text as a `datasets.Dataset` with columns `source` and `target` (strings).

    `path_or_name`: a local `.tsv` or `.csv` file (a header row naming the columns; a file of exactly two columns
    whose first line names neither is read as source and target without a header, like the default G2P data), a
    `.jsonl`/`.json` file (one object per line), or a Hub dataset name (`split` chosen). Rows of different field
    counts, missing columns, empty cells and empty data are errors that name the file and the line.
    """
    import datasets  # heavy; only the data path needs it

    name = os.fspath(path_or_name)
    path = Path(name)
    if path.exists() or path.suffix.lower() in FILE_FORMATS or (path.suffix and not _HUB_ID.fullmatch(name)):
        if not path.is_file():
            raise ValueError(f"data file {name!r} does not exist; pass an existing file ({FORMATS_TAKEN})")
        suffix = data_file_format(path)
        read = _read_json_lines if suffix in (".jsonl", ".json") else _read_delimited
        sources, targets, lines = read(path, source_column, target_column)
        where = name
    else:
        where = f"Hub dataset {name!r} (split {split!r})"
        data = datasets.load_dataset(name, split=split, cache_dir=cache_dir)
        columns = [c for c in data.column_names if not c.startswith("__")]  # no pandas index names in messages
        missing = [c for c in (source_column, target_column) if c not in columns]
        if missing:
            raise ValueError(f"{where} has no column {missing[0]!r} (columns: {columns}); name the right ones with "
                             "--source_column/--target_column")
        sources, targets = data[source_column], data[target_column]
        lines = [f"row {i}" for i in range(len(sources))]
    if not sources:
        raise ValueError(f"{where} holds no rows; give it at least one {source_column}/{target_column} pair")
    for values, column in ((sources, source_column), (targets, target_column)):
        bad = [i for i, v in enumerate(values) if v is None or not str(v).strip()]
        if bad:
            raise ValueError(f"{where}: {len(bad)} row(s) have an empty {column!r} (first: {lines[bad[0]]}); "
                             "remove or fill them")
    return datasets.Dataset.from_dict({"source": [str(v) for v in sources], "target": [str(v) for v in targets]})


def _read_delimited(path: Path, source_column: str, target_column: str):
    """(sources, targets, "line N" of each row) of a TSV (no quoting: quotes are text) or CSV file."""
    tsv = path.suffix.lower() == ".tsv"
    kind = "tab-separated" if tsv else "comma-separated"
    rows, numbers = [], []
    with open(path, encoding="utf-8", newline="") as f:
        if tsv:
            records = ((n, line.rstrip("\r\n").split("\t")) for n, line in enumerate(f, 1))
        else:
            reader = csv.reader(f)
            records = ((reader.line_num, row) for row in reader)  # line_num: where the (maybe multi-line) row ends
        for number, fields in records:
            if not any(cell.strip() for cell in fields):
                continue  # blank lines are skipped, as by pandas
            if rows and len(fields) != len(rows[0]):
                raise ValueError(f"{path}: line {number} has {len(fields)} {kind} field(s), but line {numbers[0]} has "
                                 f"{len(rows[0])}; every line needs the same fields (a header, then one row per "
                                 "pair, or two columns without a header)")
            rows.append(fields)
            numbers.append(number)
    if not rows:
        raise ValueError(f"data file {str(path)!r} is empty; it needs a header and at least one row")
    header = [cell.strip() for cell in rows[0]]
    if source_column in header and target_column in header:
        columns, rows, numbers = (header.index(source_column), header.index(target_column)), rows[1:], numbers[1:]
    elif len(header) == 2 and (source_column, target_column) == ("source", "target"):
        logger.info("%s: its first line names no 'source'/'target' column, so it is read as two columns without a "
                    "header (source, then target)", path)
        columns = (0, 1)
    else:
        missing = next(c for c in (source_column, target_column) if c not in header)
        raise ValueError(f"{path} has no column {missing!r} (its first line: {header}); name the right ones with "
                         "--source_column/--target_column, or give two columns without a header")
    return [r[columns[0]] for r in rows], [r[columns[1]] for r in rows], [f"line {n}" for n in numbers]


def _read_json_lines(path: Path, source_column: str, target_column: str):
    """(sources, targets, "line N" of each row) of a file of one JSON object per line."""
    sources, targets, lines = [], [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: line {number} is not JSON ({error.msg}); a {path.suffix} file holds one "
                                 "JSON object per line") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {number} is a JSON {type(row).__name__}, not an object "
                                 f'{{"{source_column}": ..., "{target_column}": ...}}')
            missing = [c for c in (source_column, target_column) if c not in row]
            if missing:
                raise ValueError(f"{path}: line {number} has no column {missing[0]!r} (keys: {sorted(row)}); name "
                                 "the right ones with --source_column/--target_column")
            sources.append(row[source_column])
            targets.append(row[target_column])
            lines.append(f"line {number}")
    if not lines:
        raise ValueError(f"data file {str(path)!r} is empty; it needs one JSON object per line")
    return sources, targets, lines
