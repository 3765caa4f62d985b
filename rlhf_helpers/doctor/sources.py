"""Where the run doctor's history comes from: a run folder of this course (metrics.jsonl and the
settings run.json records) or of TRL (trainer_state.json, its names mapped to the course's).

    history, facts = load_history("runs/ppo-tiny")    # metrics.jsonl's rows; run.json's settings
    read = load_run("trl-out")                        # the same, with the file read and the notes

The files themselves are read by `reading` (regular files only, numbers a float holds, a last
metrics line cut mid-write skipped with a note), run.json's settings by `facts.facts_of_run_json`
(checked before a rule multiplies by them); this module picks the file, maps TRL's names
(`TRL_NAMES`), and refuses a row that run.json rules out: a response_length above its
max_new_tokens, a step beyond its total_steps.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_helpers.doctor.facts import RunFacts, facts_of_run_json
from rlhf_helpers.doctor.reading import (
    newest_trl_state,
    read_json,
    read_metrics,
    value_problem,
    what_is_there,
)

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
    facts = facts_of_run_json(path.parent / "run.json")
    _check_lengths(rows, facts, path)
    _check_steps(rows, facts, path)
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


def _check_steps(rows: list[dict[str, Any]], facts: RunFacts, path: Path) -> None:
    """ValueError naming both files when a row's step is beyond the total_steps run.json records:
    a run stops there, and a resumed one (--resume --steps N) rewrites run.json's total_steps."""
    total = facts.total_steps
    for index, row in enumerate(rows):
        step = row.get("step")  # an integer from 0 (`reading.step_problem`), or None: not logged
        if total is not None and step is not None and step > total:
            raise ValueError(
                f"{path}, row {index + 1}: step {step!r:.40} is beyond the total_steps {total} of "
                f"{path.parent / 'run.json'}: no run logs that (a resumed run rewrites "
                "total_steps), so one of the files was edited or damaged")


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
