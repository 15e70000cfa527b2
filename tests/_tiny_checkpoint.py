"""A checkpoint folder like the training loop writes (model.save_pretrained + tokenizer.save_pretrained),
from a tiny random model and a G2P tokenizer trained on the first lines of the shipped CMUdict split."""

from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
CMUDICT = REPO / "data" / "cmudict-g2p" / "g014b2b.train.tsv"


def write_g2p_sample(path: Path, lines: int = 300) -> Path:
    """The first `lines` lines of the CMUdict split, as a WORD<TAB>PHONEMES file."""
    with open(CMUDICT, encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(lines)), encoding="utf-8")
    return path


def make_tiny_checkpoint(folder: Path, sample: Path, seed: int = 0, **config_overrides) -> Path:
    """Tokenizer (one piece per letter and phoneme of `sample`) + tiny model, saved into `folder`."""
    import vaswani
    from vaswani.tokenizer import train_tokenizer

    symbols = set()
    for line in sample.read_text(encoding="utf-8").splitlines():
        word, phonemes = line.split("\t")
        symbols |= set(word) | set(phonemes.split())
    tokenizer = train_tokenizer([sample], folder, len(symbols) + 4, "word", columns=[0, 1], spell_source=True)
    config = vaswani.VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), **{"dropout": 0.0, **config_overrides})
    torch.manual_seed(seed)
    model = vaswani.VaswaniForConditionalGeneration(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
