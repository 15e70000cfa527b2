"""Where the `onednn_linear` fast path's weight gradient should be computed, on this machine.

    python benchmarks/onednn_backward.py [--rounds 9] [--steps 5] [--threads 2]

A float32 training step (forward and backward; the optimizer is the same for every contender and left out) of the
main job's model (`g2p-small`, 128 wide, 150 CMUdict training pairs) and of the benchmark's G2P size (`g2p`, 256
wide, 256 pairs), eager attention, at dropout 0 and 0.1. Contenders, alternating round by round in one process:

- `path`: the path as it is (the forward and the input gradient by oneDNN's inner product, the weight and bias
  gradients by its backward-weights primitive, from g and x as they are stored);
- `mm`: the weight gradient g^T x on torch's `mm` (MKL), which reads the transposed operands in place (6 Dec 2026);
- `transposed`: the weight gradient on oneDNN's inner product from the transposed views of g and x, which oneDNN
  copies first (before 6 Dec 2026);
- `off`: the path switched off (every GEMM on F.linear, MKL).

Printed per model and dropout: the median (min-max) milliseconds of a step per contender, and the path's speed
against each other contender (the median (min-max) of the per-round ratios; above 1: the path is faster). The figures
of a run are in docs/performance.md with the machine they come from. This is not library code: nothing in the package
imports it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from measurement import _alternate, machine_description

MODEL = Path(__file__).resolve().parents[1] / "models" / "vaswani-g2p"  # its tokenizer; the weights start fresh


def _on_mm(grad, x, weight, bias: bool):
    """The weight gradient of 6 Dec 2026: torch's `mm`, which reads g^T and x in place; the bias's sums apart."""
    return torch.mm(grad.t(), x), grad.sum(0) if bias else None


def _transposed(grad, x, weight, bias: bool):
    """The weight gradient before 6 Dec 2026: oneDNN's inner product on the transposed views of g and x (which it
    copies first); the bias's sums apart."""
    from vaswani.onednn_vaswani import _inner_product

    return _inner_product(grad.t(), x.t()), grad.sum(0) if bias else None


# In place of `onednn_vaswani._weight_gradients`, which the path's backward calls (the rest of it unchanged)
WEIGHT_GRADIENTS = {"mm": _on_mm, "transposed": _transposed}


def contender(model, batch: dict, steps: int, variant: str, times: list[float]):
    from vaswani import onednn_vaswani

    def one_step() -> float:
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        return time.perf_counter() - start

    def run() -> float:
        kept = onednn_vaswani._weight_gradients
        model.set_fast_paths({"onednn_linear": variant != "off"})
        onednn_vaswani._weight_gradients = WEIGHT_GRADIENTS.get(variant, kept)
        try:
            times.append(1e3 * sum(one_step() for _ in range(steps)) / steps)
        finally:
            onednn_vaswani._weight_gradients = kept
        return times[-1]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5, help="steps per round and contender")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani.onednn_vaswani import faster_here
    from vaswani.training.data import load_g2p

    tokenizer = AutoTokenizer.from_pretrained(MODEL, trust_remote_code=True)
    train = load_g2p().train
    print(machine_description(0.0) | {"onednn_linear applies here": faster_here()})
    if not faster_here():
        print("the path does not apply on this CPU: every contender would be `off`")
        return
    print("| model, batch | dropout | path ms | mm ms | transposed ms | off ms | the path's speed against: mm | "
          "transposed | off |")
    print("|---|---|---|---|---|---|---|---|---|")
    for preset, words in (("g2p-small", 150), ("g2p", 256)):
        pairs = random.Random(0).sample(train, words)
        batch = dict(tokenizer([w for w, _ in pairs], text_target=[p for _, p in pairs], padding=True,
                               return_tensors="pt"))
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        for dropout in (0.0, 0.1):
            torch.manual_seed(0)
            config = VaswaniConfig.from_preset(preset, dropout=dropout, attn_implementation="eager")
            model = VaswaniForConditionalGeneration(config).train()
            times = {name: [] for name in ("path", "mm", "transposed", "off")}
            runs = {name: contender(model, batch, args.steps, name, times[name]) for name in times}
            for run in runs.values():  # warm-up
                run()
            for name in times:
                times[name].clear()
            _alternate(runs, args.rounds)
            cells = [f"{statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f})" for t in times.values()]
            ratios = []
            for name in ("mm", "transposed", "off"):
                r = [a / b for a, b in zip(times[name], times["path"])]
                ratios.append(f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")
            model.set_fast_paths(True)
            print(f"| {preset}, {words} words | {dropout} | " + " | ".join(cells + ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
