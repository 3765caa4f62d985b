"""The same step saved again (a loop that ran no step, a user's second save) never loses the
checkpoint: a Ctrl-C between its two renames puts the previous copy back, and a copy that a killed
save left aside (.old-step-NNNNNN-<pid>) is put back by the next load, read of `latest` or save,
never swept."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_helpers.ppo.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlhf_helpers.ppo.checkpoint_digest import verify_checkpoint
from rlhf_helpers.ppo.checkpoint_folder import resolve_latest

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(os.name == "nt", reason="process liveness check is POSIX-only")]


def dead_pid() -> int:
    """The PID of a process that has ended."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".tmp-", ".old-")))


@pytest.fixture(scope="module")
def saved_once(tmp_path_factory) -> Path:
    """A run folder holding one checkpoint, step-000001, of a toy trainer (made once: each test
    works on its own copy)."""
    from conftest import toy_trainer

    folder = tmp_path_factory.mktemp("saved") / "run"
    trainer = toy_trainer(max_new_tokens=4)
    trainer.step()
    save_checkpoint(trainer, folder)
    trainer.close()
    return folder


def killed_mid_swap(folder: Path) -> Path:
    """`folder` as a re-save of its step 1 killed between the two renames leaves it: the old copy
    aside and the new one at its temporary name, both under a dead PID."""
    dead = dead_pid()
    shutil.copytree(folder / "step-000001", folder / f".tmp-step-000001-{dead}")
    os.rename(folder / "step-000001", folder / f".old-step-000001-{dead}")
    return folder


def test_a_resave_interrupted_between_the_renames_keeps_the_checkpoint(make_trainer, tmp_path,
                                                                       monkeypatch):
    trainer = make_trainer(max_new_tokens=4)
    trainer.step()
    final = save_checkpoint(trainer, tmp_path)
    real = os.rename

    def rename(source, target):
        if ".tmp-step-" in str(source):
            raise KeyboardInterrupt  # a Ctrl-C landing just before the second rename
        return real(source, target)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(trainer, tmp_path)
    monkeypatch.setattr(os, "rename", real)
    assert final.is_dir(), f"step-000001 was lost: {hidden(tmp_path)}"
    assert verify_checkpoint(final) == [] and latest_checkpoint(tmp_path) == final
    assert hidden(tmp_path) == []
    assert load_checkpoint(trainer, tmp_path) == final


def test_a_checkpoint_a_killed_resave_left_aside_is_put_back_by_the_next_load(saved_once,
                                                                            make_trainer,
                                                                            tmp_path):
    folder = killed_mid_swap(shutil.copytree(saved_once, tmp_path / "run"))
    assert resolve_latest(folder) == (folder / "step-000001", None)
    assert verify_checkpoint(folder / "step-000001") == []
    assert load_checkpoint(make_trainer(max_new_tokens=4), folder) == folder / "step-000001"

    # the checkpoint folder itself passed
    named = killed_mid_swap(shutil.copytree(saved_once, tmp_path / "named"))
    assert (load_checkpoint(make_trainer(max_new_tokens=4), named / "step-000001")
            == named / "step-000001")


def test_a_checkpoint_a_killed_resave_left_aside_is_put_back_by_the_next_save(make_trainer,
                                                                            tmp_path):
    trainer = make_trainer(max_new_tokens=4)
    trainer.step()
    save_checkpoint(trainer, tmp_path)
    killed_mid_swap(tmp_path)
    trainer.step()
    save_checkpoint(trainer, tmp_path)
    assert (tmp_path / "step-000001").is_dir(), "the checkpoint left aside was swept"
    assert verify_checkpoint(tmp_path / "step-000001") == []
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000002" and hidden(tmp_path) == []
