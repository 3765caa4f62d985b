"""Locks between processes: one live run per output folder, one builder per cached artefact.

    lock = hold_run_folder(Path("runs/ppo-tiny"))   # FolderInUse if another live process holds it
    ...                                             # write checkpoints, run.json, metrics.jsonl
    lock.release()                                  # or let the process end: the OS releases it

    with FileLock(Path("runs/.lock-reward-tiny"), "the reward cache").acquire(wait=True):
        ...                                         # build the cache; a second builder waits here

A lock is `flock` on a small file that records its holder ({"pid", "host", "since"}). The kernel
drops an flock when the process holding it ends, even by kill -9, so a lock never outlives its run:
a file that still names a holder whose lock is free is stale, and the next process takes it over
with one line on stderr. Release deletes the file (a process that was waiting on the deleted file
sees that and locks the new one). Inside one process a lock is re-entrant: a
second `acquire` of a file this process already holds (the CLI, then its trainer) succeeds without
owning it. On a system without `fcntl` (Windows) the file is written but nothing is locked.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # POSIX only: elsewhere the lock records its holder but cannot exclude anyone
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: The lock file inside a run's output folder.
RUN_LOCK_FILE = ".run.lock"


class FolderInUse(RuntimeError):
    """Another live process holds the lock. `.path` is the lock file, `.holder` what it recorded
    ({"pid", "host", "since"}, or {} when the holder had not written it yet)."""

    def __init__(self, message: str, path: Path, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


def describe_holder(holder: dict[str, Any]) -> str:
    """'pid 4711 on host ada since 2026-11-26 05:40:12', or 'a process that has not written its pid yet'."""
    if not holder.get("pid"):
        return "a process that has not written its pid yet"
    return f"pid {holder['pid']} on host {holder.get('host', '?')} since {holder.get('since', '?')}"


def _read_holder(handle: Any) -> dict[str, Any]:
    """The holder recorded in an open lock file ({} if empty or unreadable)."""
    handle.seek(0)
    try:
        value = json.loads(handle.read() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _is_this_process(holder: dict[str, Any]) -> bool:
    return holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()


def _same_file(handle: Any, path: Path) -> bool:
    """Whether the open `handle` is still the file at `path` (a releasing holder deletes it)."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


class FileLock:
    """An exclusive lock on `path` (created with its folder) for what `what` names in messages."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self._handle: Any = None
        self.owned = False  #: True while this object holds the flock (False when re-entered)

    def acquire(self, wait: bool = False, on_wait: Callable[[dict[str, Any]], None] | None = None) -> FileLock:
        """Take the lock and return self. Held by another live process: FolderInUse, or with `wait`
        block until it is free (`on_wait(holder)` is called once first)."""
        if self._handle is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - kept open while the lock is held
            if fcntl is None:
                break
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(handle)
                for _ in range(100):  # the holder writes its pid just after it locks: give it a second
                    if holder.get("pid"):
                        break
                    time.sleep(0.01)
                    holder = _read_holder(handle)
                if _is_this_process(holder):  # re-entered (the CLI holds it, then its trainer asks)
                    self._handle = handle
                    return self
                if not wait:
                    handle.close()
                    raise FolderInUse(f"{self.what} is in use by {describe_holder(holder)} (lock file {self.path})",
                                      self.path, holder) from None
                if on_wait is not None:
                    on_wait(holder)
                    on_wait = None
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # blocks until the holder releases or ends
            if _same_file(handle, self.path):
                break
            handle.close()  # its holder released it and deleted the file meanwhile: lock the new one
        stale = _read_holder(handle)
        if stale.get("pid") and not _is_this_process(stale):
            print(f"took over the lock of {self.what} ({self.path}) from {describe_holder(stale)}, "
                  "which ended without releasing it", file=sys.stderr, flush=True)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        self._handle, self.owned = handle, True
        return self

    def release(self) -> None:
        """Delete the lock file and drop the lock (a re-entered lock only closes its handle)."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            if self.owned and _same_file(handle, self.path):
                self.path.unlink()  # while still locked: a waiter then finds its file gone and opens a new one
        finally:
            self.owned = False
            handle.close()  # closing the last descriptor of the file drops its flock

    @property
    def held(self) -> bool:
        return self._handle is not None

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
    another live run holds it."""
    folder = Path(folder)
    lock = FileLock(folder / RUN_LOCK_FILE, f"the run folder {folder}")
    try:
        return lock.acquire()
    except FolderInUse as error:
        raise FolderInUse(f"{folder} is in use by another run: {describe_holder(error.holder)} holds its lock "
                          f"({error.path}). Wait for that run to end or stop it, or choose another output folder",
                          error.path, error.holder) from None
