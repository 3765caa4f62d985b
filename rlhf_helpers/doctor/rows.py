"""The rows the run doctor's rules read, and the helpers they share.

Rows are per-step metric dicts whose values are floats or None (`reading.metric_rows`), each with
an int "step", one per step. Every helper makes one pass over the rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlhf_helpers.doctor.thresholds import Thresholds

Rows = Sequence[Mapping[str, Any]]
GLOSSARY_PAGE = "docs/metrics.md"
LAB = "notebooks/06_failure_modes.ipynb"


def metric(row: Mapping[str, Any], key: str) -> float | None:
    """row[key] if a finite number, else None (not logged, or NaN/inf: `non_finite` reads those)."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def passing(rows: Rows, key: str, test: Callable[[float], bool]) -> list[tuple[int, float]]:
    """(step, value) of the rows whose `key` is finite and passes `test`."""
    return [(int(row["step"]), v) for row in rows
            if (v := metric(row, key)) is not None and test(v)]


def logged(rows: Rows, key: str) -> int:
    """How many rows hold a finite `key`."""
    return sum(metric(row, key) is not None for row in rows)


def sustained(hits: list[tuple[int, float]], available: int, thresholds: Thresholds) -> bool:
    """Whether a condition held for sustain_steps steps, or all steps of a run that logged fewer."""
    return available > 0 and len(hits) >= min(thresholds.sustain_steps, available)


def fmt(hits: list[tuple[int, float]], key: str, limit: int = 4) -> str:
    """ "step 3: kl -0.01, ..." for the first `limit` hits, and how many more."""
    shown = ", ".join(f"step {s}: {key} {v:.4g}" for s, v in hits[:limit])
    return shown + (f" (and {len(hits) - limit} more steps of {key})" if len(hits) > limit else "")


def longest_run(rows: Rows, key: str, test: Callable[[float], bool]) -> list[tuple[int, float]]:
    """(step, value) of the longest stretch of consecutive rows whose `key` is finite and passes
    `test` (the first of equally long ones); one pass, and the stretch is copied once, at the
    end."""
    best_start = best_length = start = length = 0
    for index, row in enumerate(rows):
        value = metric(row, key)
        if value is not None and test(value):
            start, length = (start, length + 1) if length else (index, 1)
            if length > best_length:
                best_start, best_length = start, length
        else:
            length = 0
    return [(int(row["step"]), float(row[key]))
            for row in rows[best_start : best_start + best_length]]
