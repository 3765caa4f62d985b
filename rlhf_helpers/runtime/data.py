"""Loading the shipped JSONL files of `data/` with clear errors.

Every loader names the file, and for a malformed record the line, in the error it raises:
a missing file is a `FileNotFoundError`, a bad line a `ValueError`, never a stack trace from
deep inside `json` or `datasets`.

Files (see data/README.md for how they were made):
- prompts_train.jsonl / prompts_test.jsonl: {"prompt", "genre", "title"}
- sft.jsonl: {"prompt", "completion"}  (TRL's prompt-completion format)
- preferences_train.jsonl / preferences_test.jsonl: {"prompt", "chosen", "rejected"}
  (TRL RewardTrainer's explicit-prompt "standard" format; chosen/rejected start with a space)
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.runtime.artifacts import sha256_file

#: Environment variable that points the loaders at another data directory.
DATA_DIR_ENV = "RLHF_DATA_DIR"

SPLITS = ("train", "test")
PROMPT_FIELDS = ("prompt", "genre", "title")
SFT_FIELDS = ("prompt", "completion")
PREFERENCE_FIELDS = ("prompt", "chosen", "rejected")


def data_dir() -> Path:
    """The data directory: $RLHF_DATA_DIR if set, else `data/` at the repository root."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "data"


def data_fingerprint(names: Sequence[str]) -> dict[str, str]:
    """SHA-256 of each named file of the data directory ($RLHF_DATA_DIR or data/), "missing" for an
    absent one. Part of the SFT and reward caches' keys: an edited data file, or another data
    directory, never reuses a model trained on the old data."""
    directory = data_dir()
    out = {}
    for name in names:
        path = directory / name
        out[name] = sha256_file(path) if path.is_file() else "missing"
    return out


def _is_lone_surrogate(text: str) -> bool:
    """True when `text` holds a UTF-16 surrogate code point (JSON "\\ud800" without its pair): such
    a string cannot be encoded as UTF-8, so a tokenizer or TRL fails on it far from the file."""
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


class DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object hook: the object, or DuplicateKey naming a key given twice."""
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise DuplicateKey(key)
        record[key] = value
    return record


def load_jsonl(path: str | Path, fields: Sequence[str] = (),
               nonempty: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Records of a JSONL file; each must be a JSON object with string values for `fields`.

    Raises FileNotFoundError if the file is missing and ValueError naming the file and line for
    a line that is not UTF-8, not JSON, not an object, lacks a required string field, holds a lone
    UTF-16 surrogate in one, or has only white space in a field of `nonempty`. Blank lines are
    skipped; a UTF-8 byte order mark at the start is accepted; an empty file is an error. A NUL
    character in a field is accepted with a warning naming the lines.
    """
    path = Path(path)
    _check_data_file(path)
    records: list[dict[str, Any]] = []
    nul_lines: list[int] = []
    with path.open("rb") as handle:  # bytes, decoded line by line: a bad byte gets its line number
        for line_number, raw in enumerate(handle, start=1):
            line = _decode_line(path, line_number, raw)
            if not line.strip():
                continue
            where = f"{path}, line {line_number}"
            record = _parse_record(where, line)
            if _check_fields(where, record, fields, nonempty):
                nul_lines.append(line_number)
            records.append(record)
    if nul_lines:
        warnings.warn(f"{path}: {len(nul_lines)} line(s) hold a NUL character (first: line "
                      f"{nul_lines[0]}); they are kept as they are", UserWarning, stacklevel=3)
    if not records:
        raise ValueError(f"{path}: the file has no records")
    return records


def _check_data_file(path: Path) -> None:
    """IsADirectoryError, or FileNotFoundError with the command that writes it, unless `path` is a
    file."""
    if path.is_dir():
        raise IsADirectoryError(
            f"data file {path} is a folder; expected a JSONL file (one JSON object a line)")
    if not path.is_file():
        raise FileNotFoundError(
            f"data file not found: {path} (regenerate it with `python -m rlhf_helpers.world.build "
            "--out "
            f"{path.parent}`: it writes what is missing and replaces no file it did not write)"
        )


def _decode_line(path: Path, line_number: int, raw: bytes) -> str:
    """One line's text (a byte order mark dropped on the first line), or ValueError naming the
    line."""
    try:
        return raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}, line {line_number}: not valid UTF-8 ({error.reason} at byte "
            f"{error.start} of the line); save the file as UTF-8"
        ) from None


def _parse_record(where: str, line: str) -> dict[str, Any]:
    """The JSON object of one line, or ValueError prefixed with `where` (the file and line)."""
    try:
        record = json.loads(line, object_pairs_hook=refuse_duplicate_keys)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
    except DuplicateKey as error:  # json keeps the last of two equal keys, maybe not the one meant
        raise ValueError(f"{where}: the key {error.key!r} appears twice in one record; "
                         "keep one") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


def _check_fields(where: str, record: dict[str, Any], fields: Sequence[str],
                  nonempty: Sequence[str]) -> bool:
    """ValueError prefixed with `where` for a field of `fields` missing, not a string, holding a
    lone surrogate, or (in `nonempty`) only white space; True when a field holds a NUL character."""
    has_nul = False
    for field in fields:
        if field not in record:
            raise ValueError(f"{where}: missing field {field!r}")
        if not isinstance(record[field], str):
            raise ValueError(f"{where}: field {field!r} must be a string, got "
                             f"{type(record[field]).__name__}")
        if _is_lone_surrogate(record[field]):
            raise ValueError(f"{where}: field {field!r} holds a lone UTF-16 surrogate (such as "
                             "\\ud800 without its pair), which is not text; fix or drop the line")
        if field in nonempty and not record[field].strip():
            raise ValueError(f"{where}: field {field!r} is empty; every {field} needs text "
                             "(a model cannot be prompted with nothing)")
        has_nul = has_nul or "\x00" in record[field]
    return has_nul


def jsonl_text(records: Sequence[dict[str, Any]]) -> str:
    """Records as JSONL text: one JSON object per line, key order kept, non-ASCII as is, trailing
    newline."""
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def write_jsonl(path: str | Path, records: Sequence[dict[str, Any]]) -> None:
    """Write records as `jsonl_text` (UTF-8)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        handle.write(jsonl_text(records))


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def load_prompt_records(split: str = "train", directory: str | Path | None = None) -> list[dict]:
    """Prompt records {"prompt", "genre", "title"} of the train or held-out ("test") split."""
    _check_split(split)
    return load_jsonl(Path(directory or data_dir()) / f"prompts_{split}.jsonl", PROMPT_FIELDS,
                      nonempty=("prompt",))


def load_prompts(split: str = "train", directory: str | Path | None = None) -> list[str]:
    """The prompt texts of the train or held-out ("test") split."""
    return [r["prompt"] for r in load_prompt_records(split, directory)]


def load_sft_corpus(directory: str | Path | None = None) -> list[dict]:
    """SFT records {"prompt", "completion"}; completions start with a space, no EOS text."""
    return load_jsonl(Path(directory or data_dir()) / "sft.jsonl", SFT_FIELDS, nonempty=("prompt",))


def load_preferences(split: str = "train", directory: str | Path | None = None) -> list[dict]:
    """Preference pairs {"prompt", "chosen", "rejected"} of the train or held-out split."""
    _check_split(split)
    path = Path(directory or data_dir()) / f"preferences_{split}.jsonl"
    pairs = load_jsonl(path, PREFERENCE_FIELDS, nonempty=("prompt",))
    warn_about_pairs(path, pairs)
    return pairs


def warn_about_pairs(path: Path, pairs: Sequence[dict]) -> None:
    """One warning for each kind of pair that trains nothing or twice: chosen == rejected (no
    signal), an empty chosen or rejected response, and a pair repeated exactly (counted twice)."""
    same, empty, repeated, seen = [], [], [], set()
    for index, pair in enumerate(pairs):
        key = (pair["prompt"], pair["chosen"], pair["rejected"])
        if pair["chosen"] == pair["rejected"]:
            same.append(index)
        if not pair["chosen"].strip() or not pair["rejected"].strip():
            empty.append(index)
        if key in seen:
            repeated.append(index)
        seen.add(key)
    for found, what in ((same, "chosen == rejected (the pair carries no preference)"),
                        (empty, "an empty chosen or rejected response"),
                        (repeated, "a repeat of an earlier pair (it counts twice)")):
        if found:
            warnings.warn(f"{path}: {len(found)} pair(s) with {what}; first: record {found[0] + 1}",
                          UserWarning, stacklevel=3)
