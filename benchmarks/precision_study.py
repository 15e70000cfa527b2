"""How far a bf16-autocast training gradient is from the float32 one, at a trained G2P model.

    python benchmarks/precision_study.py MODEL_FOLDER [--batches 8] [--words 300]

For each of `--batches` batches of `--words` training pairs (drawn with a fixed seed from the shipped CMUdict split's
training side), the loss and the gradient of every parameter are computed twice, in float32 and under bf16 autocast
(what `--mixed_precision bf16` trains with), in train mode. Printed per batch: the loss difference, the relative error
of the whole gradient and its cosine to the float32 one. Then, over the batches: whether the errors of different
batches point the same way (a bias would survive the averaging an optimizer does; noise would not), the size of the
mean error against the mean gradient, and the parameter tensors with the largest relative error (a tensor whose exact
gradient is zero, such as an attention key bias, shows the rounding noise alone).

The figures of a run are in docs/recipes.md with the machine they come from. This is not library code: nothing in the
package imports it.
"""

from __future__ import annotations

import argparse
import random
from contextlib import nullcontext

import torch
import torch.nn.functional as F


def gradients(model, batch, bf16: bool) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
        loss = model(**batch).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a trained G2P model folder (a run's output_dir, or models/vaswani-g2p)")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--words", type=int, default=300, help="training pairs per batch")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from vaswani import VaswaniForConditionalGeneration
    from vaswani.training.data import load_g2p

    model = VaswaniForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32,
                                                            attn_implementation="eager").train()  # as G2P trains
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    pairs = random.Random(0).sample(load_g2p().train, args.batches * args.words)
    errors, grads, per_tensor = [], [], {}
    for i in range(args.batches):
        chunk = pairs[i * args.words:(i + 1) * args.words]
        batch = dict(tokenizer([w for w, _ in chunk], text_target=[p for _, p in chunk], padding=True,
                               return_tensors="pt"))
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        loss32, g32 = gradients(model, batch, bf16=False)
        loss16, g16 = gradients(model, batch, bf16=True)
        flat32, flat16 = torch.cat([g.flatten() for g in g32.values()]), torch.cat([g.flatten() for g in g16.values()])
        errors.append(flat16 - flat32)
        grads.append(flat32)
        for name in g32:
            per_tensor.setdefault(name, []).append(((g16[name] - g32[name]).norm() / g32[name].norm()).item())
        print(f"batch {i}: float32 loss {loss32:.5f}, bf16 - float32 {loss16 - loss32:+.5f}; gradient relative error "
              f"{(errors[-1].norm() / flat32.norm()).item():.4f}, cosine {F.cosine_similarity(flat16, flat32, 0):.5f}")
    pairs_cos = [F.cosine_similarity(errors[i], errors[i + 1], 0).item() for i in range(len(errors) - 1)]
    grads_cos = [F.cosine_similarity(grads[i], grads[i + 1], 0).item() for i in range(len(grads) - 1)]
    mean_error, mean_grad = torch.stack(errors).mean(0), torch.stack(grads).mean(0)
    print("cosine of consecutive batches' errors:", " ".join(f"{c:+.3f}" for c in pairs_cos))
    print("cosine of consecutive batches' float32 gradients:", " ".join(f"{c:+.3f}" for c in grads_cos))
    print(f"mean error / mean gradient: {(mean_error.norm() / mean_grad.norm()).item():.4f}, "
          f"cosine {F.cosine_similarity(mean_error, mean_grad, 0).item():+.4f}")
    ranked = sorted(((sum(v) / len(v), n) for n, v in per_tensor.items()), reverse=True)
    print("largest relative errors (mean over batches):")
    for value, name in ranked[:6]:
        print(f"  {value:10.3f}  {name}")
    print(f"median tensor: {ranked[len(ranked) // 2][0]:.3f}")


if __name__ == "__main__":
    main()
