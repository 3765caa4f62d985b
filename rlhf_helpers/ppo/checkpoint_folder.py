"""Which checkpoints a run folder holds: the step-NNNNNN folders, the complete ones, the one
`latest` names; and the error of a save that could not be written.

    checkpoints(Path("runs/ppo-tiny"))        # [.../step-000009, .../step-000010], oldest first
    latest_checkpoint(Path("runs/ppo-tiny"))  # .../step-000010, or None
    resolve_latest(Path("runs/ppo-tiny"))     # (path, None) or (None, what is wrong with `latest`)

Apart from `checkpoint.py` (which writes and loads them) so that `run_claim`, which the save asks
whether it may write, reads a folder without importing the save.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlhf_helpers.ppo.checkpoint_digest import required_files
from rlhf_helpers.runtime.folder_swap import restore_dead_asides

LATEST_FILE = "latest"
#: Names of checkpoint folders (what `latest` may point at).
CHECKPOINT_NAME = re.compile(r"^step-\d{6,}$")
#: A save's temporary folder (.tmp-step-N-PID) and a re-saved step's previous copy set aside
#: (.old-step-N-PID); group 2 is the PID.
TEMPORARY_CHECKPOINT = re.compile(r"^\.(?:tmp|old)-(step-\d+)-(\d+)$")


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
