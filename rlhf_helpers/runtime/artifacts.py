"""The one cache protocol of the trained artefacts (the SFT model, the reward adapter).

    folder = build_cached(final, key, train=lambda tmp: train_into(tmp))  # cached, or trained now
    problem = artifact_problem(final, key)                      # None: complete and intact

A cached folder is complete when its completion marker `COMPLETE.json`, written last, records
- `key`: what decides the artefact (settings, the content of its data and of the model it starts
  from), compared as JSON;
- `files`: the SHA-256 of every file of the folder, each checked.
A truncated or overwritten file, a missing one or a broken JSON file no longer matches its checksum,
and a folder trained for another key is out of date. `build_cached` trains into a hidden temporary
sibling `.tmp-<name>-<pid>`, writes the marker last, and renames the folder into place (an existing
folder is renamed aside first, `folder_swap.replace_folder`): at every moment `final` is complete,
or absent with its previous copy aside, put back by the next build. Temporary folders of killed
runs (their PID no longer exists) are swept first. One process builds a given folder at a
time: a second one asking for it meanwhile waits on its lock file `.lock-<name>` and then finds it
built (unless it forces a new build).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rlhf_helpers.runtime.folder_swap import (
    is_stranded_aside,
    remove_path,
    replace_folder,
    restore_dead_asides,
)
from rlhf_helpers.runtime.locks import FileLock, describe_holder, pid_is_alive

#: File written last into a cached folder: its presence means the folder is complete.
COMPLETE_MARKER = "COMPLETE.json"
#: Environment variable naming the folder of runs (default: runs/ at the repository root).
RUNS_DIR_ENV = "RLHF_RUNS_DIR"
#: Environment variable naming the folder of the content-keyed caches (SFT model, reward adapters);
#: default: the runs folder. Concurrent runs may share it: each cache is built once, atomically.
CACHE_DIR_ENV = "RLHF_CACHE_DIR"
#: Files of a model folder without a completion marker that identify its weights (the shipped tiny
#: model).
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin")


def runs_dir() -> Path:
    """$RLHF_RUNS_DIR if set, else `runs/` at the repository root."""
    override = os.environ.get(RUNS_DIR_ENV)
    return Path(override) if override else Path(__file__).resolve().parents[2] / "runs"


def new_run_dir(parent: str | Path, prefix: str = "run") -> Path:
    """A new, empty folder `parent/<prefix>-YYYYmmdd-HHMMSS-<pid>` for one run (`-2`, `-3`... after
    it if that name is taken): two runs, even started in the same second, never share one."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for attempt in range(1, 1000):
        folder = parent / (stem if attempt == 1 else f"{stem}-{attempt}")
        try:
            folder.mkdir()  # atomic: fails if another run created it first
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run folder name {stem}-N in {parent}")


def shown_path(path: str | Path) -> str:
    """`path` as a reader should see it, with no machine's folders in it: under $RLHF_CACHE_DIR or
    $RLHF_RUNS_DIR when set (written so), else relative to the course folder, else under `~`."""
    path = Path(path).resolve()
    bases = [(Path(os.environ[name]).resolve(), f"${name}/")
             for name in (CACHE_DIR_ENV, RUNS_DIR_ENV) if os.environ.get(name)]
    bases += [(Path(__file__).resolve().parents[2], ""), (Path.home().resolve(), "~/")]
    for base, shown in bases:
        if path == base:
            return shown.rstrip("/") or "."
        if path.is_relative_to(base):
            return shown + str(path.relative_to(base))
    return str(path)


def cache_dir() -> Path:
    """$RLHF_CACHE_DIR if set, else `runs_dir()`: where the SFT model and reward adapters are
    cached."""
    override = os.environ.get(CACHE_DIR_ENV)
    return Path(override) if override else runs_dir()


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint_files(paths: Iterable[Path]) -> str:
    """One SHA-256 over the names and contents of `paths`, in the order given."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + sha256_file(path).encode())
    return digest.hexdigest()


def model_fingerprint(directory: str | Path) -> str:
    """SHA-256 of what identifies a model folder's content, whatever its path: its COMPLETE.json (a
    cached folder: its key and its files' checksums) if it has one, else its config and weight files
    (the shipped tiny model). A hub id or a missing folder: the string itself."""
    directory = Path(directory)
    if not directory.is_dir():
        return str(directory)
    marker = directory / COMPLETE_MARKER
    files = [marker] if marker.is_file() else sorted(
        p for p in directory.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES)
    return fingerprint_files(files)


def _as_json(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists): the form markers are compared
    in."""
    return json.loads(json.dumps(value, sort_keys=True))


def read_marker(directory: Path) -> tuple[Any, str | None]:
    """(the parsed COMPLETE.json of a cached folder, None), or (None, why it cannot be read)."""
    if not directory.is_dir():
        return None, "the folder does not exist"
    marker = directory / COMPLETE_MARKER
    if not marker.is_file():
        return None, f"{COMPLETE_MARKER} is missing (an interrupted or older run)"
    try:
        return json.loads(marker.read_text(encoding="utf-8")), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"{COMPLETE_MARKER} is unreadable ({type(error).__name__})"


def folder_checksums(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under `directory` but the marker, by relative path."""
    return {str(path.relative_to(directory)): sha256_file(path)
            for path in sorted(directory.rglob("*"))
            if path.is_file() and path.name != COMPLETE_MARKER}


def unrecorded_files(directory: Path) -> list[str]:
    """Files under `directory` that its marker does not list (all of them when it has no readable
    marker): a person's, which replacing the folder would delete."""
    record, _ = read_marker(directory)
    files = record.get("files") if isinstance(record, dict) else None
    listed = set(files) if isinstance(files, dict) else set()
    return [name for path in sorted(directory.rglob("*")) if path.is_file() and path.name
            != COMPLETE_MARKER and (name := str(path.relative_to(directory))) not in listed]


def files_problem(directory: Path, record: Any) -> str | None:
    """Why the files of `directory` do not match the checksums its marker `record` lists, or
    None."""
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{COMPLETE_MARKER} lists no file checksums"
    for name, digest in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            actual = sha256_file(path)
        except OSError as error:
            return f"{name} is unreadable ({error.strerror or type(error).__name__})"
        if actual != digest:
            return f"{name} does not match the checksum in {COMPLETE_MARKER}"
    return None


def key_problem(record: Any, key: Mapping[str, Any],
                describe: Mapping[str, str] | None = None) -> str | None:
    """None when the marker `record` was written for `key`; else "it was trained <how>", naming the
    first part of the key that differs (`describe`: part -> words, e.g. "on other data")."""
    recorded = record.get("key") if isinstance(record, dict) else None
    if not isinstance(recorded, dict):
        return "it was trained by an older version of the course (its marker records no key)"
    wanted = _as_json(dict(key))
    for part, value in wanted.items():
        if part in ("sft_model_path",):  # recorded for people, never compared
            continue
        if recorded.get(part) != value:
            return f"it was trained {(describe or {}).get(part, f'with another {part}')}"
    return None


def artifact_problem(directory: str | Path, key: Mapping[str, Any] | None = None,
                     describe: Mapping[str, str] | None = None) -> str | None:
    """What is wrong with the cached folder `directory`, in a few words, or None when it is complete
    and intact (and, with `key`, trained for that key). Out-of-date answers start "it was
    trained"."""
    directory = Path(directory)
    record, problem = read_marker(directory)
    if problem is None:
        problem = files_problem(directory, record)
    if problem is None and key is not None:  # intact: but is it the artefact asked for?
        problem = key_problem(record, key, describe)
    return problem


def read_record(directory: str | Path) -> dict[str, Any]:
    """The marker of a complete cached folder (FileNotFoundError naming the folder otherwise)."""
    record, problem = read_marker(Path(directory))
    if problem is not None or not isinstance(record, dict):
        raise FileNotFoundError(
            f"{directory} is not a complete cached folder: {problem or 'bad marker'}")
    return record


def temporary_pattern(prefix: str) -> re.Pattern[str]:
    """`build_cached`'s temporary folders of artefacts named `prefix`...: .tmp-<name>-<pid>
    (training) and .tmp-old-<name>-<pid> (a replaced folder). Group 2 is the PID."""
    return re.compile(rf"^\.tmp-((?:old-)?{re.escape(prefix)}.*)-(\d+)$")


def remove_dead_temporary_folders(root: str | Path, pattern: re.Pattern[str]) -> list[Path]:
    """Delete the folders in `root` that match `pattern` (group 2: a PID) and whose process no
    longer exists; return them.

    A run killed mid-training (kill -9, a closed notebook, a power cut) never reaches its `finally`
    and leaves its temporary folder behind. Folders of live processes are kept (another run may be
    training right now), and so is everything else in `root`, and a previous copy moved aside whose
    own name is empty (`folder_swap.is_stranded_aside`: `restore_dead_asides` puts it back). A PID
    reused by an unrelated process only keeps a dead folder a little longer. Nothing is removed on
    Windows, where signal 0 does not test a process.
    """
    root = Path(root)
    if os.name == "nt" or not root.is_dir():
        return []
    removed = []
    for folder in sorted(root.iterdir()):
        match = pattern.match(folder.name)
        if (match and (folder.is_dir() or folder.is_symlink()) and not is_stranded_aside(folder)
                and not pid_is_alive(int(match.group(2)))):
            remove_path(folder)
            removed.append(folder)
    return removed


def move_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished folder `tmp` to `final`; an existing `final` is renamed aside to
    .tmp-old-<name>-<pid> first and deleted after (`folder_swap.replace_folder`), so a complete
    copy is at every moment at `final` or, after a kill between the renames, aside, from where the
    next `build_cached` puts it back."""
    replace_folder(tmp, final, final.parent / f".tmp-old-{final.name}-{os.getpid()}")


def build_lock(final: str | Path, what: str = "cache") -> FileLock:
    """The lock of the folder `final` that `build_cached` takes while it builds it (a file beside
    it): a caller holding it first keeps every other process from building there meanwhile."""
    final = Path(final)
    return FileLock(final.parent / f".lock-{final.name}", f"the {what} folder {final}")


def build_cached(final: str | Path, key: Mapping[str, Any],
                 train: Callable[[Path], Mapping[str, Any] | None], describe: Mapping[str, str]
                 | None = None, force: bool = False, announce: Callable[[str], None] | None = None,
                 family: str | None = None, what: str = "cache") -> Path:
    """`final` if it is complete for `key`; else `train(tmp)` fills a temporary folder, the marker
    {"key", "files" (SHA-256 each), and what `train` returned} is written last, and the folder is
    renamed into place. `announce(why)` is called before training ("forced", or what is wrong with
    the cached folder: `artifact_problem`). `force` trains even when the cache is good (so a process
    that waited for another builder trains again). Dead runs' temporary folders of artefacts whose
    names start with `family` (default: `final`'s name) are removed before training, with one line
    on stderr (`what` names the kind, e.g. "reward")."""
    final = Path(final)
    if not force and artifact_problem(final, key, describe) is None:
        return final

    def waiting(holder: dict[str, Any]) -> None:
        print(f"waiting for {describe_holder(holder)}, which is building {shown_path(final)}",
              file=sys.stderr, flush=True)

    # one builder at a time: a second process waits here, then finds the folder built by the first
    with build_lock(final, what).acquire(wait=True, on_wait=waiting):
        temporary = temporary_pattern(family or final.name)
        for restored in restore_dead_asides(final.parent, temporary):  # before the sweep
            print(f"put back {shown_path(restored)}, which a killed build had left aside",
                  file=sys.stderr, flush=True)
        removed = remove_dead_temporary_folders(final.parent, temporary)
        if removed:  # swept under the lock: no live builder of this folder can be mid-way
            print(f"removed {len(removed)} temporary {what} folder(s) of runs that no longer "
                  f"exist: {', '.join(p.name for p in removed)}", file=sys.stderr, flush=True)
        problem = "forced" if force else artifact_problem(final, key, describe)
        if problem is None:
            return final
        if announce is not None:
            announce(problem)
        tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
        remove_path(tmp)  # a link left at this name is removed, so training never writes through it
        try:
            extra = dict(train(tmp) or {})
            marker = {**extra, "key": _as_json(dict(key)), "files": folder_checksums(tmp)}
            # last: the folder is complete
            (tmp / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            move_into_place(tmp, final)
        finally:
            remove_path(tmp)
    return final
