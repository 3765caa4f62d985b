"""The one LoRA spec: validated once, carried from the profile into every config and the shared
model, and a model built with another spec is refused by the trainer. Also the typed NaN error and
the artefact cache's checksums, which the redesign introduced."""

from __future__ import annotations

import json

import pytest
import torch
from toy_world import toy_causal_lm, toy_tokenizer

from rlhf_helpers.compare import CompareConfig
from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.core.masked import masked_mean
from rlhf_helpers.ppo.guards import NonFiniteStop, non_finite_stops_run
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime import artifacts
from rlhf_helpers.runtime.lora import GPT2_TARGETS, LLAMA_TARGETS, LoRASpec
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.reward_training import RewardTrainingConfig


@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"r": 0}, ValueError, "lora.r"), ({"alpha": -2}, ValueError, "lora.alpha"),
    ({"r": 4.0}, TypeError, "lora.r"), ({"r": True}, TypeError, "lora.r"),
    ({"target_modules": ()}, ValueError, "target_modules"),
    ({"target_modules": "c_attn"}, ValueError, "target_modules"),
    ({"target_modules": ("c_attn", "")}, ValueError,
                                                                  "target_modules"),
])
def test_a_bad_spec_names_its_field(changes, error, match):
    with pytest.raises(error, match=match):
        LoRASpec(**changes)


def test_the_profile_spec_reaches_every_config():
    for profile in (get_profile("tiny"), get_profile("gpu")):
        assert profile.ppo.lora is profile.lora
        assert RewardTrainingConfig.from_profile(profile).lora is profile.lora
        assert CompareConfig.from_profile(profile).lora is profile.lora
    assert get_profile("tiny").lora == LoRASpec(8, 16, GPT2_TARGETS)
    assert get_profile("gpu").lora == LoRASpec(16, 32, LLAMA_TARGETS)


def test_a_partial_override_keeps_the_profile_targets():
    gpu = get_profile("gpu", lora={"r": 4})
    assert gpu.lora == LoRASpec(4, 32, LLAMA_TARGETS)  # not the GPT-2 default targets
    assert gpu.ppo.replace(lora={"alpha": 8}).lora == LoRASpec(4, 8, LLAMA_TARGETS)
    assert (CompareConfig.from_profile(gpu).replace(lora={"r": 2}).lora
            == LoRASpec(2, 32, LLAMA_TARGETS))


def test_a_config_round_trips_through_json_with_its_spec():
    config = PPOConfig(lora=LoRASpec(r=4, alpha=8, target_modules=["c_attn"]))
    again = PPOConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.lora.target_modules == ("c_attn",)


def test_the_model_is_built_from_the_spec_and_a_mismatch_is_refused():
    tok = toy_tokenizer()
    spec = LoRASpec(r=4, alpha=8, target_modules=("c_attn",))
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), tok.pad_token_id,
                            tok.eos_token_id, lora=spec)
    a = model.peft.base_model.model.transformer.h[0].attn.c_attn.lora_A["policy"].weight  # (r, in)
    assert a.shape[0] == 4 and model.lora == spec
    # not a target
    assert not hasattr(model.peft.base_model.model.transformer.h[0].mlp.c_fc, "lora_A")
    with pytest.raises(ValueError, match="differs from config.lora"):
        PPOTrainer(PPOConfig(lora=LoRASpec(r=8, alpha=8, target_modules=("c_attn",))), model,
                   tok, ["the movie"])
    PPOTrainer(PPOConfig(lora=spec), model, tok, ["the movie"])  # the same spec: accepted


def test_a_nan_in_the_maths_core_is_a_typed_error_that_a_run_turns_into_a_stop():
    x = torch.tensor([[1.0, float("nan")]])
    with pytest.raises(NonFiniteError) as caught:
        masked_mean(x, torch.ones_like(x))
    assert isinstance(caught.value, ValueError)  # callers catching bad input still catch it
    with pytest.raises(NonFiniteStop, match="at PPO step 3; stopping the run"):
        with non_finite_stops_run(step=3):
            masked_mean(x, torch.ones_like(x))
    with pytest.raises(ValueError) as other:  # other bad input is not turned into a NaN stop
        with non_finite_stops_run(step=3):
            masked_mean(x[:, :1], torch.ones(1, 2))
    assert not isinstance(other.value, NonFiniteError)


def test_the_cache_sees_a_same_size_overwrite_and_an_out_of_date_key(tmp_path):
    """Checksums, not sizes: a file overwritten with other bytes of the same length is damage."""
    calls = []

    def train(folder):
        calls.append(folder)
        folder.mkdir(parents=True)
        (folder / "weights.bin").write_bytes(b"abcd")
        return {"metrics": {"loss": 1.0}}

    final = tmp_path / "thing"
    assert artifacts.build_cached(final, {"data": "x"}, train) == final and len(calls) == 1
    assert artifacts.artifact_problem(final, {"data": "x"}) is None
    # cached
    assert artifacts.build_cached(final, {"data": "x"}, train) == final and len(calls) == 1
    (final / "weights.bin").write_bytes(b"abce")
    assert "does not match the checksum" in artifacts.artifact_problem(final, {"data": "x"})
    assert artifacts.artifact_problem(tmp_path / "nothing") == "the folder does not exist"
    artifacts.build_cached(final, {"data": "x"}, train)
    assert len(calls) == 2 and (final / "weights.bin").read_bytes() == b"abcd"
    problem = artifacts.artifact_problem(final, {"data": "y"}, {"data": "on other data"})
    assert problem == "it was trained on other data"
    assert artifacts.read_record(final)["metrics"] == {"loss": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing"]  # no temporary folder left


def test_a_config_written_before_the_spec_still_loads():
    """run.json of a run made before LoRASpec holds flat lora_r / lora_alpha /
    lora_target_modules."""
    old = PPOConfig().to_dict()
    del old["lora"]
    old.update(lora_r=4, lora_alpha=8, lora_target_modules=["c_attn"])
    assert PPOConfig.from_dict(old).lora == LoRASpec(r=4, alpha=8, target_modules=("c_attn",))


def test_the_reward_command_never_replaces_a_folder_that_is_not_a_reward_folder(tmp_path, capsys):
    from rlhf_helpers.stages import reward

    keep = tmp_path / "precious"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as refused:
        reward.main(["--profile", "tiny", "--out", str(keep)])
    assert refused.value.code == 2 and "is not a reward folder" in capsys.readouterr().err
    assert (keep / "notes.txt").read_text() == "mine"


def test_pruning_keeps_folders_that_only_look_like_checkpoints(tmp_path, make_trainer):
    from rlhf_helpers.ppo.checkpoints.save_load import save_checkpoint

    (tmp_path / "step-backup").mkdir()
    trainer = make_trainer(max_new_tokens=4)
    for _ in range(3):
        trainer.step()
        save_checkpoint(trainer, tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()
                  if p.is_dir()) == ["step-000003", "step-backup"]
