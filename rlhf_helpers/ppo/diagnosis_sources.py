"""Where the run doctor's history comes from: a run folder of this course (metrics.jsonl and the
settings run.json records) or of TRL (trainer_state.json, its names mapped to the course's).

    history, facts = load_history("runs/ppo-tiny")    # metrics.jsonl's rows; run.json's settings
    read = load_run("trl-out")                        # the same, with the file read and the notes

The files themselves are read by `diagnosis_reading` (regular files only, numbers a float holds, a
last metrics line cut mid-write skipped with a note); this module picks the file, maps TRL's names
(`TRL_NAMES`), checks the settings run.json records before a rule multiplies by them, and refuses a
response_length above the max_new_tokens they record.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.diagnosis_reading import (
    newest_trl_state,
    read_json,
    read_metrics,
    value_problem,
    what_is_there,
)
from rlhf_helpers.ppo.diagnosis_types import RunFacts

#: TRL log name -> this course's metric name, for the quantities that mean the same (TRL 1.x GRPO /
#: RLOO)
TRL_NAMES: dict[str, str] = {
    "reward": "score",  # mean reward of the batch's completions
    "reward_std": "score_std",  # spread of the rewards (TRL: the mean of the per-group std)
    # share of prompt groups whose rewards are all equal
    "frac_reward_zero_std": "zero_std_fraction",
    "kl": "kl_per_token",  # TRL's k3 per-token KL to the reference (ours, `kl`, is k1 per sequence)
    "entropy": "entropy",  # mean per-token entropy of the policy
    "completions/mean_length": "response_length",  # mean completion length in tokens
    "clip_ratio/region_mean": "clipfrac",  # share of tokens whose ratio left the clip band
}


def _trl_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One TRL log entry in this course's names (entries without a reward, e.g. the final summary,
    give {}). A metric TRL logged as null is left out: not logged at that step."""
    if "reward" not in row:
        return {}
    out = {ours: row[theirs] for theirs, ours in TRL_NAMES.items() if row.get(theirs) is not None}
    # share of completions cut at the length limit (no EOS)
    clipped = row.get("completions/clipped_ratio")
    if isinstance(clipped, (int, float)) and not isinstance(clipped, bool):
        out["eos_fraction"] = 1.0 - float(clipped)
    out["step"] = row.get("step")
    return out


@dataclass(frozen=True)
class RunRead:
    """What `load_run` read: the history, the run's settings, the file and the notes on the
    reading."""

    history: list[dict[str, Any]]
    facts: RunFacts
    file: Path
    notes: tuple[str, ...] = ()


def load_history(source: str | Path) -> tuple[list[dict[str, Any]], RunFacts]:
    """The metric history of a run folder or a metrics.jsonl, and the settings run.json records.

    A folder of this course's training command holds metrics.jsonl and run.json; a TRL output folder
    holds trainer_state.json (at its top, or in a checkpoint-N folder: the newest of them,
    `newest_trl_state`), read through TRL_NAMES."""
    read = load_run(source)
    return read.history, read.facts


def load_run(source: str | Path) -> RunRead:
    """`load_history`'s reading, with the file it read and the notes on the reading."""
    path = Path(source)
    # a folder named as a file (x.jsonl, trainer_state.json) is not a run folder
    if path.is_dir() and path.suffix != ".jsonl" and path.name != "trainer_state.json":
        metrics = path / "metrics.jsonl"
        if os.path.lexists(metrics):  # there in some form: read, or refused saying what it is
            return _load_file(metrics)
        found = newest_trl_state(path)
        if found is None:
            raise ValueError(f"source {path} holds no metrics.jsonl (this course's runs) and no "
                             f"trainer_state.json (TRL's): pass a run folder")
        return _load_trl(*found)
    return _load_file(path)


def _load_file(path: Path) -> RunRead:
    kind = what_is_there(path)
    if kind == "no such file":
        raise ValueError(
            f"source must be a run folder or a metrics.jsonl, got {str(path)!r} (no such file)")
    if kind is not None:
        raise ValueError(f"{path} is {kind}, not a file: the doctor reads a metrics.jsonl (one "
                         "JSON object a line)")
    if path.name == "trainer_state.json":
        return _load_trl(path, read_json(path), [])
    rows, notes = read_metrics(path)
    facts = _facts_of_run_json(path.parent / "run.json")
    _check_lengths(rows, facts, path)
    return RunRead(rows, facts, path, tuple(notes))


def _check_lengths(rows: list[dict[str, Any]], facts: RunFacts, path: Path) -> None:
    """ValueError naming both files when a row's mean response_length is above the max_new_tokens
    run.json records: every response has at most that many tokens, so neither can their mean."""
    limit = facts.max_new_tokens
    for index, row in enumerate(rows):
        length = row.get("response_length")
        # NaN and inf are the rules' (a run stopped by them)
        if (limit is not None and isinstance(length, numbers.Real) and not isinstance(length, bool)
                and math.isfinite(length) and length > limit):
            raise ValueError(
                f"{path}, row {index + 1}: response_length {length!r:.40} is above the "
                f"max_new_tokens {limit} of {path.parent / 'run.json'}: no run logs that, so one "
                "of the files was edited or damaged")


def _load_trl(state_file: Path, state: Any, notes: list[str]) -> RunRead:
    log = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(log, list):
        raise ValueError(f"{state_file}: not a TRL trainer_state.json (expected an object with a "
                         f"log_history list, got {type(log).__name__} {log!r:.60})")
    rows = []
    for index, entry in enumerate(log):
        row = _trl_row(entry) if isinstance(entry, dict) else {}
        if row and (problem := value_problem(row)) is not None:
            raise ValueError(f"{state_file}, log_history entry {index + 1}: {problem}")
        rows += [row] if row else []
    return RunRead(rows, RunFacts(source="trl"), state_file, tuple(notes))


#: the largest int setting read from run.json: the rules multiply settings by floats, and every int
#: up to 2**53 is exactly a float
MAX_SETTING = 2**53


def _checked(run_file: Path, section: dict[str, Any], key: str, kinds: tuple[type, ...],
             low: float) -> Any:
    """section[key] when it is None or a number of `kinds` >= low (never a bool) that a float holds
    (an int up to MAX_SETTING, a finite float); else ValueError naming it."""
    value = section.get(key)
    if value is None or (isinstance(value, kinds) and not isinstance(value, bool) and value >= low
                         and (value <= MAX_SETTING if isinstance(value, int)
                              else math.isfinite(value))):
        return value
    kind = "an int" if kinds == (int,) else "a number"
    # too big, inf or NaN
    beyond = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low
    raise ValueError(
        f"{run_file}: {key} must be {kind} >= {low:g}, got {type(value).__name__} {value!r:.60}"
        + (" (beyond what the doctor reads: an int up to 2**53, a finite number)"
           if beyond else ""))


def _facts_of_run_json(run_file: Path) -> RunFacts:
    # never read as "none recorded"
    if (run_file.exists() or run_file.is_symlink()) and not run_file.is_file():
        raise ValueError(
            f"{run_file} is not a readable file (a folder, a broken link or a pipe), so the run's "
            "settings are unknown; move it away to diagnose the metrics alone")
    if not run_file.is_file():
        return RunFacts()
    record = read_json(run_file)
    config = record.get("ppo_config", {}) if isinstance(record, dict) else None
    profile = record.get("profile", {}) if isinstance(record, dict) else None
    if not isinstance(config, dict) or not isinstance(profile, dict):
        raise ValueError(
            f"{run_file}: not a run record (an object whose ppo_config and profile are objects)")
    warmup = _checked(run_file, config, "value_warmup_steps", (int,), 0) or 0
    settings = {"max_new_tokens": _checked(run_file, config, "max_new_tokens", (int,), 1),
                "score_clip": _checked(run_file, config, "score_clip", (int, float), 0),
                "value_warmup_steps": warmup,
                "total_steps": _checked(run_file, config, "total_steps", (int,), 1)}
    # what the run computed in; older records hold the profile's dtype only
    compute = record.get("compute")
    if compute is not None and not isinstance(compute, dict):
        raise ValueError(f"{run_file}: compute must be an object ({{\"dtype\": ..., "
                         f"\"loss_scaling\": ...}}), got {type(compute).__name__} {compute!r:.40}")
    dtype = compute.get("dtype") if compute is not None else profile.get("dtype")
    scaling = compute.get("loss_scaling", False) if compute is not None else False
    if not isinstance(dtype, str):  # None too: a record that does not say how the run computed
        raise ValueError(
            f"{run_file}: dtype must be a dtype name, got {type(dtype).__name__} {dtype!r:.40}")
    if not isinstance(scaling, bool):
        raise ValueError(f"{run_file}: loss_scaling must be true or false, got "
                         f"{type(scaling).__name__} {scaling!r:.40}")
    # "bf16", "torch.bfloat16" are read; an unknown name is refused, never float32
    try:
        facts = RunFacts(dtype=dtype, loss_scaling=scaling)
    except ValueError as error:
        raise ValueError(f"{run_file}: {error}") from None
    return dataclasses.replace(facts, **settings)
