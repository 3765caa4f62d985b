"""What a save deletes or replaces in its run folder is its run's alone: a person's step-NNNNNN
folder, file or link is refused by name before a step runs (train()) and never replaced
(save_checkpoint); the keep rule deletes only checkpoints of the saving run (another run's copy, or
one that records no run, stays); another run's checkpoint past `latest` is not replaced; and what
killed saves left (.latest.tmp-PID files, a checkpoint half deleted) is swept by the next save.

The refusals are caught as FolderInUse, the class train() raised before, so each test fails on its
own assertion on the old code (the save went through: "DID NOT RAISE")."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from rlhf_helpers.ppo.checkpoints.save_load import (
    latest_checkpoint,
    save_checkpoint,
    write_manifest,
)
from rlhf_helpers.ppo.checkpoints.trainer_state import TRAINER_STATE_FILE
from rlhf_helpers.runtime.lock_files import FolderInUse

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NOTES = "a person's notes: do not lose them\n"
DEAD_PID = 999_999_999  # above any pid_max: no process has it


@pytest.fixture
def make_trainer(make_trainer):
    """Quick toy trainers: one epoch of one minibatch, 4 new tokens, a checkpoint every step."""
    def make(init_seed: int = 0, **overrides):
        values = dict(rollout_batch_size=4, mini_batch_size=4, ppo_epochs=1, max_new_tokens=4,
                      save_every=1)
        return make_trainer(init_seed=init_seed, **{**values, **overrides})
    return make


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def persons_folder(path: Path) -> None:
    path.mkdir()
    (path / "x.txt").write_text(NOTES)


def persons_file(path: Path) -> None:
    path.write_text(NOTES)


def persons_link(path: Path) -> None:
    target = path.parent.parent / "mine"
    persons_folder(target)
    path.symlink_to(target)


def half_a_checkpoint(path: Path) -> None:
    persons_folder(path)
    (path / "heads.safetensors").write_bytes(b"")
    (path / "manifest.json").write_text("{}")


STRAYS = {"a folder of notes": (persons_folder, "a folder holding none of a checkpoint's files"),
          "a file": (persons_file, "a file, not a folder"),
          "a link": (persons_link, "a link"),
          "an incomplete folder": (half_a_checkpoint,
                                   "an incomplete folder: it lacks trainer_state.pt")}


@pytest.mark.parametrize("case", sorted(STRAYS))
def test_train_refuses_a_persons_step_folder_file_or_link_by_name_before_a_step(
        make_trainer, tmp_path, case):
    """Before: the first save moved the person's step-000001 aside and deleted it, exit 0."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text(NOTES)
    make, words = STRAYS[case]
    make(out / "step-000001")
    before = files_of(tmp_path)
    trainer = make_trainer(output_dir=str(out))
    with pytest.raises(FolderInUse, match=rf"^{re.escape(str(out / 'step-000001'))} is not a "
                                          rf"checkpoint of this run \({re.escape(words)}.*Move it "
                                          "away, or choose another output folder"):
        trainer.train(steps=1)
    assert trainer.step_count == 0 and trainer.output_lock is None  # before a step
    assert files_of(tmp_path) == before and sorted(os.listdir(out)) == ["notes.txt", "step-000001"]
    assert (out / "step-000001").is_symlink() == (case == "a link")


def test_save_checkpoint_never_replaces_what_stands_at_its_steps_name(make_trainer, tmp_path):
    trainer = make_trainer()
    trainer.step()
    persons_folder(tmp_path / "step-000001")
    with pytest.raises(FolderInUse, match=r"step-000001 is not a checkpoint of this run"):
        save_checkpoint(trainer, tmp_path)
    assert (tmp_path / "step-000001" / "x.txt").read_text() == NOTES
    trainer.step()  # a stray at another step's name is left alone
    assert save_checkpoint(trainer, tmp_path) == tmp_path / "step-000002"
    assert (tmp_path / "step-000001" / "x.txt").read_text() == NOTES


def without_run_id(checkpoint: Path) -> None:
    """Make `checkpoint` look saved before runs had ids (its manifest rewritten to match)."""
    state = torch.load(checkpoint / TRAINER_STATE_FILE, weights_only=True)
    del state["run_id"]
    torch.save(state, checkpoint / TRAINER_STATE_FILE)
    write_manifest(checkpoint)


def test_the_keep_rule_deletes_only_the_saving_runs_own_checkpoints(make_trainer, tmp_path):
    """Before: run B's checkpoint a person copied into run A's folder as step-000000 was deleted
    by A's keep-2 rule at A's next saves, as was one that records no run."""
    other = make_trainer(init_seed=1, output_dir=str(tmp_path / "b"))
    other.train(steps=1)
    other.close()
    out = tmp_path / "a"
    run = make_trainer(output_dir=str(out))
    run.train(steps=3)
    shutil.copytree(tmp_path / "b" / "step-000001", out / "step-000000")  # run B's, for reference
    shutil.copytree(tmp_path / "b" / "step-000001", out / "step-000001")
    without_run_id(out / "step-000001")  # whose, nothing says
    copies = {name: files_of(out / name) for name in ("step-000000", "step-000001")}
    run.train(steps=2)
    assert sorted(p.name for p in out.glob("step-*")) == [
        "step-000000", "step-000001", "step-000004", "step-000005"]  # its own 2 and 3 deleted
    assert {name: files_of(out / name) for name in copies} == copies
    assert latest_checkpoint(out).name == "step-000005"


def test_another_runs_checkpoint_past_latest_is_not_replaced(make_trainer, tmp_path):
    """Before: a complete checkpoint past `latest` counted as given up by the run, whoever's it
    was: run B's copy at step-000002 was replaced by A's step 2."""
    other = make_trainer(init_seed=1, output_dir=str(tmp_path / "b"))
    other.train(steps=2)
    other.close()
    out = tmp_path / "a"
    run = make_trainer(output_dir=str(out))
    run.train(steps=1)
    shutil.copytree(tmp_path / "b" / "step-000002", out / "step-000002")
    copy = files_of(out / "step-000002")
    with pytest.raises(FolderInUse, match=r"step-000002 already holds a checkpoint of step 2 that "
                                          "this trainer neither wrote nor loaded"):
        run.train(steps=1)
    assert files_of(out / "step-000002") == copy and latest_checkpoint(out).name == "step-000001"


def test_the_next_save_sweeps_what_killed_saves_left_and_nothing_else(make_trainer, tmp_path):
    """Before: a save killed between writing .latest.tmp-PID and renaming it left that file for
    good. Only regular files of dead processes go: a link, and a live process's file, stay."""
    trainer = make_trainer()
    trainer.step()
    save_checkpoint(trainer, tmp_path)
    dead = tmp_path / f".latest.tmp-{DEAD_PID}"
    dead.write_text("step-000001\n")
    mine = tmp_path / "mine.txt"
    mine.write_text(NOTES)
    link = tmp_path / f".latest.tmp-{DEAD_PID - 1}"
    link.symlink_to(mine)
    live = tmp_path / f".latest.tmp-{os.getppid()}"
    live.write_text("step-000001\n")
    half = tmp_path / f".del-step-000000-{DEAD_PID}"  # a keep-rule delete killed midway
    persons_folder(half)
    trainer.step()
    save_checkpoint(trainer, tmp_path)
    assert not dead.exists() and not half.exists()
    assert link.is_symlink() and mine.read_text() == NOTES and live.exists()


def test_a_keep_rule_delete_cut_short_leaves_no_half_checkpoint_at_a_steps_name(
        make_trainer, tmp_path, monkeypatch):
    """The keep rule renames a checkpoint aside before deleting it: a kill mid-delete leaves a
    .del- leftover, never a half step-NNNNNN that the next run would refuse as a person's."""
    from rlhf_helpers.ppo.checkpoints import cleanup
    from rlhf_helpers.ppo.checkpoints.folder import stray_steps

    trainer = make_trainer()
    trainer.step()
    save_checkpoint(trainer, tmp_path, keep=1)

    rmtree = shutil.rmtree

    def killed(path, **kwargs):
        if not Path(path).name.startswith(".del-step-") or not Path(path).exists():
            return rmtree(path, **kwargs)
        (Path(path) / TRAINER_STATE_FILE).unlink()
        raise KeyboardInterrupt  # the process dies here, the checkpoint half deleted

    monkeypatch.setattr(cleanup.shutil, "rmtree", killed)
    trainer.step()
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(trainer, tmp_path, keep=1)
    assert not (tmp_path / "step-000001").exists() and stray_steps(tmp_path) == {}
    assert latest_checkpoint(tmp_path).name == "step-000002"
