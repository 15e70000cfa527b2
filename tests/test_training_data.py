"""training/data.py: the shipped CMUdict split (a package resource) and its dev rule, and the user's data files
with their errors (each names the file, the line and the fix)."""

import hashlib
import json
from pathlib import Path

import pytest

from vaswani.data import data_file
from vaswani.training.data import default_g2p_file, is_dev_word, load_g2p, load_parallel_data, read_g2p

SHA256 = "5882433c3a14a9a0614b5f724ce74872851092e816852c82d6b74913b2085384"


@pytest.fixture(scope="module")
def g2p():
    return load_g2p()


def test_shipped_data_is_the_original_file_with_its_notice():
    assert hashlib.sha256(default_g2p_file().read_bytes()).hexdigest() == SHA256
    assert "CMU Pronouncing Dictionary" in data_file("cmudict-g2p", "SOURCE.md").read_text(encoding="utf-8")
    assert "{{ card_data }}" in data_file("model_card.md").read_text(encoding="utf-8")


def test_the_card_template_is_the_top_level_model_card():
    """One source of truth: the package's template is the repository's top-level model_card.md, not a copy."""
    from helpers import REPO

    shipped = REPO / "data" / "model_card.md"
    assert shipped.is_symlink() and shipped.resolve() == (REPO / "model_card.md").resolve()


def test_no_library_file_looks_for_files_next_to_the_repository():
    """Shipped files are package resources; a path built from a module's own location breaks in a wheel."""
    root = Path(__file__).resolve().parent.parent
    for folder in ("modeling", "tokenizer", "training", "data"):
        for path in (root / folder).glob("*.py"):
            text = path.read_text(encoding="utf-8")
            assert "Path(__file__)" not in text and "os.path.dirname(__file__)" not in text, path


def test_dev_split_whole_words_and_documented_sizes(g2p):
    train_words = {w for w, _ in g2p.train}
    assert not train_words & set(g2p.dev)
    assert len(train_words) == 101_481 and len(g2p.train) == 107_797
    assert len(g2p.dev) == 5_356 and sum(map(len, g2p.dev.values())) == 5_641
    assert len(train_words) + len(g2p.dev) == 106_837
    assert 0.045 < len(g2p.dev) / 106_837 < 0.055
    assert all(is_dev_word(w) for w in g2p.dev) and not any(is_dev_word(w) for w in train_words)


def test_dev_references_hold_every_pronunciation(g2p):
    lines = default_g2p_file().read_text(encoding="utf-8").splitlines()
    expected: dict[str, list[str]] = {}
    for line in lines:
        word, phones = line.split("\t")
        if word in g2p.dev:
            expected.setdefault(word, []).append(phones)
    assert g2p.dev == expected
    assert any(len(refs) > 1 for refs in g2p.dev.values())


def test_split_ignores_file_order(tmp_path):
    lines = ["CAT\tK AE T", "DOG\tD AO G", "READ\tR IY D", "READ\tR EH D", "TOMATO\tT AH M EY T OW"]
    lines += [f"W{i}\tW {i}" for i in range(300)]
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    a.write_text("\n".join(lines) + "\n")
    b.write_text("\n".join(reversed(lines)) + "\n")
    da, db = load_g2p(a), load_g2p(b)
    assert set(da.dev) == set(db.dev) and 0 < len(da.dev) < 40
    assert sorted(da.train) == sorted(db.train)
    assert {k: sorted(v) for k, v in da.dev.items()} == {k: sorted(v) for k, v in db.dev.items()}
    assert load_g2p(a, dev_percent=0).dev == {}


def test_g2p_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_g2p(tmp_path / "nope.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_text("CAT\tK AE T\nDOG D AO G\n")
    with pytest.raises(ValueError, match="bad.tsv:2"):
        read_g2p(bad)
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no entries"):
        read_g2p(empty)
    three = tmp_path / "three.tsv"
    three.write_text("CAT\tK AE T\nDOG\tD AO G\tnoun\n")
    with pytest.raises(ValueError, match="three.tsv:2: 3 tab-separated fields; a G2P line has 2"):
        read_g2p(three)


ROWS = [{"src": "hello world", "tgt": "hallo welt"}, {"src": 'say "hi"', "tgt": "sag hallo"}]


def _write(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"data.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "tsv":
        path.write_text("src\ttgt\n" + "".join(f"{r['src']}\t{r['tgt']}\n" for r in ROWS))
    else:
        path.write_text('src,tgt\nhello world,hallo welt\n"say ""hi""",sag hallo\n')
    return path


@pytest.mark.parametrize("kind", ["tsv", "csv", "jsonl"])
def test_user_data_formats(tmp_path, kind):
    data = load_parallel_data(_write(tmp_path, kind), "src", "tgt", cache_dir=str(tmp_path / "cache"))
    assert data.column_names == ["source", "target"]
    assert data["source"] == [r["src"] for r in ROWS] and data["target"] == [r["tgt"] for r in ROWS]


def test_user_data_swapped_columns(tmp_path):
    data = load_parallel_data(_write(tmp_path, "jsonl"), "tgt", "src", cache_dir=str(tmp_path / "cache"))
    assert data["source"][0] == "hallo welt" and data["target"][0] == "hello world"


def test_user_data_errors(tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(ValueError, match="missing.tsv.*does not exist"):
        load_parallel_data(tmp_path / "missing.tsv", cache_dir=cache)
    with pytest.raises(ValueError, match="no column 'source'.*--source_column"):
        load_parallel_data(_write(tmp_path, "jsonl"), cache_dir=cache)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_parallel_data(empty, cache_dir=cache)
    header_only = tmp_path / "header.csv"
    header_only.write_text("source,target\n")
    with pytest.raises(ValueError, match="no rows|empty"):
        load_parallel_data(header_only, cache_dir=cache)
    holes = tmp_path / "holes.csv"
    holes.write_text("source,target\na,b\nc,\n")
    with pytest.raises(ValueError, match="1 row.*empty 'target'.*line 3"):
        load_parallel_data(holes, cache_dir=cache)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"source": "a", "target": "b"}\n{"source": "c"\n')
    with pytest.raises(ValueError, match="bad.jsonl: line 2 is not JSON"):
        load_parallel_data(bad_json, cache_dir=cache)


def test_unknown_format_names_the_formats_taken(tmp_path):
    other = tmp_path / "data.parquet.txt"
    other.write_text("x")
    for path in (other, tmp_path / "missing.txt"):
        with pytest.raises(ValueError) as error:
            load_parallel_data(path, cache_dir=str(tmp_path / "cache"))
        assert all(f in str(error.value) for f in (".tsv", ".csv", ".jsonl", "Hub dataset")), error.value


def test_rows_with_different_field_counts_name_the_file_the_line_and_the_counts(tmp_path):
    """The case of the issue: a first line of one field (read as a header by pandas, whose index name leaked out)."""
    ragged = tmp_path / "ragged.tsv"
    ragged.write_text("HELLO\nWORLD\tW ER L D\n")
    with pytest.raises(ValueError) as error:
        load_parallel_data(ragged, cache_dir=str(tmp_path / "cache"))
    message = str(error.value)
    assert "ragged.tsv" in message and "line 2 has 2 tab-separated field(s), but line 1 has 1" in message
    assert "__" not in message  # no internal names (pandas' __index_level_0__, our renames)
    csv_file = tmp_path / "ragged.csv"
    csv_file.write_text('source,target\na,b\n"c, d",e,f\n')
    with pytest.raises(ValueError, match="ragged.csv: line 3 has 3 comma-separated field.*line 1 has 2"):
        load_parallel_data(csv_file, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError) as error:
        load_parallel_data(_write(tmp_path, "tsv"), "word", "phonemes", cache_dir=str(tmp_path / "cache"))
    assert "no column 'word'" in str(error.value) and "__" not in str(error.value)


def test_headerless_two_column_tsv_reads_like_the_default_data(tmp_path):
    lines = default_g2p_file().read_text(encoding="utf-8").splitlines()[:50]
    path = tmp_path / "words.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = load_parallel_data(path, cache_dir=str(tmp_path / "cache"))
    assert list(zip(data["source"], data["target"])) == [tuple(line.split("\t")) for line in lines]
    named = tmp_path / "named.tsv"
    named.write_text("source\ttarget\n" + "\n".join(lines) + "\n", encoding="utf-8")
    assert list(load_parallel_data(named, cache_dir=str(tmp_path / "cache"))["source"]) == list(data["source"])
