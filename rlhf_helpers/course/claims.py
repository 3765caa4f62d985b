"""The notebooks' teaching claims, checked on the run's own numbers.

A claim is fixed prose in a markdown cell, written once as it holds for the shipped seed of the
`tiny` profile. The collapsed code cell below it (tagged "claim-check", its source hidden in
JupyterLab and the cell left off the site) asserts it:

    check_claims({
        "the learned score rises by over 0.5": history[-1]["score"] - history[0]["score"] > 0.5,
    })

A contradicted claim raises ClaimContradicted, so the notebook test fails: the prose and the run can
never disagree unseen. Claims about a training run hold for the shipped profile only; on any other
(the gpu profile, $RLHF_PROFILE_OVERRIDES, the quick solutions run) the cell says so and checks
nothing. A claim that holds whatever the profile (a formula, a toy tensor) passes
`any_profile=True`.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlhf_helpers.runtime.profiles import env_overrides, resolve_profile_name

#: the profile the notebooks' prose describes
SHIPPED_PROFILE = "tiny"


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


def check_claims(claims: Mapping[str, object], *, any_profile: bool = False) -> None:
    """Assert every claim (text -> whether it holds on this run); print one line saying what was
    checked.

    Raises ValueError for an empty mapping or a value that is not a bool (a tensor or an array would
    be read by its truth value, which is an error or a silent surprise), and ClaimContradicted
    naming every claim that does not hold."""
    if not claims:
        raise ValueError("claims must name at least one claim")
    values = {text: _as_bool(text, holds) for text, holds in claims.items()}
    if not any_profile and not is_shipped_run():
        print(f"Not checked: the text states these {len(values)} claims for the shipped "
              f"{SHIPPED_PROFILE!r} profile, and this run uses another profile or overrides.")
        return
    wrong = [text for text, holds in values.items() if not holds]
    if wrong:
        raise ClaimContradicted("this run contradicts the text above: " + "; ".join(wrong))
    print(f"Checked on this run: every claim of the text above holds ({len(values)} checked).")
