"""The training command and a run's identity: a checkpoint of another run, of another LoRA rank or
with a forged trainer state is refused on --resume in one line before the model is built (exit 2),
and a run folder that moves mid-run stops the run (exit 4) instead of being made again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_CLI

from rlhf_helpers.ppo.checkpoints.save_load import save_checkpoint, write_manifest
from rlhf_helpers.ppo.checkpoints.trainer_state import TRAINER_STATE_FILE, trainer_state_dict
from rlhf_helpers.stages import train_ppo as train

RUN_ID = "20261207-101500-c0mmand0"


@pytest.fixture
def run_folder(quick_cli, make_trainer):
    """A run folder as the command leaves it: step-000001, step-000002, and run.json naming the
    run's id. Returns (folder, the trainer that saved them)."""
    out = quick_cli / "ppo"
    trainer = make_trainer(max_new_tokens=4)
    trainer.run_id = RUN_ID
    for _ in range(2):
        trainer.step()
        save_checkpoint(trainer, out)
    (out / "run.json").write_text(json.dumps(
        {"run_id": RUN_ID, "profile": {"name": "tiny"}, "ppo_config": trainer.config.to_dict(),
         "reward_dir": None}))
    return out, trainer


def resume_refused(out: Path, capsys) -> str:
    """The one stderr line of `--resume` into `out` refused with exit 2 (quick_cli fails the test
    if the model is built first)."""
    with pytest.raises(SystemExit) as refused:
        train.main(["--profile", "tiny", "--no-progress", "--resume", "--steps", "5",
                    "--output-dir", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_resume_refuses_a_checkpoint_copied_from_another_run_by_name(run_folder, make_trainer,
                                                                      capsys):
    out, _ = run_folder
    stranger = make_trainer(init_seed=6, max_new_tokens=4)
    stranger.run_id = "20261207-111500-0therrun"
    for _ in range(3):
        stranger.step()
    copied = save_checkpoint(stranger, out.parent / "elsewhere")
    shutil.copytree(copied, out / copied.name)
    (out / "latest").write_text(copied.name + "\n")
    line = resume_refused(out, capsys)
    assert (f"--resume: checkpoint {out / copied.name} belongs to run {stranger.run_id}, not to "
            f"run {RUN_ID} ({out / 'run.json'})") in line


def test_resume_refuses_a_checkpoint_of_another_lora_rank_before_the_model_is_built(
        run_folder, capsys):
    out, trainer = run_folder
    record = json.loads((out / "run.json").read_text())
    record["ppo_config"]["lora"]["r"] = 2  # the run's rank; its checkpoints hold rank 4
    (out / "run.json").write_text(json.dumps(record))
    line = resume_refused(out, capsys)
    assert (f"--resume: checkpoint {out / 'step-000002'} holds a policy adapter of LoRA r=4, "
            "alpha=8") in line and "the run's (run.json) is r=2, alpha=8" in line


class _RunsCodeWhenUnpickled:
    """Unpickling it would create `marker` (any code could run there)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("forgery", ["planted code", "cut archive"])
def test_resume_refuses_a_forged_trainer_state_in_one_line(run_folder, capsys, forgery):
    out, trainer = run_folder
    latest = out / "step-000002"
    marker = out.parent / "code-ran"
    state_file = latest / TRAINER_STATE_FILE
    if forgery == "planted code":
        state = trainer_state_dict(trainer)
        state["history"] = [_RunsCodeWhenUnpickled(str(marker))]
        torch.save(state, state_file)
        expected = "trainer_state.pt was refused by the safe loader (weights_only=True)"
    else:
        state_file.write_bytes(state_file.read_bytes()[:200])
        expected = "trainer_state.pt is not a readable trainer state (RuntimeError"
    write_manifest(latest)  # the forger rewrote the digests too
    line = resume_refused(out, capsys)
    assert f"--resume: checkpoint {latest} is damaged: {state_file}" in line and expected in line
    assert f"the newest intact checkpoint is {out / 'step-000001'}" in line
    assert not marker.exists()


def test_a_run_folder_renamed_mid_run_stops_the_command_and_is_not_made_again(
        tmp_path, monkeypatch, capsys):
    torch.set_num_threads(1)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps(TINY_CLI))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(train, "ensure_reward_model", lambda *args, **kwargs: None)
    out, moved = tmp_path / "ppo", tmp_path / "moved"
    real_append = train.append_jsonl

    def append_then_move(path, rows, mode="a"):
        real_append(path, rows, mode)
        if mode == "a" and rows[-1]["step"] == 1:  # step 1 saved and logged: the folder moves
            out.rename(moved)

    monkeypatch.setattr(train, "append_jsonl", append_then_move)
    with pytest.raises(SystemExit) as stopped:
        train.main(["--profile", "tiny", "--steps", "3", "--save-every", "1", "--no-progress",
                    "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert stopped.value.code == train.EXIT_WRITE_FAILED == 4, err
    assert (f"PPO stopped: the run folder {out} was removed or renamed while the run was going "
            "(after step 2)") in err
    assert not out.exists()  # not made again with steps 2 and 3 and no run.json
    assert [json.loads(line)["step"] for line in (moved / "metrics.jsonl").read_text().splitlines()
            ] == [1.0]
    assert (moved / "latest").read_text().strip() == "step-000001"
    # the run's id: in run.json and in its checkpoint
    run_id = json.loads((moved / "run.json").read_text())["run_id"]
    state = torch.load(moved / "step-000001" / TRAINER_STATE_FILE, weights_only=True)
    assert isinstance(run_id, str) and state["run_id"] == run_id
