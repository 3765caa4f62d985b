"""`python -m rlhf_helpers.stages.train_ppo` on the tiny profile with tiny overrides: a subprocess
run, then --resume; in-process `main()` calls for a NaN stop (exit status 3) and refused
arguments."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_CLI as TINY

from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages import train_ppo as train

REPO = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], runs: Path,
            overrides: dict | None = TINY) -> subprocess.CompletedProcess:
    env = dict(os.environ, RLHF_PROFILE_OVERRIDES=json.dumps(overrides) if overrides else "",
               RLHF_RUNS_DIR=str(runs), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    return subprocess.run([sys.executable, "-m", "rlhf_helpers.stages.train_ppo", "--profile",
                           "tiny", "--no-progress", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_cli_trains_writes_checkpoints_metrics_curves_and_resumes(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "ppo"
    first = run_cli(["--steps", "1", "--output-dir", str(out), "--reward-train-pairs", "64",
                     "--kl-coef", "0.1"], runs)
    assert first.returncode == 0, first.stderr[-3000:]
    # the reward model was ensured into the runs folder, complete, under its quick-config name
    reward_dirs = [p for p in runs.iterdir() if p.name.startswith("reward-tiny-")]
    assert len(reward_dirs) == 1 and (reward_dirs[0] / "COMPLETE.json").is_file()
    assert (out / "latest").read_text().strip() == "step-000001"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1.0]
    assert rows[0]["kl_coef"] == 0.1
    for key in ("score", "hidden_score", "kl", "entropy", "clipfrac", "approx_kl", "value_loss",
                "explained_variance", "response_length", "time_step"):
        assert key in rows[0], key
    assert "plotly" in (out / "curves.html").read_text()[:200000].lower()
    run = json.loads((out / "run.json").read_text())
    assert run["ppo_config"]["rollout_batch_size"] == 8 and run["ppo_config"]["kl_coef"] == 0.1

    # without --resume an existing run is not overwritten
    refused = run_cli(
        ["--steps", "2", "--output-dir", str(out), "--reward-train-pairs", "64"], runs)
    assert refused.returncode != 0 and "--resume" in refused.stderr

    # the resume needs neither the reward folder (the checkpoint holds the reward model) nor the
    # overrides again (run.json holds the profile): neither is rebuilt from what the environment
    # says now
    import shutil

    shutil.rmtree(reward_dirs[0])
    second = run_cli(["--steps", "2", "--output-dir", str(out), "--reward-train-pairs", "64",
                      "--kl-coef", "0.1", "--resume"], runs, overrides=None)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "step-000001" in second.stderr
    assert (out / "latest").read_text().strip() == "step-000002"
    rows2 = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows2] == [1.0, 2.0]
    assert rows2[0] == rows[0]  # step 1's row came back from the checkpoint's history unchanged
    assert not [p for p in runs.iterdir() if p.name.startswith("reward-")]  # not retrained
    # run.json still records what the run did: only the resumable total changed
    resumed = json.loads((out / "run.json").read_text())
    assert resumed["ppo_config"] == {**run["ppo_config"], "total_steps": 2}
    same = [key for key in run if key != "ppo_config"]
    assert {key: resumed[key] for key in same} == {key: run[key]
                                                   for key in same} and resumed.keys() == run.keys()
    assert run["reward_dir"] == str(reward_dirs[0]) and run["reward_train_pairs"] == 64
    # the run doctor read the whole resumed history: printed at the end, and diagnosis.json as
    # diagnose() says
    from rlhf_helpers.doctor import diagnose

    assert "run doctor: 2 steps read" in second.stderr
    written = json.loads((out / "diagnosis.json").read_text())
    assert written == json.loads(json.dumps(diagnose(out).to_json()))
    assert (written["steps"] == 2
            and written["facts"]["max_new_tokens"] == run["ppo_config"]["max_new_tokens"])


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    from rlhf_helpers.stages import train_ppo as train

    with pytest.raises(SystemExit) as bad:
        train.main(["--steps", "0"])
    assert (bad.value.code == 2
            and "--total-steps/--steps must be a positive int, got 0" in capsys.readouterr().err)
    with pytest.raises(SystemExit) as bad:  # was "name must be one of...": the flag is named now
        train.main(["--profile", "cpu"])
    assert (bad.value.code == 2
            and "argument --profile: invalid choice: 'cpu'" in capsys.readouterr().err)
    with pytest.raises(SystemExit, match="no checkpoint found"):
        train.main(["--profile", "tiny", "--resume", "--output-dir", str(tmp_path / "nothing"),
                    "--reward-dir", str(tmp_path)])


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder, by relative path."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_nan_reward_exits_2_with_a_message_and_keeps_the_last_good_checkpoint(tmp_path,
                                                                              monkeypatch, capsys):
    """In-process `main()`: the reward model's score turns NaN at the third PPO step."""
    import math

    import torch

    from rlhf_helpers.ppo import run_loop
    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.stages import train_ppo as train

    torch.set_num_threads(1)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps(TINY))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    # an untrained reward adapter instead of a TRL run: this test is about the NaN, not the reward
    monkeypatch.setattr(train, "ensure_reward_model", lambda *args, **kwargs: None)
    real_scores, calls = SharedLoRAModel.reward_scores, []

    def nan_at_third_call(self, *args, **kwargs):
        calls.append(1)
        scores = real_scores(self, *args, **kwargs)
        return scores * math.nan if len(calls) == 3 else scores

    monkeypatch.setattr(SharedLoRAModel, "reward_scores", nan_at_third_call)
    real_save, written = run_loop.save_checkpoint, {}

    def save_and_hash(trainer, output_dir, *args, **kwargs):
        path = real_save(trainer, output_dir, *args, **kwargs)
        written[path.name] = file_hashes(path)
        return path

    monkeypatch.setattr(run_loop, "save_checkpoint", save_and_hash)
    out = tmp_path / "ppo"
    status = train.main(["--profile", "tiny", "--steps", "4", "--save-every", "1", "--no-progress",
                         "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert status == train.EXIT_NON_FINITE == 3
    assert "PPO stopped: reward scores has 8 NaN/inf value(s) at PPO step 2" in err
    assert "the last good checkpoint is" in err and "step-000002" in err
    assert sorted(written) == ["step-000001", "step-000002"]  # nothing saved after the bad value
    assert (out / "latest").read_text().strip() == "step-000002"
    assert file_hashes(out / "step-000002") == written["step-000002"]  # byte for byte as written
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no half-written folder left
    state = torch.load(out / "step-000002" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 2 and len(state["history"]) == 2
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1.0, 2.0]

    # a resumed run keeps its settings: another --kl-coef, or a total it has already reached, is
    # refused
    recorded = json.loads((out / "run.json").read_text())["ppo_config"]["kl_coef"]
    other = recorded + 0.5
    with pytest.raises(SystemExit,
                       match=re.escape(f"--kl-coef {other} differs from the run's {recorded}")):
        train.main(
            ["--profile", "tiny", "--resume", "--kl-coef", str(other), "--output-dir", str(out)])
    with pytest.raises(SystemExit, match="already at step 2"):
        train.main(["--profile", "tiny", "--resume", "--steps", "2", "--no-progress",
                    "--output-dir", str(out)])


# ---------------------------------------------------------------- set-up errors: exit 2, one line,
# no model
def setup_error(argv: list[str], capsys) -> str:
    """The one stderr line of a refused set-up (exit status 2)."""
    from rlhf_helpers.stages import train_ppo as train

    with pytest.raises(SystemExit) as refused:
        train.main(["--profile", "tiny", "--steps", "1", "--no-progress", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2, err
    assert len(err) == 1, err  # argparse's errors too (runtime.one_line_parser)
    return err[-1]


def test_output_dir_that_is_or_lies_under_a_file_is_refused(quick_cli, capsys):
    a_file = quick_cli / "notes.txt"
    a_file.write_text("not a folder")
    line = setup_error(["--output-dir", str(a_file)], capsys)
    assert (line == f"python -m rlhf_helpers.stages.train_ppo: error: --output-dir {a_file} is a "
                    "file, not a folder: " \
                   "choose a folder for the run")
    line = setup_error(["--output-dir", str(a_file / "run" / "ppo")], capsys)
    assert f"--output-dir {a_file / 'run' / 'ppo'} lies under {a_file}, which is a file" in line
    assert a_file.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 500 folder anyway (the "
                    "mocked read-only test below covers what a read-only file system does to root)")
def test_output_dir_without_write_permission_is_refused(quick_cli, capsys):
    locked = quick_cli / "locked"
    locked.mkdir(mode=0o500)
    try:
        line = setup_error(["--output-dir", str(locked / "ppo")], capsys)
    finally:
        locked.chmod(0o700)
    assert "is not writable (Permission denied)" in line


def test_read_only_output_dir_is_refused_even_for_root(quick_cli, capsys, monkeypatch):
    out = quick_cli / "ro"
    out.mkdir()
    real_access = os.access
    # what access(2) answers on a read-only mount, to root too (chmod does not stop root)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False
                        if Path(path) == out and mode & os.W_OK else real_access(path, mode, **kw))
    line = setup_error(["--output-dir", str(out)], capsys)
    assert f"--output-dir {out} is not writable (Permission denied)" in line
    assert list(out.iterdir()) == []


def test_full_disk_is_refused_before_any_work(quick_cli, capsys, monkeypatch):
    import errno

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    out = quick_cli / "ppo"
    line = setup_error(["--output-dir", str(out)], capsys)
    assert f"--output-dir {out}: no space left on its disk (No space left on device)" in line
    assert list(out.iterdir()) == []  # the probe file is gone


@pytest.mark.parametrize("seed", [2**63, 2**32, -1])
def test_seed_out_of_range_is_refused(quick_cli, capsys, seed):
    line = setup_error(["--seed", str(seed), "--output-dir", str(quick_cli / "ppo")], capsys)
    assert line.endswith(f"error: --seed must be an int in [0, {2**32 - 1}], got {seed}")


def test_rollout_batch_of_one_with_whitening_is_refused(quick_cli, capsys, monkeypatch):
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps(
        {**TINY, "rollout_batch_size": 1, "mini_batch_size": 1, "max_new_tokens": 1}))
    line = setup_error(["--output-dir", str(quick_cli / "ppo")], capsys)
    assert ("$RLHF_PROFILE_OVERRIDES: rollout_batch_size must be >= 2 when whiten_advantages is "
            "True" in line)


def test_resume_with_an_empty_or_broken_run_json_is_refused(quick_cli, capsys):
    out = quick_cli / "ppo"
    (out / "step-000001").mkdir(parents=True)
    (out / "latest").write_text("step-000001\n")
    (out / "run.json").write_text("{}")
    line = setup_error(["--resume", "--output-dir", str(out)], capsys)
    assert f"--resume: {out / 'run.json'} lacks the run's profile" in line
    (out / "run.json").write_text("{not json")
    assert (f"--resume: {out / 'run.json'} is not valid JSON"
            in setup_error(["--resume", "--output-dir", str(out)],
                                                                            capsys))
    (out
     / "run.json").write_text(json.dumps({"profile": {"name": "tiny"}, "ppo_config": {"seed": -5}}))
    assert (f"{out / 'run.json'}: seed must be an int in"
            in setup_error(["--resume", "--output-dir", str(out)],
                                                                       capsys))


# ---------------------------------------------------------------- bad flags, reward folders,
# damaged checkpoints
@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--target-kl", "inf", "--target-kl must be None or a finite number > 0, got inf"),
    ("--target-kl", "0", "--target-kl must be None or a finite number > 0, got 0.0"),
    ("--kl-coef", "nan", "--kl-coef must be a finite number >= 0, got nan"),
    ("--kl-coef", "-1", "--kl-coef must be a finite number >= 0, got -1.0"),
    ("--reward-dir", "", "--reward-dir must name a folder, got an empty path"),
])
def test_every_flag_is_checked_before_any_work(quick_cli, capsys, flag, value, expected):
    line = setup_error([flag, value, "--output-dir", str(quick_cli / "ppo")], capsys)
    assert line.endswith(f"error: {expected}")


def fake_reward_folder(folder: Path) -> Path:
    """A reward folder as the cache writes it (`artifacts.build_cached`): files, then the marker."""
    from rlhf_helpers.runtime.artifacts import build_cached

    def train(tmp):
        tmp.mkdir(parents=True)
        for name, data in (("adapter_config.json", b"{}"),
                           ("adapter_model.safetensors", b"weights"),
                           ("score_head.safetensors", b"head")):
            (tmp / name).write_bytes(data)
        return {"metrics": {}}

    return build_cached(folder, {"config": {}}, train)


@pytest.mark.parametrize(
    "damage", ["zeroed adapter", "truncated head", "missing file", "bad marker", "no folder"])
def test_a_damaged_reward_dir_exits_2_before_the_model_is_built(quick_cli, capsys, damage):
    folder = fake_reward_folder(quick_cli / "reward")
    weights = folder / "adapter_model.safetensors"
    if damage == "zeroed adapter":
        weights.write_bytes(bytes(len(weights.read_bytes())))  # same size, all zero
    elif damage == "truncated head":
        (folder / "score_head.safetensors").write_bytes(b"he")
    elif damage == "missing file":
        weights.unlink()
    elif damage == "bad marker":
        (folder / "COMPLETE.json").write_text("{")
    else:
        folder = quick_cli / "nowhere"
    line = setup_error(
        ["--reward-dir", str(folder), "--output-dir", str(quick_cli / "ppo")], capsys)
    assert f"--reward-dir {folder}: not a complete reward folder" in line
    expected = {"zeroed adapter": "adapter_model.safetensors does not match the checksum",
                "truncated head": "score_head.safetensors does not match the checksum",
                "missing file": "adapter_model.safetensors is missing",
                "bad marker": "COMPLETE.json is unreadable",
                "no folder": "the folder does not exist"}[damage]
    assert expected in line


@pytest.fixture
def two_checkpoints(quick_cli, make_trainer):
    """A run folder as the command leaves it: run.json and checkpoints step-000001, step-000002."""
    from rlhf_helpers.ppo.checkpoints.save_load import save_checkpoint

    out = quick_cli / "ppo"
    trainer = make_trainer(max_new_tokens=4)
    for _ in range(2):
        trainer.step()
        save_checkpoint(trainer, out)
    (out / "run.json").write_text(
        json.dumps({"profile": {"name": "tiny"}, "ppo_config": trainer.config.to_dict(),
                    "reward_dir": None}))
    return out


@pytest.mark.parametrize("damage",
                         ["truncated state", "truncated adapter", "missing adapter folder",
                          "empty latest", "latest outside", "heads garbage"])
def test_a_damaged_checkpoint_on_resume_names_the_file_and_the_intact_one(
        two_checkpoints, capsys, damage):
    import shutil

    out = two_checkpoints
    step2 = out / "step-000002"
    before = {p: p.read_bytes() for p in (out / "step-000001").rglob("*") if p.is_file()}
    if damage == "truncated state":
        state = step2 / "trainer_state.pt"
        state.write_bytes(state.read_bytes()[: 100])
        named = str(state)
    elif damage == "truncated adapter":
        weights = step2 / "adapters" / "policy" / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-10])
        named = str(weights)
    elif damage == "missing adapter folder":
        shutil.rmtree(step2 / "adapters" / "value")
        named = str(step2 / "adapters" / "value" / "adapter_config.json")
    elif damage == "heads garbage":
        (step2 / "heads.safetensors").write_bytes(b"garbage")
        named = str(step2 / "heads.safetensors")
    elif damage == "empty latest":
        (out / "latest").write_text("")
        named = f"{out / 'latest'} is empty"
    else:
        (out / "latest").write_text("../../elsewhere\n")
        named = "not a step-NNNNNN checkpoint folder"
    # a broken pointer: its target is fine
    intact = "step-000002" if "latest" in damage else "step-000001"
    line = setup_error(["--resume", "--steps", "5", "--output-dir", str(out)], capsys)
    assert (line.startswith("python -m rlhf_helpers.stages.train_ppo: error: --resume: ")
            and named in line)
    assert f"the newest intact checkpoint is {out / intact}" in line
    # untouched
    assert {p: p.read_bytes() for p in (out / "step-000001").rglob("*") if p.is_file()} == before


def test_a_resume_with_no_intact_checkpoint_says_so(two_checkpoints, capsys):
    for step in ("step-000001", "step-000002"):
        (two_checkpoints / step / "trainer_state.pt").write_bytes(b"")
    line = setup_error(["--resume", "--steps", "5", "--output-dir", str(two_checkpoints)], capsys)
    assert "no checkpoint of it is intact: start a new --output-dir" in line


def test_a_fresh_run_refuses_a_folder_with_checkpoints_even_when_latest_is_broken(
        two_checkpoints, capsys):
    (two_checkpoints / "latest").unlink()
    line = setup_error(["--output-dir", str(two_checkpoints)], capsys)
    assert "already holds checkpoints: pass --resume" in line


def test_a_save_sweeps_temporary_folders_of_dead_runs(two_checkpoints, make_trainer):
    import subprocess
    import sys

    from rlhf_helpers.ppo.checkpoints.save_load import load_checkpoint, save_checkpoint

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    orphan, live = (two_checkpoints / f".tmp-step-000003-{dead}",
                    two_checkpoints / f".tmp-step-000003-{os.getppid()}")
    for folder in (orphan, live):
        folder.mkdir()
    trainer = make_trainer(max_new_tokens=4)
    load_checkpoint(trainer, two_checkpoints)  # the run's own trainer: another's is refused
    trainer.step()
    save_checkpoint(trainer, two_checkpoints)
    assert not orphan.exists() and live.is_dir()  # a live process's save is not ours to touch


def test_a_full_disk_during_a_save_names_it_keeps_the_previous_checkpoint_and_logs_no_step(
        tmp_path, monkeypatch,
        capsys):
    """torch.save reports a full disk as `RuntimeError: [enforce fail at inline_container.cc:672]`;
    the run says the disk is full, where, and that the previous checkpoint is kept; metrics.jsonl
    ends at it."""
    import shutil
    from collections import namedtuple

    import torch

    from rlhf_helpers.stages import train_ppo as train

    torch.set_num_threads(1)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps(TINY))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(train, "ensure_reward_model", lambda *args, **kwargs: None)
    real_save, saves = torch.save, []

    def save_fails_the_second_time(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 2:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 6528 vs 6416")
        return real_save(obj, path, *args, **kwargs)

    usage = namedtuple("usage", "total used free")
    real_usage = shutil.disk_usage
    monkeypatch.setattr(torch, "save", save_fails_the_second_time)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000)
                        if len(saves) >= 2 else real_usage(p))
    out = tmp_path / "ppo"
    status = train.main(["--profile", "tiny", "--steps", "3", "--save-every", "1", "--no-progress",
                         "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert status == train.EXIT_WRITE_FAILED == 4
    assert (f"PPO stopped: could not write checkpoint step-000002 into {out}: the disk is full (0 "
            f"MiB free); the previous checkpoint {out / 'step-000001'} is kept") in err
    assert (out / "latest").read_text().strip() == "step-000001"
    # the failed step is not logged
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1.0]
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp")]


def test_every_ppo_config_field_is_a_flag_whose_help_is_its_doc(capsys):
    """The flag set is made from PPOConfig's fields (nested LoRA fields as --lora-*), each
    documented."""
    import dataclasses

    from rlhf_helpers.runtime.config_fields import field_docs
    from rlhf_helpers.runtime.lora import LoRASpec
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    parser = train.build_parser()
    flags = {option for action in parser._actions for option in action.option_strings}
    fields = [f.name for f in dataclasses.fields(PPOConfig) if f.name != "lora"]
    fields += [f"lora_{f.name}" for f in dataclasses.fields(LoRASpec)]
    expected = {"--" + name.replace("_", "-") for name in fields}
    assert expected <= flags, sorted(expected - flags)
    run_flags = {"--help", "-h", "--profile", "--resume", "--reward-dir", "--reward-train-pairs",
                 "--no-progress", "--report-to", "--steps", "--threads"}
    # --whiten-advantages / --no-whiten-advantages
    negations = {"--no-" + flag[2:] for flag in expected}
    assert flags - expected - negations == run_flags  # nothing else, no field left out
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    docs = {**field_docs(PPOConfig),
            **{f"lora_{name}": doc for name, doc in field_docs(LoRASpec).items()}}
    # a group of flags (--lora-r, --lora-alpha, --lora-target-modules), each with its doc
    del docs["lora"]
    assert len(docs) == len(fields)
    for doc in docs.values():
        assert doc and " ".join(doc.split()) in text


def test_ppo_flags_reach_the_config_and_none_unsets(quick_cli):
    """Every kind of flag lands in the run's config: numbers, a bool pair, `none`, the LoRA
    shape."""
    args = train.parse_args(["--clip-eps", "0.1", "--no-whiten-advantages", "--value-clip", "none",
                             "--lora-r", "4", "--lora-target-modules", "c_attn", "--steps", "7",
                             "--kl-kind", "k3"])
    from rlhf_helpers.runtime.config_fields import given_field_values
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    given = given_field_values(args, PPOConfig)
    assert given == {"clip_eps": 0.1, "whiten_advantages": False, "value_clip": None,
                     "total_steps": 7,
                     "kl_kind": "k3", "lora": {"r": 4, "target_modules": ("c_attn",)}}
    config = get_profile("tiny").ppo.replace(**given)
    assert (config.clip_eps, config.whiten_advantages, config.value_clip, config.lora.r,
            config.lora.alpha, config.lora.target_modules) == (0.1, False, None, 4, 16, ("c_attn",))
    # nothing given: the profile decides
    assert given_field_values(train.parse_args([]), PPOConfig) == {}


def test_a_resumed_run_refuses_any_changed_setting_that_is_not_resumable(quick_cli, capsys):
    """Every PPO flag is compared with run.json before anything is loaded: a changed one is refused,
    never ignored; the resumable ones (--steps, --save-every...) pass."""
    import dataclasses

    out = quick_cli / "resume-flags"
    (out / "step-000001").mkdir(parents=True)
    (out / "latest").write_text("step-000001\n")
    profile = get_profile("tiny")
    record = {"profile": dataclasses.asdict(profile), "ppo_config": profile.ppo.to_dict(),
              "reward_dir": None}
    (out / "run.json").write_text(json.dumps(record))
    line = setup_error(
        ["--resume", "--steps", "2", "--clip-eps", "0.3", "--output-dir", str(out)], capsys)
    assert line.endswith("--clip-eps 0.3 differs from the run's 0.2 (run.json); a resumed run "
                         "keeps its settings: start a new --output-dir to change it")
    line = setup_error(
        ["--resume", "--steps", "2", "--lora-r", "2", "--output-dir", str(out)], capsys)
    assert "--lora-r 2 differs from the run's 8" in line
    line = setup_error(
        ["--resume", "--steps", "2", "--no-whiten-advantages", "--output-dir", str(out)], capsys)
    assert "--whiten-advantages False differs from the run's True" in line
    # the same values, or resumable ones, get past the settings to the checkpoint's own check
    line = setup_error(["--resume", "--steps", "2", "--clip-eps", "0.2", "--save-every", "3",
                        "--output-dir", str(out)], capsys)
    assert "differs" not in line and "step-000001" in line


@pytest.fixture
def recorded_run(quick_cli):
    """A run folder as the command leaves it, for the checks a resume makes before it reads the
    checkpoint: run.json written by `run_record` under the TINY overrides (reward model trained on
    64 pairs), and a `latest` pointer (its checkpoint is a bare folder: a resume that passes every
    check stops there)."""
    from rlhf_helpers.stages.resume import run_record

    out = quick_cli / "recorded"
    (out / "step-000001").mkdir(parents=True)
    (out / "latest").write_text("step-000001\n")
    profile = get_profile("tiny")
    record = run_record(profile, profile.ppo.replace(save_every=10), quick_cli / "reward-a", 64, 1)
    (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return out


def resume_line(out: Path, argv: list[str], capsys) -> str:
    """The one line of a resume of `out` with `argv` (refused, or stopped at the bare checkpoint);
    run.json is never rewritten by either."""
    before = (out / "run.json").read_bytes()
    line = setup_error(["--resume", "--steps", "2", "--output-dir", str(out), *argv], capsys)
    assert (out / "run.json").read_bytes() == before
    return line


# a resume that passed the settings' checks stops at the bare checkpoint, named
PASSED = "step-000001"


@pytest.mark.parametrize("key, value, expected", [
    ("reward_dir", 5, "reward_dir must be a folder path or null, got int 5"),
    ("reward_train_pairs", "64", "reward_train_pairs must be an int or null, got str '64'"),
    ("reward_train_pairs", True, "reward_train_pairs must be an int or null, got bool True"),
    ("prompts", ["a"], "prompts must be an object of SHA-256s or null, got list"),
])
def test_a_resume_refuses_a_record_field_of_the_wrong_type(
        recorded_run, capsys, key, value, expected):
    """Before: a reward_dir of 5 resumed and was copied into the new run.json as it was."""
    record = json.loads((recorded_run / "run.json").read_text())
    (recorded_run / "run.json").write_text(json.dumps({**record, key: value}))
    assert expected in resume_line(recorded_run, [], capsys)


def test_a_resume_refuses_another_reward_folder_or_pair_count(recorded_run, capsys):
    """The checkpoint holds the run's reward model: --reward-dir and --reward-train-pairs may only
    repeat run.json."""
    other = recorded_run.parent / "reward-b"
    line = resume_line(recorded_run, ["--reward-dir", str(other)], capsys)
    assert line.endswith(
        f"--resume: --reward-dir {other} differs from the run's {recorded_run.parent / 'reward-a'} "
        "(run.json); the checkpoint holds the run's reward model, which a resumed run keeps: leave "
        "the flag out, or start a new --output-dir")
    line = resume_line(recorded_run, ["--reward-train-pairs", "32"], capsys)
    assert "--reward-train-pairs 32 differs from the run's 64 (run.json)" in line
    # the same folder spelled another way, and the same pair count, pass
    same = recorded_run.parent / "x" / ".." / "reward-a"
    assert PASSED in resume_line(recorded_run,
                                 ["--reward-dir", str(same), "--reward-train-pairs", "64"], capsys)


@pytest.mark.parametrize(("extra", "named"), [
    ({"kl_coef": 0.5}, "sets kl_coef 0.5, the run's is 0.2"),
    ({"lora": {"r": 2}}, "sets lora_r 2, the run's is 8"),
    ({"reward_lr": 0.5}, "sets reward_lr 0.5, the run's is 0.002"),
    ({"max_length": 80}, "sets max_length 80, the run's is 64"),
    ({"seed": 3}, "sets seed 3, the run's is 0"),
])
def test_a_resume_refuses_overrides_that_differ_from_run_json(recorded_run, capsys,
                                                              monkeypatch, extra, named):
    """$RLHF_PROFILE_OVERRIDES on a resume may repeat the record or change a resumable setting; any
    other change would be silently ignored (the run keeps run.json's profile), so it is refused by
    name."""
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps({**TINY, **extra}))
    line = resume_line(recorded_run, [], capsys)
    assert f"--resume: $RLHF_PROFILE_OVERRIDES {named!s}" in line and "leave it out" in line


def test_a_resume_takes_its_profile_from_run_json(recorded_run, capsys, monkeypatch):
    """No overrides, the record's own, or a resumable one: the resume goes on, and builds what
    run.json says."""
    for overrides in ("", json.dumps(TINY),
                      json.dumps({**TINY, "total_steps": 3, "save_every": 1})):
        monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", overrides)
        assert PASSED in resume_line(recorded_run, [], capsys)
    # a recorded setting the defaults lack reaches the resumed run without the environment repeating
    # it
    record = json.loads((recorded_run / "run.json").read_text())
    record["profile"]["reward_lr"] = 0.01
    (recorded_run / "run.json").write_text(json.dumps(record))
    from rlhf_helpers.stages.resume import resumed_profile

    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", "")
    assert resumed_profile(record, get_profile("tiny"), {}, recorded_run).reward_lr == 0.01
    assert resumed_profile(record, get_profile("tiny"), {},
                           recorded_run).ppo.rollout_batch_size == 8  # TINY's


def test_a_resume_refuses_prompt_files_the_run_did_not_train_on(recorded_run, capsys,
                                                                monkeypatch, tmp_path):
    """run.json records the prompts' SHA-256: another $RLHF_DATA_DIR (or an edited file) is refused,
    naming it."""
    import shutil

    from rlhf_helpers.runtime.data import data_dir

    data = tmp_path / "data"
    data.mkdir()
    for name in ("prompts_train.jsonl", "prompts_test.jsonl"):
        shutil.copy(data_dir() / name, data / name)
    monkeypatch.setenv("RLHF_DATA_DIR", str(data))
    # the same bytes elsewhere: the same prompts
    assert PASSED in resume_line(recorded_run, [], capsys)
    with open(data / "prompts_test.jsonl", "a") as handle:
        handle.write(json.dumps({"prompt": "One more", "genre": "drama", "title": "x"}) + "\n")
    line = resume_line(recorded_run, [], capsys)
    assert f"--resume: {data / 'prompts_test.jsonl'} is not the file the run trained on" in line


def test_overrides_reach_what_the_command_line_defaults_and_a_rule_names_the_flag(
        quick_cli, capsys, monkeypatch):
    """$RLHF_PROFILE_OVERRIDES' save_every and output_dir are kept (the command line's own defaults
    give way), and a rule between two settings broken by one flag names that flag."""
    out = quick_cli / "from-env"
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES",
                       json.dumps({**TINY, "save_every": 3, "output_dir": str(out)}))
    built = {}

    def capture(profile, config, reward_dir):
        built["config"] = config
        raise AssertionError("the model was built")

    monkeypatch.setattr(train, "build_shared_model", capture)
    with pytest.raises(AssertionError, match="the model was built"):
        train.run(train.parse_args(["--profile", "tiny"]))
    assert (built["config"].save_every, built["config"].output_dir) == (3, str(out))
    line = setup_error(["--mini-batch-size", "3", "--output-dir", str(quick_cli / "x")], capsys)
    assert line.endswith("the profile's PPO settings with --mini-batch-size: rollout_batch_size "
                         "(8) must be a multiple of mini_batch_size (3)")


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "100"],
     "max_prompt_length (--max-prompt-length) 16 + max_new_tokens (--max-new-tokens) "
                                  "100 = 116 tokens exceed the model's 64 positions"),
    (["--max-prompt-length", "60"], "max_prompt_length (--max-prompt-length) 60 + max_new_tokens "
                                    "(--max-new-tokens) 8 = 68 tokens exceed the model's 64"),
    (["--lora-r", "4096"], "lora.r (--lora-r) 4096 exceeds the model's hidden size"),
    (["--lora-target-modules", "c_attn", "nope"],
     "lora.target_modules (--lora-target-modules): nope is not a module of this gpt2 model"),
])
def test_settings_the_model_cannot_hold_are_refused_before_it_is_built(
        quick_cli, capsys, argv, message):
    """Before: a 24-line peft or allocator traceback after the reward model was trained, or (a
    response past the model's positions, one unknown LoRA target beside a known one) a run that
    trained and exited 0."""
    line = setup_error(["--output-dir", str(quick_cli / "limits"), *argv], capsys)
    assert message in line, line


def test_a_ptx_coefficient_trains_on_the_sft_texts(quick_cli, monkeypatch):
    """--ptx-coef > 0 was a ValueError traceback (no ptx_texts): the command now passes the SFT
    corpus."""
    from rlhf_helpers.runtime.data import load_sft_corpus

    seen = {}

    def capture(*args, **kwargs):
        seen.update(kwargs)
        raise AssertionError("captured")

    monkeypatch.setattr(train, "build_shared_model", lambda *a, **k: (torch_module(), None))
    monkeypatch.setattr(train, "PPOTrainer", capture)
    with pytest.raises(AssertionError, match="captured"):
        train.main(["--profile", "tiny", "--steps", "1", "--no-progress", "--ptx-coef", "0.5",
                    "--output-dir", str(quick_cli / "ptx")])
    corpus = load_sft_corpus()
    assert seen["ptx_texts"] == [r["prompt"] + r["completion"] for r in corpus] and len(corpus) > 0


def torch_module():
    import torch

    return torch.nn.Linear(1, 1)


@pytest.mark.parametrize("damage, message", [
    ("no model", "model directory not found"),
    ("config not JSON", "config.json does not load"),
    ("weights truncated",
     "model.safetensors is damaged (SafetensorError: truncated or overwritten)"),
    ("weights missing", "holds no weights (model.safetensors or pytorch_model.bin)"),
    ("tokenizer missing", "its tokenizer does not load"),
    ("another model's vocabulary", "not one model's files"),
])
def test_a_damaged_tiny_model_in_the_data_folder_is_one_line(
        quick_cli, capsys, monkeypatch, damage, message):
    """$RLHF_DATA_DIR's models/tiny-sft, damaged: before, each was a traceback from transformers,
    safetensors or torch, after the reward model had started training."""
    import shutil

    from rlhf_helpers.runtime.data import data_dir

    data = quick_cli / "data"
    shutil.copytree(data_dir(), data, ignore=shutil.ignore_patterns("*.md"))
    model = data / "models" / "tiny-sft"
    if damage == "no model":
        shutil.rmtree(model)
    elif damage == "config not JSON":
        (model / "config.json").write_text("{not json")
    elif damage == "weights truncated":
        weights = model / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "weights missing":
        (model / "model.safetensors").unlink()
    elif damage == "tokenizer missing":
        for path in model.iterdir():
            if "token" in path.name or path.name in ("vocab.json", "merges.txt", "vocab.txt"):
                path.unlink()
    else:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "vocab_size": 50}))
    monkeypatch.setenv("RLHF_DATA_DIR", str(data))
    line = setup_error(["--output-dir", str(quick_cli / "damaged")], capsys)
    assert "the tiny profile's SFT model: " in line and message in line, line
