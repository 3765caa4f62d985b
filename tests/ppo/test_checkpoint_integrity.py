"""Checkpoint integrity: a SHA-256 of every file at save, verified before a resume loads anything.

A real save through `save_checkpoint` (the toy trainer: a checkpoint of ~90 KB), then damage on
disk: bytes zeroed in the middle of the policy adapter (which still parses), a missing file, a lost
or garbled manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from rlhf_helpers.ppo import checkpoint as ckpt
from rlhf_helpers.ppo import checkpoint_digest
from rlhf_helpers.ppo.checkpoint import load_checkpoint, save_checkpoint, verify_checkpoint
from rlhf_helpers.ppo.checkpoint_digest import MANIFEST_FILE
from rlhf_helpers.ppo.run_folder import SetupError, check_resume_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

POLICY_WEIGHTS = Path("adapters", "policy", "adapter_model.safetensors")


@pytest.fixture
def make_trainer(make_trainer):
    """Toy trainers with 4 new tokens (a step takes a fraction of a second)."""
    def make(init_seed: int = 0, **overrides):
        return make_trainer(init_seed=init_seed, max_new_tokens=4, **overrides)
    return make


@pytest.fixture
def run_dir(tmp_path, make_trainer):
    """A run folder with two complete checkpoints, step-000001 and step-000002 (`latest`)."""
    trainer = make_trainer()
    for _ in range(2):
        trainer.step()
        save_checkpoint(trainer, tmp_path / "run")
    return tmp_path / "run"


def zero_middle(path: Path, size: int = 4096) -> None:
    """Overwrite `size` bytes in the middle of `path` with zeros: same length, still a valid
    safetensors file."""
    data = bytearray(path.read_bytes())
    assert len(data) > 2 * size, "the file is too small to damage its middle"
    start = len(data) // 2 - size // 2
    data[start:start + size] = bytes(size)
    path.write_bytes(bytes(data))


def as_if_saved_before_digests(folder: Path) -> None:
    """Make `folder` look like a checkpoint of a version that wrote no manifest (and recorded none
    in its state)."""
    (folder / MANIFEST_FILE).unlink()
    state = torch.load(folder / ckpt.TRAINER_STATE_FILE, weights_only=True)
    del state[checkpoint_digest.MANIFEST_STATE_KEY]
    torch.save(state, folder / ckpt.TRAINER_STATE_FILE)


def test_a_save_records_the_sha256_of_every_file_it_wrote(run_dir):
    folder = run_dir / "step-000002"
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    written = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*")
               if p.is_file() and p.name != MANIFEST_FILE}
    assert {"trainer_state.pt", "heads.safetensors", POLICY_WEIGHTS.as_posix()} <= written.keys()
    assert manifest["files"].keys() == written.keys()
    for name, path in written.items():
        assert manifest["files"][name] == {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                                           "bytes": path.stat().st_size}
    # no temporary file left
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []
    assert verify_checkpoint(folder) == []


def test_zeroed_bytes_in_the_policy_adapter_are_refused_naming_the_file_and_the_intact_one(
        run_dir, make_trainer):
    damaged = run_dir / "step-000002" / POLICY_WEIGHTS
    zero_middle(damaged)
    problems = verify_checkpoint(run_dir / "step-000002")
    assert len(problems) == 1 and str(damaged) in problems[0] and "SHA-256" in problems[0]
    # what `train_ppo --resume` prints as one line, exit 2
    with pytest.raises(SetupError) as refused:
        check_resume_checkpoint(run_dir)
    message = str(refused.value)
    assert refused.value.code == 2 and "\n" not in message
    assert f"checkpoint {run_dir / 'step-000002'}" in message and str(damaged) in message
    assert f"the newest intact checkpoint is {run_dir / 'step-000001'}" in message
    assert f"echo step-000001 > {run_dir / 'latest'}" in message
    fresh = make_trainer(init_seed=3)
    before = {name: p.detach().clone() for name, p in fresh.model.named_parameters()}
    with pytest.raises(ckpt.CheckpointDamagedError, match=str(damaged)):
        load_checkpoint(fresh, run_dir)  # the library refuses it too, before any weight is touched
    assert fresh.step_count == 0
    assert all(torch.equal(before[name], p) for name, p in fresh.model.named_parameters())
    # the advice works: the older checkpoint resumes
    (run_dir / "latest").write_text("step-000001\n")
    assert check_resume_checkpoint(run_dir) == 1
    assert load_checkpoint(fresh, run_dir) == run_dir / "step-000001" and fresh.step_count == 1


@pytest.mark.parametrize("damage",
                         ["missing optimiser state", "missing adapter", "missing manifest",
                          "garbled manifest", "manifest lists a path outside", "manifest is a pipe",
                          "manifest nested past json's depth", "manifest links to an endless file",
                          "manifest too large"])
def test_a_missing_file_or_a_bad_manifest_is_refused_naming_it(run_dir, damage):
    folder = run_dir / "step-000002"
    manifest = folder / MANIFEST_FILE
    if damage == "missing optimiser state":
        named = folder / ckpt.TRAINER_STATE_FILE
        named.unlink()
    elif damage == "missing adapter":
        named = folder / "adapters" / "value" / "adapter_model.safetensors"
        named.unlink()
    # lost after the save: the trainer state says the save wrote one
    elif damage == "missing manifest":
        manifest.unlink()
        named = manifest
    elif damage == "garbled manifest":
        manifest.write_text(manifest.read_text()[:40])
        named = manifest
    elif damage == "manifest is a pipe":  # opening it would wait for a writer that never comes
        manifest.unlink()
        os.mkfifo(manifest)
        named = manifest
    elif damage == "manifest nested past json's depth":  # RecursionError in json, not a ValueError
        manifest.write_text("[" * 200_000 + "]" * 200_000)
        named = manifest
    elif damage == "manifest links to an endless file":  # read to the end, it would fill the memory
        manifest.unlink()
        manifest.symlink_to("/dev/zero")
        named = manifest
    elif damage == "manifest too large":
        manifest.write_text(" " * (checkpoint_digest.MAX_MANIFEST_BYTES + 1) + "{}")
        named = manifest
    else:
        record = json.loads(manifest.read_text())
        record["files"]["../../elsewhere"] = {"sha256": "0" * 64, "bytes": 1}
        manifest.write_text(json.dumps(record))
        named = manifest
    problems = verify_checkpoint(folder)
    assert problems and str(named) in problems[0]
    with pytest.raises(SetupError,
                       match="the newest intact checkpoint is .*step-000001") as refused:
        check_resume_checkpoint(run_dir)
    assert str(named) in str(refused.value)


def test_an_extra_file_in_a_checkpoint_is_fine(run_dir, capsys):
    (run_dir / "step-000002" / "notes.txt").write_text("a person's notes")
    assert verify_checkpoint(run_dir / "step-000002") == []
    assert check_resume_checkpoint(run_dir) == 2
    assert capsys.readouterr().err == ""


def test_a_manifest_lacking_a_file_of_the_checkpoint_is_incomplete(run_dir):
    manifest = run_dir / "step-000002" / MANIFEST_FILE
    record = json.loads(manifest.read_text())
    del record["files"]["heads.safetensors"]
    manifest.write_text(json.dumps(record))
    problems = verify_checkpoint(run_dir / "step-000002")
    assert problems == [f"{manifest} does not list heads.safetensors: the manifest is incomplete"]


def test_with_no_intact_checkpoint_the_error_says_how_many_are_kept(run_dir):
    for step in ("step-000001", "step-000002"):
        zero_middle(run_dir / step / POLICY_WEIGHTS)
    with pytest.raises(SetupError) as refused:
        check_resume_checkpoint(run_dir)
    message = str(refused.value)
    assert str(run_dir / "step-000002" / POLICY_WEIGHTS) in message
    assert "no checkpoint of it is intact: start a new --output-dir" in message
    assert f"a run keeps its {ckpt.DEFAULT_KEEP} newest checkpoints" in message


def test_a_save_that_fails_while_writing_its_manifest_publishes_nothing(run_dir,
                                                                        make_trainer, monkeypatch):
    trainer = make_trainer()
    load_checkpoint(trainer, run_dir)  # the run's own trainer: save_checkpoint refuses another's
    trainer.step()

    def fail(*args, **kwargs):
        raise OSError("read error (simulated)")

    monkeypatch.setattr(checkpoint_digest, "sha256_file", fail)
    with pytest.raises(ckpt.CheckpointSaveError, match="simulated"):
        save_checkpoint(trainer, run_dir)
    assert ckpt.latest_checkpoint(run_dir) == run_dir / "step-000002"
    assert sorted(p.name for p in run_dir.iterdir()) == ["latest", "step-000001", "step-000002"]


def test_a_checkpoint_saved_before_digests_resumes_with_one_line_and_trains_identically(
        run_dir, make_trainer,
                                                                                         capsys):
    straight = make_trainer()
    for _ in range(3):
        straight.step()
    old = run_dir / "step-000002"
    as_if_saved_before_digests(old)
    assert verify_checkpoint(old) == []  # nothing found wrong; it just cannot be proven intact
    assert check_resume_checkpoint(run_dir) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(old) in err[0] and "could not be verified" in err[0]
    resumed = make_trainer(init_seed=4)
    load_checkpoint(resumed, run_dir)
    resumed.step()
    times = ("time_",)
    assert [{k: v for k, v in m.items() if not k.startswith(times)} for m in resumed.history] == \
           [{k: v for k, v in m.items() if not k.startswith(times)} for m in straight.history]


def test_an_intact_checkpoint_resumes_silently(run_dir, capsys):
    assert check_resume_checkpoint(run_dir) == 2
    assert capsys.readouterr().err == ""
    # the advice is only about the latest: an older one may be gone
    shutil.rmtree(run_dir / "step-000001")
    assert check_resume_checkpoint(run_dir) == 2


def test_the_training_command_refuses_a_damaged_checkpoint_with_one_line_and_exit_2(run_dir,
                                                                                    make_trainer,
                                                                                      tmp_path,
                                                                                    monkeypatch,
                                                                                    capsys):
    from rlhf_helpers.stages import train_ppo

    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the damaged checkpoint was found")

    monkeypatch.setattr(train_ppo, "build_shared_model", no_build)
    config = make_trainer().config.to_dict()
    (run_dir
     / "run.json").write_text(json.dumps({"profile": {"name": "tiny"}, "ppo_config": config}))
    damaged = run_dir / "step-000002" / POLICY_WEIGHTS
    zero_middle(damaged)
    with pytest.raises(SystemExit) as refused:
        train_ppo.main(["--profile", "tiny", "--resume", "--steps", "5", "--no-progress",
                        "--output-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and len(err) == 1, err
    assert (err[0].startswith("python -m rlhf_helpers.stages.train_ppo: error: --resume: ")
            and str(damaged) in err[0])


@pytest.mark.parametrize("saved_with_manifest", [True, False])
def test_a_link_in_a_checkpoint_is_refused_naming_it(run_dir, tmp_path, saved_with_manifest):
    """A save writes no link: one in a checkpoint (a file swapped for a link to a copy, or to any
    file) is refused by name, never read through, with or without a manifest."""
    folder = run_dir / "step-000002"
    if not saved_with_manifest:
        as_if_saved_before_digests(folder)
    heads = folder / ckpt.HEADS_FILE
    copy = tmp_path / "copy-of-heads.safetensors"
    shutil.copy(heads, copy)  # the same bytes: only the link is wrong
    heads.unlink()
    heads.symlink_to(copy)
    problems = verify_checkpoint(folder)
    assert problems == [f"{heads} is a link (to {copy}): a checkpoint's save writes no links, so "
                        "it is not read through one; put the file itself there, or train again"]
    with pytest.raises(SetupError, match="newest intact checkpoint is .*step-000001") as refused:
        check_resume_checkpoint(run_dir)
    assert f"{heads} is a link" in str(refused.value) and "\n" not in str(refused.value)
