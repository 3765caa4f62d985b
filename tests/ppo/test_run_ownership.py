"""One owner per run folder through the Python API: train() never writes over another run's
checkpoints, a checkpoint of another run or LoRA shape is refused by name, a forged state is one
clear error, a folder that moves mid-run stops the run, and stray step-* folders never count.

The errors are caught by the classes the code had before these checks (FolderInUse,
CheckpointSaveError, ValueError), so each test fails on its own assertion on the old code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlhf_helpers.ppo.checkpoints.save_load import (
    CheckpointSaveError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    write_manifest,
)
from rlhf_helpers.ppo.checkpoints.trainer_state import TRAINER_STATE_FILE, trainer_state_dict
from rlhf_helpers.runtime.lock_files import FolderInUse

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def make_trainer(make_trainer):
    """Quick toy trainers: one epoch of one minibatch, 4 new tokens."""
    def make(init_seed: int = 0, **overrides):
        values = dict(rollout_batch_size=4, mini_batch_size=4, ppo_epochs=1, max_new_tokens=4)
        return make_trainer(init_seed=init_seed, **{**values, **overrides})
    return make


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def command_run_folder(make_trainer, out: Path) -> str:
    """A folder as the training command leaves it: checkpoints step-000001 and step-000002 and
    run.json naming the run's id; returns that id."""
    trainer = make_trainer(init_seed=1)
    trainer.run_id = "20261207-101500-c0mmand0"  # the id the command gave its run
    for _ in range(2):
        trainer.step()
        save_checkpoint(trainer, out)
    (out / "run.json").write_text(json.dumps({"run_id": trainer.run_id,
                                              "profile": {"name": "tiny"},
                                              "ppo_config": trainer.config.to_dict()}))
    return trainer.run_id


def test_train_refuses_a_folder_holding_a_command_line_runs_checkpoints(make_trainer, tmp_path):
    out = tmp_path / "ppo"
    owner = command_run_folder(make_trainer, out)
    before = files_of(out)
    intruder = make_trainer(output_dir=str(out), save_every=1)
    with pytest.raises(FolderInUse, match=rf"{out} already holds checkpoints of run {owner}.*"
                                          r"load_checkpoint\(trainer, .*another output_dir"):
        intruder.train(steps=1)
    assert files_of(out) == before  # step-000002 and latest untouched
    assert intruder.step_count == 0 and intruder.output_lock is None  # refused before a step
    assert not (out / ".run.lock").exists()


def test_a_trainer_continues_its_own_folder_across_train_calls_and_after_loading_it(
        make_trainer, tmp_path):
    out = tmp_path / "ppo"
    trainer = make_trainer(output_dir=str(out), save_every=1)
    trainer.train(steps=1)
    trainer.train(steps=1)  # still locked by it: its own checkpoints
    trainer.close()
    trainer.train(steps=1)  # locked again: its checkpoints name its run
    trainer.close()
    assert latest_checkpoint(out).name == "step-000003"
    # a new trainer that loaded the folder's checkpoint continues that run
    other = make_trainer(init_seed=4, output_dir=str(out), save_every=1)
    load_checkpoint(other, out)
    assert other.run_id == trainer.run_id and other.last_checkpoint == str(out / "step-000003")
    other.train(steps=1)
    assert latest_checkpoint(out).name == "step-000004"
    # a command-line run's folder, resumed through the API
    cli = tmp_path / "cli"
    owner = command_run_folder(make_trainer, cli)
    resumed = make_trainer(init_seed=5, output_dir=str(cli), save_every=1)
    load_checkpoint(resumed, cli)
    resumed.train(steps=1)
    assert latest_checkpoint(cli).name == "step-000003" and resumed.run_id == owner


def without_run_id(checkpoint: Path) -> None:
    """Make `checkpoint` look saved before runs had ids (its manifest rewritten to match)."""
    state = torch.load(checkpoint / TRAINER_STATE_FILE, weights_only=True)
    del state["run_id"]
    torch.save(state, checkpoint / TRAINER_STATE_FILE)
    write_manifest(checkpoint)


def test_checkpoints_without_a_run_id_are_continued_only_by_a_trainer_that_loaded_them(
        make_trainer, tmp_path):
    out = tmp_path / "old"
    saver = make_trainer()
    saver.step()
    without_run_id(save_checkpoint(saver, out))
    with pytest.raises(FolderInUse, match="a run that records no id"):
        make_trainer(output_dir=str(out), save_every=1).train(steps=1)
    loader = make_trainer(init_seed=2, output_dir=str(out), save_every=1)
    load_checkpoint(loader, out)  # an old checkpoint: accepted as before
    loader.train(steps=1)
    assert latest_checkpoint(out).name == "step-000002"
    saved = torch.load(out / "step-000002" / TRAINER_STATE_FILE, weights_only=True)
    assert saved["run_id"] == loader.run_id is not None  # the continued run has an id from now on


def test_load_checkpoint_refuses_a_checkpoint_copied_from_another_run_by_name(
        make_trainer, tmp_path):
    out = tmp_path / "ppo"
    owner = command_run_folder(make_trainer, out)
    stranger = make_trainer(init_seed=6)
    stranger.run_id = "20261207-111500-0therrun"
    for _ in range(3):
        stranger.step()
    copied = save_checkpoint(stranger, tmp_path / "elsewhere")
    shutil.copytree(copied, out / copied.name)
    (out / "latest").write_text(copied.name + "\n")
    fresh = make_trainer(init_seed=7)
    weights = [p.detach().clone() for p in fresh.model.parameters()]
    with pytest.raises(ValueError, match=rf"checkpoint {out / copied.name} belongs to run "
                                         rf"{stranger.run_id}, not to run {owner}"):
        load_checkpoint(fresh, out)
    assert fresh.step_count == 0 and fresh.history == [] and fresh.run_id is None
    assert all(torch.equal(a, b) for a, b in zip(weights, fresh.model.parameters(), strict=True))


def rank_2_trainer():
    """A toy trainer whose adapters have LoRA rank 2 (the toy trainers' is 4)."""
    from conftest import TOY_TRAINER
    from toy_world import good_count, toy_causal_lm, toy_tokenizer

    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.runtime.lora import LoRASpec
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    tok, lora = toy_tokenizer(), LoRASpec(r=2, alpha=8)
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, seed=0, lora=lora)
    return PPOTrainer(PPOConfig(**{**TOY_TRAINER, "lora": lora}), model, tok, ["the movie was"],
                      reward_fn=good_count)


def test_a_checkpoint_of_another_lora_rank_is_one_line_not_a_size_mismatch(make_trainer,
                                                                           tmp_path):
    saved = save_checkpoint(make_trainer(), tmp_path)
    other = rank_2_trainer()
    with pytest.raises(ValueError) as refused:
        load_checkpoint(other, tmp_path)
    message = str(refused.value)
    assert (f"checkpoint {saved} holds a policy adapter of LoRA r=4, alpha=8" in message
            and "this model's is r=2, alpha=8" in message), message
    assert "\n" not in message and "size mismatch" not in message
    assert other.step_count == 0


@pytest.mark.parametrize("forgery", ["cut archive", "optimiser of other groups", "step a string"])
def test_a_forged_trainer_state_with_its_digests_rewritten_is_one_clear_error(
        make_trainer, tmp_path, forgery):
    trainer = make_trainer()
    trainer.step()
    path = save_checkpoint(trainer, tmp_path)
    state_file = path / TRAINER_STATE_FILE
    if forgery == "cut archive":
        state_file.write_bytes(state_file.read_bytes()[:200])
        expected = "is not a readable trainer state (RuntimeError: truncated, overwritten"
    else:
        state = trainer_state_dict(trainer)
        if forgery == "step a string":
            state["step"] = "1; import os"
            expected = "its step is '1; import os', not an int >= 0"
        else:
            state["policy_optimizer"] = {"state": {}, "param_groups": []}
            expected = "its policy optimiser state is not one of"
        torch.save(state, state_file)
    write_manifest(path)  # whoever forges a file can rewrite the digests too
    fresh = make_trainer(init_seed=3)
    weights = [p.detach().clone() for p in fresh.model.parameters()]
    with pytest.raises(ValueError) as refused:
        load_checkpoint(fresh, tmp_path)
    assert expected in str(refused.value) and "\n" not in str(refused.value)
    # nothing of it was applied
    assert fresh.step_count == 0 and fresh.history == []
    assert all(torch.equal(a, b) for a, b in zip(weights, fresh.model.parameters(), strict=True))


@pytest.mark.parametrize("change", ["renamed", "removed"])
def test_a_run_folder_that_moves_mid_run_stops_the_run_and_is_not_made_again(
        make_trainer, tmp_path, change):
    out, moved = tmp_path / "ppo", tmp_path / "moved"

    def move_after_step_1(metrics):
        if metrics["step"] == 1:
            out.rename(moved) if change == "renamed" else shutil.rmtree(out)

    trainer = make_trainer(output_dir=str(out), save_every=1)
    with pytest.raises(CheckpointSaveError, match=rf"the run folder {out} was removed or renamed "
                                                  r"while the run was going \(after step 2\)"):
        trainer.train(steps=3, callback=move_after_step_1)
    assert not out.exists()  # not made again with the later steps
    if change == "renamed":
        # the lock file too, held until trainer.close()
        assert sorted(p.name for p in moved.iterdir()) == [".run.lock", "latest", "step-000001"]
        trainer.close()


def test_a_run_folder_moved_between_train_calls_is_not_made_again(make_trainer, tmp_path,
                                                                  capsys):
    out = tmp_path / "ppo"
    trainer = make_trainer(output_dir=str(out), save_every=1)
    trainer.train(steps=1)
    out.rename(tmp_path / "archived")
    with pytest.raises(CheckpointSaveError, match=rf"the run folder {out} was removed, renamed or "
                                                  r"replaced after this trainer locked it"):
        trainer.train(steps=1)
    with pytest.raises(CheckpointSaveError, match="call trainer.close()"):
        trainer.train(steps=1)  # every time, until the trainer is closed or pointed elsewhere
    assert not out.exists() and trainer.step_count == 1
    trainer.config = trainer.config.replace(output_dir=str(tmp_path / "archived"))
    trainer.train(steps=1)  # where the folder went: its own checkpoints
    assert latest_checkpoint(tmp_path / "archived").name == "step-000002"
    assert "took over" not in capsys.readouterr().err  # its own lock file, not a dead run's


def test_stray_or_empty_step_folders_never_count_toward_the_keep_rule(make_trainer, tmp_path):
    strays = {"step-000009": None, "step-foo": None, "step-000005": "notes.txt"}
    for name, file in strays.items():
        (tmp_path / name).mkdir()
        if file:
            (tmp_path / name / file).write_text("a person's notes")
    trainer = make_trainer()
    for _ in range(3):
        trainer.step()
        save_checkpoint(trainer, tmp_path, keep=2)
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert folders == sorted(["step-000002", "step-000003", *strays]), folders
    assert latest_checkpoint(tmp_path).name == "step-000003"


def test_a_second_trainer_object_is_refused_while_another_holds_the_folder(make_trainer,
                                                                          tmp_path):
    """Before: the lock is re-entrant within a process and both trainers carry the run's id, so the
    first trainer's next train() silently replaced the second's step-000003."""
    out = tmp_path / "ppo"
    first = make_trainer(output_dir=str(out), save_every=1)
    first.train(steps=2)
    second = make_trainer(init_seed=3, output_dir=str(out), save_every=1)
    load_checkpoint(second, out)  # as the refusal of another run's folder advises
    before = files_of(out)
    with pytest.raises(FolderInUse, match=rf"{out} is held by another trainer object of this "
                                          r"process .*Call that trainer's close\(\) first"):
        second.train(steps=1)
    assert files_of(out) == before and second.step_count == 2 and second.output_lock is None
    first.close()
    second.train(steps=1)  # the folder is free: the second continues the run
    assert latest_checkpoint(out).name == "step-000003"
    with pytest.raises(FolderInUse, match="held by another trainer object"):
        first.train(steps=1)  # now the first is the intruder
    assert first.step_count == 2


def test_train_refuses_a_folder_holding_only_another_runs_run_json(make_trainer, tmp_path):
    """A command-line run interrupted before its first checkpoint leaves run.json and
    metrics.jsonl. Before: train() wrote its checkpoints beside them."""
    out = tmp_path / "ppo"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"run_id": "20261207-101500-c0mmand0"}))
    (out / "metrics.jsonl").write_text("")
    before = files_of(out)
    intruder = make_trainer(output_dir=str(out), save_every=1)
    with pytest.raises(FolderInUse, match=rf"{out} holds run.json of run 20261207-101500-c0mmand0"):
        intruder.train(steps=1)
    assert files_of(out) == before and intruder.step_count == 0
    # the run the record names may write there (the command's own train loop)
    owner = make_trainer(output_dir=str(out), save_every=1)
    owner.run_id = "20261207-101500-c0mmand0"
    owner.train(steps=1)
    assert latest_checkpoint(out).name == "step-000001"
