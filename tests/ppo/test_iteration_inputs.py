"""The update loop is a function of what it reads: `iteration.update_epochs` runs on a model, a
batch, two optimisers, a config and the pieces, with no trainer, returns its rows and writes nothing
back; its old names still import (tests/course/test_exercises.py: the notebooks' exercise checks
hide it by its new ones)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from rlhf_helpers.ppo import iteration

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def trained(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.policy_parameters()
            + trainer.model.value_parameters()]


@pytest.mark.parametrize("settings", [{}, {"ptx_coef": 0.5, "value_warmup_steps": 2}],
                         ids=["plain", "ptx-and-warmup"])
def test_update_epochs_alone_gives_the_trainers_update_and_writes_nothing_back(make_trainer,
                                                                               settings):
    """Before: `iteration.update(trainer, batch, generator)` read the config, step, model, pieces,
    guard, optimisers and ptx loss off the trainer and wrote `trainer.last_update_stats`."""
    ptx = {"ptx_texts": ["the movie was good .", "the plot is bad ."]} if settings else {}
    by_trainer, alone = (make_trainer(**settings, **ptx) for _ in range(2))
    for trainer in (by_trainer, alone):
        trainer.step()  # identical first steps (same seed): the policy moves off the reference
    batch, rows_before = alone.last_batch, alone.last_update_stats
    by_trainer.update(by_trainer.last_batch, torch.Generator().manual_seed(7))
    rows = iteration.update_epochs(
        alone.model, batch, alone.policy_opt, alone.value_opt, alone.config,
        torch.Generator().manual_seed(7), alone.pieces, step=alone.step_count,
        ptx_loss=alone.ptx_loss if settings else None)
    assert rows == by_trainer.last_update_stats
    assert ("ptx_loss" in rows[0]) == bool(settings)
    assert alone.last_update_stats is rows_before  # the caller records the rows, not the loop
    for a, b in zip(trained(alone), trained(by_trainer), strict=True):
        assert torch.equal(a, b)


def test_no_function_of_the_iteration_takes_or_reads_a_trainer():
    tree = ast.parse(Path(iteration.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            assert "trainer" not in names, node.name
        assert not (isinstance(node, ast.Name) and node.id == "trainer"), node.lineno
        assert not (isinstance(node, ast.Attribute) and node.attr == "last_update_stats")


def test_the_old_names_still_import_as_the_same_functions():
    """The re-exports of the rename: notebooks a learner saved before it hide `iteration.update`
    and `iteration.minibatch_losses`, the same functions under their new names."""
    assert iteration.update is iteration.update_epochs
    assert iteration.minibatch_losses is iteration.minibatch_backward
