"""Exercise checks hide the library function an exercise teaches (rlhf_helpers.course.exercises)."""

from __future__ import annotations

import pytest
import torch

import rlhf_helpers
from rlhf_helpers.core import gae
from rlhf_helpers.course.exercises import LibraryShortcut, hidden_from_learner
from rlhf_helpers.course.notebook import EXERCISE_FAILED, EXERCISE_PASSED, exercise_check
from rlhf_helpers.ppo.trainer import PPOTrainer


def test_every_binding_of_a_hidden_function_refuses_and_comes_back():
    original = gae.compute_gae
    rlhf_helpers.compute_gae  # noqa: B018  # the package's lazy export now holds it too
    namespace = {"compute_gae": original, "alias": original, "other": rlhf_helpers.masked_mean}
    d, v, m = torch.randn(2, 4), torch.randn(2, 4), torch.ones(2, 4)
    with hidden_from_learner([original], namespace):
        for call in (namespace["compute_gae"], namespace["alias"], rlhf_helpers.compute_gae, gae.compute_gae):
            with pytest.raises(LibraryShortcut, match=r"rlhf_helpers\.core\.gae\.compute_gae is hidden"):
                call(d, v, m, gamma=1.0, lam=0.9)
        from rlhf_helpers.core.gae import compute_gae as imported_in_the_check  # an import at call time

        with pytest.raises(LibraryShortcut):
            imported_in_the_check(d, v, m)
        namespace["other"](d, m)  # what is not hidden still works
    assert gae.compute_gae is original and rlhf_helpers.compute_gae is original
    assert namespace["compute_gae"] is original and namespace["alias"] is original


def test_a_hidden_method_refuses_on_its_class_and_comes_back():
    original = PPOTrainer.update
    with hidden_from_learner([PPOTrainer.update]):
        with pytest.raises(LibraryShortcut, match=r"rlhf_helpers\.ppo\.trainer\.PPOTrainer\.update is hidden"):
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
            running = rewards[:, t] - values[:, t] + (values[:, t + 1] if t + 1 < rewards.shape[1] else 0.0) \
                + 0.9 * running
            out[:, t] = running
        return out

    def shortcut(rewards, values, mask):
        return rlhf_helpers.compute_gae(rewards, values, mask, gamma=1.0, lam=0.9)[0]

    r, v, m = torch.randn(3, 5), torch.randn(3, 5), torch.ones(3, 5)
    expected = honest(r, v, m)  # gamma 1, lambda 0.9, no padding: the loop is the definition
    torch.testing.assert_close(shortcut(r, v, m), expected)  # the library agrees outside the check
    for solution in (honest, shortcut):
        exercise_check("gae", lambda solution=solution: torch.testing.assert_close(solution(r, v, m), expected),
                       hidden=[gae.compute_gae])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{EXERCISE_PASSED}  gae"
    assert lines[1].startswith(f"{EXERCISE_FAILED}  gae: LibraryShortcut: rlhf_helpers.core.gae.compute_gae is hidden")


def test_the_private_twin_and_a_re_export_outside_the_library_are_hidden_too():
    """`core.gae._td_errors` (what `td_errors` delegates to) and torch's own re-export of a hidden torch
    function would otherwise let a shortcut through."""
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
            with pytest.raises(LibraryShortcut, match=r"torch\.distributions\.kl\.kl_divergence is hidden"):
                call(p, p)
    assert torch.distributions.kl_divergence is original and torch_kl.kl_divergence is original
