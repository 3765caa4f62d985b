"""A run folder's one owner, whatever the entry point, and a run stopped when its folder moves.

    watch = claim_run_folder(trainer, Path(config.output_dir))   # at the start of train()
    ...
    watch.check(trainer)      # after each step: RunFolderGone if the folder moved meanwhile
    lock = claim_for_save(trainer, folder)      # save_checkpoint: the same checks, outside train()
    check_save(trainer, folder)                 # before every save: it replaces no one's checkpoint

`PPOTrainer.train` (`run_loop.train_loop`) takes the lock the training command takes
(`runtime.locks.hold_run_folder`: another live process writing there is FolderInUse) and makes the
command's "holds checkpoints: resume or choose another folder" check: a folder holding checkpoints
of another run is refused (FolderOfAnotherRun), so train() never replaces a command-line run's
step-000002 and repoints its `latest`. The checkpoints are the trainer's own when they name its run
(`run_identity`: it wrote them, in this or an earlier train(), or it loaded one of them); those
saved before runs had ids are its own when it loaded or wrote one of them (`last_checkpoint`). A
folder with no checkpoint but another run's run.json (a command-line run stopped before its first
save) is refused too. Within one process the lock is re-entrant, so a second trainer object (even
one of the same run, after load_checkpoint) is refused while another holds the folder
(FolderHeldByAnotherTrainer): it must call the other's close() first.

The public `checkpoint.save_checkpoint` makes the same checks (`claim_for_save`), holding the lock
for the save only, unless the trainer holds the folder already (its train() claimed it).

A trainer never writes over a checkpoint of its own run that it did not write or load
(`check_save`: when train() claims the folder, before a step runs, and before every save). One that
loaded an older checkpoint, or was overtaken by another trainer of its run after its close(), is
behind the folder, and its next save would replace the newer step-NNNNNN. The rule, for a trainer at
step N: the folder's newest checkpoint (the one `latest` names) is of step N at most, and a
step-N checkpoint there is the very one the trainer last wrote or loaded (`last_checkpoint_digest`:
the SHA-256 of its manifest.json, which lists every file's digest, so equal digests mean the same
bytes), unless it lies past `latest` and is of its run (given up: a save that crashed before
repointing `latest`, or a damaged checkpoint `latest` was pointed back past, as resuming advises).
So train() with no step to run saves its step again, and a resumed run writes on; every other
replacement, and a trainer that reached step N on another line going on after the folder's step-N,
is refused (CheckpointWouldBeReplaced); so is a folder holding anything named like a checkpoint that
is none (a person's `step-000001/`: `folder.stray_steps`), which a save of that step would replace.

While the run goes on its folder must stay the one locked: removed, renamed or replaced (another
inode, its lock file gone, its run.json gone), the run stops with RunFolderGone, instead of writing
its later steps into a new folder at the old path, which would split it into two halves that
neither resumes.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.checkpoints.digest import manifest_digest
from rlhf_helpers.ppo.checkpoints.folder import (
    CheckpointSaveError,
    checkpoint_name,
    checkpoint_run_id,
    checkpoint_step,
    checkpoints,
    is_complete_checkpoint,
    latest_checkpoint,
    stray_problem,
    stray_step,
    stray_steps,
)
from rlhf_helpers.ppo.checkpoints.run_identity import RUN_FILE, new_run_id, recorded_run_id
from rlhf_helpers.runtime.lock_files import FolderInUse
from rlhf_helpers.runtime.locks import RUN_LOCK_FILE, FileLock, hold_run_folder


class FolderOfAnotherRun(FolderInUse):
    """config.output_dir holds checkpoints of another run than the trainer's: the message names
    both runs and how to continue that run instead. A FolderInUse, so the training command's one
    line (exit 2) covers it too."""


class FolderHeldByAnotherTrainer(FolderInUse):
    """Another trainer object of this process holds config.output_dir (its train() locked it and
    its close() was not called): the lock is re-entrant within a process, so without this check
    two trainers of one run would write over each other's checkpoints."""


class CheckpointWouldBeReplaced(FolderInUse):
    """A save into config.output_dir (train()'s or save_checkpoint's) would replace a checkpoint
    this trainer did not write or load: the folder holds a newer step than the trainer's (it loaded
    an older checkpoint, or another trainer of its run went on after it), or the step folder it
    would write holds another trainer's checkpoint of that step, or anything named like a checkpoint
    that is none (a person's step-NNNNNN folder, file or link). The message names it and what to
    do. A FolderInUse, so the training command's one line covers it."""


#: the trainer object that last locked each folder (by resolved path), while it lives
_HOLDERS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def _holding_trainer(trainer: Any, folder: Path) -> Any:
    """Another trainer object of this process that holds `folder` (its lock taken, not closed, the
    folder not moved since), or None."""
    holder = _HOLDERS.get(str(folder.resolve()))
    if holder is None or holder is trainer:
        return None
    lock = holder.output_lock
    if lock is None or lock.path.parent.resolve() != folder.resolve() or not lock.is_current():
        return None
    return holder


class RunFolderGone(CheckpointSaveError):
    """The run's folder was removed, renamed or replaced while the run went on: nothing more is
    written. The message names the folder, what happened to it and the run's last checkpoint."""


def folder_run_id(folder: Path) -> str | None:
    """The run a folder's checkpoints belong to: run.json's id, else the newest checkpoint's; None
    when neither records one (saved by an older version) or it cannot be read."""
    recorded = recorded_run_id(folder)
    if recorded is not None:
        return recorded
    found = checkpoints(folder)
    newest = latest_checkpoint(folder) or (found[-1] if found else None)
    if newest is None:
        return None
    try:
        return checkpoint_run_id(newest)
    except (OSError, ValueError):  # damaged: the loader says so when someone loads it
        return None


def _wrote_or_loaded(trainer: Any, folder: Path) -> bool:
    """Whether the trainer's last checkpoint (written or loaded) lies in `folder`."""
    last = trainer.last_checkpoint
    return last is not None and Path(last).parent.resolve() == folder.resolve()


def owner_problem(trainer: Any, folder: Path) -> str | None:
    """Why `trainer` may not write into `folder` (it holds checkpoints of another run, or the
    run.json of another run that has no checkpoint yet), or None."""
    if latest_checkpoint(folder) is None and not checkpoints(folder):
        recorded = recorded_run_id(folder)  # a command-line run stopped before its first save
        if recorded is None or recorded == trainer.run_id:
            return None  # no checkpoint and no other run's record: a new run's folder
        mine = f" this trainer's run {trainer.run_id}" if trainer.run_id else " this trainer's run"
        return (f"{folder} holds {RUN_FILE} of run {recorded} (a training command's run stopped "
                f"before its first checkpoint), not of{mine}: a trainer never writes its "
                "checkpoints beside another run's files, which no resume could then read. Choose "
                "another output_dir (runtime.artifacts.new_run_dir makes a new one), or remove "
                "that folder if its run is abandoned")
    owner = folder_run_id(folder)
    if owner is not None and owner == trainer.run_id:
        return None
    if owner is None and _wrote_or_loaded(trainer, folder):
        return None
    whose = f"run {owner}" if owner else "a run that records no id (saved by an older version)"
    mine = f", not of this trainer's run {trainer.run_id}" if trainer.run_id else ""
    return (f"{folder} already holds checkpoints of {whose}{mine}: a trainer never writes "
            f"over another run's checkpoints. Continue that run with load_checkpoint(trainer, "
            f"{str(folder)!r}) first, or choose another output_dir "
            "(runtime.artifacts.new_run_dir makes a new one)")


def newest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint a run in `folder` is at: the one `latest` names, else (`latest` missing or
    broken) the newest complete one; None when there is none."""
    found = checkpoints(folder)
    return latest_checkpoint(folder) or (max(found, key=checkpoint_step) if found else None)


def behind_problem(trainer: Any, folder: Path) -> str | None:
    """Why `trainer` is behind `folder` (the folder's newest checkpoint is of a later step than the
    trainer's, so its saves would replace that run's later checkpoints), or None."""
    newest = newest_checkpoint(folder)
    if newest is None or checkpoint_step(newest) <= trainer.step_count:
        return None
    return (f"{folder} holds {newest.name}, newer than this trainer's step {trainer.step_count}: "
            "its saves there would replace the run's later checkpoints. Continue from it with "
            f"load_checkpoint(trainer, {str(folder)!r}), or choose another output_dir "
            "(runtime.artifacts.new_run_dir makes a new one)")


def _own_checkpoint(trainer: Any, checkpoint: Path) -> bool:
    """Whether `checkpoint` holds the very checkpoint `trainer` last wrote or loaded: the same
    manifest bytes; one saved before manifests existed, by its path."""
    digest = manifest_digest(checkpoint)
    if digest is None:
        last = trainer.last_checkpoint
        return last is not None and Path(last).resolve() == checkpoint.resolve()
    return digest == trainer.last_checkpoint_digest


def _given_up(trainer: Any, checkpoint: Path) -> bool:
    """Whether a checkpoint past `latest` is the trainer's run's to give up: its state names that
    run, or cannot be read (damaged: resuming advises pointing `latest` back past it). Another
    run's copy, or one that records no run, is not."""
    try:
        return trainer.run_id is not None and checkpoint_run_id(checkpoint) == trainer.run_id
    except (OSError, ValueError):
        return True


def replace_problem(trainer: Any, folder: Path) -> str | None:
    """Why `trainer` may not write the checkpoint of its step into `folder` (anything there that is
    no complete checkpoint, `stray_step`; a complete checkpoint of that step, up to the one
    `latest` names or of another run, that is not the one it last wrote or loaded), or None."""
    final = folder / checkpoint_name(trainer.step_count)
    stray = stray_step(final)
    if stray is not None:
        return stray_problem({final: stray})
    if not is_complete_checkpoint(final) or _own_checkpoint(trainer, final):
        return None
    newest = newest_checkpoint(folder)
    if (newest is not None and checkpoint_step(final) > checkpoint_step(newest)
            and _given_up(trainer, final)):
        return None  # past `latest`: a save that never repointed it, or a checkpoint given up
    return (f"{final} already holds a checkpoint of step {checkpoint_step(final)} that this "
            "trainer neither wrote nor loaded (another trainer's of its run, of an earlier line "
            "of it, or another run's copied in): this trainer's checkpoints there would replace "
            "it, or follow it without coming from it. Continue from it with "
            f"load_checkpoint(trainer, {str(final)!r}), or choose another output_dir")


def check_save(trainer: Any, folder: Path) -> None:
    """CheckpointWouldBeReplaced unless `trainer` may write the checkpoint of its step into
    `folder` (`behind_problem`, `replace_problem`): asked when train() claims the folder, before a
    step runs, and before every save."""
    problem = behind_problem(trainer, folder) or replace_problem(trainer, folder)
    if problem is not None:
        raise CheckpointWouldBeReplaced(problem, folder / RUN_LOCK_FILE, {})


def _refuse_another_holder(trainer: Any, folder: Path) -> None:
    """FolderHeldByAnotherTrainer when another trainer object of this process holds `folder`."""
    holder = _holding_trainer(trainer, folder)
    if holder is not None:
        raise FolderHeldByAnotherTrainer(
            f"{folder} is held by another trainer object of this process (run "
            f"{holder.run_id or 'without an id'}, at step {holder.step_count}): two trainers "
            "writing into one folder would replace each other's checkpoints. Call that trainer's "
            "close() first (then load_checkpoint this one from the folder to continue its run), "
            "or choose another output_dir", folder / RUN_LOCK_FILE, {})


def lock_run_folder(folder: Path) -> FileLock:
    """The lock of a run folder, taken once for the run (FolderInUse names the live run holding
    it). The one place a run folder is locked: the training command takes it before its checks read
    the folder, and hands it to its trainer (`trainer.output_lock`), whose train() then uses it
    rather than lock the folder again; train() of a trainer without one takes it here too."""
    return hold_run_folder(folder)


def _holds(trainer: Any, folder: Path) -> bool:
    """Whether `trainer` holds `folder`'s lock (its train() claimed it), the folder unmoved."""
    lock = trainer.output_lock
    return (lock is not None and lock.is_current()
            and lock.path.parent.resolve() == folder.resolve())


def claim_for_save(trainer: Any, folder: Path) -> FileLock | None:
    """For `save_checkpoint`: None when `trainer` holds `folder` already (its train() claimed it);
    else the checks of `claim_run_folder` (FolderHeldByAnotherTrainer, FolderInUse,
    FolderOfAnotherRun) and the folder's lock, held for the save only: the caller releases it."""
    if _holds(trainer, folder):
        return None
    _refuse_another_holder(trainer, folder)
    lock = lock_run_folder(folder)
    try:
        problem = owner_problem(trainer, folder)
        if problem is not None:
            raise FolderOfAnotherRun(problem, folder / RUN_LOCK_FILE, {})
    except BaseException:
        lock.release()
        raise
    return lock


@dataclass
class RunFolderWatch:
    """The folder a run locked, as it was then: its (device, inode), its lock and whether it held
    run.json. `check` stops the run once any of them changed."""

    folder: Path
    lock: FileLock
    key: tuple[int, int]
    run_file: bool

    def problem(self) -> str | None:
        """What happened to the folder since it was locked, or None if it is still the same."""
        try:
            info = os.stat(self.folder)
        except OSError:
            return "was removed or renamed"
        if (info.st_dev, info.st_ino) != self.key:
            return "was replaced by another folder"
        if not self.lock.is_current():
            return f"lost its lock file {RUN_LOCK_FILE} (removed or replaced)"
        if self.run_file and not (self.folder / RUN_FILE).is_file():
            return f"lost its {RUN_FILE}"
        return None

    def check(self, trainer: Any) -> None:
        """RunFolderGone when the folder is no longer the one locked."""
        problem = self.problem()
        if problem is not None:
            raise RunFolderGone(
                f"the run folder {self.folder} {problem} while the run was going (after step "
                f"{trainer.step_count}): the run stops rather than write its later steps into a "
                "new folder at that path, which could not be resumed; its last checkpoint was "
                f"{trainer.last_checkpoint or 'none'} (gone with the folder)")


def claim_run_folder(trainer: Any, folder: Path) -> RunFolderWatch:
    """Lock `folder` for `trainer` (kept in `trainer.output_lock` until `trainer.close()`), refuse
    it when it holds another run's checkpoints or run.json (FolderOfAnotherRun; FolderInUse when
    another live process holds it, FolderHeldByAnotherTrainer when another trainer object of this
    process does: one live trainer per folder) or a newer checkpoint than the trainer's step
    (CheckpointWouldBeReplaced), give the trainer a run id if it has none, and
    return the watch of the folder. A folder that moved since an earlier train() locked it:
    RunFolderGone, at every call until `trainer.close()` or another output_dir."""
    lock = trainer.output_lock
    if lock is not None and not lock.is_current():
        raise RunFolderGone(
            f"the run folder {folder} was removed, renamed or replaced after this trainer locked "
            f"it (its lock file {RUN_LOCK_FILE} is gone): its checkpoints went with it, so nothing "
            "is written at the old path. To go on, point the trainer at the folder where it is now "
            "(trainer.config = trainer.config.replace(output_dir=...)), or call trainer.close() "
            "to start again at the old path")
    _refuse_another_holder(trainer, folder)
    taken = lock is None
    lock = lock or lock_run_folder(folder)
    try:
        problem = owner_problem(trainer, folder)
        if problem is not None:
            raise FolderOfAnotherRun(problem, folder / RUN_LOCK_FILE, {})
        problem = stray_problem(stray_steps(folder))  # a person's step-NNNNNN: before a step
        if problem is not None:
            raise CheckpointWouldBeReplaced(problem, folder / RUN_LOCK_FILE, {})
        check_save(trainer, folder)  # before a step runs, not at its save
        info = os.stat(folder)
    except BaseException:
        if taken:
            lock.release()
        raise
    trainer.output_lock = lock
    _HOLDERS[str(folder.resolve())] = trainer
    if trainer.run_id is None:
        trainer.run_id = new_run_id()
    return RunFolderWatch(folder, lock, (info.st_dev, info.st_ino), (folder / RUN_FILE).is_file())
