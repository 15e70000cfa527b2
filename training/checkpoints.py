"""Atomic training checkpoints: write aside, verify, rename; find the newest valid one.

A save goes to `<dir>/.tmp-checkpoint-<step>` through a caller's `save_fn(tmp_dir)` (in the
loop: `save_training_state`), then a marker `vaswani_state.json` is written LAST with the
step, epoch, batches done in that epoch, any extra JSON, and every file's size and sha256.
Only then is the folder renamed to `<dir>/checkpoint-<step>`, and only after that are older
checkpoints beyond `keep_last` deleted. A crash at any point leaves either no
`checkpoint-<step>` or a complete one; `latest_valid_checkpoint` re-checks sizes and hashes,
skips (with a warning naming it) any checkpoint whose marker is missing or whose files differ.

Trust: the loop's `save_fn` (`vaswani.training.train_state`) writes safetensors and JSON only, so
loading a checkpoint never unpickles anything; the marker's sha256 list is what
`latest_valid_checkpoint` verifies before the loop restores the state. Everything this module
writes itself is JSON.

Multi-process: `save_fn` runs on every process (each writes its own RNG state), so
pass `is_main_process` and `wait_for_everyone`; only the main process creates, hashes,
renames and deletes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"  # under a run's output_dir: its checkpoints, config and tokenizer
BEST_DIR = "best"  # under CHECKPOINT_DIR: the best weights so far (`save_pretrained`), kept by the loop
MARKER = "vaswani_state.json"
FORMAT_VERSION = 1
_NAME = re.compile(r"^checkpoint-(\d+)$")
_TMP_PREFIX = ".tmp-checkpoint-"


@dataclass
class CheckpointInfo:
    path: Path
    step: int
    epoch: int
    batches_done: int  # batches of `epoch` already trained on
    extra: dict = field(default_factory=dict)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _file_table(folder: Path) -> dict[str, dict]:
    table = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if relative != MARKER:
            table[relative] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return table


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    save_fn: Callable[[Path], None],
    epoch: int,
    batches_done: int,
    keep_last: int | None = 3,
    extra: dict | None = None,
    is_main_process: bool = True,
    wait_for_everyone: Callable[[], None] = lambda: None,
) -> Path:
    """Save atomically to `<output_dir>/checkpoint-<step>` and return that path.

    `save_fn(tmp_dir)` writes the state; if it raises, the partial folder is removed, the error
    propagates, and earlier checkpoints are untouched. `keep_last`: how many complete
    checkpoints with step <= this one to keep (None keeps all).
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last={keep_last} must be >= 1 or None")
    output_dir = Path(output_dir)
    tmp = output_dir / f"{_TMP_PREFIX}{step}"
    final = output_dir / f"checkpoint-{step}"
    if is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a save that crashed
            shutil.rmtree(tmp)
        tmp.mkdir()
    wait_for_everyone()
    try:
        save_fn(tmp)
    except BaseException:
        if is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    wait_for_everyone()
    if is_main_process:
        files = _file_table(tmp)
        for name in files:
            _fsync(tmp / name)
        marker = {"format": FORMAT_VERSION, "step": step, "epoch": epoch, "batches_done": batches_done,
                  "extra": extra or {}, "files": files}
        marker_tmp = tmp / (MARKER + ".tmp")
        with open(marker_tmp, "w", encoding="utf-8") as f:
            json.dump(marker, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(marker_tmp, tmp / MARKER)
        _fsync(tmp)
        if final.exists():  # the same step saved again: swap, then drop the old one
            old = output_dir / f".old-checkpoint-{step}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync(output_dir)
        if keep_last is not None:
            _prune(output_dir, step, keep_last)
    wait_for_everyone()
    return final


def write_best(model, output_dir: str | Path) -> Path:
    """Write `model` (`save_pretrained`) as `output_dir/best`, replacing the folder there: written to a temporary
    folder first, so an interruption leaves the previous best whole or the new one in place of it."""
    final = Path(output_dir) / BEST_DIR
    tmp = final.with_name(f".tmp-{BEST_DIR}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def _numbered(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every `checkpoint-<step>` folder in `output_dir`, oldest first (none if it does not exist)."""
    if not output_dir.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in output_dir.iterdir() if (m := _NAME.match(p.name)))


def _prune(output_dir: Path, newest: int, keep_last: int) -> None:
    """Delete checkpoints older than the `keep_last` newest complete ones with step <= `newest`.

    Checkpoints with a larger step (from a run that was resumed from an earlier point) are left.
    """
    older = [(step, p) for step, p in _numbered(output_dir) if step <= newest]
    complete = [(s, p) for s, p in older if (p / MARKER).is_file()]
    keep = {p for _, p in complete[-keep_last:]}
    for _, path in older:
        if path not in keep:
            shutil.rmtree(path, ignore_errors=True)


def refuse_older_run(output_dir: str | Path, resume: bool) -> None:
    """Raise ValueError when a new run (not `resume`) would start over another run's checkpoints in `output_dir`:
    its tokenizer and checkpoints would mix with theirs. The command line checks it before it trains a tokenizer,
    the loop again for callers of the library."""
    if not resume and any(Path(output_dir).glob("checkpoint-*")):
        raise ValueError(f"{output_dir} already holds checkpoints; pass --resume to continue that run, or choose "
                         "another --output_dir")


def checkpoint_problem(path: str | Path, check_hashes: bool = True) -> str | None:
    """Why the checkpoint at `path` cannot be trusted, or None if it is complete and intact."""
    path = Path(path)
    marker_path = path / MARKER
    if not marker_path.is_file():
        return f"no {MARKER} (the save did not finish)"
    try:
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
        files = marker["files"]
        int(marker["step"]), int(marker["epoch"]), int(marker["batches_done"])
    except (ValueError, KeyError, TypeError) as err:
        return f"unreadable {MARKER} ({err!r})"
    if not files:
        return f"{MARKER} lists no files"
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"missing file {name}"
        size = file.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes, expected {expected['size']} (truncated or replaced)"
        if check_hashes and _sha256(file) != expected["sha256"]:
            return f"{name} does not match its sha256 (corrupted)"
    return None


def read_checkpoint(path: str | Path) -> CheckpointInfo:
    """The marker of a checkpoint (not verified; see `checkpoint_problem`)."""
    path = Path(path)
    marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
    return CheckpointInfo(path=path, step=int(marker["step"]), epoch=int(marker["epoch"]),
                          batches_done=int(marker["batches_done"]), extra=marker.get("extra", {}))


def latest_valid_checkpoint(output_dir: str | Path, check_hashes: bool = True) -> CheckpointInfo | None:
    """The newest (highest step) intact checkpoint in `output_dir`, or None.

    Each newer checkpoint that is incomplete or corrupted, and each leftover temporary folder
    of an interrupted save, is skipped with a warning naming it and the reason.
    """
    output_dir = Path(output_dir)
    for p in output_dir.glob(f"{_TMP_PREFIX}*"):
        logger.warning("ignoring %s: an interrupted save (partial checkpoint)", p)
    for _, path in reversed(_numbered(output_dir)):
        problem = checkpoint_problem(path, check_hashes=check_hashes)
        if problem is None:
            return read_checkpoint(path)
        logger.warning("skipping checkpoint %s: %s", path, problem)
    return None


def valid_checkpoints(output_dir: str | Path) -> list[CheckpointInfo]:
    """Every intact checkpoint in `output_dir`, oldest first; the others are skipped with a warning naming them."""
    infos = []
    for _, path in _numbered(Path(output_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            infos.append(read_checkpoint(path))
        else:
            logger.warning("skipping checkpoint %s: %s", path, problem)
    return infos
