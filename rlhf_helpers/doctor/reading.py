"""How the run doctor reads its files: only regular files (a pipe is never opened, so nothing
blocks), JSON whose numbers a float can hold, and a metrics.jsonl whose last line may have been cut
mid-write.

    rows, notes = read_metrics(Path("runs/ppo-tiny/metrics.jsonl"))  # notes: what was skipped, why
    state = read_json(Path("trl-out/trainer_state.json"))
    state_file, state, notes = newest_trl_state(Path("trl-out"))  # top level or newer checkpoint's

Every error is a ValueError naming the file (and the line); no JSON value reaches a rule as a number
a float cannot hold, as a structure nested deeper than the parser's recursion, as anything but a
number or None, or as a value no run logs (a share of 2, a negative length, step 1e300:
`value_problem`, from the ranges of ppo/metric_docs.py).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.metric_docs import METRICS
from rlhf_helpers.runtime.data import DuplicateKey, refuse_duplicate_keys
from rlhf_helpers.runtime.lock_files import mode_kind

#: digits from which an integer literal is beyond every float (1.8e308 has 309): read as +-inf,
#: never parsed as an int (Python refuses int literals over 4300 digits, and a float conversion of a
#: huge int overflows)
MAX_INT_DIGITS = 309
#: what each metric can be at all, by name (`MetricDoc.possible`, whose step range ends here)
POSSIBLE = {name: doc.possible for name, (_, doc) in METRICS.items() if doc.possible is not None}
MAX_STEP = int(POSSIBLE["step"][1])


class HugeInt(float):
    """An integer literal beyond every float, read as +-inf (what a float of it would be) that
    remembers how many digits it had: in a metric with a range, or as a step, it is no run's, and
    the refusal says "an integer of 401 digits" rather than "inf"."""

    digits: int

    def __new__(cls, text: str) -> HugeInt:
        value = super().__new__(cls, -math.inf if text.startswith("-") else math.inf)
        value.digits = len(text) - text.startswith("-")
        return value

    def words(self) -> str:
        """'an integer of 401 digits' (or 'a negative integer of ...')."""
        return f"{'a negative' if self < 0 else 'an'} integer of {self.digits} digits"


def _parse_int(text: str) -> int | float:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        return HugeInt(text)
    return int(text)


def parse_json(text: str, where: str) -> Any:
    """The JSON value of `text`; ValueError starting with `where` when it is not JSON, nests deeper
    than the parser can follow, or gives one key twice in an object. Integers beyond every float are
    read as +-inf (`HugeInt`, which keeps their number of digits)."""
    try:
        return json.loads(text, object_pairs_hook=refuse_duplicate_keys, parse_int=_parse_int)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise ValueError(
            f"{where}: nested too deeply to be read (lists or objects inside each other thousands "
            "of levels down); a metrics record is one flat object"
        ) from None
    except DuplicateKey as error:
        raise ValueError(
            f"{where}: the key {error.key!r} appears twice in one record; keep one") from None


def what_is_there(path: Path) -> str | None:
    """None for a regular file (or a link to one); else what `path` is, in words ("no such file", "a
    folder", "a broken link (to gone.jsonl)", "a named pipe (FIFO)", ...). Never opens it."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            return f"a broken link (to {os.readlink(path)})"
        return "no such file"
    except OSError as error:  # a loop of links, a path through a file, no permission to look
        return f"not readable ({error.strerror})"
    return mode_kind(info.st_mode)  # os.stat followed any link: never "a symbolic link" here


def open_regular(path: Path) -> Any:
    """`path` opened for reading in binary; ValueError saying what it is when it is not a regular
    file. Opened without blocking and checked again once open, so a pipe put there after the first
    look never blocks a read."""
    kind = what_is_there(path)
    if kind is not None:
        raise ValueError(f"{path} is {kind}, not a file")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ValueError(f"{path} cannot be opened ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def read_json(path: Path) -> Any:
    """The JSON in a regular file (`parse_json`); ValueError naming the file if not UTF-8 JSON."""
    with open_regular(path) as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 JSON ({error.reason} at byte {error.start})") from None
    return parse_json(text, str(path))


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a metrics.jsonl, and notes on what was skipped.

    One JSON object a line; blank lines are skipped, a UTF-8 byte order mark is accepted. The last
    line, when it has no newline at its end and is not valid JSON (or not UTF-8), is a record cut
    mid-write (the run was stopped or is still writing): it is skipped with a note and the rest is
    read. Any other bad line is refused (ValueError naming the file and the line), and so is a file
    with no row."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    with open_regular(path) as handle:
        for line_number, raw in enumerate(handle, start=1):
            cut = not raw.endswith(b"\n")  # only the last line can lack its newline
            where = f"{path}, line {line_number}"
            try:
                line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
                if not line.strip():
                    continue
                record = parse_json(line, where)
            except (UnicodeDecodeError, ValueError) as error:
                if cut:
                    bad = "not UTF-8" if isinstance(error, UnicodeDecodeError) else "not valid JSON"
                    notes.append(f"{where}: skipped, a record cut mid-write "
                                 f"(no newline at its end, and {bad})")
                    break
                if isinstance(error, UnicodeDecodeError):
                    raise ValueError(
                        f"{where}: not valid UTF-8 ({error.reason} at byte {error.start} of the "
                        "line); save the file as UTF-8"
                    ) from None
                raise
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            if (problem := value_problem(record)) is not None:
                raise ValueError(f"{where}: {problem}")
            rows.append(record)
    if not rows:
        raise ValueError(f"{path}: holds no metrics row"
                         + (f" ({notes[0]})" if notes else " (the file is empty)"))
    return rows, notes


def step_problem(value: Any) -> str | None:
    """Why a logged step is not one (an integer from 0 to MAX_STEP: an int, or a float equal to one,
    as TRL and this course log steps from 0 or 1), or None. None (no step logged) is no problem: the
    row's place stands for it."""
    if value is None:
        return None
    if isinstance(value, HugeInt):
        return (f"step must be an integer from 0 to {MAX_STEP:,} (no run is that long), got "
                f"{value.words()}: no run logs that, so the file was edited or damaged")
    whole = isinstance(value, numbers.Integral) or (
        isinstance(value, numbers.Real) and math.isfinite(float(value))
        and float(value).is_integer()
    )
    if isinstance(value, bool) or not whole or value < 0:
        return f"step must be an integer >= 0, got {type(value).__name__} {value!r:.40}"
    if value > MAX_STEP:
        return (f"step must be at most {MAX_STEP:,} (no run is that long), got "
                f"{type(value).__name__} {value!r:.40}")
    return None


def _words(low: float, high: float) -> str:
    """A range in words: 'in [0, 1]', '>= 0', '<= 1'."""
    if math.isinf(high):
        return f">= {low:g}"
    return f"<= {high:g}" if math.isinf(low) else f"in [{low:g}, {high:g}]"


def value_problem(record: Mapping[str, Any]) -> str | None:
    """Why a logged row cannot come from any run, or None: its step (`step_problem`), or the first
    metric outside what it can be at all (`MetricDoc.possible` in ppo/metric_docs.py: a share
    outside [0, 1], a negative length, ...), an integer literal beyond every float (`HugeInt`)
    included. NaN and inf are the rules' business (a run stopped by them), and values that are no
    numbers `metric_rows`'."""
    if (problem := step_problem(record.get("step"))) is not None:
        return problem
    for key, value in record.items():
        bounds = POSSIBLE.get(key)
        if bounds is not None and isinstance(value, HugeInt):  # never a float a run logged
            return (f"{key} must be {_words(*bounds)} ({METRICS[key][1].meaning}), got "
                    f"{value.words()}: no run logs that, so the file was edited or damaged")
        if (bounds is None or isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(float(value)) or bounds[0] <= value <= bounds[1]):
            continue
        return (f"{key} must be {_words(*bounds)} ({METRICS[key][1].meaning}), got {value!r:.40}: "
                "no run logs that, so the file was edited or damaged")
    return None


def as_number(value: Any) -> float | None:
    """A logged value as a float the rules can compare: None stays None (not logged); any real
    number (int, float, numpy's float32 and int64, ...) becomes a float, one beyond a float's range
    +-inf. TypeError for anything else (a bool, a string, a list)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # so is numpy's bool_
        raise TypeError(f"not a number: {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int beyond every float
        return math.inf if value > 0 else -math.inf


def metric_rows(history: Sequence[Mapping[str, Any]],
                where: str = "") -> tuple[list[dict[str, Any]], int]:
    """(one row per step, every value a float or None (`as_number`), each with an int "step"; how
    many steps were logged more than once). ValueError starting with `where` and naming the row and
    metric of the first value that is not a number: the rules read numbers, and a string or a list
    would silently read as "not logged".

    A row without a step (None) is the step of its place in the history; a step that is not an
    integer >= 0 is refused (`step_problem`): -5 and -5.5 would read as one step. A step logged
    again (a resumed run logs again the steps after its last checkpoint) is read from its last row,
    the one the run went on from, in the place of its first: every rule counts it once."""
    by_step: dict[int, dict[str, Any]] = {}
    repeated: set[int] = set()
    for index, row in enumerate(history):
        numbers_only = {}
        for key, value in row.items():
            try:
                numbers_only[key] = as_number(value)
            except TypeError:
                raise ValueError(
                    f"{where}row {index + 1}: {key} must be a number, got {type(value).__name__} "
                    f"{value!r:.40}"
                ) from None
        if (problem := value_problem(row)) is not None:
            raise ValueError(f"{where}row {index + 1}: {problem}")
        step = numbers_only.get("step")
        step = int(step) if step is not None else index + 1
        if step in by_step:
            repeated.add(step)
        numbers_only["step"] = step
        by_step[step] = numbers_only
    return list(by_step.values()), len(repeated)


def _state_step(state: Any, fallback: float) -> float:
    """A TRL state's global_step (a finite number), else `fallback`."""
    step = state.get("global_step") if isinstance(state, dict) else None
    if isinstance(step, numbers.Real) and not isinstance(step, bool) and math.isfinite(float(step)):
        return float(step)
    return fallback


def newest_trl_state(folder: Path) -> tuple[Path, Any, list[str]] | None:
    """(file, JSON, notes) of a TRL output folder's newest trainer_state.json; None if it has none.

    TRL writes one into each checkpoint-N folder as it saves, and one at the top when `save_state()`
    runs (at the end of training): the top-level one is read unless the newest checkpoint's is
    further on (by its global_step, else N), as when a run resumed and saved past an older top-level
    state. A tie goes to the top-level one."""
    top = folder / "trainer_state.json"
    saved = [
        (int(number), p / "trainer_state.json")
        for p in folder.glob("checkpoint-*")
        # [0-9], not str.isdigit: '²'.isdigit() is True
        if re.fullmatch(r"[0-9]+", number := p.name.removeprefix("checkpoint-"))
        and os.path.lexists(p / "trainer_state.json")
    ]
    newest = max(saved, key=lambda item: item[0]) if saved else None
    if not os.path.lexists(top):
        return None if newest is None else (newest[1], read_json(newest[1]), [])
    top_state = read_json(top)
    if newest is None:
        return top, top_state, []
    number, path = newest
    state = read_json(path)
    top_step, saved_step = _state_step(top_state, -math.inf), _state_step(state, _as_float(number))
    if saved_step <= top_step:
        return top, top_state, []
    if _logged(top_state) and not _logged(state):  # an empty log never outranks one with steps
        note = f"{path} holds no logged step: read the top-level {top.name} instead"
        return top, top_state, [note]
    return (
        path,
        state,
        [
            f"read {path} (global_step {saved_step:g}): newer than the top-level {top.name} "
            f"(global_step {top_step:g}), which a later checkpoint has outdated"
        ],
    )


def _as_float(number: int) -> float:
    """A checkpoint's number as a float; +inf beyond a float's range (a name of 400 digits)."""
    try:
        return float(number)
    except OverflowError:
        return math.inf


def _logged(state: Any) -> bool:
    """Whether a TRL state's log_history holds an entry."""
    log = state.get("log_history") if isinstance(state, dict) else None
    return isinstance(log, list) and bool(log)
