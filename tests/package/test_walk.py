"""One PPO iteration stays short to read: tools/walk_iteration.py's walk, from the training command
to the first optimiser step (CONTRIBUTING.md says how it counts)."""

from __future__ import annotations

import json
import subprocess
import sys

from run_folders import ROOT


def test_one_iteration_reads_few_modules_and_comes_back_rarely(tmp_path):
    """At most 12 modules read and 10 returns to a module already left (the issue's bar); the walk
    must also reach the iteration's own file and the optimiser, or the hook missed the iteration."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "walk_iteration.py")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    counts = json.loads(lines[-1])
    walk = "\n".join(lines[:-1])
    assert "ppo/iteration.py: rollout" in walk and "ppo/optim.py" in walk, walk
    assert counts["modules"] <= 12, walk
    assert counts["returns"] <= 10, walk
    assert counts["hops"] >= counts["modules"] - 1  # every module read was reached by a hop


def test_the_counts_follow_the_reader():
    """The counter on a made-up path: a return is a hop into a module already left."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from walk_iteration import Walk
    finally:
        sys.path.remove(str(ROOT / "tools"))
    walk = Walk()
    for module in ("a.py", "b.py", "a.py", "c.py", "a.py", "b.py"):
        walk.move(module, "f")
    walk.move("b.py", "same module: no hop")
    assert walk.path == ["a.py", "b.py", "a.py", "c.py", "a.py", "b.py"]
    assert walk.returns == 3  # a (after b), a (after c), b (after a)
