"""What a save deletes in its run folder: its run's checkpoints past the keep rule, and what killed
saves left behind.

    sweep_dead_saves(folder)                             # before a save writes
    remove_old_checkpoints(trainer, folder, 2, final)    # after `latest` names `final`

Only what is provably the run's, or a dead process's leftover of a save, is deleted: a checkpoint
is the run's when its trainer state names the run's id (`folder.checkpoint_run_id`). Another run's
checkpoint copied in, one saved before runs had ids (nothing says whose it is) and one whose state
cannot be read stay where they are, for a person to judge; they do not count toward the run's
`keep` either. A deleted checkpoint is first renamed to .del-step-N-PID, so a kill mid-delete
leaves no half checkpoint at a step's name (which `folder.stray_step` would take for a person's),
only a leftover the next save sweeps away.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.checkpoints.folder import (
    LATEST_FILE,
    TEMPORARY_CHECKPOINT,
    checkpoint_run_id,
    checkpoints,
)
from rlhf_helpers.runtime.artifacts import remove_dead_temporary_folders
from rlhf_helpers.runtime.folder_swap import remove_path, restore_dead_asides
from rlhf_helpers.runtime.locks import pid_is_alive

#: `latest`'s replacement while a save writes it (.latest.tmp-PID); group 1 is the PID.
POINTER_TMP = re.compile(rf"^\.{LATEST_FILE}\.tmp-(\d+)$")


def remove_dead_pointer_files(folder: Path) -> list[Path]:
    """Delete the .latest.tmp-PID files of saves killed before renaming them over `latest` (their
    process gone); return them. Only regular files: a link or anything else at such a name is not a
    save's, and stays. Nothing is removed on Windows, where signal 0 does not test a process."""
    if os.name == "nt" or not folder.is_dir():
        return []
    removed = []
    for entry in os.scandir(folder):
        match = POINTER_TMP.match(entry.name)
        if (match and entry.is_file(follow_symlinks=False)
                and not pid_is_alive(int(match.group(1)))):
            Path(entry.path).unlink(missing_ok=True)
            removed.append(Path(entry.path))
    return removed


def sweep_dead_saves(folder: Path) -> None:
    """Put back a checkpoint a killed re-save left aside (`restore_dead_asides`), then delete the
    temporary folders and pointer files of saves whose process is gone."""
    restore_dead_asides(folder, TEMPORARY_CHECKPOINT)
    remove_dead_temporary_folders(folder, TEMPORARY_CHECKPOINT)
    remove_dead_pointer_files(folder)


def _of_run(checkpoint: Path, run_id: str | None) -> bool:
    """Whether the checkpoint's trainer state names run `run_id` (not when it names none or cannot
    be read: what cannot be attributed to the run is not the run's to delete)."""
    try:
        return run_id is not None and checkpoint_run_id(checkpoint) == run_id
    except (OSError, ValueError):
        return False


def remove_old_checkpoints(trainer: Any, folder: Path, keep: int, final: Path) -> list[Path]:
    """The keep rule: delete the complete checkpoints of the trainer's run but its `keep` newest
    (`final`, the one just saved, among them); return the deleted ones. A checkpoint that cannot be
    renamed aside stays (a later save deletes it)."""
    own = [path for path in checkpoints(folder) if path == final or _of_run(path, trainer.run_id)]
    removed = []
    for stale in own[:-keep]:
        if stale == final:
            continue
        doomed = folder / f".del-{stale.name}-{os.getpid()}"
        remove_path(doomed)  # an earlier leftover of this process
        try:
            os.rename(stale, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(stale)
    return removed
