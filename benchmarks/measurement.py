"""The measuring the benchmarks share: the sizes, alternating rounds with their statistics, activation memory and
the machine's description. benchmark.py and long_inputs.py import it; it imports neither.

This is not library code: nothing in the package imports it, and it is not installed with it.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

SIZES = {
    "g2p": dict(vocab=128, d_model=256, layers=3, heads=4, ffn=1024, batch=256, source=12, target=10),
    "base": dict(vocab=8000, d_model=512, layers=6, heads=8, ffn=2048, batch=16, source=64, target=64),
    # for the test suite: the bookkeeping, not the speed
    "quick": dict(vocab=64, d_model=32, layers=1, heads=2, ffn=64, batch=8, source=6, target=5),
}


@dataclass
class Stat:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> "Stat":
        return cls(statistics.median(values), min(values), max(values))


NOISY_SPREAD = 0.2  # (max - min) / median of either contender above this: the machine was busy; rerun that row


def _relative_range(stat: dict) -> float:
    """(max - min) / median of a `Stat` as a dict."""
    return (stat["high"] - stat["low"]) / stat["median"]


def spread(comparison: dict, contenders: tuple[str, str] = ("marian", "vaswani")) -> float:
    """The wider of the two contenders' (max - min) / median: how far a row's ratio can be trusted."""
    return max(_relative_range(comparison[who]) for who in contenders)


def _spread_of(rates: dict[str, list[float]]) -> float:
    """`spread` of raw measurements (any contenders' names)."""
    return max(_relative_range(Stat.of(values).__dict__) for values in rates.values())


def _paired(first: list[float], second: list[float]) -> tuple[Stat, Stat, Stat, int]:
    """Two contenders' rates, round by round: the statistics of each, of the per-round ratios second / first, and the
    number of rounds."""
    ratios = [b / a for a, b in zip(first, second)]
    return Stat.of(first), Stat.of(second), Stat.of(ratios), len(ratios)

def _alternate(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Runs each contender once per round, in alternating order, and collects what each returns."""
    results = {name: [] for name in contenders}
    names = list(contenders)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            results[name].append(contenders[name]())
    return results


def _measure(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """`_alternate`, and as many rounds again when the first ones spread more than `NOISY_SPREAD`: a busy stretch of
    the machine then weighs less in the medians, which are taken over all the rounds (the decision looks at the
    spread alone, never at which contender was ahead)."""
    rates = _alternate(contenders, rounds)
    if _spread_of(rates) > NOISY_SPREAD:
        more = _alternate(contenders, rounds)
        rates = {name: rates[name] + more[name] for name in rates}
    return rates

def activation_bytes(model, batch: dict) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward: the memory that grows with
    sequence length (parameters, gradients and optimizer state don't). Exact and independent of machine noise."""
    seen: dict[int, int] = {}

    def pack(tensor):
        if tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(n for ptr, n in seen.items() if ptr not in parameters)

def machine_description(peak_gflops: float) -> dict:
    model_name = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return dict(cpu=model_name, cores=os.cpu_count(), threads=torch.get_num_threads(), torch=torch.__version__,
                matmul_peak_gflops=peak_gflops)
