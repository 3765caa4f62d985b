"""Replacing a cached folder (`artifacts.move_into_place`, `folder_swap.replace_folder`) never
loses it: a Ctrl-C or an error between the two renames puts the previous copy back, a Ctrl-C is
held until both are done, and a copy that a killed build left aside is put back by the next build
instead of being swept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_helpers.runtime.artifacts import (
    build_cached,
    move_into_place,
    remove_dead_temporary_folders,
    shown_path,
    temporary_pattern,
)

pytestmark = pytest.mark.skipif(os.name == "nt", reason="process liveness check is POSIX-only")

KEY = {"what": "a test cache"}


def dead_pid() -> int:
    """The PID of a process that has ended."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


def folder_with(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "adapter.bin").write_text(text)
    return path


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-"))


def interrupt_renames_of(source_part: str, monkeypatch, *, real_signal: bool = False) -> None:
    """Ctrl-C at the rename of a path containing `source_part`: raised in its place (as if it
    landed just before it), or with `real_signal` a real SIGINT sent before the rename goes on."""
    real = os.rename

    def rename(source, target):
        if source_part in str(source):
            if not real_signal:
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGINT)
        return real(source, target)

    monkeypatch.setattr(os, "rename", rename)


def test_an_interrupt_between_the_renames_puts_the_previous_folder_back(tmp_path, monkeypatch):
    final = folder_with(tmp_path / "reward", "old")
    tmp = folder_with(tmp_path / f".tmp-reward-{os.getpid()}", "new")
    interrupt_renames_of(".tmp-reward-", monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        move_into_place(tmp, final)
    assert final.is_dir(), "the previous folder was lost"
    assert (final / "adapter.bin").read_text() == "old"
    assert not any(name.startswith(".tmp-old-") for name in hidden(tmp_path))


def test_a_ctrl_c_during_the_swap_is_raised_once_both_renames_are_done(tmp_path, monkeypatch):
    final = folder_with(tmp_path / "reward", "old")
    tmp = folder_with(tmp_path / f".tmp-reward-{os.getpid()}", "new")
    interrupt_renames_of(".tmp-reward-", monkeypatch, real_signal=True)
    with pytest.raises(KeyboardInterrupt):
        move_into_place(tmp, final)
    assert final.is_dir(), "the swap was split: neither copy is in place"
    assert (final / "adapter.bin").read_text() == "new"
    assert hidden(tmp_path) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_error_between_the_renames_puts_the_previous_link_back(tmp_path, monkeypatch):
    """A link at the final name is moved aside itself and back; its target is never touched."""
    users = folder_with(tmp_path / "my-folder", "mine")
    final = tmp_path / "reward"
    final.symlink_to(users)
    tmp = folder_with(tmp_path / f".tmp-reward-{os.getpid()}", "new")
    real = os.rename

    def rename(source, target):
        if ".tmp-reward-" in str(source):
            raise OSError("disk gone")
        return real(source, target)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="disk gone"):
        move_into_place(tmp, final)
    assert final.is_symlink() and (users / "adapter.bin").read_text() == "mine"


def test_a_build_killed_between_the_renames_is_put_back_by_the_next_build(tmp_path, capsys):
    """What a SIGKILL between the renames leaves: the previous copy aside, the new one at its
    temporary name, both under a dead PID. The next build puts the copy back and trains
    nothing."""
    final = tmp_path / "reward-test"
    calls: list[Path] = []

    def train(tmp: Path) -> None:
        calls.append(tmp)
        folder_with(tmp, f"trained {len(calls)}")

    build_cached(final, KEY, train)
    dead = dead_pid()
    aside = tmp_path / f".tmp-old-reward-test-{dead}"
    os.rename(final, aside)
    folder_with(tmp_path / f".tmp-reward-test-{dead}", "half")
    # the sweep alone never deletes the only copy
    assert remove_dead_temporary_folders(tmp_path, temporary_pattern("reward")) == [
        tmp_path / f".tmp-reward-test-{dead}"]
    assert aside.is_dir()

    assert build_cached(final, KEY, train) == final
    assert len(calls) == 1, "the previous folder was lost and trained again"
    assert (final / "adapter.bin").read_text() == "trained 1" and hidden(tmp_path) == []
    assert (f"put back {shown_path(final)}, which a killed build had left aside"
            in capsys.readouterr().err)
