"""One live run per output folder, one builder per cache, and tests that never write into the
checkout.

Every concurrency test starts real processes (the lock is `flock`, which works between open files,
so threads of one process would prove nothing), lines them up on a "go" file so they meet at the
same moment, and then checks what was left on disk: nothing of the refused run, one intact cache.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_folders import SKIPPED_DIRS, changes, snapshot

from rlhf_helpers.ppo.checkpoints.save_load import (
    checkpoints,
    latest_checkpoint,
    load_trainer_state,
)
from rlhf_helpers.runtime.artifacts import (
    COMPLETE_MARKER,
    artifact_problem,
    new_run_dir,
    read_record,
    shown_path,
)
from rlhf_helpers.runtime.locks import RUN_LOCK_FILE, FileLock, FolderInUse, hold_run_folder

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
pytestmark = pytest.mark.skipif(os.name == "nt", reason="flock is POSIX")

HOLD = """
import sys
from rlhf_helpers.runtime.locks import hold_run_folder
lock = hold_run_folder(sys.argv[1])
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
"""


def start_holder(folder: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    assert read_line(holder) == "held"
    return holder


def read_line(process: subprocess.Popen, timeout: float = 300.0) -> str:
    """The next line `process` prints, or a failure after `timeout` seconds (a hung child fails the
    test)."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, f"no line from pid {process.pid} in {timeout} s"
    return process.stdout.readline().strip()


def wait_for(processes: list[subprocess.Popen], word: str = "ready") -> None:
    """Read one line from each process and check it is `word` (each has done its slow set-up)."""
    for process in processes:
        line = read_line(process)
        assert line == word, (line, process.stderr.read() if process.poll() is not None else "")


def test_a_live_holder_refuses_a_second_process_naming_folder_and_pid(tmp_path):
    folder = tmp_path / "run"
    holder = start_holder(folder)
    try:
        with pytest.raises(FolderInUse) as refused:
            hold_run_folder(folder)
        assert str(folder) in str(refused.value) and f"pid {holder.pid} " in str(refused.value)
        assert refused.value.holder["pid"] == holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    lock = hold_run_folder(folder)  # released by its process: free now, and the file names us
    assert json.loads((folder / RUN_LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (folder / RUN_LOCK_FILE).exists()  # a clean release leaves nothing behind


def test_a_killed_holder_leaves_a_stale_lock_that_is_taken_over_with_one_line(tmp_path, capsys):
    folder = tmp_path / "run"
    holder = start_holder(folder)
    # no release: the file still names it, the kernel dropped the flock
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    assert json.loads((folder / RUN_LOCK_FILE).read_text())["pid"] == holder.pid
    lock = hold_run_folder(folder)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "took over" in lines[0] and f"pid {holder.pid} " in lines[0], lines
    lock.release()
    hold_run_folder(folder).release()  # released cleanly: no second "took over" line
    assert capsys.readouterr().err == ""


def test_the_lock_is_shared_inside_one_process_and_held_until_the_last_share_is_released(tmp_path):
    folder = tmp_path / "run"
    first = hold_run_folder(folder)
    # the CLI holds it, then its trainer asks: same process, allowed
    second = hold_run_folder(folder)
    first.release()  # the trainer's share still holds it: another process is refused
    refused = subprocess.run([sys.executable, "-c", HOLD, str(folder)], capture_output=True,
                             text=True, env=ENV, cwd=REPO, input="", timeout=120)
    assert (refused.returncode == 1 and "FolderInUse" in refused.stderr
            and f"pid {os.getpid()} " in refused.stderr)
    assert second.held and (folder / RUN_LOCK_FILE).exists()
    second.release()  # the last share: the file goes, and another process may take the folder
    assert not (folder / RUN_LOCK_FILE).exists()
    start_holder(folder).communicate(input="", timeout=60)
    with FileLock(tmp_path / "other.lock", "a test") as lock:
        assert lock.held
    assert not lock.held and not (tmp_path / "other.lock").exists()


BUILD = """
import json, os, sys, time
from pathlib import Path
from rlhf_helpers.runtime.artifacts import build_cached, read_record
final, log, go = map(Path, sys.argv[1:4])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)

def train(tmp):
    tmp.mkdir(parents=True)
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    for i in range(10):  # written over ~1 s: a second builder would overlap with this one
        (tmp / f"part-{i}.txt").write_text(str(os.getpid()) * 100)
        time.sleep(0.1)
    return {"builder": os.getpid()}

out = build_cached(final, {"what": "a test cache"}, train)
print(json.dumps({"final": str(out), "builder": read_record(out)["builder"]}), flush=True)
"""


def test_two_processes_building_one_cache_at_once_end_with_one_intact_cache(tmp_path):
    final, log, go = tmp_path / "cache" / "reward-test", tmp_path / "builds.log", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(final), str(log), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                              cwd=REPO) for _ in range(2)]
    wait_for(procs)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    builders = log.read_text().split()
    # trained once: the other process waited, then found it built
    assert len(builders) == 1, builders
    assert [r["final"] for r in results] == [str(final)] * 2
    assert {r["builder"] for r in results} == {int(builders[0])}
    assert artifact_problem(final, {"what": "a test cache"}) is None
    assert sorted(p.name for p in final.iterdir()) == sorted([COMPLETE_MARKER]
                                                             + [f"part-{i}.txt" for i in range(10)])
    assert {p.read_text() for p in final.glob("part-*")} == {builders[0] * 100}
    # no temporary folder, no lock file
    assert [p.name for p in final.parent.iterdir()] == [final.name]


TRAIN = ("""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[4])
import torch
torch.set_num_threads(1)
from conftest import toy_trainer
from rlhf_helpers.runtime.locks import FolderInUse
out, go, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
trainer = toy_trainer(output_dir=out, save_every=1, total_steps=4, seed=seed)
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
try:
    trainer.train()
except FolderInUse as error:
    print(json.dumps({"refused": str(error)}), flush=True)
    sys.exit(2)
print(json.dumps({"scores": [row["score"] for row in trainer.history]}), flush=True)
"""
         "sys.stdin.read()  # the lock stays held (the trainer is not closed) until the test has "
         "heard from both\n")


@pytest.mark.slow
def test_two_trainers_started_at_once_on_one_folder_one_is_refused_and_nothing_is_mixed(tmp_path):
    out, go = tmp_path / "ppo", tmp_path / "go"
    procs = {seed: subprocess.Popen(
        [sys.executable, "-c", TRAIN, str(out), str(go), str(seed), str(TESTS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV, cwd=REPO)
             for seed in (1, 2)}
    wait_for(list(procs.values()))
    go.touch()
    # each prints one result line; the winner then keeps its lock until both are heard, so however
    # late the other one is scheduled, it meets a live holder
    lines = {seed: read_line(proc, timeout=600) for seed, proc in procs.items()}
    results = {}
    for seed, proc in procs.items():
        _, stderr = proc.communicate(input="", timeout=120)
        results[seed] = (proc.returncode, json.loads(lines[seed]) if lines[seed] else stderr)
    assert sorted(code for code, _ in results.values()) == [0, 2], results
    winner = next(seed for seed, (code, _) in results.items() if code == 0)
    loser = 3 - winner
    message = results[loser][1]["refused"]
    assert str(out) in message and f"pid {procs[winner].pid} " in message
    # every checkpoint in the folder is the winner's: its seed, and its history up to that step
    saved = checkpoints(out)
    assert [p.name for p in saved] == ["step-000003", "step-000004"]  # the newest two are kept
    for path in saved:
        state = load_trainer_state(path / "trainer_state.pt")
        assert state["config"]["seed"] == winner
        assert [row["score"]
                for row in state["history"]] == results[winner][1]["scores"][: state["step"]]
    assert latest_checkpoint(out) == saved[-1]


CLI_OVERRIDES = {"rollout_batch_size": 8, "mini_batch_size": 4, "max_new_tokens": 8,
                 "ppo_epochs": 1, "n_eval_prompts": 8}


@pytest.mark.slow
def test_two_cli_runs_started_at_once_into_one_folder_the_second_exits_2_and_nothing_is_mixed(
        tmp_path):
    out = tmp_path / "ppo"
    env = dict(ENV, RLHF_PROFILE_OVERRIDES=json.dumps(CLI_OVERRIDES),
               RLHF_RUNS_DIR=str(tmp_path / "runs"))
    procs = {seed: subprocess.Popen(
        [sys.executable, "-m", "rlhf_helpers.stages.train_ppo", "--profile", "tiny",
         "--no-progress", "--steps", "2", "--save-every", "1", "--seed", str(seed),
         "--reward-train-pairs", "64", "--output-dir", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
             for seed in (1, 2)}
    # no "go" file: the winner holds the folder from its first second to its last (reward model
    # included, many seconds), so the other, started in the same instant, always meets a live holder
    results = {seed: (proc.communicate(timeout=900), proc.returncode) for seed,
               proc in procs.items()}
    codes = sorted(code for _, code in results.values())
    assert codes == [0, 2], {seed: (code, err[-2000:]) for seed,
                             ((_, err), code) in results.items()}
    winner = next(seed for seed, (_, code) in results.items() if code == 0)
    (_, refused), _ = results[3 - winner]
    lines = refused.strip().splitlines()
    assert len(lines) == 1 and "in use by another run" in lines[0], lines  # one line, no traceback
    assert str(out) in lines[0] and f"pid {procs[winner].pid} " in lines[0]
    run = json.loads((out / "run.json").read_text())
    assert run["ppo_config"]["seed"] == winner
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1.0, 2.0]  # one run's steps, once each
    for path in checkpoints(out):
        assert load_trainer_state(path / "trainer_state.pt")["config"]["seed"] == winner
    assert not (out / RUN_LOCK_FILE).exists()  # the winner released it when its run ended


def test_new_run_dir_gives_every_run_its_own_folder(tmp_path):
    folders = [new_run_dir(tmp_path / "05_full_ppo") for _ in range(3)]  # same process, same second
    assert len(set(folders)) == 3 and all(f.is_dir() and not any(f.iterdir()) for f in folders)
    assert all(f.name.startswith("run-") and str(os.getpid()) in f.name for f in folders)


def test_shown_path_names_no_folder_of_the_machine(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_RUNS_DIR", raising=False)
    monkeypatch.delenv("RLHF_CACHE_DIR", raising=False)
    assert shown_path(REPO / "runs" / "reward-tiny") == "runs/reward-tiny"
    assert shown_path(REPO) == "."
    if not REPO.resolve().is_relative_to(Path.home().resolve() / "elsewhere"):
        assert shown_path(Path.home() / "elsewhere" / "x") == "~/elsewhere/x"
    assert shown_path("/nonexistent-root-folder/x") == "/nonexistent-root-folder/x"
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RLHF_CACHE_DIR", str(tmp_path / "cache"))
    assert shown_path(tmp_path / "runs" / "05_full_ppo"
                      / "run-1") == "$RLHF_RUNS_DIR/05_full_ppo/run-1"
    assert shown_path(tmp_path / "cache" / "reward-tiny") == "$RLHF_CACHE_DIR/reward-tiny"
    assert shown_path(tmp_path / "runs") == "$RLHF_RUNS_DIR"


def test_the_checkout_guard_sees_files_added_changed_and_removed_outside_build(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "a.ipynb").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.jsonl").write_text("x")
    before = snapshot(tmp_path)
    (tmp_path / "runs" / "05_full_ppo").mkdir(parents=True)
    (tmp_path / "runs" / "05_full_ppo" / "latest").write_text("step-000003")
    (tmp_path / "data" / "b.jsonl").write_text("xy")
    (tmp_path / "notebooks" / "a.ipynb").unlink()
    # the Makefile's output folders and tool caches
    for skipped in ("build", ".venv", "__pycache__"):
        assert skipped in SKIPPED_DIRS
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "x").write_text("x")
    (tmp_path / "my-env").mkdir()  # a virtual environment of any name
    (tmp_path / "my-env" / "pyvenv.cfg").write_text("home = /usr/bin")
    assert changes(before, snapshot(tmp_path)) == [
        "changed data/b.jsonl", "removed notebooks/a.ipynb", "added runs/05_full_ppo/latest"]
    assert changes(before, before) == []


def wait_until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_cache_being_built_is_absent_until_it_is_complete(tmp_path):
    """A reader that looks while a builder is inside train() sees no folder, then a complete one:
    build_cached trains into a temporary folder and renames it into place."""
    final, log, go = tmp_path / "c" / "sft-test", tmp_path / "log", tmp_path / "go"
    go.touch()
    proc = subprocess.Popen([sys.executable, "-c", BUILD, str(final), str(log), str(go)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    wait_until(log.exists)  # the builder is inside train(): the folder must not exist yet
    assert not final.exists()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert read_record(final)["builder"] == proc.pid


HOLD_BUILD = """
import sys
from pathlib import Path
from rlhf_helpers.runtime.locks import FileLock
out = Path(sys.argv[1])  # the lock a build of `out` takes (artifacts.build_cached)
lock = FileLock(out.parent / f".lock-{out.name}", f"the reward folder {out}").acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
"""


def test_a_second_reward_command_into_a_locked_out_folder_exits_2_before_training(
        tmp_path, monkeypatch, capsys):
    """`stages.reward --out X` while another run trains into X: one line naming that run, exit 2,
    nothing trained (before, both trained, both exited 0, and one model was lost)."""
    from rlhf_helpers.stages import reward

    def no_training(*args, **kwargs):
        raise AssertionError("trained into --out while another run holds it")

    monkeypatch.setattr(reward, "build_cached", no_training)
    out = tmp_path / "reward"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_BUILD, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        assert read_line(holder) == "held"
        with pytest.raises(SystemExit) as refused:
            reward.main(["--profile", "tiny", "--out", str(out)])
    finally:
        holder.communicate(input="", timeout=60)
    lines = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and len(lines) == 1, lines
    assert (lines[0].startswith(f"python -m rlhf_helpers.stages.reward: error: --out {out}: the "
                                f"reward folder {out} is in use by pid {holder.pid} ")
            and "choose another --out" in lines[0]), lines
