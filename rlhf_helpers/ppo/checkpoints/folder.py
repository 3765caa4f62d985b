"""Which checkpoints a run folder holds: the step-NNNNNN folders, the complete ones, the one
`latest` names; and the error of a save that could not be written.

    checkpoints(Path("runs/ppo-tiny"))        # [.../step-000009, .../step-000010], oldest first
    latest_checkpoint(Path("runs/ppo-tiny"))  # .../step-000010, or None
    resolve_latest(Path("runs/ppo-tiny"))     # (path, None) or (None, what is wrong with `latest`)
    stray_steps(Path("runs/ppo-tiny"))        # {.../step-000001: "a link"}: named like a
                                              # checkpoint, none: no save replaces it
    checkpoint_run_id(Path("runs/ppo-tiny/step-000010"))   # the run its trainer state names

Apart from `checkpoint.py` (which writes and loads them) so that `run_claim`, which the save asks
whether it may write, reads a folder without importing the save.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlhf_helpers.ppo.checkpoints.digest import required_files
from rlhf_helpers.ppo.checkpoints.trainer_state import (
    RUN_ID_KEY,
    TRAINER_STATE_FILE,
    load_trainer_state,
)
from rlhf_helpers.runtime.folder_swap import restore_dead_asides

LATEST_FILE = "latest"
#: Names of checkpoint folders (what `latest` may point at).
CHECKPOINT_NAME = re.compile(r"^step-\d{6,}$")
#: A save's temporary folder (.tmp-step-N-PID), a re-saved step's previous copy set aside
#: (.old-step-N-PID) and an old checkpoint the keep rule is deleting (.del-step-N-PID: renamed
#: first, so a kill mid-delete leaves no half checkpoint at a step's name); group 2 is the PID.
TEMPORARY_CHECKPOINT = re.compile(r"^\.(?:tmp|old|del)-(step-\d+)-(\d+)$")


class CheckpointSaveError(OSError):
    """A checkpoint (or the file pointing at it) could not be written: the message says why (a full
    disk is named as such) and which earlier checkpoint is kept, unchanged."""


def checkpoint_step(path: Path) -> int:
    """The step of a step-NNNNNN checkpoint folder, from its name."""
    return int(path.name.removeprefix("step-"))


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def is_complete_checkpoint(path: Path) -> bool:
    """Whether `path` is a step-NNNNNN folder (not a link) holding every file a save writes
    (`checkpoint_digest.required_files`; their bytes are checked on loading, not here)."""
    return (bool(CHECKPOINT_NAME.match(path.name)) and path.is_dir() and not path.is_symlink()
            and all((path / name).is_file() for name in required_files()))


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The complete checkpoints of output_dir, oldest first: a stray or empty step-* folder (a
    person's `step-000009/`, `step-backup`) is none, so it never counts toward the keep rule."""
    return sorted(p for p in Path(output_dir).glob("step-*") if is_complete_checkpoint(p))


def stray_step(path: Path) -> str | None:
    """What `path`, named like a checkpoint (step-NNNNNN), is when it is no complete checkpoint (a
    link, a file, a folder lacking some of a checkpoint's files); None when nothing is there, or a
    complete checkpoint is. A save's folder is complete from the moment it has that name (it is
    renamed there whole), so such an entry is not one of ours, and no save replaces it."""
    if not (path.exists() or path.is_symlink()) or is_complete_checkpoint(path):
        return None
    if path.is_symlink() or not path.is_dir():
        return "a link" if path.is_symlink() else "a file, not a folder"
    missing = [name for name in required_files() if not (path / name).is_file()]
    if len(missing) == len(required_files()):
        return "a folder holding none of a checkpoint's files"
    more = f" and {len(missing) - 2} more" if len(missing) > 2 else ""
    return f"an incomplete folder: it lacks {', '.join(missing[:2])}{more}"


def stray_steps(output_dir: str | Path) -> dict[Path, str]:
    """{path: what it is} of every entry of output_dir named like a checkpoint that is none
    (`stray_step`), once a copy a killed swap left aside is put back."""
    if not Path(output_dir).is_dir():
        return {}
    restore_dead_asides(output_dir, TEMPORARY_CHECKPOINT)
    found = {path: stray_step(path) for path in sorted(Path(output_dir).iterdir())
             if CHECKPOINT_NAME.match(path.name)}
    return {path: what for path, what in found.items() if what is not None}


def stray_problem(strays: dict[Path, str]) -> str | None:
    """The refusal of a run folder holding `strays` (`stray_steps`), naming the first; or None."""
    if not strays:
        return None
    path, what = next(iter(strays.items()))
    more = f" (and {len(strays) - 1} more such entries)" if len(strays) > 1 else ""
    return (f"{path} is not a checkpoint of this run ({what}){more}: a save of that step would "
            "replace it, and a run never deletes what it did not write. Move it away, or choose "
            "another output folder")


def checkpoint_run_id(checkpoint: Path) -> str | None:
    """The run id `checkpoint`'s trainer state records; None when it records none (saved before
    runs had ids). OSError or ValueError when the state cannot be read (damaged, or not ours)."""
    run_id = load_trainer_state(checkpoint / TRAINER_STATE_FILE).get(RUN_ID_KEY)
    return run_id if isinstance(run_id, str) else None


def resolve_latest(output_dir: str | Path) -> tuple[Path | None, str | None]:
    """(the checkpoint output_dir/latest names, None), or (None, what is wrong with the pointer):
    missing, empty, unreadable, naming something other than a step-NNNNNN folder of output_dir (a
    path elsewhere is refused), or naming a folder that does not exist. A checkpoint that a save
    killed mid-swap left aside is put back first (`restore_dead_asides`)."""
    restore_dead_asides(output_dir, TEMPORARY_CHECKPOINT)
    pointer = Path(output_dir) / LATEST_FILE
    if not pointer.is_file():
        return None, f"{pointer} is missing"
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        return None, f"{pointer} is unreadable ({type(error).__name__})"
    if not name:
        return None, f"{pointer} is empty"
    if not CHECKPOINT_NAME.match(name):
        return (None,
                f"{pointer} names {name!r}, not a step-NNNNNN checkpoint folder of {output_dir}")
    path = Path(output_dir) / name
    if not path.is_dir():
        return None, f"{pointer} names {name}, which does not exist"
    return path, None


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in output_dir, or None if there is none (or `latest` is
    broken: `resolve_latest` says how)."""
    return resolve_latest(output_dir)[0]
