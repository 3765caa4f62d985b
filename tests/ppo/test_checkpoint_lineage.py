"""No checkpoint is replaced by a trainer that did not write or load it, whatever the entry point.

The public `save_checkpoint` checks the folder's owner as train() does (another live process,
another trainer object of this process, another run's checkpoints), and neither it nor train()
writes into a folder whose newest checkpoint is ahead of the trainer (it loaded an older one, or
another trainer of its run went on after it), nor over a step folder holding another trainer's
checkpoint of that step. Saving its own step again, and resuming, still work.

The errors are caught as FolderInUse, the class the code had before these checks, so each test
fails on its own assertion on the old code (the save went through, "DID NOT RAISE")."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_run_locks import start_holder

from rlhf_helpers.ppo.checkpoints.save_load import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlhf_helpers.runtime.lock_files import FolderInUse
from rlhf_helpers.runtime.locks import RUN_LOCK_FILE

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def make_trainer(make_trainer):
    """Quick toy trainers: one epoch of one minibatch, 4 new tokens, a checkpoint every step."""
    def make(init_seed: int = 0, **overrides):
        values = dict(rollout_batch_size=4, mini_batch_size=4, ppo_epochs=1, max_new_tokens=4,
                      save_every=1)
        return make_trainer(init_seed=init_seed, **{**values, **overrides})
    return make


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by relative path, with its bytes, but the lock file (it names
    whoever holds the folder now)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != RUN_LOCK_FILE}


def test_save_checkpoint_refuses_a_folder_held_by_a_live_trainer_or_process(make_trainer,
                                                                           tmp_path):
    """Before: save_checkpoint took no lock and made no check, and replaced the live trainer's
    step-000003 and repointed `latest`."""
    out = tmp_path / "ppo"
    holder = make_trainer(output_dir=str(out))
    holder.train(steps=3)  # holds the folder until close()
    before = files_of(out)
    other = make_trainer(init_seed=2)  # another run, at the same step
    for _ in range(3):
        other.step()
    with pytest.raises(FolderInUse, match=rf"{out} is held by another trainer object of this "
                                          "process"):
        save_checkpoint(other, out)
    assert files_of(out) == before
    holder.close()
    process = start_holder(out)  # another live process (a training command) holds it
    try:
        with pytest.raises(FolderInUse, match=rf"{out} is in use by another run: pid "
                                              rf"{process.pid}"):
            save_checkpoint(other, out)
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    assert files_of(out) == before


def test_save_checkpoint_refuses_a_folder_of_another_run(make_trainer, tmp_path):
    """Before: a trainer of another run saved its step-000005 beside the run's checkpoints and
    repointed `latest` at it."""
    out = tmp_path / "ppo"
    owner = make_trainer(output_dir=str(out))
    owner.train(steps=2)
    owner.close()
    before = files_of(out)
    stranger = make_trainer(init_seed=3)
    for _ in range(3):
        stranger.step()
    with pytest.raises(FolderInUse, match=rf"{out} already holds checkpoints of run "
                                          rf"{owner.run_id}.*load_checkpoint\(trainer, "):
        save_checkpoint(stranger, out)
    assert files_of(out) == before and stranger.last_checkpoint is None


def test_a_trainer_overtaken_by_another_of_its_run_does_not_replace_its_checkpoint(make_trainer,
                                                                                   tmp_path):
    """Before: A's train() after B had continued the run replaced B's step-000003 with A's own
    step 3 (the same run id, so the owner checks passed)."""
    out = tmp_path / "ppo"
    first = make_trainer(output_dir=str(out))
    first.train(steps=2)
    first.close()
    second = make_trainer(init_seed=1, output_dir=str(out))
    load_checkpoint(second, out)
    second.train(steps=1)
    second.close()
    before = files_of(out)
    with pytest.raises(FolderInUse, match=rf"{out} holds step-000003, newer than this trainer's "
                                          r"step 2.*load_checkpoint\(trainer, "):
        first.train(steps=1)
    assert first.step_count == 2 and first.output_lock is None  # refused before a step ran
    with pytest.raises(FolderInUse, match="newer than this trainer's step 2"):
        save_checkpoint(first, out)
    assert files_of(out) == before
    load_checkpoint(first, out)  # as the message says: it continues from step 3
    first.train(steps=1)
    assert latest_checkpoint(out).name == "step-000004"


def test_a_trainer_loaded_from_an_older_checkpoint_does_not_replace_the_newer_one(make_trainer,
                                                                                 tmp_path):
    """Before: loading step-000002 of a 3-step run and training one step silently replaced
    step-000003 and its weights."""
    out = tmp_path / "ppo"
    run = make_trainer(output_dir=str(out))
    run.train(steps=3)
    run.close()
    before = files_of(out)
    older = make_trainer(init_seed=1, output_dir=str(out))
    load_checkpoint(older, out / "step-000002")
    with pytest.raises(FolderInUse, match=rf"{out} holds step-000003, newer than this trainer's "
                                          r"step 2.*or choose another output_dir"):
        older.train(steps=1)
    assert files_of(out) == before and older.step_count == 2
    # the branch it meant to train goes to a folder of its own
    older.config = older.config.replace(output_dir=str(tmp_path / "branch"))
    older.train(steps=1)
    assert latest_checkpoint(tmp_path / "branch").name == "step-000003"


def test_a_step_folder_holding_another_trainers_checkpoint_of_that_step_is_not_replaced(
        make_trainer, tmp_path):
    """A trainer that reached step 3 elsewhere, from the run's step-000002, may not replace the
    run's own step-000003: the folder is not ahead of it, but that checkpoint is not its own."""
    out = tmp_path / "ppo"
    run = make_trainer(output_dir=str(out))
    run.train(steps=3)
    run.close()
    before = files_of(out)
    branch = make_trainer(init_seed=1, output_dir=None)
    load_checkpoint(branch, out / "step-000002")
    branch.train(steps=1)  # step 3, saved nowhere
    with pytest.raises(FolderInUse, match=rf"{out / 'step-000003'} already holds a checkpoint of "
                                          "step 3 that this trainer neither wrote nor loaded"):
        save_checkpoint(branch, out)
    branch.config = branch.config.replace(output_dir=str(out))
    for steps in (0, 1):  # its step 3 again ("no step ran: save as it is"), or a step after it
        with pytest.raises(FolderInUse, match="neither wrote nor loaded"):
            branch.train(steps=steps)
        assert branch.step_count == 3 and branch.output_lock is None
    assert files_of(out) == before


def test_its_own_step_is_saved_again_and_a_checkpoint_past_latest_is_replaced(make_trainer,
                                                                             tmp_path):
    """What the rule lets through: a trainer saves its own step again (train() with no step to run,
    or save_checkpoint), a trainer that loaded a checkpoint saves it again, and a checkpoint past
    the one `latest` names (pointed back past a damaged one, as resuming advises) is replaced."""
    out = tmp_path / "ppo"
    run = make_trainer(output_dir=str(out))
    run.train(steps=3)
    run.train(steps=0)
    run.close()
    assert save_checkpoint(run, out) == out / "step-000003"
    loader = make_trainer(init_seed=1, output_dir=str(out))
    load_checkpoint(loader, out)
    loader.train(steps=0)
    loader.close()
    (out / "latest").write_text("step-000002\n")  # step-000003 given up
    resumed = make_trainer(init_seed=2, output_dir=str(out))
    load_checkpoint(resumed, out)
    resumed.train(steps=1)
    assert latest_checkpoint(out).name == "step-000003"
    assert resumed.last_checkpoint == str(out / "step-000003")
