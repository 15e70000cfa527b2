import json
import logging

import pytest
import torch
from safetensors.torch import save_file

from vaswani.training.checkpoints import (MARKER, checkpoint_problem, latest_valid_checkpoint, refuse_older_run,
                                         save_checkpoint)


def writer(value: float):
    def save_fn(folder):
        save_file({"w": torch.full((64,), value)}, str(folder / "model.safetensors"))
        (folder / "sub").mkdir()
        (folder / "sub" / "state.json").write_text(json.dumps({"value": value}))

    return save_fn


def test_save_writes_marker_last_and_reads_back(tmp_path):
    path = save_checkpoint(tmp_path, 10, writer(1.0), epoch=2, batches_done=7, extra={"loss": 3.5})
    assert path == tmp_path / "checkpoint-10"
    marker = json.loads((path / MARKER).read_text())
    assert set(marker["files"]) == {"model.safetensors", "sub/state.json"}
    assert marker["files"]["model.safetensors"]["size"] == (path / "model.safetensors").stat().st_size
    info = latest_valid_checkpoint(tmp_path)
    assert (info.path, info.step, info.epoch, info.batches_done, info.extra) == (path, 10, 2, 7, {"loss": 3.5})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-10"]


def test_failing_save_leaves_no_checkpoint_and_keeps_the_previous(tmp_path):
    save_checkpoint(tmp_path, 10, writer(1.0), epoch=0, batches_done=10)

    def broken(folder):
        writer(2.0)(folder)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 20, broken, epoch=0, batches_done=20, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]
    assert latest_valid_checkpoint(tmp_path).step == 10


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "no_marker"])
def test_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path, caplog, damage):
    save_checkpoint(tmp_path, 10, writer(1.0), epoch=0, batches_done=10)
    newest = save_checkpoint(tmp_path, 20, writer(2.0), epoch=0, batches_done=20)
    weights = newest / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-10])
    elif damage == "flip":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "delete":
        weights.unlink()
    else:
        (newest / MARKER).unlink()
    assert checkpoint_problem(newest) is not None
    with caplog.at_level(logging.WARNING, logger="vaswani.training.checkpoints"):
        info = latest_valid_checkpoint(tmp_path)
    assert info.step == 10
    assert any("checkpoint-20" in r.getMessage() for r in caplog.records)


def test_partial_tmp_folder_is_ignored_with_a_warning(tmp_path, caplog):
    save_checkpoint(tmp_path, 10, writer(1.0), epoch=0, batches_done=10)
    partial = tmp_path / ".tmp-checkpoint-20"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    with caplog.at_level(logging.WARNING, logger="vaswani.training.checkpoints"):
        assert latest_valid_checkpoint(tmp_path).step == 10
    assert any(".tmp-checkpoint-20" in r.getMessage() for r in caplog.records)
    # a later save of that step replaces the leftover
    save_checkpoint(tmp_path, 20, writer(2.0), epoch=0, batches_done=20)
    assert not partial.exists() and latest_valid_checkpoint(tmp_path).step == 20


def test_keep_last_k(tmp_path):
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, writer(step), epoch=0, batches_done=step, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-30", "checkpoint-40"]
    # resaving a step replaces it atomically
    save_checkpoint(tmp_path, 40, writer(41.0), epoch=1, batches_done=0, keep_last=2)
    assert latest_valid_checkpoint(tmp_path).epoch == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-30", "checkpoint-40"]


def test_empty_dir_has_no_checkpoint(tmp_path):
    assert latest_valid_checkpoint(tmp_path) is None
    assert latest_valid_checkpoint(tmp_path / "missing") is None


def test_write_best_replaces_the_folder_through_a_temporary_one(tmp_path):
    from vaswani.training.checkpoints import BEST_DIR, write_best

    class Model:
        def __init__(self, value):
            self.value = value

        def save_pretrained(self, folder):
            folder.mkdir()
            save_file({"w": torch.full((4,), self.value)}, str(folder / "model.safetensors"))

    (tmp_path / f".tmp-{BEST_DIR}").mkdir()  # a leftover of an interrupted write
    (tmp_path / f".tmp-{BEST_DIR}" / "junk").write_text("x")
    assert write_best(Model(1.0), tmp_path) == tmp_path / BEST_DIR
    write_best(Model(2.0), tmp_path)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / BEST_DIR / "model.safetensors"))["w"], torch.full((4,), 2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == [BEST_DIR]


def test_a_new_run_refuses_an_older_runs_checkpoints(tmp_path):
    refuse_older_run(tmp_path, resume=False)  # an empty folder: a new run
    (tmp_path / "checkpoint-5").mkdir()
    refuse_older_run(tmp_path, resume=True)
    with pytest.raises(ValueError, match="already holds checkpoints; pass --resume"):
        refuse_older_run(tmp_path, resume=False)
