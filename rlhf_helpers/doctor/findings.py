"""What the run doctor reports: a Finding (one failure signature a run shows) and its severities."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: the severities, most severe first: findings come sorted in this order
SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One failure signature a run shows."""

    rule: str  #: the rule's name, e.g. "first_ratio_not_one"
    #: "error" (the run is broken), "warning" (likely a problem), "info" (worth knowing)
    severity: str
    title: str  #: the signature in a few words
    steps: tuple[int, ...]  #: the steps where it holds
    evidence: str  #: the numbers that show it
    meaning: str  #: what it usually means
    check_first: str  #: what to check first
    learn_more: str  #: the notebook section or glossary entry that teaches it

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "steps": list(self.steps)}

    def where(self) -> str:
        """"step 3" or "steps 1-3, 7"."""
        return f"step {self.steps[0]}" if len(self.steps) == 1 else f"steps {spans(self.steps)}"

    def text(self) -> str:
        """A few lines for a terminal or a notebook."""
        return (f"[{self.severity}] {self.rule}: {self.title} ({self.where()})\n"
                f"    evidence: {self.evidence}\n    usually: {self.meaning}\n"
                f"    check first: {self.check_first}\n    learn more: {self.learn_more}")


def spans(steps: Sequence[int]) -> str:
    """1, 2, 3, 7 -> "1-3, 7"."""
    out, start = [], None
    steps = sorted(set(steps))
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(f"{start}" if start == s else f"{start}-{s}")
            start = None
    return ", ".join(out) or "-"
