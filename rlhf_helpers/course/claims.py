"""The notebooks' teaching claims, checked on the run's own numbers.

A claim is fixed prose in a markdown cell, written once as it holds for the shipped seed of the
`tiny` profile, with a margin that every learner's machine keeps (CPUs round differently, and a
chaotic run takes another path on each: docs/claim_margins.md has each claim's margin under several
numeric variants). The collapsed code cell below it (tagged "claim-check", its source hidden in
JupyterLab and the cell left off the site) asserts it:

    check_claims({
        "the learned score rises by over 0.5": history[-1]["score"] - history[0]["score"] > 0.5,
    })

Under the tests ($RLHF_STRICT_CLAIMS=1, which tests/conftest.py sets) a contradicted claim raises
ClaimContradicted, so the notebook test fails: the prose and the run can never disagree unseen. In
a learner's kernel it prints a note instead (what the text says, what this run measured, and that
runs differ between machines) and the notebook goes on. Claims about a training run hold for the
shipped profile only; on any other (the gpu profile, $RLHF_PROFILE_OVERRIDES, the quick solutions
run) the cell says so and checks nothing. A claim that holds whatever the profile (a formula, a toy
tensor) passes `any_profile=True`. With $RLHF_CLAIM_LOG set, every claim checked appends one JSON
line there, its measured sides and margin included (tools/claim_margins.py reads them).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from rlhf_helpers.course.claim_measures import Measure, measure_claims
from rlhf_helpers.runtime.profiles import env_overrides, resolve_profile_name

#: the profile the notebooks' prose describes
SHIPPED_PROFILE = "tiny"
#: set to "1" (the tests do): a contradicted claim raises instead of printing a note
STRICT_ENV = "RLHF_STRICT_CLAIMS"
#: a file path: each claim checked appends one JSON line there (a Measure, with the notebook's
#: name from NOTEBOOK_ENV when set)
LOG_ENV = "RLHF_CLAIM_LOG"
#: the notebook's name, for the log's lines (tools/claim_margins.py sets it per notebook)
NOTEBOOK_ENV = "RLHF_CLAIM_NOTEBOOK"
#: what a learner reads when a claim does not hold on their run
NOTE_HEAD = ("Note: this run does not bear out a claim of the text above. Floating-point rounding "
             "differs between CPUs (Intel or AMD, AVX2 or AVX-512) and between library versions, "
             "and a training run is chaotic: a small difference grows, so your run can take "
             "another path than the one the text was written on. The notebook goes on; the "
             "numbers printed above are your run's own.")


class ClaimContradicted(AssertionError):
    """A claim of the notebook's text does not hold on this run's numbers."""


def is_shipped_run() -> bool:
    """True when this kernel runs the shipped profile unchanged: the run the prose describes."""
    return resolve_profile_name(None) == SHIPPED_PROFILE and not env_overrides()


def _as_bool(text: str, holds: object) -> bool:
    """A claim's truth value: a bool, or a 0-d numpy/torch boolean."""
    if isinstance(holds, bool):
        return holds
    shape, item = getattr(holds, "shape", None), getattr(holds, "item", None)
    if (shape is not None and len(shape) == 0 and callable(item)
        and isinstance(value := item(), bool)):
        return value
    raise ValueError(f"claim {text!r}: expected a bool, got {type(holds).__name__}")


def strict() -> bool:
    """True under the tests: a contradicted claim raises ClaimContradicted."""
    return os.environ.get(STRICT_ENV, "") == "1"


def _describe(measure: Measure) -> str:
    """One claim for the note: the text's words, then what this run measured."""
    lines = ["  The text says: " + measure.claim]
    for side in measure.sides:
        left = f"{side.left:.4g}" if isinstance(side.left, float) else side.left
        right = f"{side.right:.4g}" if isinstance(side.right, float) else side.right
        lines.append(f"    this run: {side.text}  ->  {left} {side.op} {right}")
    if not measure.sides:
        lines.append("    this run: it does not hold")
    return "\n".join(lines)


def _log(measures: list[Measure], checked: bool) -> None:
    """Append one JSON line per claim to $RLHF_CLAIM_LOG, if set."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    notebook = os.environ.get(NOTEBOOK_ENV, "")
    with Path(path).open("a", encoding="utf-8") as log:
        for number, measure in enumerate(measures):
            row = {"notebook": notebook, "index": number, "checked": checked,
                   **dataclasses.asdict(measure)}
            log.write(json.dumps(row) + "\n")


def check_claims(claims: Mapping[str, object], *, any_profile: bool = False) -> None:
    """Check every claim (text -> whether it holds on this run); print one line saying what was
    checked.

    Raises ValueError for an empty mapping or a value that is not a bool (a tensor or an array would
    be read by its truth value, which is an error or a silent surprise). A claim that does not hold
    raises ClaimContradicted, naming every such claim, under the tests (strict()); elsewhere it
    prints a note saying what the text says and what this run measured, and returns."""
    if not claims:
        raise ValueError("claims must name at least one claim")
    values = {text: _as_bool(text, holds) for text, holds in claims.items()}
    checked = any_profile or is_shipped_run()
    wrong = [text for text, holds in values.items() if not holds]
    if os.environ.get(LOG_ENV) or (checked and wrong):
        caller = inspect.currentframe().f_back  # the check cell, whose source names each claim
        measures = measure_claims(values, caller)
        del caller
        _log(measures, checked)
    if not checked:
        these = "this claim is" if len(values) == 1 else f"these {len(values)} claims are"
        print(f"Not checked: {these} about the {SHIPPED_PROFILE!r} profile as shipped, not this "
              "run.")
        return
    if not wrong:
        print(f"Checked on this run: every claim of the text above holds ({len(values)} checked).")
        return
    notes = [_describe(m) for m in measures if not m.holds]
    if strict():
        raise ClaimContradicted("this run contradicts the text above: " + "; ".join(wrong) + "\n"
                                + "\n".join(notes))
    print("\n".join([NOTE_HEAD, *notes]), file=sys.stderr)
    held = len(values) - len(wrong)
    print(f"Checked on this run: {held} of {len(values)} claims of the text above hold.")
