"""Benchmark vaswani against transformers' MarianMTModel on identical weights, in one process, A/B alternating.

    python scripts/benchmark.py                      # g2p and base sizes; writes benchmarks/results.{json,md,png}
    python scripts/benchmark.py --sizes g2p --rounds 7
    python scripts/benchmark.py --quick              # a tiny run that checks the bookkeeping (used by the tests)

The logic lives in vaswani.training.benchmark.
"""

import argparse
import os
import sys

import torch

from vaswani.training.benchmark import run_benchmark, write_outputs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["g2p", "base"], choices=["g2p", "base"])
    parser.add_argument("--rounds", type=int, default=5, help="alternating A/B rounds per measurement")
    parser.add_argument("--steps", type=int, default=3, help="training steps per round")
    parser.add_argument("--generation_rounds", type=int, default=5)
    parser.add_argument("--memory_lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--memory_size", default="g2p", choices=["g2p", "base"])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output_dir", default="benchmarks")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and one round: checks, not speed")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.sizes, args.rounds, args.steps, args.generation_rounds = ["quick"], 1, 1, 1
        args.memory_lengths, args.memory_size = [16, 32], "quick"
    results = run_benchmark(args.sizes, args.rounds, args.steps, args.generation_rounds, args.memory_lengths,
                            args.memory_size)
    for path in write_outputs(results, args.output_dir):
        print(f"wrote {path}")
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
