"""The README.md of a trained model: Hub metadata (YAML front matter) plus the filled template `model_card.md`.

The template is model_card.md at the repository's top level (one file: data/model_card.md is a link to it, so the
package `vaswani.data` carries it in the sdist and the wheel; Jinja, read with
`importlib.resources` and rendered by `huggingface_hub.ModelCard.from_template`); the
front matter comes from `ModelCardData`, so it is valid YAML with `library_name`, `pipeline_tag`, `license`,
`tags` and a `model-index` holding the measured dev metrics. The Hub validates metadata only on upload, and
offline `ModelCardData` accepts any string, so `license` and `pipeline_tag` are checked against our own lists.
"""

from __future__ import annotations

import os

TEMPLATE_FILE = "model_card.md"  # inside the package `vaswani.data`

# Hub license identifiers we allow (a subset of https://huggingface.co/docs/hub/repositories-licenses).
LICENSES = ("apache-2.0", "mit", "bsd-2-clause", "bsd-3-clause", "cc-by-4.0", "cc-by-sa-4.0", "cc-by-nc-4.0",
            "cc0-1.0", "gpl-3.0", "lgpl-3.0", "mpl-2.0", "openrail", "other", "unknown")
PIPELINE_TAGS = ("text2text-generation", "translation", "summarization")
# The tasks on the CMUdict split (the card credits it) -> the dev set's name.
CMUDICT_TASKS = {"g2p": "CMUdict g014b2b (dev: 5% of train words by crc32)",
                 "g2p-paragraph": "CMUdict g014b2b lines of words (dev: lines of the 5% dev words by crc32)"}
_METRIC_NAMES = {"wer": "WER (%)", "per": "PER (%)", "bleu": "BLEU", "chrf": "chrF", "loss": "dev loss (NLL)"}


SCHEDULE_TEXT = {"inverse_sqrt": "linear warmup, then inverse square root",
                 "linear": "linear warmup, then linear decay to zero over the run's budget",
                 "cosine": "linear warmup, then cosine decay to zero over the run's budget"}


def describe_optimizer(optimizer) -> str:
    """"Adam(0.9, 0.98, eps 1e-9)" or "AdamW(0.9, 0.98, eps 1e-9, weight decay 0.01)": the optimizer as built (an
    Accelerate wrapper is looked through), read from its parameter groups, not from the flags. Muon with Adam:
    "Muon(momentum 0.95, Nesterov) for the layers' weight matrices, Adam(...) for the rest"."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    muon = getattr(optimizer, "muon", None)
    if muon is not None:
        group = muon.param_groups[0]
        text = (f"Muon(momentum {group['momentum']:g}{', Nesterov' if group['nesterov'] else ''}"
                + (f", weight decay {_number(group['weight_decay'])}" if group["weight_decay"] else "")
                + ") for the layers' weight matrices")
        return text + (f", {describe_optimizer(optimizer.adam)} for the rest" if optimizer.adam is not None else "")
    group = optimizer.param_groups[0]
    (beta1, beta2), decay = group["betas"], max(g.get("weight_decay", 0.0) for g in optimizer.param_groups)
    text = f"{type(optimizer).__name__}({beta1:g}, {beta2:g}, eps {_number(group['eps'])}"
    return text + (f", weight decay {_number(decay)})" if decay else ")")


def _number(value: float) -> str:
    """1e-09 -> "1e-9", 0.01 -> "0.01"."""
    return format(value, "g").replace("e-0", "e-")


def describe_schedule(schedule: str) -> str:
    """The learning-rate schedule in words, for the card."""
    return SCHEDULE_TEXT[schedule]


def check_metadata(license: str, pipeline_tag: str) -> None:
    if license not in LICENSES:
        raise ValueError(f"license={license!r} is not a Hub license id we accept; choose one of {LICENSES}")
    if pipeline_tag not in PIPELINE_TAGS:
        raise ValueError(f"pipeline_tag={pipeline_tag!r} is not accepted; choose one of {PIPELINE_TAGS}")


def read_template(path: str | os.PathLike | None = None) -> str:
    """The text of a model card template: `path`, or the shipped `model_card.md` of `vaswani.data`."""
    if path is not None:
        with open(path, encoding="utf-8") as f:
            return f.read()
    from vaswani.data import data_file

    return data_file(TEMPLATE_FILE).read_text(encoding="utf-8")


def build_model_card(
    *,
    task: str,
    model_name: str,
    config,
    dev: dict,
    dev_size: int,
    weights: str,
    data_description: str,
    training_summary: str,
    settings: dict,
    repo_id: str | None = None,
    predictions: list[tuple[str, str]] = (),
    examples: list[str] = (),
    license: str = "apache-2.0",
    pipeline_tag: str = "text2text-generation",
    template_path: str | os.PathLike | None = None,
):
    """A `huggingface_hub.ModelCard` for a trained model; `.save(path)` writes README.md.

    `weights`: which weights were evaluated ("step 1200", "the average of steps 900, 1200").
    `dev`: the final evaluation (keys wer/per or bleu/chrf, loss, num_beams); `settings`: training settings to list.
    `template_path`: another template to fill (default: the shipped one).
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from .tasks import SPECS

    check_metadata(license, pipeline_tag)
    metric_keys = SPECS[task].metrics
    cmudict = task in CMUDICT_TASKS
    dataset_name = CMUDICT_TASKS[task] if cmudict else data_description.split(":")[0]
    eval_results = [
        EvalResult(task_type=pipeline_tag, dataset_type="cmudict" if cmudict else "custom",
                   dataset_name=dataset_name, dataset_split="dev", metric_type=k, metric_name=_METRIC_NAMES[k],
                   metric_value=round(float(dev[k]), 2))
        for k in metric_keys
    ]
    tags = ["vaswani", "transformer", "encoder-decoder", "seq2seq"] + (["g2p", "grapheme-to-phoneme", "cmudict"]
                                                                     if cmudict else [])
    card_data = ModelCardData(
        library_name="transformers", pipeline_tag=pipeline_tag, license=license, tags=tags,
        language=["en"] if cmudict else None, model_name=model_name, eval_results=eval_results,
        metrics=list(metric_keys),
    )
    config_fields = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                     "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function",
                     "dropout", "attention_dropout", "activation_dropout", "normalize_before", "scale_embedding",
                     "tie_word_embeddings", "position_encoding", "label_smoothing")
    hyperparameters = [(name, getattr(config, name)) for name in config_fields]
    num_parameters = dev.get("num_parameters")
    if num_parameters:
        hyperparameters.append(("parameters", f"{num_parameters:,}"))
    return ModelCard.from_template(
        card_data,
        template_str=read_template(template_path),
        task=task,
        model_name=model_name,
        repo_id=repo_id or "path/to/this/folder",
        examples=list(examples) or ["HELLO"],
        num_beams=dev.get("num_beams", 1),
        max_length=dev.get("max_length", ""),
        predictions=list(predictions),
        data_description=data_description,
        dev_size=dev_size,
        unit=SPECS[task].unit,
        weights=weights,
        metrics=[(_METRIC_NAMES[k], f"{dev[k]:.2f}") for k in (*metric_keys, "loss") if k in dev],
        wer_rounded=round(dev.get("wer", 0)),
        training_summary=training_summary,
        hyperparameters=hyperparameters,
        settings=list(settings.items()),
    )
