"""On a CUDA machine: the long-input attention patterns on the GPU backends that run them.

1. Agreement: local attention under flash_attention_2 (its sliding window) and flex_attention (a block mask),
   block-sparse attention under flex_attention, each also under sdpa, and linear attention, against eager in bf16
   on a padded batch of long sources: forward logits at real positions, the gradients of one training step, and
   greedy generate with the pattern's cache (eager in fp32 is the noise floor).
2. Cost: the time of one training step (forward + backward), batch 1, against source length, for full attention
   under sdpa and each pattern on its GPU backends; out-of-memory is reported as such.

    python scripts/gpu_patterns.py [--preset g2p] [--src_len 2048] [--lengths 4096 8192 16384 32768]

`--device cpu` runs what the CPU can (eager and sdpa; flex attention has no backward there and flash attention no
CPU kernel) at the sizes given: the suite's smoke test. `scripts/gpu_run.sh` runs it on a lent GPU machine.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import vaswani

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kit's sibling, also when loaded by path
from gpu_check import padded_batch, rel, run  # noqa: E402

# (pattern, backend) pairs checked against eager; the CPU runs only those under sdpa.
CHECKS = [("local", "flash_attention_2"), ("local", "flex_attention"), ("local", "sdpa"),
          ("block_sparse", "flex_attention"), ("block_sparse", "sdpa"), ("linear", "sdpa")]
COSTS = [("full", "sdpa"), ("local", "flash_attention_2"), ("local", "flex_attention"), ("local", "sdpa"),
         ("block_sparse", "flex_attention"), ("block_sparse", "sdpa"), ("linear", "sdpa")]
UNAVAILABLE = (ImportError, ValueError, RuntimeError, NotImplementedError)


def build(args, pattern: str) -> vaswani.VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    config = vaswani.VaswaniConfig.from_preset(
        args.preset, vocab_size=args.vocab_size, dropout=0.0, encoder_attention_pattern=pattern,
        decoder_attention_pattern=pattern, attention_window=args.window, sparse_block_size=args.block,
        sparse_global_tokens=args.global_tokens)
    return vaswani.VaswaniForConditionalGeneration(config).to(args.device)


def agreement(args) -> list[dict]:
    """Each (pattern, backend) against eager in bf16 (the CPU: float32) on one padded batch."""
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    rows = []
    for pattern in ("local", "block_sparse", "linear"):
        model = build(args, pattern)
        batch = padded_batch(model.config.vocab_size, args.batch, args.src_len, args.tgt_len, args.device)
        floor = run(model, batch, "eager")
        model.to(dtype)
        reference = run(model, batch, "eager")
        contenders = [("eager fp32 (noise floor)", floor)]
        for checked, backend in CHECKS:
            if checked != pattern or (args.device == "cpu" and backend != "sdpa"):
                continue
            try:
                contenders.append((backend, run(model, batch, backend)))
            except UNAVAILABLE as error:
                print(f"{pattern} / {backend}: unavailable: {str(error).splitlines()[0]}")
        for backend, (logits, grads, generated) in contenders:
            same = (generated == reference[2]).all(-1).float().mean().item() if generated.shape == reference[
                2].shape else 0.0
            rows.append(dict(pattern=pattern, backend=backend, logits_rel=rel(logits, reference[0]),
                             grads_rel=rel(grads, reference[1]), greedy_same=same,
                             finite=bool(torch.isfinite(logits).all() and torch.isfinite(grads).all())))
            r = rows[-1]
            print(f"{r['pattern']:<14}{r['backend']:<28}{r['logits_rel']:>12.2e}{r['grads_rel']:>12.2e}"
                  f"{r['greedy_same']:>13.0%}{str(r['finite']):>8}", flush=True)
    return rows


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_seconds(model, length: int, args, repeats: int = 3) -> float:
    """Median time of a forward + backward at batch 1, source `length`, target `args.tgt_len`."""
    ids = torch.randint(4, model.config.vocab_size, (1, length), device=args.device)
    labels = torch.randint(4, model.config.vocab_size, (1, args.tgt_len), device=args.device)
    times = []
    for _ in range(repeats + 1):  # the first call compiles (flex) and warms up
        model.zero_grad(set_to_none=True)
        _sync(args.device)
        start = time.perf_counter()
        model(input_ids=ids, labels=labels).loss.backward()
        _sync(args.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def costs(args) -> list[dict]:
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    rows = []
    for pattern, backend in COSTS:
        if args.device == "cpu" and backend not in ("sdpa", "eager"):
            continue
        model = build(args, pattern).to(dtype).train()
        for length in args.lengths:
            try:
                model.set_attn_implementation(backend)
                seconds = step_seconds(model, length, args)
            except torch.OutOfMemoryError:
                seconds = "out of memory"
            except UNAVAILABLE as error:
                seconds = f"unavailable: {str(error).splitlines()[0][:80]}"
            rows.append(dict(pattern=pattern, backend=backend, source_length=length, step_seconds=seconds))
            print(f"{pattern:<14}{backend:<20}{length:>8}  {seconds if isinstance(seconds, str) else f'{seconds:.4f}'}",
                  flush=True)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--preset", default="g2p")
    parser.add_argument("--vocab_size", type=int, default=128)
    parser.add_argument("--window", type=int, default=128, help="attention_window of local attention")
    parser.add_argument("--block", type=int, default=64, help="sparse_block_size of block-sparse attention")
    parser.add_argument("--global_tokens", type=int, default=2, help="sparse_global_tokens")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--src_len", type=int, default=2048, help="source length of the agreement check")
    parser.add_argument("--tgt_len", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768],
                        help="source lengths of the cost sweep")
    parser.add_argument("--output", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_patterns: no CUDA device here; run this on a machine with an NVIDIA GPU (or --device cpu)")

    # Each row is printed as it is measured and the JSON written after each part, so a run stopped at its time limit
    # keeps what it measured.
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"\n{name}, torch {torch.__version__}, preset {args.preset}, window {args.window}, block {args.block}, "
          f"globals {args.global_tokens}, batch {args.batch}, source {args.src_len}, target {args.tgt_len} (padded)")
    print(f"{'pattern':<14}{'backend vs eager':<28}{'logits rel':>12}{'grads rel':>12}{'greedy same':>14}{'finite':>8}",
          flush=True)
    results = dict(device=name, torch=torch.__version__, agreement=agreement(args), costs=[])
    write(results, args.output)
    print(f"\ntraining step (forward + backward), batch 1, target {args.tgt_len}: seconds", flush=True)
    results["costs"] = costs(args)
    write(results, args.output)
    return results


def write(results: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
