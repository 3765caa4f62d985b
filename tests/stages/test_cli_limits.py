"""The training command's limits: every number a flag takes is checked for what float32 arithmetic
can hold, a negative number may follow its flag, flags that cannot go together are refused, and
Ctrl-C, a lock or a damaged checkpoint end the run with one line (no traceback) before or while it
trains."""

from __future__ import annotations

import dataclasses
import json
import shlex
import typing
from pathlib import Path

import pytest
from conftest import TINY_CLI as TINY

from rlhf_helpers.runtime.config_fields import flag_name
from rlhf_helpers.runtime.config_limits import (
    PPO_LIMITS,
    PROFILE_LIMITS,
    Limit,
    allowed,
    limit_problem,
)
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages import train_ppo

PROG = "python -m rlhf_helpers.stages.train_ppo"


def refusal(argv: list[str], capsys, code: int = 2) -> str:
    """The one stderr line of a refused run (exit `code`); argparse's errors are one line too."""
    with pytest.raises(SystemExit) as refused:
        try:
            train_ppo.main(["--profile", "tiny", "--steps", "2", "--no-progress", *argv])
        except KeyboardInterrupt:  # it would end the test session
            pytest.fail("Ctrl-C reached the caller as a KeyboardInterrupt (a traceback)")
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == code, err
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------- every number a flag takes
def _fields(kind: type) -> list[tuple[str, str]]:
    """(field, flag) of PPOConfig's fields of this number type (X | None too), the LoRA ints as
    lora.r/--lora-r."""
    out = []
    for cls, prefix in ((PPOConfig, ""), (LoRASpec, "lora_")):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if kind in [k for k in typing.get_args(hints[field.name]) or (hints[field.name],)]:
                out.append((prefix + field.name, flag_name(prefix + field.name)))
    return out


FLOAT_FLAGS = _fields(float)
INT_FLAGS = _fields(int)
EXTREMES = ["1e308", "-1e308", "1e-320", "1e29", str(10**30), str(2**63)]


def test_the_tables_cover_every_float_and_int_setting():
    assert {name for name, _ in FLOAT_FLAGS} == set(PPO_LIMITS) and len(INT_FLAGS) == 15
    profile_floats = {f.name for f in dataclasses.fields(get_profile("tiny"))
                      if f.type in ("float", float)}
    assert profile_floats == set(PROFILE_LIMITS)


@pytest.mark.parametrize("field, flag", FLOAT_FLAGS)
def test_every_float_flag_refuses_values_float32_cannot_hold(quick_cli, capsys, field, flag):
    """Before: 1e308 passed "finite and > 0" and crashed in torch.clamp after the model was built
    (clip-eps, value-clip, score-clip), or ran to a NaN stop, or was 0 in float32 (1e-320) without a
    word."""
    for value in EXTREMES:
        line = refusal([flag, value, "--output-dir", str(quick_cli / "ppo")], capsys)
        assert line.startswith(f"{PROG}: error: {flag} must be"), (value, line)
    # the edges of the range pass the validation (the build then stops the run)
    limit = PPO_LIMITS[field]
    for value in (limit.low, limit.high):
        assert limit_problem(field, value, limit) is None
        PPOConfig(**{field: value})


@pytest.mark.parametrize("field, flag", INT_FLAGS)
def test_every_int_flag_refuses_huge_and_non_int_values(quick_cli, capsys, field, flag):
    """Before: --steps or --ppo-epochs 10**30 ran forever, --lora-alpha 10**30 ran to a NaN stop."""
    for value in [str(10**30), str(2**63), "1e308", "-1e308", "1e-320"]:
        line = refusal([flag, value, "--output-dir", str(quick_cli / "ppo")], capsys)
        assert flag in line, (value, line)


def test_the_range_is_in_the_message_with_its_reason(quick_cli, capsys):
    line = refusal(["--clip-eps", "1e308", "--output-dir", str(quick_cli / "ppo")], capsys)
    assert line == (f"{PROG}: error: --clip-eps must be in [1e-6, 1e9], got 1e+308: float32 cannot "
                    "tell 1 +- 6e-8 from 1, and the ratio never exceeds e^20 ~ 4.9e8 (the loss's "
                    "log-ratio bound), so 1e9 already never clips")
    line = refusal(["--missing-eos-penalty=-1e12", "--output-dir", str(quick_cli / "ppo")], capsys)
    assert ("--missing-eos-penalty must be None, 0 or of magnitude in [1e-6, 1e9] (either sign), "
            "got -1000000000000.0: it is of the size of the rewards") in line
    line = refusal(["--steps", str(10**30), "--output-dir", str(quick_cli / "ppo")], capsys)
    assert f"--total-steps/--steps must be <= 10^9, got {10**30}" in line
    assert allowed(Limit(1e-6, 1e3, "", zero=True)) == "0 or in [1e-6, 1000]"


def test_a_profile_setting_float32_cannot_hold_is_refused(quick_cli, capsys, monkeypatch):
    """The overrides reach the reward and SFT trainings: reward_lr 1e308 was handed to TRL."""
    with pytest.raises(ValueError, match=r"reward_lr must be in \[1e-9, 10\], got 1e\+308"):
        get_profile("tiny", reward_lr=1e308)
    with pytest.raises(ValueError, match=r"compare_batches must be <= 10\^9"):
        get_profile("tiny", compare_batches=10**30)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps({**TINY, "sft_epochs": 1e-320}))
    line = refusal(["--output-dir", str(quick_cli / "ppo")], capsys)
    assert "$RLHF_PROFILE_OVERRIDES: sft_epochs must be in [1e-6, 1e4], got 1e-320" in line


@pytest.mark.parametrize("name", ["clip_eps", "missing_eos_penalty", "reward_lr"])
def test_an_int_too_big_for_a_float_is_refused_not_an_overflow(quick_cli, capsys,
                                                               monkeypatch, name):
    """A 400-digit number in the overrides (JSON reads it as an int): before, OverflowError from
    math.isfinite."""
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES",
                       json.dumps(TINY)[:-1] + f', "{name}": -{10**400}}}')
    line = refusal(["--output-dir", str(quick_cli / "ppo")], capsys)
    assert f"$RLHF_PROFILE_OVERRIDES: {name} must be" in line and f"got -{10**400}" in line


# ---------------------------------------------------------------- negative numbers after their flag
@pytest.mark.parametrize("argv", [["--missing-eos-penalty", "-1e3"], ["--missing-eos-penalty=-1e3"],
                                  ["--missing-eos", "-1e3"], ["--missing-eos-penalty", "-1000.0"]])
def test_a_negative_number_may_follow_its_flag(argv):
    """Before: `--missing-eos-penalty -1e3` was "expected one argument" (argparse's negative-number
    pattern ignores exponents); `=` was needed."""
    assert train_ppo.parse_args([*argv, "--clip-eps", "0.1"]).missing_eos_penalty == -1000.0


def test_a_negative_non_finite_number_reaches_the_config_check(quick_cli, capsys):
    line = refusal(["--kl-coef", "-inf", "--output-dir", str(quick_cli / "ppo")], capsys)
    assert line.endswith("error: --kl-coef must be a finite number >= 0, got -inf")
    # an int flag: argparse's own line
    line = refusal(["--seed", "-1e3", "--output-dir", str(quick_cli / "ppo")], capsys)
    assert line.endswith("argument --seed: invalid int value: '-1e3'")


def test_joining_leaves_options_and_words_that_are_no_numbers_alone():
    from rlhf_helpers.runtime.config_fields import join_negative_values
    from rlhf_helpers.stages.train_args import _parser_and_actions

    _, actions = _parser_and_actions()
    assert join_negative_values(
        ["--kl-coef", "-1e-3", "--resume", "--lora-target-modules", "-x"], actions) == [
        "--kl-coef=-1e-3", "--resume", "--lora-target-modules", "-x"]
    # takes no value
    assert join_negative_values(["--resume", "-1e3"], actions) == ["--resume", "-1e3"]
    assert join_negative_values(["--", "--kl-coef", "-1"], actions) == ["--", "--kl-coef", "-1"]
    # ambiguous: argparse says so
    assert join_negative_values(["--no", "-1"], actions) == ["--no", "-1"]


# ---------------------------------------------------------------- flags that cannot go together
@pytest.mark.parametrize("argv", [["--value-warmup-steps", "2"], ["--value-warmup-steps", "9"]])
def test_a_value_warm_up_as_long_as_the_run_is_refused(quick_cli, capsys, argv):
    """Before: the run ended with exit 0 and a policy that never trained."""
    out = quick_cli / "ppo"
    line = refusal([*argv, "--output-dir", str(out)], capsys)
    assert (f"error: --value-warmup-steps {argv[1]} is not below --steps 2: the first {argv[1]} "
            "iterations train " \
           "only the critic, so the policy would never train" in line)
    assert not out.exists()  # refused before the folder is made
    from rlhf_helpers.stages.train_args import warmup_problem

    assert warmup_problem(
        get_profile("tiny").ppo.replace(value_warmup_steps=1, total_steps=2)) is None


def test_kl_coef_0_with_a_target_kl_is_refused_before_the_model_is_built(quick_cli, capsys):
    """Before: every check passed, the model was built, then the adaptive controller raised
    `ValueError: init_kl_coef must be a finite number > 0` (exit 1, a traceback)."""
    out = quick_cli / "ppo"
    line = refusal(["--kl-coef", "0", "--target-kl", "0.01", "--output-dir", str(out)], capsys)
    assert line.startswith(f"{PROG}: error: --kl-coef must be > 0 when target_kl is set"), line
    assert not out.exists()
    # either alone is a run
    assert PPOConfig(kl_coef=0).kl_coef == 0 and PPOConfig(target_kl=0.01).target_kl == 0.01


@pytest.mark.parametrize("kl_coef", [0, 1e-6, 0.05, 1e3])
@pytest.mark.parametrize("target_kl", [None, 1e-6, 6.0, 1e6])
@pytest.mark.parametrize("kl_horizon", [1, 10000, 10**9])
def test_every_kl_setting_the_config_accepts_makes_a_controller(kl_coef, target_kl, kl_horizon):
    """One check source: what PPOConfig accepts, the trainer's KL controller (built with the model)
    accepts too, so no KL setting is refused only after the model is built."""
    from rlhf_helpers.ppo.trainer import kl_controller

    try:
        config = PPOConfig(kl_coef=kl_coef, target_kl=target_kl, kl_horizon=kl_horizon)
    except ValueError:
        assert kl_coef == 0 and target_kl is not None
        return
    assert kl_controller(config).value == kl_coef


def recorded(folder: Path, **ppo: int) -> Path:
    """A run folder a resume reads up to its checkpoint: run.json of the TINY run (with `ppo`
    changes) and a `latest` pointer to a bare checkpoint folder."""
    from rlhf_helpers.stages.resume import run_record

    (folder / "step-000001").mkdir(parents=True)
    (folder / "latest").write_text("step-000001\n")
    profile = get_profile("tiny")
    record = run_record(profile, profile.ppo.replace(save_every=10, **ppo),
                        folder.parent / "reward-a", 64, 1)
    (folder / "run.json").write_text(json.dumps(record, default=str))
    return folder


def test_a_resume_whose_warm_up_outlasts_the_new_total_is_refused(quick_cli, capsys):
    out = recorded(quick_cli / "ppo", value_warmup_steps=4, total_steps=5)
    line = refusal(["--resume", "--steps", "3", "--output-dir", str(out)], capsys)
    assert "--resume: --value-warmup-steps 4 (the run's, run.json) is not below --steps 3" in line
    line = refusal(["--resume", "--steps", "6", "--output-dir", str(out)], capsys)
    # past the warm-up: the checkpoint's check
    assert "--value-warmup-steps" not in line and "step-000001" in line


def test_reward_train_pairs_with_a_reward_dir_is_refused(quick_cli, capsys):
    """Before: the pairs were ignored without a word when a reward folder was given."""
    line = refusal(["--reward-dir", str(quick_cli / "reward"), "--reward-train-pairs", "64",
                    "--output-dir", str(quick_cli / "ppo")], capsys)
    assert line == (f"{PROG}: error: --reward-train-pairs 64 applies only when the reward model is "
                    f"trained here, and --reward-dir {quick_cli / 'reward'} uses one already "
                    "trained: leave one of them out")
    # a resume may repeat what its run.json recorded (the checkpoint holds the reward model)
    out = recorded(quick_cli / "resumed")
    line = refusal(["--resume", "--reward-dir", str(quick_cli / "reward-a"), "--reward-train-pairs",
                    "64", "--output-dir", str(out)], capsys)
    assert "applies only" not in line and "step-000001" in line


# ---------------------------------------------------------------- errors met while the run goes on:
# one line
def _lock_error():
    from rlhf_helpers.runtime.locks import FolderInUse

    return FolderInUse("the reward cache runs/reward-tiny is in use by pid 4711 on host ada since "
                       "2026-11-27 10:00:00 (lock file runs/.lock-reward-tiny)",
                       Path("runs/.lock-reward-tiny"), {"pid": 4711})


def _damaged_checkpoint():
    from rlhf_helpers.ppo.checkpoint import CheckpointDamagedError

    return CheckpointDamagedError(
        "checkpoint runs/ppo/step-000002 is damaged: adapters/policy/adapter_model."
        "safetensors does not match its SHA-256")


def _unusable_lock():
    from rlhf_helpers.runtime import lock_files

    return lock_files.LockFileUnusable(
        "cannot lock the reward cache: its lock file runs/.lock is a folder, not a "
        "regular file\n(left as it is)", Path("runs/.lock"))


def _gguf():
    from rlhf_helpers.runtime.weights import IncompleteGGUFFile

    return IncompleteGGUFFile("model.gguf is not a complete GGUF file: it ends at byte 4096")


@pytest.mark.parametrize("make_error", [_lock_error, _damaged_checkpoint, _unusable_lock, _gguf])
def test_lock_checkpoint_and_weights_errors_during_the_run_are_one_line(quick_cli, capsys,
                                                                        monkeypatch, make_error):
    """Raised past the flag checks (a cache lock, a checkpoint changed after its check): before, a
    traceback."""
    error = make_error()

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(train_ppo, "ensure_sft_model", fail)
    line = refusal(["--output-dir", str(quick_cli / "ppo")], capsys)
    assert line == f"{PROG}: error: {' '.join(str(error).splitlines())}"


# ---------------------------------------------------------------- Ctrl-C
def test_ctrl_c_before_training_is_one_line_and_exit_130(quick_cli, capsys, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_ppo, "ensure_sft_model", interrupt)
    out = quick_cli / "ppo"
    line = refusal(["--output-dir", str(out)], capsys, code=130)
    assert line == (f"PPO interrupted (Ctrl-C): no checkpoint was saved in {out} yet, so there is "
                    "nothing to resume; run the same command again to start over")
    assert not (out / ".run.lock").exists()  # the folder is free at once


def test_ctrl_c_before_the_first_checkpoint_names_the_run_files_a_new_run_refuses(
        quick_cli, capsys, monkeypatch):
    """Before: "run the same command again to start over", which a new run now refuses while the
    interrupted run's run.json and metrics.jsonl are in the folder."""
    out = quick_cli / "ppo"

    def run_files_then_interrupt(*args, **kwargs):  # as if stopped after they were started
        (out / "run.json").write_text("{}")
        (out / "metrics.jsonl").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(train_ppo, "ensure_sft_model", run_files_then_interrupt)
    line = refusal(["--output-dir", str(out)], capsys, code=130)
    assert line == (f"PPO interrupted (Ctrl-C): no checkpoint was saved in {out} yet, so there is "
                    "nothing to resume; to start over, remove its run.json, metrics.jsonl and run "
                    "the same command again, or choose another --output-dir")
    monkeypatch.setattr(train_ppo, "ensure_sft_model",
                        lambda *args, **kwargs: pytest.fail("the new run was not refused first"))
    assert "already holds run.json, metrics.jsonl " in refusal(["--output-dir", str(out)], capsys)


def test_ctrl_c_while_training_names_the_last_checkpoint_and_how_to_resume(tmp_path,
                                                                           capsys, monkeypatch):
    """In-process run of the tiny model, Ctrl-C in the third PPO step: before, a 103-line
    traceback."""
    import torch

    from rlhf_helpers.ppo.trainer import PPOTrainer

    torch.set_num_threads(1)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps({**TINY, "max_new_tokens": 4}))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    # an untrained adapter
    monkeypatch.setattr(train_ppo, "ensure_reward_model", lambda *args, **kwargs: None)
    real_step, calls = PPOTrainer.step, []

    def step_then_interrupt(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(PPOTrainer, "step", step_then_interrupt)
    out = tmp_path / "my run"
    line = refusal(["--steps", "5", "--save-every", "1", "--output-dir", str(out)],
                   capsys, code=130)
    assert (line
            == (f"PPO interrupted (Ctrl-C): the last checkpoint saved is {out / 'step-000002'}; "
                    f"continue the run with: {PROG} --profile tiny --output-dir '{out}' --resume"))
    assert not (out / ".run.lock").exists()  # both shares of the folder's lock were given back
    calls.clear()
    monkeypatch.setattr(train_ppo, "build_shared_model", lambda *a,
                        **k: pytest.fail("built after a refusal"))
    # the resume reads that line's run
    line = refusal(["--steps", "1", "--resume", "--output-dir", str(out)], capsys)
    assert "is already at step 2" in line


def test_ctrl_c_whose_step_undo_failed_is_the_same_one_line(tmp_path, capsys, monkeypatch):
    """A Ctrl-C whose step could not be undone whole (StepUndoError, raised from it): before, a
    traceback. The process ends, so what the undo could not put back in memory goes with it; the
    checkpoints on disk are whole, and the line names the last one."""
    import torch

    from rlhf_helpers.ppo.step_undo import StepUndoError
    from rlhf_helpers.ppo.trainer import PPOTrainer

    torch.set_num_threads(1)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps({**TINY, "max_new_tokens": 4}))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(train_ppo, "ensure_reward_model", lambda *args, **kwargs: None)
    real_step, calls = PPOTrainer.step, []

    def step_then_undo_fails(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise StepUndoError("PPO step 2 was interrupted and could not be undone whole") \
                from KeyboardInterrupt()
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(PPOTrainer, "step", step_then_undo_fails)
    out = tmp_path / "run"
    line = refusal(["--steps", "3", "--save-every", "1", "--output-dir", str(out)],
                   capsys, code=130)
    last, folder = out / "step-000001", shlex.quote(str(out))
    assert line == (f"PPO interrupted (Ctrl-C): the last checkpoint saved is {last}; "
                    f"continue the run with: {PROG} --profile tiny --output-dir {folder} --resume")
    assert not (out / ".run.lock").exists()
