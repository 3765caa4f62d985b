"""Locks between processes: one live run per output folder, one builder per cached artefact.

    lock = hold_run_folder(Path("runs/ppo-tiny"))   # FolderInUse if another live process holds it
    ...                                             # write checkpoints, run.json, metrics.jsonl
    lock.release()                                  # or let the process end: the OS releases it

    with FileLock(Path("runs/.lock-reward-tiny"), "the reward cache").acquire(wait=True):
        ...                                         # build the cache; a second builder waits here

A lock is `flock` on a small file that records its holder ({"pid", "host", "since"}) for messages.
The kernel drops an flock when the process holding it ends, even by kill -9, so a lock never
outlives its run: a file that still names a holder although its lock is free is stale, and the next
process takes it over with one line on stderr. The last release deletes the file (a process that was
waiting on the deleted file sees that and locks the new one).

Inside one process a lock is re-entrant and counted: the CLI holds its folder, then its trainer asks
for it too, and the folder stays locked until both have released it. The process keeps one open file
per lock (a second open and close of the same file would drop the lock on file systems that emulate
flock with POSIX locks, NFS among them). A forked child never releases its parent's lock. On a
system without `fcntl` (Windows) the file is written but nothing is locked.

A lock file lives in a folder people use too, so it is opened by `lock_files.open_lock_file`: never
through a symbolic link, only when it is a regular file, and never truncated before it is locked;
what stops that raises LockFileUnusable naming the path and what is there, and leaves it as it is.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_helpers.runtime.lock_files import (
    FolderInUse,
    LockFileUnusable,
    cannot_open,
    not_a_file,
    open_lock_file,
)

try:  # POSIX only: elsewhere the lock records its holder but cannot exclude anyone
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: The lock file inside a run's output folder.
RUN_LOCK_FILE = ".run.lock"
#: How long a refused process waits for the holder to write its pid (it does so just after locking).
HOLDER_WRITE_S = 1.0
#: How much of a lock file is read for its holder record (a few dozen bytes; a huge file is not
#: ours).
HOLDER_READ_BYTES = 4096


@dataclass
class _Held:
    """A lock this process holds: its open file, how many FileLocks share it, and the pid that took
    it."""

    handle: Any
    count: int
    pid: int


#: (st_dev, st_ino) of each lock file this process holds -> its one open file and share count
_HELD: dict[tuple[int, int], _Held] = {}


def _unreadable(holder: dict[str, Any]) -> bool:
    """Whether a record names a holder whose pid is no process id (written by hand, or by something
    else)."""
    pid = holder.get("pid")
    return bool(pid) and (isinstance(pid, bool) or not isinstance(pid, int) or pid < 0)


def describe_holder(holder: dict[str, Any]) -> str:
    """'pid 4711 on host ada since 2026-11-26 05:40:12', 'a process that has not written its pid
    yet', or 'an unknown process' (its record's pid is no process id)."""
    if not holder.get("pid"):
        return "a process that has not written its pid yet"
    if _unreadable(holder):
        return "an unknown process"
    return f"pid {holder['pid']} on host {holder.get('host', '?')} since {holder.get('since', '?')}"


def unreadable_advice(holder: dict[str, Any], path: Path, folder: str) -> str:
    """For a held lock whose record is unreadable: what that means and how to free `folder` (''
    otherwise)."""
    if not _unreadable(holder):
        return ""
    return (f"; the lock file's record ({json.dumps(holder, default=str)[:120]}) is unreadable, so "
            f"the holder is unknown: if no run uses {folder}, remove {path} and start again")


def _read_holder(handle: Any) -> dict[str, Any]:
    """The holder recorded in an open lock file ({} if empty or unreadable)."""
    handle.seek(0)
    try:
        value = json.loads(handle.read(HOLDER_READ_BYTES) or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def pid_is_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (POSIX signal 0: checks, sends
    nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True  # it exists under another user, or is no pid
    return True


def _may_be_alive(holder: dict[str, Any]) -> bool:
    """False for a record of a process on this host that no longer exists."""
    if not holder.get("pid") or _unreadable(holder) or holder.get("host") != socket.gethostname():
        # an unreadable record: held by a process this one cannot check
        return bool(holder.get("pid"))
    return pid_is_alive(holder["pid"])


def _file_key(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of what is at `path` itself (a link is not followed), or None if nothing
    is."""
    try:
        info = os.lstat(path)
    except OSError:  # missing, or a parent that is no folder
        return None
    return info.st_dev, info.st_ino


def _close(handle: Any) -> None:
    """Close a lock file whose write failed (the descriptor, and with it the flock, goes even if the
    flush fails)."""
    try:
        handle.close()
    except OSError:
        pass


def _same_file(handle: Any, path: Path) -> bool:
    """Whether the open `handle` is still the file at `path` (a releasing holder deletes it)."""
    info = os.fstat(handle.fileno())
    return _file_key(path) == (info.st_dev, info.st_ino)


class FileLock:
    """An exclusive lock on `path` (created with its folder) for what `what` names in messages."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        # set while this object holds (a share of) the lock
        self._key: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        return self._key is not None

    def is_current(self) -> bool:
        """Whether this object holds the lock and its path still names the file locked: False once
        that file (or its folder) was removed, renamed or replaced."""
        return self._key is not None and _file_key(self.path) == self._key

    def acquire(self, wait: bool = False,
                on_wait: Callable[[dict[str, Any]], None] | None = None) -> FileLock:
        """Take the lock and return self. Held by another live process: FolderInUse, or with `wait`
        block until it is free (`on_wait(holder)` is called once first). A path that cannot hold a
        lock (a link, a folder, an unwritable file...): LockFileUnusable."""
        if self._key is not None:
            return self
        key = _file_key(self.path)
        # this process holds it already: share it
        if key in _HELD and _HELD[key].pid == os.getpid():
            _HELD[key].count += 1
            self._key = key
            return self
        while True:
            handle = open_lock_file(self.path, self.what)  # kept open while the lock is held
            if fcntl is None:
                break
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._holder_of_a_held_lock(handle)
                if not wait:
                    handle.close()
                    raise FolderInUse(
                        f"{self.what} is in use by {describe_holder(holder)} (lock file "
                        f"{self.path}){unreadable_advice(holder, self.path, self.what)}", self.path,
                        holder) from None
                if on_wait is not None:
                    on_wait(holder)
                    on_wait = None
                # blocks until the holder releases or ends
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            except OSError as error:  # no locks on this file system (ENOLCK), or the like
                _close(handle)
                raise cannot_open(self.path, self.what, error) from None
            if _same_file(handle, self.path):
                break
            # its holder released it and deleted the file meanwhile: lock the new one
            handle.close()
        stale = _read_holder(handle)
        # this process's own record (a lock file that moved with its folder, released since): no
        # one ended
        mine = stale.get("pid") == os.getpid() and stale.get("host") == socket.gethostname()
        if fcntl is not None and stale.get("pid") and not mine:
            print(f"took over the lock of {self.what} ({self.path}) from {describe_holder(stale)}, "
                  "which ended without releasing it", file=sys.stderr, flush=True)
        # a hard link made since it was opened: never written through
        if os.fstat(handle.fileno()).st_nlink > 1:
            _close(handle)
            raise not_a_file(self.path, self.what, "a hard link")
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
            handle.flush()
        except OSError as error:  # a full disk or quota: closing drops the flock, nothing is held
            _close(handle)
            raise cannot_open(self.path, self.what, error) from None
        info = os.fstat(handle.fileno())
        self._key = (info.st_dev, info.st_ino)
        _HELD[self._key] = _Held(handle, 1, os.getpid())
        return self

    def _holder_of_a_held_lock(self, handle: Any) -> dict[str, Any]:
        """The record of the process that holds the lock now: it writes it just after locking, over
        the record a dead holder may have left, so wait up to HOLDER_WRITE_S for a live one."""
        deadline = time.monotonic() + HOLDER_WRITE_S
        holder = _read_holder(handle)
        while not _may_be_alive(holder) and time.monotonic() < deadline:
            time.sleep(0.01)
            holder = _read_holder(handle)
        return holder

    def release(self) -> None:
        """Give up this share; the last one deletes the lock file and drops the lock. In a forked
        child the parent's lock is left alone (only the child's copy of the file is closed)."""
        key, self._key = self._key, None
        held = _HELD.get(key) if key is not None else None
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _HELD[key]
        try:
            if held.pid == os.getpid() and _same_file(held.handle, self.path):
                if fcntl is None:  # Windows cannot delete an open file
                    held.handle.close()
                # while still locked: a waiter then sees its file is gone
                self.path.unlink(missing_ok=True)
        except OSError:
            pass  # the lock itself goes with the close below; a file left behind is only stale
        finally:
            held.handle.close()  # closing the process's one descriptor of the file drops its flock

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: the OS releases the flock anyway
            pass


def hold_run_folder(folder: str | Path) -> FileLock:
    """Lock `folder` (created if missing) for one run: its lock file RUN_LOCK_FILE is held until
    `release()` or the end of the process. FolderInUse names the folder and the holder's pid when
    another live run holds it; LockFileUnusable (a FolderInUse) says what stops the lock file's
    use."""
    folder = Path(folder)
    lock = FileLock(folder / RUN_LOCK_FILE, f"the run folder {folder}")
    try:
        return lock.acquire()
    except LockFileUnusable:
        raise  # not in use: its message says what is at the path
    except FolderInUse as error:
        advice = unreadable_advice(error.holder, error.path, str(folder))
        raise FolderInUse(f"{folder} is in use by another run: {describe_holder(error.holder)} "
                          f"holds its lock ({error.path}){advice}. Wait for that run to end or "
                          "stop it (a notebook's trainer holds it until `trainer.close()` or a "
                          "kernel restart), or choose another output folder",
                          error.path, error.holder) from None
