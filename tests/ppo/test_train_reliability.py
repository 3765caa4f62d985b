"""The NaN/inf stop on the toy model: broken sampling logits, broken weights after an optimiser
step, and weights that are finite but useless never become the "last good" checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.ppo.checkpoints.save_load import latest_checkpoint, load_checkpoint
from rlhf_helpers.ppo.iteration import collect_experience
from rlhf_helpers.ppo.model.sampling import sample_model
from rlhf_helpers.ppo.trainer import PPOTrainer

PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def make_trainer(make_trainer):
    """Toy trainers of this module: one minibatch per step, so the last optimiser step of a step is
    followed by no forward before the checkpoint (the case where broken weights used to be
    saved)."""
    def make(init_seed: int = 0, **overrides):
        values = dict(rollout_batch_size=4, mini_batch_size=4, ppo_epochs=1, max_new_tokens=6,
                      policy_lr=3e-2, value_lr=3e-2)
        return make_trainer(init_seed=init_seed, prompts=PROMPTS, hidden_score_fn=None,
                            **{**values, **overrides})
    return make


def policy_state(trainer: PPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.policy_parameters()]


def break_policy(trainer: PPOTrainer, value: float) -> None:
    """Fill one policy LoRA tensor (B of the first attention layer) with `value`."""
    with torch.no_grad():
        trainer.model.policy_parameters()[1].fill_(value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_sampling_logits_stop_before_multinomial(make_trainer, value):
    trainer = make_trainer()
    break_policy(trainer, value)
    prompt_ids = torch.tensor([[3, 4, 6]])  # "the movie was"
    with pytest.raises(ValueError, match=r"sampling logits must be finite, but 1 of 1 rows met NaN "
                                         r"or inf at response token 0"):
        sample_model(trainer.model, prompt_ids, torch.ones_like(prompt_ids), max_new_tokens=4)
    with pytest.raises(NonFiniteError, match="sampling logits must be finite.* at PPO step 7"):
        collect_experience(trainer.model, trainer.tokenizer, PROMPTS, trainer.config,
                           kl_coef=0.1, step=7)
    # the reference (adapters off) is not broken and still samples
    sample_model(trainer.model, prompt_ids, torch.ones_like(prompt_ids),
                 max_new_tokens=4, adapter=None)


def test_non_finite_weights_after_an_optimiser_step_stop_that_step(make_trainer,
                                                                   tmp_path, monkeypatch):
    trainer = make_trainer(save_every=1, output_dir=str(tmp_path))
    kept = {}
    real_step = trainer.policy_opt.optimizer.step

    def step_then_nan(*args, **kwargs):
        real_step(*args, **kwargs)
        if trainer.step_count == 2:  # the third PPO step's only policy step writes a NaN weight
            break_policy(trainer, math.nan)

    monkeypatch.setattr(trainer.policy_opt.optimizer, "step", step_then_nan)
    with pytest.raises(NonFiniteError, match=r"policy weights: 1 tensor\(s\) hold NaN/inf after an "
                                             r"optimiser step at PPO step 2.*last good checkpoint "
                                             r"is .*step-000002"):
        trainer.train(steps=4,
                      callback=lambda m: kept.__setitem__(int(m["step"]), policy_state(trainer)))
    assert sorted(kept) == [1, 2] and latest_checkpoint(tmp_path).name == "step-000002"
    fresh = make_trainer(init_seed=5)
    load_checkpoint(fresh, tmp_path)
    for saved, loaded in zip(kept[2], policy_state(fresh), strict=True):
        assert torch.equal(saved, loaded)


def test_huge_learning_rate_stops_at_the_first_bad_step_and_keeps_usable_weights(
        make_trainer, tmp_path):
    """A learning rate of 1e12 from the third step on (an optimiser's param_groups changed by hand:
    PPOConfig refuses a policy_lr above 10): the weights stay finite (~1e12) but every forward
    overflows to NaN."""
    trainer = make_trainer(save_every=1, output_dir=str(tmp_path))
    kept = {}

    def record_then_raise_lr(metrics):
        kept[int(metrics["step"])] = policy_state(trainer)
        if trainer.step_count == 2:
            for group in trainer.policy_opt.optimizer.param_groups:
                group["lr"] = 1e12

    with pytest.raises(NonFiniteError,
                       match="the weights after the update of PPO step 2 fail on their "
                                             "own batch.*last good checkpoint is .*step-000002"):
        trainer.train(steps=5, callback=record_then_raise_lr)
    # finite, broken
    assert max(float(p.detach().abs().max()) for p in trainer.model.policy_parameters()) > 1e11
    assert sorted(kept) == [1, 2] and latest_checkpoint(tmp_path).name == "step-000002"
    fresh = make_trainer(init_seed=5)
    load_checkpoint(fresh, tmp_path)
    for saved, loaded in zip(kept[2], policy_state(fresh), strict=True):
        assert torch.equal(saved, loaded)
    # the kept weights really are good: a resumed run samples, scores and updates from them
    metrics = fresh.step()
    assert math.isfinite(metrics["policy_loss"]) and fresh.step_count == 3


# ---------------------------------------------------------------- Ctrl-C
@pytest.mark.slow
def test_ctrl_c_ends_a_training_run_with_one_line_naming_its_checkpoint_and_exit_130(tmp_path):
    """SIGINT to the training command once it has saved a checkpoint: before, a 103-line
    traceback."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = ("import sys, torch; torch.set_num_threads(1)\n"
              "from rlhf_helpers.stages import train_ppo as train\n"
              # an untrained reward adapter: no reward training
              "train.ensure_reward_model = lambda *a, **k: None\n"
              "sys.exit(train.main(sys.argv[1:]))\n")
    out = tmp_path / "ppo"
    tiny = {"rollout_batch_size": 4, "mini_batch_size": 4, "max_new_tokens": 4, "ppo_epochs": 1,
            "n_eval_prompts": 4}
    env = dict(os.environ, RLHF_PROFILE_OVERRIDES=json.dumps(tiny),
               RLHF_RUNS_DIR=str(tmp_path / "runs"),
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TQDM_DISABLE="1", CUDA_VISIBLE_DEVICES="")
    run = subprocess.Popen([sys.executable, "-c", script, "--profile", "tiny", "--no-progress",
                            "--steps", "100000", "--save-every", "1", "--output-dir", str(out)],
                           cwd=Path(__file__).resolve().parents[2],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "latest").is_file():  # training has started and saved its first checkpoint
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    last = out / (out / "latest").read_text().strip()
    assert run.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == [
        f"PPO interrupted (Ctrl-C): the last checkpoint saved is {last}; continue the run with: "
        f"python -m rlhf_helpers.stages.train_ppo --profile tiny --output-dir {out} --resume"]
    assert not (out / ".run.lock").exists()  # the folder is free for that resume


# ---------------------------------------------------------------- two processes (accelerate launch)
def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def file_hashes(folder) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def launch_two_processes(tmp_path, *args: str, **env_extra: str):
    """Run tests/two_process_run.py under `accelerate launch --multi_gpu --num_processes 2` (two CPU
    processes on gloo when no GPU is visible; `--cpu --num_processes 2` would start one).
    Returns (the launcher's exit status, its output, the results folder, the run's output
    folder)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out, results = tmp_path / "ppo", tmp_path / "results"
    results.mkdir()
    tiny = {"rollout_batch_size": 4, "mini_batch_size": 4, "max_new_tokens": 6, "ppo_epochs": 1,
            "n_eval_prompts": 4}
    env = dict(os.environ, RLHF_PROFILE_OVERRIDES=json.dumps(tiny),
               RLHF_RUNS_DIR=str(tmp_path / "runs"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TQDM_DISABLE="1", CUDA_VISIBLE_DEVICES="", RESULTS_DIR=str(results), **env_extra)
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
               "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(free_port()), str(repo / "tests" / "two_process_run.py"), "--profile", "tiny",
               "--no-progress", "--output-dir", str(out), *args]
    # a new session, so that a hang (the bug) can be ended with both workers and the launcher
    launcher = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = launcher.communicate(timeout=150)  # about 60 s on two busy cores
    except subprocess.TimeoutExpired:
        for pid_file in results.glob("pid-*"):  # the workers run in sessions of their own
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.killpg(launcher.pid, signal.SIGKILL)
        output, _ = launcher.communicate()
        pytest.fail("the two-process run hung (a process waiting for one that had "
                    "left):\n" + output[-3000:])
    return launcher.returncode, output, results, out


def worker_output(output: str) -> str:
    """What the two processes printed: the output before torchrun's first log line."""
    return output.split("torch/distributed/elastic")[0]


def launcher_report(output: str) -> tuple[int, set[int]]:
    """From torchrun's ChildFailedError report: the exit status of its root cause (the first process
    to end with a non-zero status) and the set of every process's status. torchrun ends the
    processes still running with SIGTERM (-15) once one has failed, so a slower peer can show
    -15."""
    import re

    codes = [int(code)
             for code in re.findall(r"exitcode\s*: (-?\d+)", output.split("ChildFailedError")[-1])]
    root = re.search(r"Root Cause.*?exitcode\s*: (-?\d+)", output, re.S)
    assert root is not None and len(codes) == 2, output[-3000:]
    return int(root.group(1)), set(codes)


@pytest.mark.slow
def test_two_processes_a_nan_on_one_rank_stops_both_with_exit_3(tmp_path):
    """Process 1 alone sees NaN reward scores at its second step: both processes must stop there
    with exit status 3 (before the fix, process 0 waited forever in the gradient all-reduce), and
    step-000001 must stay as it was written. The launcher itself exits 1, as the README says, and
    its report gives each process's 3; process 0 alone prints the summary, naming the kept
    checkpoint."""
    import json

    returncode, output, results, out = launch_two_processes(
        tmp_path, "--steps", "3", "--save-every", "1", NAN_RANK="1", NAN_CALL="2")
    ranks = [json.loads(path.read_text()) for path in sorted(results.glob("rank-*.json"))]
    # one may be ended first (-15)
    assert ranks and {r["exit"] for r in ranks} == {3}, output[-3000:]
    root, codes = launcher_report(output)
    assert returncode == 1 and root == 3 and codes <= {3, -15}, output[-3000:]
    assert ranks[0]["num_processes"] == 2
    assert json.loads((out / "run.json").read_text())["num_processes"] == 2
    assert "reward scores has 4 NaN/inf value(s) at PPO step 1" in output
    assert "[process 1 of 2; every process stops]" in output
    summaries = [json.loads(line) for line in output.splitlines() if line.startswith('{"status"')]
    assert summaries == [{"status": "stopped", "steps": 1, "output_dir": str(out),
                          "checkpoint": str(out / "step-000001")}]
    assert (out / "latest").read_text().strip() == "step-000001"
    # none after
    assert sorted(p.name for p in results.glob("saved-*")) == ["saved-step-000001.json"]
    assert (file_hashes(out / "step-000001")
            == json.loads((results / "saved-step-000001.json").read_text()))
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no half-written folder
    assert "Traceback" not in worker_output(output)  # the launcher's own report only


@pytest.mark.slow
def test_two_processes_a_bug_on_one_rank_gives_one_traceback_and_one_line(tmp_path):
    """A RuntimeError on process 1 (a bug, not a NaN): that process prints its traceback and exits
    1; process 0 prints one line naming process 1 and its error and exits 1, instead of a second
    traceback from a gloo collective whose peer had gone. Nothing is saved after the error."""
    returncode, output, results, out = launch_two_processes(
        tmp_path, "--steps", "3", "--save-every", "1", NAN_RANK="1", NAN_CALL="2", FAIL="error")
    root, codes = launcher_report(output)
    assert returncode == 1 and root == 1 and codes <= {1, -15}, output[-3000:]
    assert ("PPO stopped: process 1 of 2 failed (RuntimeError: a bug on this process); this "
            "process stops with it: read process 1's traceback") in output
    workers = worker_output(output)
    assert workers.count("Traceback (most recent call last)") == 1 and "[rank0]" not in workers
    assert "Connection closed by peer" not in output
    assert (out / "latest").read_text().strip() == "step-000001"


@pytest.mark.slow
def test_two_processes_a_bad_flag_is_one_line_and_exit_2_on_each(tmp_path):
    """A flag no run can use is found by every process before any model is built: each prints the
    usage error and exits 2 (the first to exit always prints: torchrun ends the others after it)."""
    returncode, output, _, out = launch_two_processes(tmp_path, "--steps", "3",
                                                      "--target-kl", "inf")
    root, codes = launcher_report(output)
    assert returncode == 1 and root == 2 and codes <= {2, -15}, output[-3000:]
    assert 1 <= output.count("error: --target-kl must be None or a finite number > 0, got inf") <= 2
    assert "Traceback" not in worker_output(output)
    assert not out.exists()


class PeerStub:
    """Process 0 of two, whose peer's vote and message are given (stands in for accelerate)."""

    num_processes, process_index, device = 2, 0, torch.device("cpu")

    def __init__(self, peer_message: str | None) -> None:
        self.peer_message = peer_message
        self.votes = 0

    def gather(self, flag: torch.Tensor) -> torch.Tensor:
        self.votes += 1
        return torch.cat([flag, torch.tensor([0 if self.peer_message is None else 1])])  # (2,)


def test_the_vote_stops_a_process_that_saw_nothing_when_its_peer_saw_a_nan(monkeypatch):
    import accelerate.utils

    from rlhf_helpers.ppo.guards import collective_stop

    peer = PeerStub("policy loss has 1 NaN/inf value(s) at PPO step 4")
    monkeypatch.setattr(accelerate.utils, "gather_object",
                        lambda mine: mine + [(True, peer.peer_message)])
    with pytest.raises(NonFiniteError, match=r"^policy loss has 1 NaN/inf value\(s\) at PPO step 4 "
                                             r"\[process 1 of 2; every process stops\]$"):
        with collective_stop(peer):
            pass  # nothing went wrong here
    quiet = PeerStub(None)
    with collective_stop(quiet):
        pass
    assert quiet.votes == 1  # one gathered flag, and no stop
    with pytest.raises(NonFiniteError, match=r"^mine \[process 0 of 2; every process stops\]$"):
        with collective_stop(quiet):
            raise NonFiniteError("mine")
    # one process: as raised
    with pytest.raises(NonFiniteError, match="^alone$"), collective_stop(None):
        raise NonFiniteError("alone")


def test_the_vote_ends_the_peers_of_a_process_that_met_a_bug(monkeypatch):
    """A non-NaN error (a bug) on one process wins over a NaN elsewhere: the process that met it
    re-raises its own error (its traceback is the one to read), the others raise PeerProcessFailed
    naming it."""
    import accelerate.utils

    from rlhf_helpers.ppo.guards import PeerProcessFailed, collective_stop

    report = [(False, "RuntimeError: out of cheese")]
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda mine: mine + report)
    with pytest.raises(PeerProcessFailed, match=r"^process 1 of 2 failed \(RuntimeError: out of "
                                                r"cheese\); this process stops with it: read "
                                                r"process 1's traceback$"):
        with collective_stop(PeerStub("its bug")):
            raise NonFiniteError("a NaN here too")
    report[:] = [(True, "a NaN there")]
    with pytest.raises(KeyError, match="mine"), collective_stop(PeerStub("a NaN there")):
        raise KeyError("mine")
    with pytest.raises(KeyError, match="alone"), collective_stop(None):  # one process: as raised
        raise KeyError("alone")
