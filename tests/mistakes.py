"""Plausible wrong answers to the notebooks' exercises, one file per notebook in
tests/wrong_answers/.

Each wrong answer is the worked solution with one edit, written as the text it replaces and the text
it puts there, so that it stays a realistic variant of the solution when the solution changes (the
edited text must occur exactly once in the solution: tests/course/test_teaching_rules.py):

    MISTAKES = {
        "2": [
            Mistake("the ratio against the reference's log-probs", "batch.old_logprobs[rows]",
                    "batch.ref_logprobs[rows]"),
        ],
    }

The solutions run (tests/notebooks/test_notebooks.py) defines each one after its exercise's check,
runs the check again as "Mistake n.k", and requires FAILED; where a mistake gives `hint`, the FAILED
line must contain it (the check names the cause, not only the place).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

WRONG_ANSWERS_DIR = Path(__file__).resolve().parent / "wrong_answers"


@dataclass(frozen=True)
class Mistake:
    """One plausible wrong answer: the solution with `old` replaced by `new`."""

    #: what the learner got wrong, in their terms
    what: str
    #: text of the worked solution that the mistake changes (occurs exactly once there)
    old: str
    #: what the mistake writes instead
    new: str
    #: words the FAILED line must hold: the cause, as the hint names it ("": any FAILED will do)
    hint: str = ""

    def apply(self, solution: str) -> str:
        """The wrong answer's source."""
        if solution.count(self.old) != 1:
            raise ValueError(f"mistake {self.what!r}: {self.old!r} occurs "
                             f"{solution.count(self.old)} times in the solution, expected once")
        return solution.replace(self.old, self.new)


def load_mistakes(stem: str) -> dict[str, list[Mistake]]:
    """Exercise number -> its wrong answers, from tests/wrong_answers/<stem>.py ({} when there is no
    file)."""
    path = WRONG_ANSWERS_DIR / f"{stem}.py"
    if not path.is_file():
        return {}
    spec = importlib.util.spec_from_file_location(f"wrong_answers_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MISTAKES
