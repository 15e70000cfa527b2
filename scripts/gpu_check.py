"""On a CUDA machine: compare flash_attention_2 and sdpa with eager in bf16 on padded source AND target.

For each backend: forward logits at real positions, the gradients of one training step, and greedy generate, each
against eager (and, for reference, eager in fp32 against eager in bf16, the noise floor of bf16). Prints a table.

    python scripts/gpu_check.py [--preset base] [--batch 16] [--src_len 64] [--tgt_len 48]

`--device cpu` runs the same comparisons on the CPU (a smoke test of this script); `scripts/gpu_run.sh` is the one
command for a lent GPU machine.
"""

import argparse
import sys

import torch

import vaswani


def padded_batch(vocab: int, batch: int, src_len: int, tgt_len: int, device: str):
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, vocab, (batch, src_len), generator=g)
    labels = torch.randint(4, vocab, (batch, tgt_len), generator=g)
    # lengths from 1 to full, source and target independent, so query and key padding differ in every row
    src_lens = torch.randint(1, src_len + 1, (batch,), generator=g)
    tgt_lens = torch.randint(1, tgt_len + 1, (batch,), generator=g)
    src_lens[0], tgt_lens[-1] = src_len, tgt_len
    attention_mask = (torch.arange(src_len) < src_lens[:, None]).long()
    decoder_attention_mask = (torch.arange(tgt_len) < tgt_lens[:, None]).long()
    batch = dict(
        input_ids=input_ids.masked_fill(attention_mask == 0, 0),
        attention_mask=attention_mask,
        labels=labels.masked_fill(decoder_attention_mask == 0, -100),
        decoder_attention_mask=decoder_attention_mask,
    )
    return {k: v.to(device) for k, v in batch.items()}


def run(model, batch, implementation):
    model.set_attn_implementation(implementation)
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    with torch.no_grad():
        generated = model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=16, do_sample=False
        )
    real = batch["decoder_attention_mask"].bool()
    return out.logits.detach()[real].float(), grads, generated


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--src_len", type=int, default=64)
    parser.add_argument("--tgt_len", type=int, default=48)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here; run this on a machine with an NVIDIA GPU (or --device cpu)")

    torch.manual_seed(0)
    config = vaswani.VaswaniConfig.from_preset(args.preset, vocab_size=args.vocab_size, dropout=0.0)
    model = vaswani.VaswaniForConditionalGeneration(config).to(args.device)
    batch = padded_batch(config.vocab_size, args.batch, args.src_len, args.tgt_len, args.device)

    reference_fp32 = run(model, batch, "eager")
    model.to(torch.bfloat16)
    reference = run(model, batch, "eager")
    rows = [("eager fp32 (noise floor)", reference_fp32)]
    for implementation in ("sdpa", "flash_attention_2"):
        try:
            rows.append((implementation, run(model, batch, implementation)))
        except (ImportError, ValueError, RuntimeError) as error:
            print(f"{implementation}: unavailable: {str(error).splitlines()[0]}")

    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"\n{name}, torch {torch.__version__}, preset {args.preset}, bf16, "
          f"batch {args.batch}, source {args.src_len}, target {args.tgt_len} (padded both sides)")
    print(f"{'backend vs eager bf16':<28}{'logits rel':>12}{'grads rel':>12}{'greedy same':>14}{'finite':>8}")
    results = []
    for name, (logits, grads, generated) in rows:
        same = (generated == reference[2]).all(-1).float().mean().item() if generated.shape == reference[2].shape else 0.0
        finite = bool(torch.isfinite(logits).all() and torch.isfinite(grads).all())
        results.append(dict(backend=name, logits_rel=rel(logits, reference[0]), grads_rel=rel(grads, reference[1]),
                            greedy_same=same, finite=finite))
        print(f"{name:<28}{results[-1]['logits_rel']:>12.2e}{results[-1]['grads_rel']:>12.2e}"
              f"{same:>13.0%}{str(finite):>8}")
    return results


if __name__ == "__main__":
    main()
