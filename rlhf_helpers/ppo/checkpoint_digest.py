"""A checkpoint's SHA-256 manifest: written last by the save, verified before a resume loads it.

    write_manifest(folder)         # folder/manifest.json: each file of the folder, SHA-256 and size
    verify_checkpoint(folder)      # [] when intact, else one line per problem, each naming the file
    checkpoint_problem(folder)     # the same problems as one line, or None
    manifest_digest(folder)        # SHA-256 of manifest.json: which checkpoint this is, or None

    step-NNNNNN/manifest.json
      {"format": 1, "algorithm": "sha256",
       "files": {"trainer_state.pt": {"sha256": "<64 hex>", "bytes": 8147},
                 "adapters/policy/...": {...}, ...}}

Reading a file back misses damage that leaves it well formed (4 KiB of an adapter zeroed still
loads); a digest does not. trainer_state.pt records that its save wrote a manifest
(MANIFEST_STATE_KEY), so a checkpoint whose manifest was lost is refused, not taken for one saved
before manifests existed: such an older checkpoint still resumes, after every file of it is read
back (`unverified` tells it apart). Files the manifest does not list (a person's notes) are ignored.
The digests catch damage, not forgery: whoever rewrites a file can rewrite the manifest too, which
is why trainer_state.pt is still read with the safe unpickler. Nothing is read through a link (a
save writes none: an edited manifest could list a link to any file), and a file whose size is not
the listed one is damaged without being read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from safetensors.torch import load_file

from rlhf_helpers.ppo.adapters import CHECKPOINT_ADAPTERS_DIR as ADAPTERS_DIR
from rlhf_helpers.ppo.adapters import CHECKPOINT_HEADS_FILE as HEADS_FILE
from rlhf_helpers.ppo.shared_model import ADAPTERS
from rlhf_helpers.ppo.trainer_state import TRAINER_STATE_FILE, load_trainer_state
from rlhf_helpers.runtime.artifacts import sha256_file

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
#: a manifest lists a checkpoint's few files (~100 bytes each): anything larger is not one of ours
MAX_MANIFEST_BYTES = 1 << 20
#: The trainer state's key saying that its save wrote MANIFEST_FILE (value: that file's name).
MANIFEST_STATE_KEY = "manifest"
#: Problems shown in one line (`checkpoint_problem`); a missing adapter folder alone gives several.
SHOWN_PROBLEMS = 3
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def required_files() -> list[str]:
    """Files (relative paths) without which a folder is no checkpoint: what a manifest must list."""
    adapters = [f"{ADAPTERS_DIR}/{adapter}/{name}" for adapter in ADAPTERS
                for name in ("adapter_config.json", "adapter_model.safetensors")]
    return [TRAINER_STATE_FILE, HEADS_FILE, *adapters]


def write_manifest(folder: str | Path) -> Path:
    """Write folder/manifest.json listing every other file under `folder` (SHA-256 and size),
    through a temporary file that is fsync-ed and then renamed over the manifest: it is complete or
    absent."""
    folder = Path(folder)
    manifest = folder / MANIFEST_FILE
    files = {path.relative_to(folder).as_posix(): {"sha256": sha256_file(path),
                                                   "bytes": path.stat().st_size}
             for path in sorted(folder.rglob("*")) if path.is_file() and path != manifest}
    record = {"format": MANIFEST_FORMAT, "algorithm": "sha256", "files": files}
    tmp = folder / f".{MANIFEST_FILE}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, manifest)
    return manifest


def _entry_problem(name: Any, entry: Any) -> str | None:
    """Why one manifest entry is not a file of the checkpoint with its digest and size, or None."""
    parts = PurePosixPath(name).parts if isinstance(name, str) else ()
    if not parts or name.startswith("/") or ".." in parts or "\\" in name:
        return f"lists {name!r}, a path outside the checkpoint"
    if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
            and _HEX64.match(entry["sha256"])
            and type(entry.get("bytes")) is int and entry["bytes"] >= 0):
        return f"holds no SHA-256 and size for {name}"
    return None


def read_manifest(folder: str | Path) -> tuple[dict[str, dict[str, Any]] | None, str | None]:
    """(the files folder/manifest.json lists, None); (None, None) when there is no manifest; (None,
    why it is not a manifest of this course) when it is unreadable, malformed, or lists a path
    outside the folder."""
    manifest = Path(folder) / MANIFEST_FILE
    try:
        mode, size = (info := manifest.lstat()).st_mode, info.st_size
    except FileNotFoundError:
        return None, None
    except OSError as error:
        return (None, f"{manifest} is unreadable ({type(error).__name__}): the checkpoint cannot "
                      "be verified")
    # a link, a pipe (opening it would wait for a writer), a device, or a file far larger than a
    # few files' digests need
    if not stat.S_ISREG(mode) or size > MAX_MANIFEST_BYTES:
        what = ("not a regular file" if not stat.S_ISREG(mode)
                else f"{size} bytes (at most {MAX_MANIFEST_BYTES})")
        return None, f"{manifest} is {what}: the checkpoint cannot be verified"
    try:
        descriptor = os.open(manifest, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                             | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as handle:
            record = json.loads(handle.read(MAX_MANIFEST_BYTES + 1).decode("utf-8"))
    # ValueError: bad JSON, or a number too long; RecursionError: nested deeper than json follows
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        return (None, f"{manifest} is unreadable ({type(error).__name__}): the checkpoint cannot "
                      "be verified")
    record = record if isinstance(record, dict) else {}
    files, form, algorithm = record.get("files"), record.get("format"), record.get("algorithm")
    if (not isinstance(files, dict) or type(form) is not int or form != MANIFEST_FORMAT
        or algorithm != "sha256"):
        return (None,
                (f"{manifest} is not a SHA-256 manifest of format {MANIFEST_FORMAT} (\"format\", "
                      "\"algorithm\" and \"files\"): the checkpoint cannot be verified"))
    for name, entry in files.items():
        problem = _entry_problem(name, entry)
        if problem is not None:
            return None, f"{manifest} {problem}: the checkpoint cannot be verified"
    return files, None


def link_in(folder: Path, name: str) -> Path | None:
    """The first path from `folder` down to folder/name (a relative path) that is a symbolic link,
    or None. A checkpoint's save writes no link: one there points to a file the save never wrote
    (anywhere, of any size), so nothing of the checkpoint is read through it."""
    path = folder
    for part in PurePosixPath(name).parts:
        path = path / part
        if path.is_symlink():
            return path
    return None


def _link_problem(link: Path) -> str:
    return (f"{link} is a link (to {os.readlink(link)}): a checkpoint's save writes no links, so "
            "it is not read through one; put the file itself there, or train again")


def _sha256_of_regular(path: Path) -> str:
    """SHA-256 of the regular file at `path`, opened without following a link or waiting on a
    pipe; OSError for anything else (a link put there since the check: ELOOP)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    with os.fdopen(os.open(path, flags), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_digest(folder: str | Path) -> str | None:
    """SHA-256 of folder/manifest.json, which lists every other file's SHA-256: the checkpoint's
    identity (equal digests, the same bytes). None when it has none (saved by an older version)
    or it cannot be read as a regular file."""
    try:
        return _sha256_of_regular(Path(folder) / MANIFEST_FILE)
    except OSError:
        return None


def _file_problem(folder: Path, name: str, entry: dict[str, Any]) -> str | None:
    """Why a file the manifest lists is not the one the save wrote, or None. A link is refused
    unread, and a size other than the listed one is damage found without reading the file (a
    listed file swapped for a 20 GB one is never hashed)."""
    path = folder / name
    manifest = folder / MANIFEST_FILE
    if (link := link_in(folder, name)) is not None:
        return _link_problem(link)
    try:
        info = path.lstat()
    except FileNotFoundError:
        return f"{path} is missing (listed in {manifest})"
    except OSError as error:
        return f"{path} is unreadable ({error.strerror or type(error).__name__})"
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a file (listed in {manifest} as one)"
    if info.st_size != entry["bytes"]:
        return (f"{path} does not match its SHA-256 in {manifest}: its bytes changed after the "
                f"save ({info.st_size} bytes, {entry['bytes']} when saved)")
    try:
        digest = _sha256_of_regular(path)
    except OSError as error:
        return f"{path} is unreadable ({error.strerror or error})"
    if digest == entry["sha256"]:
        return None
    return (
        f"{path} does not match its SHA-256 in {manifest}: its bytes changed after the save")


def _read_back_problem(folder: Path) -> tuple[str | None, dict[str, Any] | None]:
    """(what is wrong, None) or (None, the trainer state) after reading back every file of a
    checkpoint without a manifest: the trainer state (safe loader, every key), each adapter's config
    and weights, the heads."""
    for name in required_files():  # nothing is read through a link
        if (link := link_in(folder, name)) is not None:
            return _link_problem(link), None
    try:
        state = load_trainer_state(folder / TRAINER_STATE_FILE)
    except FileNotFoundError:
        return f"{folder / TRAINER_STATE_FILE} is missing", None
    except ValueError as error:  # the safe loader's refusal, or not a trainer state
        return str(error), None
    except Exception as error:  # a truncated or garbled zip archive: RuntimeError/EOFError
        return (f"{folder / TRAINER_STATE_FILE} is damaged ({type(error).__name__}: truncated or "
                "overwritten)", None)
    for name in required_files()[1:]:
        file = folder / name
        if not file.is_file():
            return f"{file} is missing", None
        try:
            if file.suffix == ".json":
                json.loads(file.read_text(encoding="utf-8"))
            else:
                load_file(str(file))  # reads the header and every tensor: a truncated file fails
        except Exception as error:  # safetensors raises its own SafetensorError
            return f"{file} is damaged ({type(error).__name__}: truncated or overwritten)", None
    return None, state


def verify_checkpoint(folder: str | Path) -> list[str]:
    """The problems of the checkpoint folder `folder`, one line each naming the file, or [] when it
    is intact: a file missing or not matching its SHA-256 in manifest.json, a manifest unreadable or
    lacking a file every checkpoint has, or lost (the trainer state says the save wrote one).
    Nothing is loaded before the digests match. A checkpoint saved before manifests existed
    (`unverified`) has each file read back instead."""
    folder = Path(folder)
    files, problem = read_manifest(folder)
    if problem is not None:
        return [problem]
    if files is None:
        problem, state = _read_back_problem(folder)
        if problem is not None:
            return [problem]
        if MANIFEST_STATE_KEY in state:
            return [f"{folder / MANIFEST_FILE} is missing, though {folder / TRAINER_STATE_FILE} "
                    "records that the save wrote one: the checkpoint cannot be verified"]
        return []
    problems = [f"{folder / MANIFEST_FILE} does not list {name}: the manifest is incomplete"
                for name in required_files() if name not in files]
    problems += [p for name, entry in files.items()
                 if (p := _file_problem(folder, name, entry)) is not None]
    return problems


def unverified(folder: str | Path) -> bool:
    """True for a checkpoint from before manifests: `verify_checkpoint` read its files back."""
    return not (Path(folder) / MANIFEST_FILE).exists()


def checkpoint_problem(folder: str | Path) -> str | None:
    """`verify_checkpoint`'s problems as one line (the first few, how many more); None if intact."""
    problems = verify_checkpoint(folder)
    if not problems:
        return None
    more = len(problems) - SHOWN_PROBLEMS
    return "; ".join(problems[:SHOWN_PROBLEMS]) + (f" (and {more} more)" if more > 0 else "")
