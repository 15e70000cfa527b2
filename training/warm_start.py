"""Warm start: a run's model initialised from a saved model folder instead of at random (`vaswani-train --init_from`).

The run's config is the folder's, with `--config_overrides` over it (`cli.build_config`), so every weight keeps its
shape except those indexed by token id: the run trains its own tokenizer, whose pieces may be more (the paragraph
task adds the word boundary to the word-level G2P symbols) and in another order. Those (the shared embedding, an
untied output projection, the final logits bias) are copied row by row where the two tokenizers share the piece;
the rows of new pieces keep their fresh initialisation. Everything else must match exactly, or the run stops with a
message naming the weight: a changed layer count or width is not a warm start.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .train_state import load_weights


def _vocab_axes(model) -> dict[int, int]:
    """The data pointer of each tensor of `model` indexed by token id -> that axis."""
    axes = {model.get_input_embeddings().weight.data_ptr(): 0}
    output = model.get_output_embeddings()
    if output is not None:
        axes[output.weight.data_ptr()] = 0
    bias = getattr(model, "final_logits_bias", None)
    if isinstance(bias, torch.Tensor):
        axes[bias.data_ptr()] = bias.dim() - 1
    return axes


def _pieces(tokenizer) -> list[str]:
    return tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))


@torch.no_grad()
def warm_start(model, tokenizer, folder: str | Path) -> dict:
    """Copy the weights of the model saved in `folder` into `model`, built from the folder's config for the vocabulary
    of `tokenizer`; rows indexed by token id are matched by piece (see the module docstring).

    Returns {"copied": token rows copied, "new": the pieces the folder's tokenizer lacks}. Raises ValueError when the
    folder has no weights or tokenizer, or a weight is missing or of another shape.
    """
    from safetensors.torch import load_file

    from vaswani import VaswaniTokenizer

    folder = Path(folder)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"--init_from {folder}: no model.safetensors; pass a model folder written by save_pretrained "
                         "(the --output_dir of a finished vaswani-train run)")
    try:
        source_tokenizer = VaswaniTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ValueError(f"--init_from {folder}: its tokenizer does not load ({error}); the token rows are matched "
                         "by piece, so the folder needs the tokenizer it was trained with") from None
    source_id = {piece: i for i, piece in enumerate(_pieces(source_tokenizer))}
    new_pieces = _pieces(tokenizer)
    pairs = [(i, source_id[piece]) for i, piece in enumerate(new_pieces) if piece in source_id]
    rows, source_rows = (torch.tensor(ids, dtype=torch.long) for ids in zip(*pairs)) if pairs else (None, None)

    tensors = load_file(str(weights))
    state, axes = model.state_dict(), _vocab_axes(model)  # tied names share a data pointer
    for name, tensor in tensors.items():
        target = state.get(name)
        if target is None or target.data_ptr() not in axes:
            continue  # other weights are copied whole by load_weights, which names any mismatch
        axis = axes[target.data_ptr()]
        if tensor.shape[axis] != len(source_id) or _without(tensor.shape, axis) != _without(target.shape, axis):
            raise ValueError(f"--init_from {folder}: {name} has shape {tuple(tensor.shape)}, but the folder's "
                             f"tokenizer has {len(source_id)} pieces and this model needs "
                             f"{_without(target.shape, axis)} besides the vocabulary; is the tokenizer the "
                             "model's own?")
        merged = target.detach().clone()
        if rows is not None:
            merged.index_copy_(axis, rows, tensor.to(merged.dtype).index_select(axis, source_rows))
        tensors[name] = merged
    load_weights(model, tensors, f"the model in --init_from {folder}")
    return {"copied": len(pairs), "new": [piece for piece in new_pieces if piece not in source_id]}


def _without(shape, axis: int) -> tuple:
    dims = list(shape)
    del dims[axis]
    return tuple(dims)
