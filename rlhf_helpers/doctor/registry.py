"""The run doctor's rules, each registered where it is written, with its documentation.

    @rule("negative_kl", "warning", reads=("kl",),
          fires=lambda t: f"kl < 0 at {t.negative_kl_steps} steps in a row",
          teaches=f"{LAB}, section (d)")
    def negative_kl(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
        ...
        return finding("negative_kl", steps, evidence, title=..., meaning=..., check_first=...)

A rule is a function (rows, facts, thresholds) -> Finding | None (rows: `rows.Rows`); a rule
`on_folder` is a function (run folder) -> (Finding | None, notes), run on this course's run folders
only. `RULES` holds every rule in the order it was registered, which is the order `diagnose` runs
them (`rules.RULE_MODULES` imports the modules that write them in that order; within a module, top
to bottom); docs/metrics.md lists them by severity (`rules.documented`). A rule's `reads` names the
metrics whose curves its findings are marked on (`ppo.metric_docs.METRICS` documents each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlhf_helpers.doctor.findings import SEVERITIES, Finding
from rlhf_helpers.doctor.thresholds import Thresholds


@dataclass(frozen=True)
class Rule:
    """One rule of the run doctor: its name, what it checks and its documentation."""

    name: str  #: the name its findings carry, e.g. "first_ratio_not_one"
    severity: str  #: the most severe finding it gives ("error", "warning" or "info")
    reads: tuple[str, ...]  #: the metrics it reads (() for every metric, or files)
    #: when it fires, in words, under given thresholds (docs/metrics.md's "Fires", after severity)
    fires: Callable[[Thresholds], str]
    #: where the course teaches it: its findings' learn_more, unless a finding names another place
    teaches: str
    check: Callable[..., Any]  #: the rule itself
    on_folder: bool = False  #: reads a run folder's files (checkpoints), not the metric rows

    def doc(self, thresholds: Thresholds | None = None) -> str:
        """"severity: when it fires" under `thresholds` (the defaults when None)."""
        return f"{self.severity}: {self.fires(thresholds or Thresholds())}"


#: every rule, in the order they were registered: the order `diagnose` runs them
RULES: list[Rule] = []


def rule(name: str, severity: str, *, reads: Iterable[str] = (),
         fires: Callable[[Thresholds], str], teaches: str,
         on_folder: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the function it decorates as the rule `name` (returned unchanged). ValueError for a
    severity not in SEVERITIES or a name already registered."""
    if severity not in SEVERITIES:
        raise ValueError(f"rule {name!r}: severity must be one of {SEVERITIES}, got {severity!r}")
    if any(known.name == name for known in RULES):
        raise ValueError(f"rule {name!r} is registered twice: a rule's name is its identity")

    def register(check: Callable[..., Any]) -> Callable[..., Any]:
        RULES.append(Rule(name, severity, tuple(reads), fires, teaches, check, on_folder))
        return check

    return register


def registered(name: str) -> Rule:
    """The rule registered as `name`; KeyError naming it when there is none."""
    for known in RULES:
        if known.name == name:
            return known
    raise KeyError(f"no run doctor rule is registered as {name!r}")


def finding(name: str, steps: Iterable[int], evidence: str, *, title: str, meaning: str,
            check_first: str, severity: str | None = None,
            learn_more: str | None = None) -> Finding:
    """A Finding of the registered rule `name`: its severity and where the course teaches it come
    from the registration unless given (a rule that gives a milder finding, or names another
    lesson for one of its signatures)."""
    known = registered(name)
    return Finding(name, severity or known.severity, title, tuple(steps), evidence, meaning,
                   check_first, learn_more or known.teaches)
