"""Walk one PPO iteration as a newcomer reads it, from the training command to the optimiser step.

    python tools/walk_iteration.py            # the walk, hop by hop, then its two counts
    python tools/walk_iteration.py --json     # the counts only, as one JSON object

It runs the training command (tiny profile, one iteration) with a profiler hook and records what a
reader opens: the functions on the way from the command to the iteration (the stack when
`PPOTrainer.step` starts), then each function of `rlhf_helpers` that an opened function calls, the
first time it is called, until the first optimiser step. Two kinds of call are read by name and not
opened:
- the maths (`rlhf_helpers/core/`): `shape_rewards`, `compute_gae`, `policy_loss`... say what they
  compute;
- the model (`MODEL_MODULES`): a forward or a decoder step returns log-probs, values or tokens.
A call made through a library (a torch module's `__call__`, an autograd function) is not opened
either.

A hop is a move of the reader to another module: into an opened function of another module, or back
to the caller's module when that function ends. `modules` counts the modules the walk reads (opens a
function of), `returns` the hops into a module the reader had already left, and `named` the modules
it only calls by name (the maths and the model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rlhf_helpers.runtime.interrupt import one_line_interrupt

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlhf_helpers"
#: library functions that call the package's code for it (a module's forward, an autograd function):
#: by name
OPAQUE = {"_call_impl", "_wrapped_call_impl", "apply", "backward", "_engine_run_backward"}
#: modules whose functions compute a forward or a decoding step: read by name
MODEL_MODULES = {"ppo/shared_model.py", "ppo/packed_gpt2.py",
                 "ppo/fused_lora.py", "ppo/adapters.py", "ppo/value_head.py", "ppo/gpt2_decoder.py",
                 "ppo/fast_decoder.py"}


def package_module(frame: FrameType) -> str | None:
    """The frame's module as a path inside rlhf_helpers (ppo/trainer.py), or None outside it."""
    path = Path(frame.f_code.co_filename)
    try:
        return path.resolve().relative_to(PACKAGE).as_posix()
    except ValueError:
        return None


def read_by_name(module: str) -> bool:
    """True for the maths and the model: their names say what they return."""
    return module.startswith("core/") or module in MODEL_MODULES


@dataclass
class Walk:
    """The reader's path: the modules in the order the reader is in them."""

    #: the module after each hop (the first: the command's)
    path: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  #: one line per hop, for the printout
    touched: set[str] = field(default_factory=set)  #: every module opened or read by name
    read: set[Any] = field(default_factory=set)  #: the code objects read already
    #: one entry per live frame since the walk began: (module, opened) with module None outside the
    #: package
    frames: list[tuple[str | None, bool]] = field(default_factory=list)
    done: bool = False

    def move(self, module: str, why: str) -> None:
        if self.path and self.path[-1] == module:
            return
        back = module in self.path
        self.lines.append(f"{'<- ' if back else '-> '}{module}: {why}")
        self.path.append(module)

    def start(self, frame: FrameType) -> None:
        """The functions on the stack when the iteration starts: how the reader got there from the
        command."""
        stack = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        for f in reversed(stack):
            module = package_module(f)
            if module is not None:
                self.touched.add(module)
                self.read.add(f.f_code)
                self.move(module, f.f_code.co_qualname)

    def call(self, frame: FrameType) -> None:
        module = package_module(frame)
        parent_module, parent_opened = self.frames[-1] if self.frames else (None, True)
        # a library's frame: a decorator or context manager passes the reader through
        if module is None:
            through = parent_opened and frame.f_code.co_name not in OPAQUE
            self.frames.append((parent_module, through) if through else (None, False))
            return
        opened = False
        if parent_opened and parent_module is not None:
            self.touched.add(module)
            if not read_by_name(module) and frame.f_code not in self.read:
                self.read.add(frame.f_code)
                opened = True
                self.move(module, frame.f_code.co_qualname)
            elif not read_by_name(module) and module == parent_module:
                # a function already read, in the module the reader is in: follow it there
                opened = True
        self.frames.append((module, opened))

    def leave(self) -> None:
        module, opened = self.frames.pop()
        if opened and self.frames:
            caller = next((m for m, o in reversed(self.frames) if o and m is not None), None)
            if caller is not None and caller != module:
                self.move(caller, "back")

    @property
    def returns(self) -> int:
        seen: set[str] = set()
        count = 0
        for module in self.path:
            count += module in seen
            seen.add(module)
        return count


def walk_one_iteration(workdir: Path) -> Walk:
    """Run the tiny profile's training command for one iteration, tracing the walk."""
    os.environ["RLHF_RUNS_DIR"] = str(workdir / "runs")
    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.stages.train_ppo import main

    walk = Walk()
    step_code = PPOTrainer.step.__code__
    started = False

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal started
        if walk.done:
            return
        if event == "call":
            if not started:
                if frame.f_code is step_code:
                    started = True
                    walk.start(frame)
                    walk.frames.append((package_module(frame), True))
                return
            if (frame.f_code.co_name == "step"
                and "torch/optim" in frame.f_code.co_filename.replace("\\", "/")):
                walk.done = True  # the optimiser step: the end of the walk
                return
            walk.call(frame)
        elif event == "return" and started and walk.frames:
            walk.leave()

    sys.setprofile(hook)
    try:
        main(["--profile", "tiny", "--steps", "1", "--eval-every", "0", "--reward-train-pairs",
              "16", "--no-progress", "--output-dir", str(workdir / "run")])
    finally:
        sys.setprofile(None)
    if not walk.done:
        raise RuntimeError("the iteration ended before any optimiser step")
    return walk


@one_line_interrupt("tools/walk_iteration.py", "nothing was written")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the counts only, as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        walk = walk_one_iteration(Path(tmp))
    opened = set(walk.path)
    counts = {"modules": len(opened), "returns": walk.returns, "hops": len(walk.path) - 1,
              "named": len(walk.touched - opened)}
    if not args.json:
        print("\n".join(walk.lines))
        print("read by name:", ", ".join(sorted(walk.touched - opened)))
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
