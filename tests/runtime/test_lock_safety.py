"""Lock files are never followed, never written through, and a lock that cannot be taken is one
clear error.

The run folder's `.run.lock` and the caches' `.lock-<name>` (shared by runs) live in folders a
person also uses: a link, a folder, a pipe or an unwritable file at that path must be refused by
name, and the file a link points to must keep its bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rlhf_helpers.runtime.artifacts import build_cached
from rlhf_helpers.runtime.locks import (
    RUN_LOCK_FILE,
    FileLock,
    FolderInUse,
    LockFileUnusable,
    hold_run_folder,
)

pytestmark = pytest.mark.skipif(os.name == "nt", reason="links, pipes and flock are POSIX here")

NOTES = "my notes: do not lose them\n"
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(NOTES)
    return path


def words(error: BaseException, *paths: Path) -> str:
    """The error's message without the paths it names (a test's folder name must not make a word
    match)."""
    message = str(error)
    for path in paths:
        message = message.replace(str(path), "<path>")
    return message


def never_train(tmp: Path) -> None:
    raise AssertionError("nothing may be built behind a lock that was not taken")


def take_run_lock(folder: Path) -> None:
    hold_run_folder(folder).release()


def take_cache_lock(folder: Path) -> None:
    build_cached(folder / "reward-test", {"what": "a test cache"}, never_train)


@pytest.mark.parametrize("take, name",
                         [(take_run_lock, RUN_LOCK_FILE), (take_cache_lock, ".lock-reward-test")])
def test_a_lock_file_that_is_a_link_is_refused_and_the_file_it_points_to_is_untouched(
        tmp_path, take, name):
    notes, folder = users_file(tmp_path), tmp_path / "run"
    folder.mkdir()
    (folder / name).symlink_to(notes)
    with pytest.raises(LockFileUnusable) as refused:
        take(folder)
    message = str(refused.value)
    assert str(folder / name) in message and str(notes) in message and "\n" not in message
    assert "symbolic link" in words(refused.value, folder / name, notes)
    # the training command turns it into one line and exit 2
    assert isinstance(refused.value, FolderInUse)
    assert notes.read_text() == NOTES  # not overwritten by a lock record
    # and the link kept
    assert (folder / name).is_symlink() and os.readlink(folder / name) == str(notes)


@pytest.mark.parametrize("take, name",
                         [(take_run_lock, RUN_LOCK_FILE), (take_cache_lock, ".lock-reward-test")])
def test_a_lock_file_that_is_a_hard_link_is_refused_and_the_other_name_keeps_its_bytes(
        tmp_path, take, name):
    """O_NOFOLLOW stops symbolic links only: a second name of the user's file would get the lock
    record."""
    notes, folder = users_file(tmp_path), tmp_path / "run"
    folder.mkdir()
    os.link(notes, folder / name)
    with pytest.raises(LockFileUnusable) as refused:
        take(folder)
    message = str(refused.value)
    assert str(folder / name) in message and "\n" not in message
    assert "hard link" in words(refused.value, folder / name)
    # not written, and both names kept
    assert notes.read_text() == NOTES and os.stat(notes).st_nlink == 2


def test_a_held_lock_whose_record_is_malformed_is_refused_naming_the_file_and_how_to_free_it(
        tmp_path):
    """Another process holds the lock (flock on another open file) and its record's pid is no
    number."""
    import fcntl
    import json
    import socket

    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / RUN_LOCK_FILE
    lock.write_text(json.dumps({"pid": "abc", "host": socket.gethostname()}))
    with open(lock) as other:  # a second open file conflicts with ours as another process's would
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(FolderInUse) as refused:
            hold_run_folder(folder)
    message = words(refused.value, lock, folder)
    assert str(lock) in str(refused.value) and "\n" not in message
    assert "unreadable" in message and "remove" in message and "no run" in message
    assert json.loads(lock.read_text())["pid"] == "abc"  # left as it is


def test_a_dangling_link_is_refused_and_creates_nothing_where_it_points(tmp_path):
    folder, target = tmp_path / "run", tmp_path / "elsewhere" / "made-by-the-lock"
    folder.mkdir()
    target.parent.mkdir()
    (folder / RUN_LOCK_FILE).symlink_to(target)
    with pytest.raises(LockFileUnusable, match="symbolic link"):
        hold_run_folder(folder)
    assert not target.exists() and (folder / RUN_LOCK_FILE).is_symlink()


def test_a_folder_or_a_pipe_at_the_lock_path_is_refused_naming_what_it_is(tmp_path):
    held = tmp_path / "folder" / RUN_LOCK_FILE
    held.mkdir(parents=True)
    (held / "keep.txt").write_text(NOTES)
    with pytest.raises(LockFileUnusable) as refused:
        hold_run_folder(held.parent)
    assert str(held) in str(refused.value) and "is a folder" in words(refused.value, held)
    assert (held / "keep.txt").read_text() == NOTES
    pipe = tmp_path / "pipe" / ".lock-sft"
    pipe.parent.mkdir()
    os.mkfifo(pipe)
    with pytest.raises(LockFileUnusable) as refused:  # and no hang: a pipe is never opened
        FileLock(pipe, "the SFT folder").acquire(wait=True)
    assert str(pipe) in str(refused.value) and "named pipe" in words(refused.value, pipe)


def test_a_lock_whose_folder_is_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "cache").write_text(NOTES)  # a file where the cache folder should be
    with pytest.raises(LockFileUnusable) as refused:
        FileLock(tmp_path / "cache" / ".lock-reward", "the reward folder").acquire()
    assert str(tmp_path / "cache") in str(refused.value)
    assert "not a folder" in words(refused.value, tmp_path / "cache",
                                   tmp_path / "cache" / ".lock-reward")
    assert (tmp_path / "cache").read_text() == NOTES


@pytest.mark.skipif(AS_ROOT, reason="root writes read-only files and folders; the folder case "
                                    "above fails for root too")
def test_a_read_only_lock_file_or_folder_is_refused_with_one_clear_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / RUN_LOCK_FILE).write_text("")
    (folder / RUN_LOCK_FILE).chmod(0o444)
    with pytest.raises(LockFileUnusable) as refused:
        hold_run_folder(folder)
    assert str(folder / RUN_LOCK_FILE) in str(refused.value)
    assert "permission denied" in words(refused.value, folder / RUN_LOCK_FILE).lower()
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    try:
        with pytest.raises(LockFileUnusable, match="permission denied|Permission denied"):
            hold_run_folder(readonly)
    finally:
        readonly.chmod(0o755)


def test_an_immutable_lock_file_is_refused_even_for_root(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / RUN_LOCK_FILE
    lock.write_text(NOTES)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(lock)],
                                        capture_output=True).returncode != 0:
        pytest.skip(
            "chattr +i is not available here (no tool, no capability, or a file system without it)")
    try:
        with pytest.raises(LockFileUnusable) as refused:
            hold_run_folder(folder)
        assert str(lock) in str(refused.value) and "immutable" in words(refused.value, lock)
    finally:
        subprocess.run([chattr, "-i", str(lock)], check=True)
    assert lock.read_text() == NOTES


def test_the_training_command_refuses_a_linked_run_lock_in_one_line_with_exit_2(
        tmp_path, monkeypatch, capsys):
    from rlhf_helpers.stages import train_ppo

    def nothing_may_start(*args, **kwargs):
        raise AssertionError("the run must stop before any model is built")

    monkeypatch.setattr(train_ppo, "ensure_sft_model", nothing_may_start)
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    notes, out = users_file(tmp_path), tmp_path / "run"
    out.mkdir()
    (out / RUN_LOCK_FILE).symlink_to(notes)
    with pytest.raises(SystemExit) as refused:
        train_ppo.main(["--profile", "tiny", "--no-progress", "--output-dir", str(out)])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert ("\n" not in err and str(out / RUN_LOCK_FILE) in err
            and "symbolic link" in err.replace(str(out), ""))
    assert notes.read_text() == NOTES and (out / RUN_LOCK_FILE).is_symlink()


def test_a_cache_never_trains_through_a_link_left_at_its_temporary_name(tmp_path):
    users = tmp_path / "my-folder"
    users.mkdir()
    (users / "keep.txt").write_text(NOTES)
    final = tmp_path / "cache" / "reward-test"
    final.parent.mkdir()
    # this process's temporary name
    (final.parent / f".tmp-reward-test-{os.getpid()}").symlink_to(users)

    def train(tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "adapter.bin").write_bytes(b"weights")

    build_cached(final, {"what": "a test cache"}, train)
    assert (sorted(p.name for p in users.iterdir()) == ["keep.txt"]
            and (users / "keep.txt").read_text() == NOTES)
    assert (final.is_dir() and not final.is_symlink()
            and (final / "adapter.bin").read_bytes() == b"weights")
def test_the_training_command_refuses_a_linked_cache_lock_in_one_line_with_exit_2(
        tmp_path, monkeypatch, capsys):
    """The reward cache's lock (in a folder several runs share) as a link: exit 2, one line, the
    file kept."""
    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.stages import train_ppo
    from rlhf_helpers.stages.reward import reward_cache_dir
    from rlhf_helpers.stages.reward_training import RewardTrainingConfig

    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    monkeypatch.setenv("RLHF_CACHE_DIR", str(tmp_path / "cache"))
    profile = get_profile("tiny")
    cache = reward_cache_dir(profile,
                             RewardTrainingConfig.from_profile(profile, max_train_pairs=None))
    cache.parent.mkdir(parents=True)
    notes, lock = users_file(tmp_path), cache.parent / f".lock-{cache.name}"
    lock.symlink_to(notes)
    with pytest.raises(SystemExit) as refused:
        train_ppo.main(
            ["--profile", "tiny", "--no-progress", "--output-dir", str(tmp_path / "run")])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert ("\n" not in err and str(lock) in err
            and "symbolic link" in err.replace(str(tmp_path), ""))
    assert notes.read_text() == NOTES and lock.is_symlink()
