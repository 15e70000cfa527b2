"""On a CUDA machine: eager, sdpa and flash_attention_2 in bf16 at the paper's base and big sizes, padded batches.

For each (size, backend): training step time and tokens/s (forward + backward + AdamW step), peak memory, MFU
against a bf16 matmul peak measured in the same run, and greedy generation throughput (64 sentences, 32 new
tokens). Backends alternate round by round; medians with min-max. Prints a table and writes a JSON file.

    python scripts/gpu_benchmark.py [--sizes base big] [--batch 64] [--length 128] [--rounds 5] [--output gpu.json]

`--device cpu` runs the same bookkeeping on the CPU (a smoke test of this script, no figures worth reading);
`scripts/gpu_run.sh` is the one command for a lent GPU machine.
"""

import argparse
import json
import statistics
import sys
import time

import torch

import vaswani


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def matmul_peak(device: str, dtype: torch.dtype, n: int, repeats: int = 20) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12  # TFLOP/s


def padded_batch(vocab: int, batch: int, length: int, device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (batch, length), generator=g)
    labels = torch.randint(4, vocab, (batch, length), generator=g)
    src = (torch.arange(length) < torch.randint(length // 2, length + 1, (batch, 1), generator=g)).long()
    tgt = (torch.arange(length) < torch.randint(length // 2, length + 1, (batch, 1), generator=g)).long()
    return {k: v.to(device) for k, v in dict(input_ids=ids.masked_fill(src == 0, 0), attention_mask=src,
                                          labels=labels.masked_fill(tgt == 0, -100),
                                          decoder_attention_mask=tgt).items()}


def step_flops(config, batch: dict) -> float:
    """6 x parameters in GEMMs x tokens (forward + backward), plus attention, on real tokens."""
    d, f, v = config.d_model, config.encoder_ffn_dim, config.vocab_size
    src, tgt = batch["attention_mask"].sum().item(), batch["decoder_attention_mask"].sum().item()
    s, t = batch["input_ids"].shape[1], batch["labels"].shape[1]
    b = batch["input_ids"].shape[0]
    enc = config.encoder_layers * (4 * d * d + 2 * d * f) * src
    dec = config.decoder_layers * ((6 * d * d + 2 * d * f) * tgt + 2 * d * d * src) + d * v * tgt
    attention = 4 * b * d * (config.encoder_layers * s * s + config.decoder_layers * (t * t + t * s))
    return 6 * (enc + dec) + 3 * attention


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--sizes", nargs="+", default=["base", "big"])
    parser.add_argument("--vocab_size", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--peak_n", type=int, default=8192, help="matrix size of the matmul peak measurement")
    parser.add_argument("--output", default="gpu_benchmark.json")
    return parser


def print_table(rows: list[dict]) -> None:
    print(f"\n{'size':<6}{'backend':<20}{'step ms [min-max]':>24}{'tokens/s':>12}{'peak GiB':>10}{'MFU':>7}"
          f"{'gen tok/s':>11}")
    for r in rows:
        span = f"{r['step_ms']:.1f} [{r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}]"
        memory = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f}"  # measured on CUDA only
        print(f"{r['size']:<6}{r['backend']:<20}{span:>24}{r['tokens_per_s']:>12.0f}{memory:>10}"
              f"{r['mfu']:>7.0%}{r['generate_tokens_per_s']:>11.0f}")


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_benchmark: no CUDA device here; run this on a machine with an NVIDIA GPU (or --device cpu)")
    device, dtype = args.device, getattr(torch, args.dtype)

    peak = matmul_peak(device, dtype, args.peak_n)
    print(f"{device_name(device)}, torch {torch.__version__}: {args.dtype} matmul peak {peak:.1f} TFLOP/s")
    rows = []
    for size in args.sizes:
        config = vaswani.VaswaniConfig.from_preset(size, vocab_size=args.vocab_size)
        torch.manual_seed(0)
        model = vaswani.VaswaniForConditionalGeneration(config).to(device, dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        batch = padded_batch(config.vocab_size, args.batch, args.length, device)
        flops = step_flops(config, batch)
        tokens = int(batch["attention_mask"].sum() + batch["decoder_attention_mask"].sum())
        backends = []
        for backend in ("eager", "sdpa", "flash_attention_2"):
            try:
                model.set_attn_implementation(backend)
                backends.append(backend)
            except (ImportError, ValueError) as error:
                print(f"{size} {backend}: unavailable: {str(error).splitlines()[0]}")
        times = {b: [] for b in backends}
        memory = {}
        generation = {b: [] for b in backends}
        model.train()
        for round_index in range(args.rounds + 1):  # round 0 warms up
            for backend in backends if round_index % 2 == 0 else backends[::-1]:
                model.set_attn_implementation(backend)
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                synchronize(device)
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                model(**batch).loss.backward()
                optimizer.step()
                synchronize(device)
                if round_index:
                    times[backend].append(time.perf_counter() - start)
                memory[backend] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
                model.eval()
                sentences = batch["input_ids"][:64]
                start = time.perf_counter()
                with torch.inference_mode():
                    model.generate(input_ids=sentences, attention_mask=batch["attention_mask"][:64],
                                   max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
                synchronize(device)
                if round_index:
                    generation[backend].append(len(sentences) * args.new_tokens / (time.perf_counter() - start))
                model.train()
        for backend in backends:
            t = statistics.median(times[backend])
            rows.append(dict(size=size, backend=backend, step_ms=1e3 * t, step_ms_min=1e3 * min(times[backend]),
                             step_ms_max=1e3 * max(times[backend]), tokens_per_s=tokens / t,
                             peak_memory_gib=memory[backend], mfu=flops / t / (peak * 1e12),
                             generate_tokens_per_s=statistics.median(generation[backend])))
        del model, optimizer
        if device == "cuda":
            torch.cuda.empty_cache()

    print_table(rows)
    with open(args.output, "w") as f:
        json.dump({"device": device_name(device), "torch": torch.__version__, "dtype": args.dtype,
                   "matmul_peak_tflops": peak, "rows": rows}, f, indent=2)
    print(f"wrote {args.output}")
    return rows


if __name__ == "__main__":
    main()
