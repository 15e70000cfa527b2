"""Test settings shared by the whole suite: one thread (tiny models run far faster), no network; and the shared
fixtures: the tiny config, a tiny G2P checkpoint with its loaded model and tokenizer, and a tiny vaswani-train run."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def tiny_config():
    """The shared tiny size: d_model 16, 2+2 layers, 4 heads, vocab 100; dropout off so outputs are comparable."""
    import vaswani

    return vaswani.VaswaniConfig.from_preset("tiny", dropout=0.0)


@pytest.fixture(scope="session")
def g2p_sample(tmp_path_factory):
    """The first 300 lines of the shipped CMUdict split (WORD<TAB>PHONEMES)."""
    from helpers import write_g2p_sample

    return write_g2p_sample(tmp_path_factory.mktemp("g2p") / "sample.tsv", lines=300)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, g2p_sample):
    """A folder like the training loop writes: tiny random model and a G2P tokenizer; tests only read it."""
    from helpers import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), g2p_sample)


@pytest.fixture(scope="module")
def loaded(checkpoint):
    """(model, tokenizer) of `checkpoint` on the CPU, one per test file (some tests switch the model's attention)."""
    from vaswani.training.generation import load_checkpoint

    return load_checkpoint(checkpoint, device="cpu")


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory, g2p_sample):
    """A tiny G2P checkpoint trained for a few hundred steps on the sample (outputs are pronunciations), pre-LN with
    the split sinusoid layout and a final logits bias, so that an export that drops any of them shows."""
    from helpers import make_tiny_checkpoint, train_tiny

    folder = make_tiny_checkpoint(tmp_path_factory.mktemp("trained"), g2p_sample, d_model=32, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, normalize_before=True, position_encoding="sinusoidal_split",
                                  final_logits_bias=True)
    return train_tiny(folder)


@pytest.fixture(scope="session")
def train_workspace(tmp_path_factory):
    """A slice of CMUdict (g2p.tsv, every 400th line) and a tokenizer trained on it once (tokenizer/)."""
    from helpers import write_train_workspace

    return write_train_workspace(tmp_path_factory.mktemp("train_loop"))


@pytest.fixture(scope="session")
def trained_run(train_workspace):
    """scripts/train.py end to end: 20 steps, the whole output folder (trains its own tokenizer); (folder, result).
    Tests only read it (the loop's, the export's, the model card's and vaswani-average's)."""
    from helpers import TINY, run_train

    out = train_workspace / "e2e"
    result = run_train(["--train_file", str(train_workspace / "g2p.tsv"), *TINY, "--max_steps", "20", "--eval_every",
                        "10", "--save_every", "10", "--output_dir", str(out), "--show", "HELLO", "PYTORCH"],
                       train_workspace)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return out, result
