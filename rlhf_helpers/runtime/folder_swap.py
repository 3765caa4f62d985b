"""Replace a folder by a finished one so that a complete copy exists at every moment: at its own
name, or renamed aside under a name that says whose process moved it.

    replace_folder(tmp, final, aside)    # final -> aside, tmp -> final, then aside deleted
    restore_dead_asides(root, pattern)   # put back copies that a killed swap left aside

A process that lives through the swap never leaves `final` missing: the two renames run with Ctrl-C
held back (`interrupt.deferred_interrupt`), and an error between them puts the previous copy back.
Only a process killed outright between them (SIGKILL, a power cut) can: its previous copy is then
aside (`.old-<name>-<pid>` for a checkpoint, `.tmp-old-<name>-<pid>` for a cached folder) with its
PID dead, and `restore_dead_asides`, which the next save, build or load runs first, renames it back
to `final`. The sweep of dead runs' temporary folders never deletes such a copy
(`is_stranded_aside`). Links are moved aside themselves, never written through, and nothing else
in the folder is touched.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from rlhf_helpers.runtime.interrupt import deferred_interrupt
from rlhf_helpers.runtime.locks import pid_is_alive

#: Names of previous copies moved aside: group 1 is the name they belong at, group 2 the PID.
ASIDE_NAME = re.compile(r"^\.(?:tmp-)?old-(.+)-(\d+)$")

_in_flight: set[str] = set()  # asides (absolute) of the swaps running in this process: not stranded


def _present(path: Path) -> bool:
    """Whether anything is at `path` (a dangling link included)."""
    return path.exists() or path.is_symlink()


def remove_path(path: Path) -> None:
    """Delete the folder at `path`, or the link itself when it is a symbolic link (never what it
    points to)."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def is_stranded_aside(path: Path) -> bool:
    """Whether `path` is a previous copy moved aside whose own name is empty: the only copy left
    by a swap that did not finish, which must be put back, never deleted."""
    match = ASIDE_NAME.match(path.name)
    return bool(match) and _present(path) and not _present(path.parent / match.group(1))


def restore_dead_asides(root: str | Path, pattern: re.Pattern[str]) -> list[Path]:
    """Rename back to its own name every stranded aside copy in `root` (`is_stranded_aside`) that
    matches `pattern` and whose process is gone (or is this one, outside a swap); return the
    restored paths. Best effort: a copy that cannot be moved (a read-only folder, another process
    first) stays where it is. Nothing is moved on Windows, where signal 0 does not test a
    process."""
    root = Path(root)
    if os.name == "nt" or not root.is_dir():
        return []
    restored = []
    for folder in sorted(root.iterdir()):
        match = ASIDE_NAME.match(folder.name)
        if not (match and pattern.match(folder.name) and is_stranded_aside(folder)):
            continue
        pid = int(match.group(2))
        if os.path.abspath(folder) in _in_flight or (pid != os.getpid() and pid_is_alive(pid)):
            continue  # a swap running right now: its process puts the copy back itself
        final = root / match.group(1)
        try:
            os.rename(folder, final)
        except OSError:
            continue
        restored.append(final)
    return restored


def replace_folder(tmp: Path, final: Path, aside: Path) -> None:
    """Rename the finished folder `tmp` to `final`. A folder or link already at `final` is renamed
    to `aside` first and deleted once `tmp` is in place; any error or interrupt between the two
    renames puts it back. A Ctrl-C meanwhile is raised once both renames are done."""
    if _present(aside):
        if _present(final):
            remove_path(aside)  # an older copy: the one at `final` replaced it
        else:
            os.rename(aside, final)  # a copy an earlier swap of this process could not put back
    if not _present(final):
        os.rename(tmp, final)
        return
    swapped, key = False, os.path.abspath(aside)
    _in_flight.add(key)
    try:
        with deferred_interrupt():
            os.rename(final, aside)  # a link at `final` is moved aside itself, never its target
            try:
                os.rename(tmp, final)
            except BaseException:
                os.rename(aside, final)  # the previous copy back in place
                raise
            swapped = True
    finally:
        _in_flight.discard(key)
        if swapped:
            remove_path(aside)
