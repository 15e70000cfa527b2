"""The end product of a run: a folder ready for the Hub, and its upload.

`write_model_folder` puts into one folder: `model.safetensors`, `config.json` (with `auto_map`),
`generation_config.json`, the code for `trust_remote_code` (the model's files of modeling/ and
`tokenization_vaswani.py`: `save_pretrained` copies them because `import vaswani` registers the classes for the Auto
API), the tokenizer (`spm.model`,
`tokenizer_config.json`), `README.md` (the model card) and `metrics.json`.

The small folder of a model we publish (16-bit weights, scored again) is `release.py`'s.

The training run also leaves `checkpoints/`, `runs/` and `train_log.jsonl` in the same folder; `push_folder`
uploads only the model's own files (`hub_files` lists them) in one `HfApi.create_commit`.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

# Training leftovers that stay local (patterns as `upload_folder` reads them, relative to the folder).
HUB_IGNORE = ["checkpoints/*", "runs/*", "train_log.jsonl", "training_args.json", "*.tmp", ".*"]


def write_model_folder(folder, model, tokenizer, card=None, metrics: dict | None = None) -> Path:
    """Save model (safetensors), configs, code, tokenizer, README.md and metrics.json into `folder`."""
    import vaswani  # noqa: F401  registers the classes for remote code, so save_pretrained copies their files

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if card is not None:
        card.save(folder / "README.md")
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
    return folder


def hub_files(folder) -> list[str]:
    """The files `push_folder` sends: everything under `folder` except training leftovers (sorted, posix paths)."""
    folder = Path(folder)
    files = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and not any(fnmatch.fnmatch(relative, p) for p in HUB_IGNORE):
            files.append(relative)
    return sorted(files)


def push_folder(folder, repo_id: str, private: bool = False, token: str | None = None,
                commit_message: str = "Upload vaswani model") -> str:
    """Create (if needed) the model repo `repo_id` and upload the model files of `folder`; returns the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    folder = Path(folder)
    for required in ("config.json", "model.safetensors", "README.md"):
        if not (folder / required).is_file():
            raise ValueError(f"{folder} has no {required}; train first or point to a finished output folder")
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    # One commit of exactly `hub_files` (the Hub validates README.md's metadata before accepting it). A plain
    # create_commit rather than upload_folder: the list sent is the list tested, whatever upload strategy
    # upload_folder picks (it streams through hf_xet when installed); our folders are small.
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in hub_files(folder)]
    commit = api.create_commit(repo_id=repo_id, repo_type="model", operations=operations, commit_message=commit_message)
    return str(getattr(commit, "commit_url", commit))
