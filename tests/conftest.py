"""Test settings shared by the whole suite: one thread (tiny models run far faster), no network."""

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
