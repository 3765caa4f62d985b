"""Exercise checks hide the library function an exercise teaches (rlhf_helpers.course.exercises)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

import rlhf_helpers
from rlhf_helpers.core import gae
from rlhf_helpers.course.exercises import LibraryShortcut, hidden_from_learner
from rlhf_helpers.course.notebook import EXERCISE_FAILED, EXERCISE_PASSED, exercise_check
from rlhf_helpers.ppo import iteration
from rlhf_helpers.ppo.trainer import PPOTrainer

ROOT = Path(__file__).resolve().parents[2]
#: notebook source -> the name it imports `rlhf_helpers.ppo.iteration` as
NOTEBOOK_HIDDEN_LISTS = {"05_full_ppo.py": "iteration", "08_ppo_capstone.py": "library_steps"}


def test_every_binding_of_a_hidden_function_refuses_and_comes_back():
    original = gae.compute_gae
    rlhf_helpers.compute_gae  # noqa: B018  # the package's lazy export now holds it too
    namespace = {"compute_gae": original, "alias": original, "other": rlhf_helpers.masked_mean}
    d, v, m = torch.randn(2, 4), torch.randn(2, 4), torch.ones(2, 4)
    with hidden_from_learner([original], namespace):
        for call in (namespace["compute_gae"], namespace["alias"],
                     rlhf_helpers.compute_gae, gae.compute_gae):
            with pytest.raises(LibraryShortcut,
                               match=r"rlhf_helpers\.core\.gae\.compute_gae is hidden"):
                call(d, v, m, gamma=1.0, lam=0.9)
        # an import at call time
        from rlhf_helpers.core.gae import compute_gae as imported_in_the_check

        with pytest.raises(LibraryShortcut):
            imported_in_the_check(d, v, m)
        namespace["other"](d, m)  # what is not hidden still works
    assert gae.compute_gae is original and rlhf_helpers.compute_gae is original
    assert namespace["compute_gae"] is original and namespace["alias"] is original


def test_a_hidden_method_refuses_on_its_class_and_comes_back():
    original = PPOTrainer.update
    with hidden_from_learner([PPOTrainer.update]):
        with pytest.raises(LibraryShortcut,
                           match=r"rlhf_helpers\.ppo\.trainer\.PPOTrainer\.update is hidden"):
            PPOTrainer.update(object(), None)
    assert PPOTrainer.update is original


def test_a_hidden_object_comes_back_when_the_check_raises():
    original = gae.compute_gae
    with pytest.raises(KeyError), hidden_from_learner([original]):
        raise KeyError("the check failed")
    assert gae.compute_gae is original


def test_exercise_check_fails_a_solution_that_calls_the_library(capsys):
    def honest(rewards, values, mask):  # (B, T) -> (B, T): the reverse loop
        out, running = torch.zeros_like(rewards), torch.zeros(rewards.shape[0])
        for t in reversed(range(rewards.shape[1])):
            running = rewards[:, t] - values[:, t] + (values[:, t + 1]
                                                      if t + 1 < rewards.shape[1] else 0.0) \
                + 0.9 * running
            out[:, t] = running
        return out

    def shortcut(rewards, values, mask):
        return rlhf_helpers.compute_gae(rewards, values, mask, gamma=1.0, lam=0.9)[0]

    r, v, m = torch.randn(3, 5), torch.randn(3, 5), torch.ones(3, 5)
    expected = honest(r, v, m)  # gamma 1, lambda 0.9, no padding: the loop is the definition
    torch.testing.assert_close(shortcut(r, v, m), expected)  # the library agrees outside the check
    for solution in (honest, shortcut):
        exercise_check(
            "gae",
            lambda solution=solution: torch.testing.assert_close(solution(r, v, m), expected),
            hidden=[gae.compute_gae])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{EXERCISE_PASSED}  gae"
    assert lines[1].startswith(
        f"{EXERCISE_FAILED}  gae: LibraryShortcut: rlhf_helpers.core.gae.compute_gae is hidden")


def test_the_private_twin_and_a_re_export_outside_the_library_are_hidden_too():
    """`core.gae._td_errors` (what `td_errors` delegates to) and torch's own re-export of a hidden
    torch function would otherwise let a shortcut through."""
    from torch.distributions import kl as torch_kl

    d, v, m = torch.randn(2, 4), torch.randn(2, 4), torch.ones(2, 4)
    with hidden_from_learner([rlhf_helpers.td_errors]):
        with pytest.raises(LibraryShortcut):
            gae._td_errors(d, v, m, 1.0)
    assert gae._td_errors(d, v, m, 1.0).shape == (2, 4)  # back
    original = torch_kl.kl_divergence
    p = torch.distributions.Categorical(logits=torch.zeros(3))
    with hidden_from_learner([original]):
        for call in (torch.distributions.kl_divergence, torch_kl.kl_divergence):
            with pytest.raises(LibraryShortcut,
                               match=r"torch\.distributions\.kl\.kl_divergence is hidden"):
                call(p, p)
    assert torch.distributions.kl_divergence is original and torch_kl.kl_divergence is original


LIBRARY = '''
import functools

def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()

def _decorate(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper

@_decorate
def wrapped_mean(x, mask):  # a closure: hidden by its bindings, not by its code
    return (x * mask).sum() / mask.sum()
'''
LATER = '''
from fakelib.core import masked_mean, wrapped_mean

TABLE = {"mean": masked_mean, "wrapped": wrapped_mean}
LISTED = [wrapped_mean]

def by_default(x, mask, fn=masked_mean):
    return fn(x, mask)

def wrapped_by_default(x, mask, *, fn=wrapped_mean):
    return fn(x, mask)
'''


@pytest.fixture
def fake_library(tmp_path, monkeypatch):
    """A package `fakelib` whose module `later` is imported for the first time during a check."""
    package = tmp_path / "fakelib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text(LIBRARY)
    (package / "later.py").write_text(LATER)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "fakelib"]:
        del sys.modules[name]


def test_what_a_check_imports_gets_everything_back(fake_library):
    """A module first imported during the check binds the hidden functions then; afterwards every
    way it reaches them works again (a name, a dict, a default argument), a closure-wrapped one
    included."""
    import importlib

    core = importlib.import_module("fakelib.core")
    x, m = torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    with hidden_from_learner([core.masked_mean, core.wrapped_mean]):
        later = importlib.import_module("fakelib.later")
        calls = (lambda: later.masked_mean, lambda: later.TABLE["mean"], lambda: later.by_default,
                 lambda: later.wrapped_mean, lambda: later.TABLE["wrapped"],
                 lambda: later.LISTED[0], lambda: later.wrapped_by_default)
        for call in calls:
            with pytest.raises(LibraryShortcut, match=r"fakelib\.core\.\w+ is hidden"):
                call()(x, m)
    for call in (*calls, lambda: core.wrapped_mean):
        assert float(call()(x, m)) == 1.5
    assert later.wrapped_mean is core.wrapped_mean and later.TABLE["wrapped"] is core.wrapped_mean


def test_the_issue_s_case_a_library_module_imported_during_a_check_works_afterwards():
    """rlhf_helpers.ppo.experience imported for the first time while masked_mean is hidden (a fresh
    process, so that the import really is the first)."""
    import subprocess

    code = ("import torch\nimport rlhf_helpers.core.masked as masked\n"
            "from rlhf_helpers.course.exercises import hidden_from_learner\n"
            "assert 'rlhf_helpers.ppo.experience' not in __import__('sys').modules\n"
            "with hidden_from_learner([masked.masked_mean]):\n    import "
            "rlhf_helpers.ppo.experience as "
            "experience\nprint(float(experience.masked_mean(torch.tensor([1.0, 3.0]), "
            "torch.tensor([1.0, 1.0]))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "2.0", done.stderr[-2000:]


def _namespace(source: str) -> dict:
    """A notebook-like namespace: the learner's function and its check defined in one globals
    dict."""
    namespace: dict = {"torch": torch, "rlhf_helpers": rlhf_helpers}
    exec(source, namespace)  # noqa: S102  # test code, written above
    return namespace


def test_a_check_fails_a_library_call_through_a_default_argument_or_a_dict(capsys):
    namespace = _namespace(
        "import rlhf_helpers\n"
        "def by_default(x, m, mean=rlhf_helpers.masked_mean):\n    return mean(x, m)\n"
        "TABLE = {'mean': rlhf_helpers.masked_mean}\n"
        "def by_dict(x, m):\n    return TABLE['mean'](x, m)\n"
        "def check(fn):\n    x, m = torch.tensor([1.0, 3.0]), torch.tensor([1.0, 0.0])\n"
        "    assert float(fn(x, m)) == 1.0\n")
    for name in ("by_default", "by_dict"):
        exercise_check(f"Exercise 1 ({name})",
                       lambda name=name: namespace["check"](namespace[name]),
                       hidden=[rlhf_helpers.masked_mean])
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith(f"{EXERCISE_FAILED}  Exercise 1 (by_")
               and "masked_mean is hidden" in line for line in lines) and len(lines) == 2
    # back afterwards
    assert float(namespace["by_dict"](torch.tensor([2.0]), torch.tensor([1.0]))) == 2.0


@pytest.mark.parametrize(("body", "named"), [
    ("    x.mul_(mask)\n    return x.sum() / mask.sum()", "x"),
    # a write, even of equal values
    ("    mask[mask == 0] = 0\n    return (x * mask).sum() / mask.sum()", "mask"),
    ("    batch['x'] *= batch['mask']\n    return batch['x'].sum()", "batch['x']"),
])
def test_a_check_fails_a_function_that_changes_its_arguments_in_place(capsys, body, named):
    """The caller's tensors would change under it: torch counts every in-place write (`_version`),
    so the check names the argument even when the values returned are right."""
    args = "batch" if "batch" in body else "x, mask"
    namespace = _namespace(
        f"def mean_of(x, mask):\n    return (x * mask).sum() / mask.sum()\n"
        f"def learner({args}):\n{body}\n"
        "def check():\n    x, mask = torch.tensor([1.0, 3.0, 9.0]), torch.tensor([1.0, 1.0, 0.0])\n"
        "    want = mean_of(x, mask)\n"
        f"    got = learner({'dict(x=x, mask=mask)' if args == 'batch' else 'x, mask'})\n"
        "    assert got.shape == want.shape\n")
    exercise_check("Exercise 1 (learner)", namespace["check"])
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{EXERCISE_FAILED}  Exercise 1 (learner): AssertionError: learner "
                           f"changed its argument {named} in place"), line
    # the learner's own function is back
    assert getattr(namespace["learner"], "__wrapped__", None) is None
    # one that writes nothing passes
    exec(f"def learner({args}):\n    return 0 * torch.ones(())\n", namespace)
    exercise_check("Exercise 1 (learner)", namespace["check"])
    assert capsys.readouterr().out.strip() == f"{EXERCISE_PASSED}  Exercise 1 (learner)"


def test_a_check_that_never_ends_stops_with_failed_and_the_alarm_is_put_back(capsys):
    import signal
    import time

    def endless():
        t = 3
        while t >= 0:  # the classic slip: the index never moves
            pass

    before = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    exercise_check("Exercise 1 (endless)", endless, seconds=0.5)
    elapsed = time.monotonic() - start
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        f"{EXERCISE_FAILED}  Exercise 1 (endless): CheckTimeout: the check stopped after 0.5 s")
    assert elapsed < 30  # stopped, not finished (it never would); generous for a loaded machine
    assert (signal.getsignal(signal.SIGALRM) is before
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
    # a check within its limit passes
    exercise_check("Exercise 1 (quick)", lambda: None, seconds=0.5)
    time.sleep(0.7)  # and no alarm is left to fire after it
    assert capsys.readouterr().out.strip() == f"{EXERCISE_PASSED}  Exercise 1 (quick)"


@pytest.mark.parametrize("notebook", NOTEBOOK_HIDDEN_LISTS)
def test_the_notebooks_hide_the_library_update_loop_by_its_names(notebook):
    """Exercise 4 of notebook 05 and exercise 2 of notebook 08 must refuse a learner loop that calls
    the library's: their `hidden` lists name both functions of it, by names that exist."""
    alias = NOTEBOOK_HIDDEN_LISTS[notebook]
    tree = ast.parse((ROOT / "notebooks" / "src" / notebook).read_text())
    named = set()
    for node in ast.walk(tree):
        in_list = (isinstance(node, ast.keyword) and node.arg == "hidden") or (
            isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith(
                "_HIDDEN") for t in node.targets))
        if in_list and isinstance(node.value, ast.List):
            named |= {item.attr for item in node.value.elts if isinstance(item, ast.Attribute)
                      and isinstance(item.value, ast.Name) and item.value.id == alias}
    assert {"update_epochs", "minibatch_backward"} <= named, named
    assert all(hasattr(iteration, name) for name in named), named
    with hidden_from_learner([getattr(iteration, name) for name in named]):
        with pytest.raises(LibraryShortcut, match="update_epochs is hidden"):
            iteration.update(None, None, None, None, None, None, None, step=0)  # the old name too
