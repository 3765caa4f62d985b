"""tools/walk_iteration.py: the static walk of one PPO iteration from the training command's `main`
(CONTRIBUTING.md says how it counts). It reports its numbers; no test bounds them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tool_scripts import load_tool

#: a made-up package, small enough to walk by hand (the counts are worked out in
#: test_the_counts_of_a_walk_worked_out_by_hand)
MINI_PACKAGE = {
    "stages/train_ppo.py": '''
from rlhf_helpers.ppo import loop
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.stages.flags import parse


def main():
    parse()
    loop.train(PPOTrainer())
''',
    "stages/flags.py": '''
def parse():
    return 1
''',
    "ppo/loop.py": '''
def train(trainer):
    trainer.step()
    trainer.save()
''',
    "ppo/trainer.py": '''
from rlhf_helpers.ppo.iteration import rollout, update
from rlhf_helpers.ppo.optim import Optimizer
from rlhf_helpers.ppo.pieces import make_pieces


class PPOTrainer:
    def __init__(self):
        self.pieces = make_pieces()
        self.opt = Optimizer()

    def step(self):
        batch = rollout(self.pieces)
        update(self, batch)
        return self.metrics(batch)

    def guard(self):
        return None

    def metrics(self, batch):
        return batch

    def save(self):
        return None
''',
    "ppo/pieces.py": '''
from dataclasses import dataclass
from functools import partial
from typing import Callable

from rlhf_helpers.core.gae import gae


@dataclass
class Pieces:
    advantages: Callable


def checked(fn, values):
    return fn(values)


def make_pieces(own=None) -> Pieces:
    library = partial(gae, lam=0.95)
    return Pieces(advantages=library if own is None else partial(checked, own))
''',
    "ppo/iteration.py": '''
from rlhf_helpers.core.masked import whiten
from rlhf_helpers.ppo.checks import finite
from rlhf_helpers.ppo.model.net import Net
from rlhf_helpers.ppo.pieces import Pieces


def rollout(pieces: Pieces):
    values = Net().forward()
    finite(values)
    return whiten(pieces.advantages(values))


def update(trainer, batch):
    with trainer.guard():
        trainer.opt.step(batch)
    trainer.guard()
''',
    "ppo/checks.py": '''
def finite(x):
    return x
''',
    "ppo/optim.py": '''
from rlhf_helpers.core.masked import whiten
from rlhf_helpers.ppo.checks import finite


class Optimizer:
    def step(self, batch):
        finite(batch)
        return whiten(batch)
''',
    "ppo/model/net.py": '''
class Net:
    def forward(self):
        return 0.0
''',
    "core/gae.py": '''
from rlhf_helpers.core.masked import whiten


def gae(values, lam=1.0):
    return whiten(values)
''',
    "core/masked.py": '''
def whiten(x):
    return x
''',
}


@pytest.fixture(scope="module")
def walker():
    return load_tool("walk_iteration")


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "rlhf_helpers"
    for path, text in files.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text)
    for folder in [package, *(p for p in package.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return package


def test_the_counts_of_a_walk_worked_out_by_hand(walker, tmp_path):
    """The reader of MINI_PACKAGE, hop by hop: main -> loop.train (module.f; `parse` and the
    trainer's __init__ do not lead to the iteration: passed) -> PPOTrainer.step (`trainer` typed by
    RECEIVERS) -> rollout -> checks.finite, <- rollout (the piece is partial(gae): the maths, and
    the model's forward: by name), <- step, <- update, <- PPOTrainer.guard, <- update, -> optim
    (`trainer.opt`: its __init__ assigns an Optimizer), <- checks.finite read already (a re-entry),
    <- optim, <- update (the second guard(): the reader remembers it), <- step, which ends the walk
    (`save` after it is never read)."""
    walk, with_maths = walker.walk_one_iteration(write_package(tmp_path, MINI_PACKAGE))
    assert walk.path == ["stages/train_ppo.py", "ppo/loop.py", "ppo/trainer.py",
                         "ppo/iteration.py", "ppo/checks.py", "ppo/iteration.py", "ppo/trainer.py",
                         "ppo/iteration.py", "ppo/trainer.py", "ppo/iteration.py", "ppo/optim.py",
                         "ppo/checks.py", "ppo/optim.py", "ppo/iteration.py", "ppo/trainer.py"]
    assert [fn.qualname for fn in walk.opened] == [
        "main", "train", "PPOTrainer.step", "rollout", "finite", "update", "PPOTrainer.guard",
        "Optimizer.step", "PPOTrainer.metrics"]
    assert {module: sorted(names) for module, names in walk.named.items()} == {
        "ppo/model/net.py": ["Net.forward"], "core/gae.py": ["gae"], "core/masked.py": ["whiten"]}
    # with the maths: gae and whiten opened, gae's own whiten (maths calling maths) by name, the
    # optimiser's whiten a re-entry
    assert with_maths.path == [
        "stages/train_ppo.py", "ppo/loop.py", "ppo/trainer.py", "ppo/iteration.py",
        "ppo/checks.py", "ppo/iteration.py", "core/gae.py", "ppo/iteration.py", "core/masked.py",
        "ppo/iteration.py", "ppo/trainer.py", "ppo/iteration.py", "ppo/trainer.py",
        "ppo/iteration.py", "ppo/optim.py", "ppo/checks.py", "ppo/optim.py", "core/masked.py",
        "ppo/optim.py", "ppo/iteration.py", "ppo/trainer.py"]
    assert walker.all_counts(walk, with_maths) == {
        "modules": 6, "returns": 9, "hops": 14, "named": 3, "modules_with_maths": 8,
        "returns_with_maths": 13}


def test_the_call_the_reader_came_by_types_the_parameters(walker, tmp_path):
    """Without RECEIVERS, update's `trainer` is what `step` passed (its `self`: a PPOTrainer); a
    function passed as an argument (`guard=self.guard`) is read as the function it is: the same
    walk as above. (The way to the iteration is found by annotations and RECEIVERS only.)"""
    walk, _ = walker.walk_one_iteration(write_package(tmp_path / "a", MINI_PACKAGE))
    typed_loop = {**MINI_PACKAGE, "ppo/loop.py": "from rlhf_helpers.ppo.trainer import PPOTrainer\n"
                  + MINI_PACKAGE["ppo/loop.py"].replace("(trainer)", "(trainer: PPOTrainer)")}
    untyped, _ = walker.walk_one_iteration(write_package(tmp_path / "b", typed_loop),
                                           receivers={})
    assert untyped.path == walk.path and untyped.opened == walk.opened
    files = {**MINI_PACKAGE}
    files["ppo/trainer.py"] = files["ppo/trainer.py"].replace("update(self, batch)",
                                                              "update(self, batch, self.guard)")
    files["ppo/iteration.py"] = files["ppo/iteration.py"].replace(
        "def update(trainer, batch):\n    with trainer.guard():",
        "def update(trainer, batch, guard):\n    with guard():")
    assert "with guard():" in files["ppo/iteration.py"]
    passed, _ = walker.walk_one_iteration(write_package(tmp_path / "c", files))
    assert passed.path == walk.path and passed.opened == walk.opened


def test_the_model_is_read_by_name_wherever_it_moves(walker, tmp_path):
    """A module of the model outside ppo/model/ is read by name once MODEL_MODULES names it."""
    files = {**MINI_PACKAGE, "ppo/net.py": MINI_PACKAGE["ppo/model/net.py"]}
    del files["ppo/model/net.py"]
    files["ppo/iteration.py"] = files["ppo/iteration.py"].replace("ppo.model.net", "ppo.net")
    package = write_package(tmp_path, files)
    walk, _ = walker.walk_one_iteration(package)
    assert "ppo/net.py" in {fn.module for fn in walk.opened}
    assert walker.is_model("ppo/model/anything.py")
    walker.MODEL_MODULES.add("ppo/net.py")
    try:
        walk, _ = walker.walk_one_iteration(package)
    finally:
        walker.MODEL_MODULES.discard("ppo/net.py")
    assert walk.named["ppo/net.py"] == {"Net.forward"}


def test_an_entry_that_never_reaches_the_iteration_is_one_line(walker, tmp_path, capsys,
                                                               monkeypatch):
    files = {**MINI_PACKAGE, "ppo/loop.py": "def train(trainer):\n    return trainer\n"}
    with pytest.raises(LookupError, match="main never reaches PPOTrainer.step"):
        walker.walk_one_iteration(write_package(tmp_path, files))

    def lost() -> None:
        raise LookupError("stages/train_ppo.py:main never reaches PPOTrainer.step")

    monkeypatch.setattr(walker, "walk_one_iteration", lost)
    with pytest.raises(SystemExit) as stop:
        walker.main(["--json"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "tools/walk_iteration.py: error: stages/train_ppo.py:main never reaches PPOTrainer.step"]


def test_the_real_walk_goes_from_main_through_the_whole_iteration(walker, capsys, monkeypatch):
    """From the command's main through PPOTrainer.step, the rollout, the update and its optimiser
    step, back to the end of `step`; the counts printed (not bounded)."""
    walk, with_maths = walker.walk_one_iteration()
    opened = [(fn.module, fn.qualname) for fn in walk.opened]
    names = [qualname for _, qualname in opened]
    assert opened[0] == ("stages/train_ppo.py", "main")
    assert "PPOTrainer.step" in names and ("ppo/iteration.py", "rollout") in opened
    optimiser_step = names.index("AdapterOptimizer.sync_and_step")
    # the update: a function of the iteration's module other than the rollout, before that step
    assert any(module == "ppo/iteration.py" and name != "rollout"
               for module, name in opened[:optimiser_step])
    # the walk ends where `step` is: it reads the whole step, not up to the first optimiser step
    step_module = opened[names.index("PPOTrainer.step")][0]
    assert walk.path[-1] == step_module and optimiser_step < len(opened) - 1
    assert {"core/gae.py", "core/losses.py"} <= set(walk.named)
    assert len(with_maths.opened) > len(walk.opened)

    monkeypatch.setattr(walker, "walk_one_iteration", lambda: (walk, with_maths))  # walked once
    assert walker.main(["--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts == walker.all_counts(walk, with_maths)
    assert walker.main([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == counts
    assert lines[0] == "-> stages/train_ppo.py: main"
    print(counts)
