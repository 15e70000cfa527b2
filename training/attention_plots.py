"""Attention heat maps: encoder self-, decoder self- and cross-attention, per layer and head.

`attention_maps` runs the model on one input and its own greedy output: generate, then one
forward pass with `output_attentions=True` under the eager backend (the only one that returns
weights) with the generated sequence, minus its last token, as decoder input. The weights
of position i of the decoder are those that predicted output token i, so:
- encoder self-attention: rows and columns are the source tokens;
- decoder self-attention: rows and columns are the decoder inputs (`<s>`, then the output);
- cross-attention: rows are the output tokens (the one each step produced), columns the source.
A long-input attention pattern shows as what it is (each title names it): a band (local), blocks with the global
rows and columns (block-sparse), zero outside them; linear attention has no softmax, and its maps are the implied
weights phi(q_i).phi(k_j) / sum_j phi(q_i).phi(k_j).
`save_attention_plots` draws each kind as a grid of layers (rows) x heads (columns) into one PNG,
or one PNG per layer. matplotlib is imported only here, with the Agg backend (no display).

`main` is the command line `vaswani-plot-attention` (also `python scripts/plot_attention.py`):
    vaswani-plot-attention OUT TRANSFORMER --output_dir plots/
writes plots/encoder_self_attention.png, decoder_self_attention.png and cross_attention.png and prints their paths.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

KINDS = ("encoder_self_attention", "decoder_self_attention", "cross_attention")


@dataclass
class AttentionMaps:
    """Weights as arrays (layers, heads, queries, keys); each row sums to 1."""

    source_tokens: list[str]
    decoder_tokens: list[str]  # decoder inputs: <s> then the output without its last token
    output_tokens: list[str]  # what each decoder position produced (ends with </s> unless cut short)
    output_text: str
    encoder_self_attention: np.ndarray  # (L, H, S, S)
    decoder_self_attention: np.ndarray  # (L, H, T, T)
    cross_attention: np.ndarray  # (L, H, T, S)
    patterns: dict[str, str] = field(default_factory=dict)  # kind -> the attention pattern it shows, in words

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of a kind."""
        return {
            "encoder_self_attention": (self.source_tokens, self.source_tokens),
            "decoder_self_attention": (self.decoder_tokens, self.decoder_tokens),
            "cross_attention": (self.output_tokens, self.source_tokens),
        }[kind]


def pattern_description(config, side: str) -> str:
    """The self-attention pattern of one stack in words, for titles: "full", "local (window 3)", ..."""
    pattern = getattr(config, f"{side}_attention_pattern", "full")
    if pattern == "local":
        return f"local attention, window {config.attention_window}"
    if pattern == "block_sparse":
        globals_ = config.sparse_global_tokens
        return (f"block-sparse attention, blocks of {config.sparse_block_size}, "
                f"{globals_} global token{'' if globals_ == 1 else 's'}")
    if pattern == "linear":
        return "linear attention, implied weights"
    return "full attention"


def _readable(tokens: list[str]) -> list[str]:
    # SentencePiece marks a word start with "▁"; on an axis it is noise, unless it is the whole piece
    return [t.lstrip("\u2581") or t for t in tokens]


def attention_maps(model, tokenizer, text: str, max_new_tokens: int | None = None) -> AttentionMaps:
    """Generate greedily for `text`, then collect every attention weight of that input/output pair.

    Switches the model to the eager attention backend (the others return no weights).
    max_new_tokens: default 2 x source tokens + 10.
    """
    if not text.strip():
        raise ValueError("the text to plot is empty")
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    model.eval()
    batch = tokenizer([text], return_tensors="pt")
    batch = {k: batch[k].to(model.device) for k in ("input_ids", "attention_mask")}
    source_length = batch["input_ids"].shape[1]
    with torch.inference_mode():
        generated = model.generate(**batch, do_sample=False, num_beams=1,
                                   max_new_tokens=max_new_tokens or 2 * source_length + 10)
        outputs = model(**batch, decoder_input_ids=generated[:, :-1], output_attentions=True, use_cache=False)

    def stack(per_layer) -> np.ndarray:  # tuple of (1, H, Q, K) -> (L, H, Q, K)
        return torch.cat([a.float() for a in per_layer]).cpu().numpy()

    ids = generated[0].tolist()
    return AttentionMaps(
        source_tokens=_readable(tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())),
        decoder_tokens=_readable(tokenizer.convert_ids_to_tokens(ids[:-1])),
        output_tokens=_readable(tokenizer.convert_ids_to_tokens(ids[1:])),
        output_text=tokenizer.decode(ids, skip_special_tokens=True),
        encoder_self_attention=stack(outputs.encoder_attentions),
        decoder_self_attention=stack(outputs.decoder_attentions),
        cross_attention=stack(outputs.cross_attentions),
        patterns={"encoder_self_attention": pattern_description(model.config, "encoder"),
                  "decoder_self_attention": pattern_description(model.config, "decoder"),
                  "cross_attention": "full attention"},
    )


def _draw(weights: np.ndarray, rows: list[str], columns: list[str], title: str, path: Path,
          layer_names: list[str]) -> None:
    """One figure: a grid of len(weights) layers x heads panels, a shared 0..max colour scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers, heads = weights.shape[:2]
    panel = min(8.0, max(2.5, 0.22 * max(len(rows), len(columns)) + 1.0))  # inches per heat map
    fontsize = 8 if max(len(rows), len(columns)) <= 30 else 6
    figure, axes = plt.subplots(layers, heads, figsize=(panel * heads + 1.2, panel * layers + 0.8),
                                squeeze=False, constrained_layout=True)
    vmax = float(weights.max()) or 1.0
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto",
                              interpolation="nearest")
            ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=fontsize)
            ax.set_yticks(range(len(rows)), rows, fontsize=fontsize)
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=fontsize + 2)
            if head == 0:
                ax.set_ylabel(layer_names[layer], fontsize=fontsize + 2)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    figure.suptitle(title)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def save_attention_plots(maps: AttentionMaps, output_dir: str | Path, per_layer: bool = False,
                         prefix: str = "") -> list[Path]:
    """Write the three kinds as PNGs into output_dir and return their paths.

    One file per kind (`{prefix}{kind}.png`, grid layers x heads), or with per_layer one per kind
    and layer (`{prefix}{kind}_layer{i}.png`).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    source = " ".join(maps.source_tokens)
    paths = []
    for kind in KINDS:
        weights = getattr(maps, kind)
        rows, columns = maps.axes(kind)
        pattern = f" ({maps.patterns[kind]})" if kind in maps.patterns else ""
        title = f"{kind.replace('_', ' ')}{pattern}: {source}  ->  {maps.output_text}"
        groups = [(f"_layer{i}", [i]) for i in range(len(weights))] if per_layer else [("", range(len(weights)))]
        for suffix, layers in groups:
            path = output_dir / f"{prefix}{kind}{suffix}.png"
            _draw(weights[list(layers)], rows, columns, title, path, [f"layer {i}" for i in layers])
            paths.append(path)
    return paths


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-plot-attention",
        description="Plot a checkpoint's attention for one input and its own (greedy) output as PNG heat maps: "
                    "encoder self-, decoder self- and cross-attention, each a grid of layers (rows) x heads "
                    "(columns) with the tokens on the axes; prints the paths.")
    parser.add_argument("checkpoint", help="a folder written by save_pretrained (model + tokenizer), or a Hub id")
    parser.add_argument("text", help="the input (for G2P: one word)")
    parser.add_argument("--output_dir", default="attention_plots", help="folder for the PNGs (created)")
    parser.add_argument("--per_layer", action="store_true",
                        help="one PNG per kind and layer (easier to read for big models or long inputs)")
    parser.add_argument("--prefix", default="", help="put before every file name")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: 2 x source tokens + 10")
    parser.add_argument("--device", default="cpu")
    return parser


def plot_checkpoint(args: argparse.Namespace) -> tuple[AttentionMaps, list[Path]]:
    """What `main` does for parsed arguments: the maps and the PNG paths (printed, the output text on stderr)."""
    import transformers

    from .generation import CheckpointError, load_checkpoint

    transformers.logging.disable_progress_bar()
    try:
        model, tokenizer = load_checkpoint(args.checkpoint, device=args.device, attn_implementation="eager")
        maps = attention_maps(model, tokenizer, args.text, max_new_tokens=args.max_new_tokens)
    except (CheckpointError, ValueError) as error:
        sys.exit(f"error: {error}")
    paths = save_attention_plots(maps, args.output_dir, per_layer=args.per_layer, prefix=args.prefix)
    print(f"output: {maps.output_text}", file=sys.stderr)
    for path in paths:
        print(path)
    return maps, paths


def main(argv=None) -> int:
    """`vaswani-plot-attention`."""
    plot_checkpoint(build_parser().parse_args(argv))
    return 0
