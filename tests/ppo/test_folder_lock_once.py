"""One layer owns a run folder's lock: `run_claim.lock_run_folder` is the only place that takes it,
and the training command takes it once, hands it to its trainer, and train() keeps that lock
rather than take the folder again (before, the command and train() each took it: the lock had to be
re-entrant for the run to lock its own folder)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from rlhf_helpers.runtime.locks import RUN_LOCK_FILE, FileLock
from rlhf_helpers.stages import train_ppo

PACKAGE = Path(__file__).resolve().parents[2] / "rlhf_helpers"


def test_only_run_claim_takes_a_run_folders_lock():
    callers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "hold_run_folder"):
                callers.add(path.relative_to(PACKAGE).as_posix())
    assert callers == {"ppo/run_claim.py"}


def test_the_training_command_locks_its_folder_once(tmp_path, monkeypatch):
    import torch

    torch.set_num_threads(1)
    taken = []
    real = FileLock.acquire

    def counted(self, *args, **kwargs):
        if self.path.name == RUN_LOCK_FILE:
            taken.append(self.path.parent)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FileLock, "acquire", counted)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps({"max_new_tokens": 4}))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(train_ppo, "ensure_reward_model", lambda *args, **kwargs: None)
    out = tmp_path / "run"
    assert train_ppo.main(["--profile", "tiny", "--steps", "1", "--no-progress", "--eval-every",
                           "0", "--output-dir", str(out)]) == 0
    assert taken == [out]
    assert not (out / ".run.lock").exists()  # given back at the end
