"""What an update of the main job's model costs with each optimizer, on this machine.

    python benchmarks/optimizer_step.py [--rounds 7] [--steps 5] [--words 150] [--threads 2]

The main job's model (`g2p-small`, eager attention) trains on a batch of `--words` CMUdict training pairs (a fixed
sample of the shipped split; 150 words is about the main job's 1,500-token update) in the precision
`--mixed_precision auto` gives on this machine. Contenders, alternating round by round in one process: Adam (fused),
and `MuonWithAdam` with its Newton-Schulz iterations in float32 and in bf16 (the default is bf16 where the CPU
multiplies it in hardware, float32 elsewhere), and in the default precision at 3 iterations instead of 5. Printed
per contender: the median (min-max) milliseconds of the whole update (forward, backward, optimizer step) and of the
optimizer step alone, and the update's time over Adam's (the median of the per-round ratios).

The figures of a run are in docs/recipes.md with the machine they come from. This is not library code: nothing in the
package imports it.
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


def contender(name: str, batch: dict, precision: str, steps: int, kind: str, ns_dtype=None, ns_steps: int = 5):
    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani.training.schedule import make_optimizer

    torch.manual_seed(0)
    config = VaswaniConfig.from_preset("g2p-small", attn_implementation="eager")
    model = VaswaniForConditionalGeneration(config).train()
    optimizer = make_optimizer(model, lr=1e-4, kind=kind)
    if kind == "muon":
        optimizer.muon.ns_dtype = ns_dtype
        for group in optimizer.muon.param_groups:
            group["ns_steps"] = ns_steps
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    times: dict[str, list[float]] = {"update": [], "optimizer": []}

    def one_update() -> tuple[float, float]:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        middle = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        return end - start, end - middle

    one_update()  # warm-up
    one_update()

    def run() -> float:
        measured = [one_update() for _ in range(steps)]
        times["update"].append(1e3 * sum(u for u, _ in measured) / steps)
        times["optimizer"].append(1e3 * sum(o for _, o in measured) / steps)
        return times["update"][-1]

    return run, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="updates per round and contender")
    parser.add_argument("--words", type=int, default=150, help="training pairs per batch")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from vaswani.training.data import load_g2p
    from vaswani.training.loop import resolve_mixed_precision
    from vaswani.training.schedule import native_bf16

    tokenizer = AutoTokenizer.from_pretrained(MODEL, trust_remote_code=True)
    pairs = random.Random(0).sample(load_g2p().train, args.words)
    batch = dict(tokenizer([w for w, _ in pairs], text_target=[p for _, p in pairs], padding=True,
                           return_tensors="pt"))
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    precision = resolve_mixed_precision("auto", cpu=True)
    default = torch.bfloat16 if native_bf16("cpu") else torch.float32
    print(machine_description(0.0) | {"forward": precision, "bf16 native": native_bf16("cpu"),
                                      "target tokens": int((batch["labels"] != -100).sum())})
    made = {
        "adam": contender("adam", batch, precision, args.steps, "adam"),
        "muon, iterations in float32": contender("f32", batch, precision, args.steps, "muon", torch.float32),
        "muon, iterations in bf16": contender("bf16", batch, precision, args.steps, "muon", torch.bfloat16),
        f"muon, 3 iterations in {str(default).split('.')[1]}": contender("3", batch, precision, args.steps, "muon",
                                                                           default, ns_steps=3),
    }
    _alternate({name: run for name, (run, _) in made.items()}, args.rounds)
    adam = made["adam"][1]["update"]
    print(f"| optimizer | update ms | optimizer step ms | update / Adam's |\n|---|---|---|---|")
    for name, (_, times) in made.items():
        u, o = times["update"], times["optimizer"]
        ratio = statistics.median(b / a for a, b in zip(adam, u))
        print(f"| {name} | {statistics.median(u):.1f} ({min(u):.1f}-{max(u):.1f}) | {statistics.median(o):.1f} "
              f"({min(o):.1f}-{max(o):.1f}) | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
