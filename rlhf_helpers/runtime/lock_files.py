"""Opening a lock file safely, and the errors of a lock that cannot be taken (`runtime.locks` uses
them).

    handle = open_lock_file(Path("runs/ppo-tiny/.run.lock"), "the run folder runs/ppo-tiny")

A lock file sits in folders people use (a run's output folder, a cache folder several runs share),
so it is never opened through a symbolic link, never opened at all when it is no regular file (a
folder, a named pipe, a device), never written when it is a hard link (a second name of a file
someone keeps), and never truncated on opening (another process may hold it). Whatever stops it
raises LockFileUnusable, which names the path and what is there and leaves it as it is.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

#: open() flags of a lock file: created if missing but never truncated (another process may hold
#: it), never through a symbolic link, and never blocking (a named pipe swapped in after the check
#: must not hang us)
OPEN_FLAGS = (
    os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class FolderInUse(RuntimeError):
    """Another live process holds the lock. `.path` is the lock file, `.holder` what it recorded
    ({"pid", "host", "since"}, or {} when the holder had not written it yet)."""

    def __init__(self, message: str, path: Path, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


class LockFileUnusable(FolderInUse):
    """The lock cannot be taken at all: its path is a link, a folder, a pipe, or a file that cannot
    be opened for writing. A FolderInUse (with an empty `.holder`), so every caller that refuses a
    folder in use, the training command's one line and exit 2 among them, refuses this too."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message, path, {})


def mode_kind(mode: int) -> str | None:
    """What a file of this st_mode is, in words ("a folder", "a named pipe (FIFO)", ...); None for a
    regular file."""
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((words for test, words in kinds if test(mode)),
                None if stat.S_ISREG(mode) else "not a regular file")


def file_kind(info: os.stat_result) -> str | None:
    """What this file is, in words, when it is not a regular file with one name (None when it is): a
    hard link shares its bytes with another name (O_NOFOLLOW does not stop it), so a lock record
    would overwrite them."""
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return "a hard link"
    return mode_kind(info.st_mode)


def not_a_file(path: Path, what: str, kind: str) -> LockFileUnusable:
    """LockFileUnusable for a lock path that holds `kind` (a link: what it points to is named, never
    opened)."""
    if kind == "a symbolic link":
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        return LockFileUnusable(
            f"cannot lock {what}: its lock file {path} is a symbolic link{target}, which a lock "
            "never follows or writes through (what it points to is left as it is): remove the "
            "link, or choose another folder",
            path,
        )
    if kind == "a hard link":
        return LockFileUnusable(
            f"cannot lock {what}: its lock file {path} is a hard link (the file has other names), "
            "which a lock never writes through (the file keeps its bytes under every name): remove "
            "this name, or choose another folder",
            path,
        )
    return LockFileUnusable(
        f"cannot lock {what}: its lock file {path} is {kind}, not a regular file (left as it "
        "is): move it away, or choose another folder",
        path,
    )


def cannot_open(path: Path, what: str, error: OSError) -> LockFileUnusable:
    """LockFileUnusable saying why `error` (from creating the folder, opening or locking) stops the
    lock."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    if error.errno == errno.ELOOP:
        return not_a_file(path, what, "a symbolic link")
    if error.errno == errno.EISDIR:
        return not_a_file(path, what, "a folder")
    if error.errno in (errno.ENOTDIR, errno.EEXIST):
        return LockFileUnusable(
            f"cannot lock {what}: the folder of its lock file {path} is not a folder "
            f"({reason}): move what is there away, or choose another folder",
            path,
        )
    why = {
        errno.EACCES: "the file is read-only, or its folder is not writable, for this user",
        errno.EPERM: "the file is immutable or append-only (chattr +i / +a)",
        errno.EROFS: "the file system is mounted read-only",
    }.get(error.errno or 0)
    if why is not None:
        return LockFileUnusable(
            f"cannot lock {what}: its lock file {path} cannot be opened for writing ({reason}: "
            f"{why}): make it writable, or choose another folder",
            path,
        )
    return LockFileUnusable(
        f"cannot lock {what}: its lock file {path} cannot be used ({reason})", path)


def open_lock_file(path: Path, what: str) -> Any:
    """The lock file at `path` opened for reading and writing (created with its folder if missing,
    never truncated), or LockFileUnusable. What is at the path is checked without following a link,
    then opened with O_NOFOLLOW and checked again through the open descriptor (a swap in between, or
    a hard link made meanwhile, is refused too): nothing is written into a file that is not a
    regular file of one name."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            kind = file_kind(os.lstat(path))
        except FileNotFoundError:
            kind = None
        if kind is not None:  # never opened: opening a pipe or a device may block or act
            raise not_a_file(path, what, kind)
        descriptor = os.open(path, OPEN_FLAGS, 0o666)
    except LockFileUnusable:
        raise
    except OSError as error:
        raise cannot_open(path, what, error) from None
    kind = file_kind(os.fstat(descriptor))
    if kind is not None:
        os.close(descriptor)
        raise not_a_file(path, what, kind)
    # opened non-blocking only for the pipe case above
    if OPEN_FLAGS & getattr(os, "O_NONBLOCK", 0):
        os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "r+", encoding="utf-8")
