"""VaswaniTokenizer, its training (tokenizer/) and its command line vaswani-train-tokenizer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from vaswani.tokenizer import TokenizerTrainingError, VaswaniTokenizer, train_tokenizer
from vaswani.tokenizer import train_vaswani_tokenizer as command
from vaswani.training.data import default_g2p_file


REPO = Path(__file__).resolve().parents[1]

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog.",
    "Café déjà vu, naïve façade — “quotes” and ‘single’ Ærøskøbing.",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "Привет, как дела? Всё хорошо!",
    "Numbers: 3.14159, 42, 1,000,000 and 2024-06-01 (10% off) #1 @home & [x] {y} <z>",
    "Emoji: 😀 🚀 👍🏽 🇫🇷",
    "Γειά σου κόσμε. שלום עולם. مرحبا بالعالم. नमस्ते दुनिया",
]
# Not in the training text: characters the model has never seen must round-trip through byte pieces.
UNSEEN = ["  two  spaces  ", "tab\there\nnewline", "unseen ✓ ∑ 𝔘 ǅ ﬁ", "ÀÉÎÕÜ ñ ß", "🦙🦜"]


def _write_corpus(folder: Path, repeat: int = 20) -> Path:
    # The multilingual lines plus English-like filler so that there is something to merge.
    filler = [f"line {i} of the corpus, with words like train{i % 7} and test{i % 5}." for i in range(200)]
    path = folder / "corpus.txt"
    path.write_text("\n".join(MULTILINGUAL * repeat + filler) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def unigram(corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("unigram")
    return train_tokenizer([corpus], folder, vocab_size=440, model_type="unigram"), folder


@pytest.fixture(scope="module")
def cmudict_sample(tmp_path_factory):
    path = tmp_path_factory.mktemp("g2p") / "sample.tsv"
    with default_g2p_file().open(encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(3000)), encoding="utf-8")
    return path


def test_round_trip_multilingual(unigram):
    tok, _ = unigram
    for text in MULTILINGUAL + UNSEEN:
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids, text
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_fixed(unigram):
    tok, _ = unigram
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = tok("hello world")["input_ids"]
    assert ids[-1] == tok.eos_token_id and tok.bos_token_id not in ids
    assert tok.model_input_names == ["input_ids", "attention_mask"]


def test_special_ids_match_config(unigram):
    vaswani = pytest.importorskip("vaswani")
    if not hasattr(vaswani, "VaswaniConfig"):
        pytest.skip("vaswani.VaswaniConfig not there yet")
    tok, _ = unigram
    config = vaswani.VaswaniConfig()
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (
        tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    assert len(tok) == 440 and config.vocab_size >= len(tok)


def test_text_target_gives_labels(unigram):
    tok, _ = unigram
    batch = tok(["Привет", "Café"], text_target=["Hello there", "東京"])
    assert batch["labels"] == [tok("Hello there")["input_ids"], tok("東京")["input_ids"]]
    assert batch["input_ids"] == [tok("Привет")["input_ids"], tok("Café")["input_ids"]]
    assert set(batch) == {"input_ids", "attention_mask", "labels"}


def test_padding_right_and_truncation_keeps_eos(unigram):
    tok, _ = unigram
    long, short = MULTILINGUAL[1], "Hi"
    batch = tok([short, long], padding=True, return_tensors="pt")
    n_short = len(tok(short)["input_ids"])
    assert batch["input_ids"][0, n_short - 1] == tok.eos_token_id
    assert (batch["input_ids"][0, n_short:] == tok.pad_token_id).all()
    assert batch["attention_mask"][0].tolist() == [1] * n_short + [0] * (batch["input_ids"].shape[1] - n_short)
    truncated = tok([short, long], truncation=True, max_length=6, padding=True)["input_ids"]
    assert len(truncated[1]) == 6 and truncated[1][-1] == tok.eos_token_id
    assert truncated[1][:5] == tok(long)["input_ids"][:5]


def test_save_load_same_ids(unigram, tmp_path):
    tok, folder = unigram
    tok.save_pretrained(tmp_path)
    assert {"spm.model", "tokenizer_config.json", "tokenization_vaswani.py"} <= set(os.listdir(tmp_path))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "VaswaniTokenizer"
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_vaswani.VaswaniTokenizer"
    reloaded = VaswaniTokenizer.from_pretrained(tmp_path)
    remote = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    for text in MULTILINGUAL + UNSEEN:
        assert reloaded(text)["input_ids"] == tok(text)["input_ids"] == remote(text)["input_ids"]
    assert (tmp_path / "spm.model").read_bytes() == (folder / "spm.model").read_bytes()


def test_auto_tokenizer_registered_without_config_json(unigram):
    """Registered (as vaswani/__init__ does) the local class loads, no trust_remote_code, no config.json."""
    from transformers import AutoConfig, PreTrainedConfig

    vaswani = pytest.importorskip("vaswani")
    config_class = getattr(vaswani, "VaswaniConfig", None)
    if config_class is None:
        class StandInConfig(PreTrainedConfig):
            model_type = "vaswani_tokenizer_test"

        AutoConfig.register(StandInConfig.model_type, StandInConfig, exist_ok=True)
        config_class = StandInConfig
    AutoTokenizer.register(config_class, tokenizer_class=VaswaniTokenizer, exist_ok=True)
    _, folder = unigram
    assert not (folder / "config.json").exists()
    assert type(AutoTokenizer.from_pretrained(folder)) is VaswaniTokenizer


def test_g2p_word_model(cmudict_sample, tmp_path):
    # letters spelled out + phonemes as words, one shared symbol vocabulary
    symbols = set()
    for line in cmudict_sample.read_text(encoding="utf-8").splitlines():
        word, phonemes = line.split("\t")
        symbols |= set(word) | set(phonemes.split())
    vocab_size = len(symbols) + 4
    tok = train_tokenizer([cmudict_sample], tmp_path, vocab_size, "word", columns=[0, 1], spell_source=True)
    assert len(tok) == vocab_size
    batch = tok(["AACHEN"], text_target=["AA K AH N"])
    source, labels = batch["input_ids"][0], batch["labels"][0]
    assert tok.convert_ids_to_tokens(source) == ["▁A", "▁A", "▁C", "▁H", "▁E", "▁N", "</s>"]
    assert tok.convert_ids_to_tokens(labels) == ["▁AA", "▁K", "▁AH", "▁N", "</s>"]
    assert tok.decode(labels, skip_special_tokens=True) == "AA K AH N"
    assert tok.unk_token_id not in source + labels
    # the choice travels with the folder
    reloaded = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    assert reloaded(["AACHEN"], text_target=["AA K AH N"])["input_ids"] == batch["input_ids"]
    with pytest.raises(TokenizerTrainingError, match=f"largest it can fill is {vocab_size}"):
        train_tokenizer([cmudict_sample], tmp_path / "big", vocab_size + 1, "word", columns=[0, 1], spell_source=True)


def test_char_model(cmudict_sample, tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("\n".join(line.split("\t")[0] for line in cmudict_sample.read_text().splitlines()))
    alphabet = set(words.read_text()) - {"\n"}
    tok = train_tokenizer([words], tmp_path / "tok", len(alphabet) + 5, "char")  # +4 special, +1 "▁"
    assert tok.tokenize("AACHEN") == ["▁", "A", "A", "C", "H", "E", "N"]
    assert tok.decode(tok("AACHEN")["input_ids"], skip_special_tokens=True) == "AACHEN"


def test_reproducible(corpus, tmp_path):
    for run in ("a", "b"):
        train_tokenizer([corpus], tmp_path / run, vocab_size=450, model_type="bpe")
    assert (tmp_path / "a" / "spm.model").read_bytes() == (tmp_path / "b" / "spm.model").read_bytes()


def test_remote_code_load_without_package(unigram, tmp_path):
    """The saved folder loads with trust_remote_code in a python where vaswani is not importable."""
    tok, folder = unigram
    code = f"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if p not in ("", {str(REPO)!r})]
try:
    import vaswani
    sys.exit("vaswani is importable")
except ModuleNotFoundError:
    pass
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
assert type(tok).__module__.startswith("transformers_modules."), type(tok).__module__
print(tok({MULTILINGUAL!r})["input_ids"])
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == tok(MULTILINGUAL)["input_ids"]


def test_fast_tokenizer_same_ids(corpus, tmp_path):
    pytest.importorskip("google.protobuf")
    texts = MULTILINGUAL + UNSEEN + [" leading", "trailing ", "", "<sep> a<sep>b", "a </s> b"]
    for model_type, vocab_size in (("bpe", 600), ("unigram", 440)):
        tok = train_tokenizer([corpus], tmp_path / model_type, vocab_size, model_type, user_defined_symbols=["<sep>"])
        fast = tok.to_fast()
        for text in texts:
            ids = tok(text)["input_ids"]
            assert fast(text)["input_ids"] == ids, (model_type, text)
            assert fast.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)
        assert fast(["a", "Café déjà"], padding=True)["input_ids"] == tok(["a", "Café déjà"], padding=True)["input_ids"]


# Bad input: a clear exception in the library, one line and no traceback from the script.

def test_missing_model_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no spm.model"):
        VaswaniTokenizer.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        VaswaniTokenizer(vocab_file=str(tmp_path / "missing.model"))


@pytest.mark.parametrize("case", ["missing", "directory", "not_utf8", "empty", "vocab_too_big", "vocab_too_small"])
def test_script_bad_input_in_process(case, corpus, tmp_path, capsys):
    script = command
    inputs = {"missing": tmp_path / "nope.txt", "directory": tmp_path, "not_utf8": tmp_path / "latin1.txt",
              "empty": tmp_path / "empty.txt"}.get(case, corpus)
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("\n  \n")
    vocab_size = {"vocab_too_big": 100000, "vocab_too_small": 270}.get(case, 440)
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--input", str(inputs), "--vocab_size", str(vocab_size), "--output_dir", str(tmp_path / "out")])
    message = exit_info.value.code  # a string: python prints it to stderr and exits with status 1
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message
    expected = {"missing": "No such file", "directory": "Is a directory", "not_utf8": "not UTF-8",
                "empty": "corpus is empty", "vocab_too_big": "the largest it can fill is",
                "vocab_too_small": "too small"}[case]
    assert expected in message
    assert not (tmp_path / "out").exists()


def test_script_subprocess_one_line_error(corpus, tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train_tokenizer.py"), "--input", str(corpus),
         "--vocab_size", "100000", "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    largest = int(lines[0].rsplit(" ", 1)[1])
    assert 300 < largest < 100000


def test_vocab_too_small_for_byte_fallback_names_the_flag_and_the_smallest_size(corpus, tmp_path, capsys):
    """The case of the issue (unigram, 200 < the 260 reserved ids): the message names --no-byte_fallback and the
    smallest sizes, with and without byte pieces, and both sizes train."""
    for model_type in ("unigram", "bpe"):
        with pytest.raises(SystemExit) as exit_info:
            command.main(["--input", str(corpus), "--vocab_size", "200", "--model_type", model_type,
                          "--output_dir", str(tmp_path / "out")])
        message = exit_info.value.code
        assert "--no-byte_fallback" in message and "\n" not in message, message
        smallest = int(message.split("pass --vocab_size ")[1].split()[0])
        without = int(message.split("--no-byte_fallback (then ")[1].split()[0])
        assert smallest == without + 256 and 260 < smallest <= 440
        assert len(train_tokenizer([corpus], tmp_path / f"{model_type}-bf", smallest, model_type)) == smallest
        assert len(train_tokenizer([corpus], tmp_path / f"{model_type}-nobf", without, model_type,
                                   byte_fallback=False)) == without
        with pytest.raises(TokenizerTrainingError, match="too small"):
            train_tokenizer([corpus], tmp_path / "x", smallest - 1, model_type)
    with pytest.raises(TokenizerTrainingError, match=r"--vocab_size 261 or more, or --no-byte_fallback \(then 5"):
        train_tokenizer([corpus], tmp_path / "word", 200, "word", byte_fallback=True)
