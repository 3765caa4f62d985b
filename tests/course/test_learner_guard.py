"""A learner's function cannot leave torch's global modes changed for the next cell
(ppo.learner_guard): every exercise check puts them back after the call and names the change."""

from __future__ import annotations

import re

import pytest
import torch

from rlhf_helpers.course.notebook import EXERCISE_FAILED, EXERCISE_PASSED, exercise_check
from rlhf_helpers.ppo.learner_guard import (
    global_modes,
    global_modes_kept,
    learner_call_guard,
    set_global_modes,
)


@pytest.fixture(autouse=True)
def modes_back():
    """The modes as before the test, even when an assertion fails half-way."""
    before = global_modes()
    yield
    set_global_modes(before)


def _namespace(body: str) -> dict:
    """A notebook-like namespace: a learner's masked mean with `body` run first, and its check."""
    namespace: dict = {"torch": torch}
    exec(  # noqa: S102  # test code, written here
        f"def masked_mean(x, mask):\n{body}\n    return (x * mask).sum() / mask.sum()\n"
        "def check():\n    x, mask = torch.tensor([1.0, 3.0, 9.0]), torch.tensor([1.0, 1.0, 0.0])\n"
        "    assert float(masked_mean(x, mask)) == 2.0\n", namespace)
    return namespace


@pytest.mark.parametrize(("body", "named"), [
    ("    torch.set_grad_enabled(False)", r"autograd off \(torch\.set_grad_enabled\(False\)\)"),
    ("    torch.set_default_dtype(torch.float64)",
     r"the default dtype float64 \(torch\.set_default_dtype\)"),
    ("    torch.set_grad_enabled(False)\n    torch.set_default_dtype(torch.float64)",
     r"autograd off .* and the default dtype float64 \(torch\.set_default_dtype\)"),
])
def test_a_right_answer_that_leaves_a_mode_changed_fails_and_the_mode_is_back(capsys, body, named):
    """The issue's case: the function returns the right number, so it used to pass, and every cell
    after it ran without gradients or in float64."""
    exercise_check("Exercise 1 (masked_mean)", _namespace(body)["check"])
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{EXERCISE_FAILED}  Exercise 1 (masked_mean): AssertionError: "
                           "masked_mean left "), line
    assert len(line.splitlines()) == 1
    assert re.search(named + r" for the code after it \(put back now\): instead, ", line), line
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert torch.zeros(1).dtype == torch.float32 and torch.ones(1, requires_grad=True).exp().grad_fn


def test_a_function_that_turns_autograd_off_then_fails_is_told_the_cause_first(capsys):
    namespace = _namespace("    torch.set_grad_enabled(False)\n"
                           "    x.requires_grad_(True).sum().backward()")
    exercise_check("Exercise 1 (masked_mean)", namespace["check"])
    line = capsys.readouterr().out.strip()
    assert "masked_mean left autograd off" in line and line.endswith(
        "; then it raised RuntimeError: element 0 of tensors does not require grad and does not "
        "have a grad_fn"), line
    assert torch.is_grad_enabled()


def test_a_change_made_by_other_code_of_the_check_gets_a_line_of_its_own(capsys):
    """Code that is not the exercise's function (a helper the learner's check calls) is not wrapped:
    the check puts the mode back when it ends and says so under its outcome line."""
    def check():
        torch.set_default_dtype(torch.float64)

    exercise_check("Exercise 1 (not_defined_here)", check)
    assert capsys.readouterr().out.splitlines() == [
        f"{EXERCISE_PASSED}  Exercise 1 (not_defined_here)",
        "    and the code this check ran left the default dtype float64 "
        "(torch.set_default_dtype): put back now, so the next cell runs as before"]
    assert torch.get_default_dtype() == torch.float32


def test_a_function_that_changes_a_mode_and_puts_it_back_passes(capsys):
    namespace = _namespace("    with torch.no_grad():\n        pass\n"
                           "    torch.set_default_dtype(torch.float64)\n"
                           "    torch.set_default_dtype(torch.float32)")
    exercise_check("Exercise 1 (masked_mean)", namespace["check"])
    assert capsys.readouterr().out.strip() == f"{EXERCISE_PASSED}  Exercise 1 (masked_mean)"


def test_the_guards_put_back_every_mode_they_watch():
    before = global_modes()
    with pytest.raises(AssertionError) as raised, learner_call_guard("learner"):
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        torch.set_default_device("meta")
        torch.autograd.set_detect_anomaly(True)
        torch.use_deterministic_algorithms(True, warn_only=True)
    assert global_modes() == before
    message = str(raised.value)
    for what in ("autograd off", "the default dtype float64", "the default device meta",
                 "anomaly detection on", "deterministic algorithms on"):
        assert what in message, message
    with global_modes_kept() as changed:
        pass
    assert changed == [] and global_modes() == before
