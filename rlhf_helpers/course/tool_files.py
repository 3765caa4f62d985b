"""Files the course's tools write into folders a person also uses (the executed notebooks of
tools/build_site.py and the notebook tests, the notebooks of tools/build_notebooks.py), written so
that the next write can tell the tool's own file from a person's.

    write_recorded(path, data)   # a temporary file renamed into place, never through a link, and
                                 # the SHA-256 of `data` in a hidden record beside it
    as_written(path)             # True: the bytes a tool recorded writing; False: anything else
                                 # there (edited since, never recorded, a link); None: nothing there
    replace_problem(path)        # why a tool may not replace `path` ("edited since ..."), or None

The record of `01_a.ipynb` is `.01_a.ipynb.sha256` in the same folder, one SHA-256 a line. One
record a file, not one for the folder: two writers at once (the notebook tests run two at a time)
each update their own.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

RECORD_SUFFIX = ".sha256"
#: A record is a few lines; a bigger file at its name is no record.
MAX_RECORD_BYTES = 4096


def record_path(path: Path) -> Path:
    """Where the record of `path` lies: `.NAME.sha256` beside it."""
    return path.with_name(f".{path.name}{RECORD_SUFFIX}")


def digest(data: bytes) -> str:
    """The SHA-256 of `data`, in hex."""
    return hashlib.sha256(data).hexdigest()


def recorded_digests(path: Path) -> set[str]:
    """The SHA-256s recorded for `path` (none where there is no record, or a link, or no regular
    file at its name)."""
    record = record_path(path)
    try:
        info = os.lstat(record)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_RECORD_BYTES:
            return set()
        text = record.read_text(encoding="ascii")
    except (OSError, ValueError):
        return set()
    digests = {line.strip() for line in text.splitlines() if line.strip()}
    # a record holds SHA-256s only: any other text there is a person's file at the record's name
    return digests if all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests) else set()


def as_written(path: Path) -> bool | None:
    """Whether `path` holds the very bytes a tool recorded writing there: None when nothing is
    there; False for a link, anything but a regular file, a file with no record or one changed
    since."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return False
    recorded = recorded_digests(path)
    return bool(recorded) and digest(path.read_bytes()) in recorded


def _plainly_under(path: Path, folder: Path) -> bool:
    """Whether `path` lies in `folder` with no link on the way: neither `folder` nor any folder
    between them is a link (a build/ linked to a person's folder is not the tools')."""
    folder = folder.absolute()
    try:
        inside = path.absolute().relative_to(folder)
    except ValueError:
        return False
    steps = [folder, *(folder / Path(*inside.parts[:n]) for n in range(1, len(inside.parts)))]
    return not any(step.is_symlink() for step in steps)


def replace_problem(path: Path, unrecorded_under: Path | None = None) -> str | None:
    """Why a tool may not replace `path` (a person's file: it was changed since a tool wrote it,
    or no tool recorded writing it, or it is a link or no regular file), or None (nothing there,
    or a tool's file as written). `unrecorded_under`: a folder the tools own (the checkout's
    build/), where a regular file with no record at all was written before the tools kept
    records, and counts as theirs."""
    record = record_path(path)
    if os.path.lexists(record) and not recorded_digests(path):
        return f"{record} is no record a tool of the course wrote (a person's file at its name)"
    if (unrecorded_under is not None and not path.is_symlink() and path.is_file()
            and not os.path.lexists(record) and _plainly_under(path, Path(unrecorded_under))):
        return None
    written = as_written(path)
    if written is None or written:
        return None
    if path.is_symlink():
        return f"{path} is a link (to {os.readlink(path)})"
    if not path.is_file():
        return f"{path} is not a regular file"
    if recorded_digests(path):
        return f"{path} was changed after a tool of the course wrote it"
    return f"{path} was not written by a tool of the course (it has no {record_path(path).name})"


def _replace_with(target: Path, data: bytes, mode: int = 0o644) -> None:
    """`data` written to a temporary file in `target`'s folder, then renamed over `target`: a link
    there is replaced, never written through, and a write stopped half-way leaves the old file
    whole."""
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                         suffix=".tmp")
    try:
        os.fchmod(handle, mode)  # mkstemp's 0o600 would hide the file from other users
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_recorded(path: Path, data: bytes) -> None:
    """Put `data` at `path` (never through a link) and record its SHA-256 beside it. The record
    names the old bytes and the new while the file is replaced, so that a write stopped in
    between leaves a file still recognised as the tool's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = digest(data)
    old = recorded_digests(path) if as_written(path) else set()
    _replace_with(record_path(path), "".join(f"{d}\n" for d in sorted({new, *old})).encode())
    _replace_with(path, data)
    _replace_with(record_path(path), f"{new}\n".encode())
