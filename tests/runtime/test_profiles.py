"""Profiles: one setting picks tiny/gpu/auto; every field is typed and documented."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhf_helpers.runtime.profiles import PROFILE_ENV, Profile, get_profile


def test_default_is_tiny_on_cpu_with_the_shipped_model(monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    profile = get_profile()
    assert profile.name == "tiny" and profile.device == "cpu" and profile.dtype == "float32"
    assert (Path(profile.sft_model_path) / "config.json").is_file()
    assert profile.torch_dtype is torch.float32


def test_environment_variable_and_argument(monkeypatch):
    monkeypatch.setenv(PROFILE_ENV, "gpu")
    assert get_profile().name == "gpu"
    assert get_profile("tiny").name == "tiny"  # the argument wins
    gpu = get_profile()
    assert gpu.dtype == "bfloat16" and gpu.torch_dtype is torch.bfloat16
    assert gpu.ppo.rollout_batch_size > get_profile("tiny").ppo.rollout_batch_size
    monkeypatch.setenv(PROFILE_ENV, "huge")
    with pytest.raises(ValueError, match=PROFILE_ENV):
        get_profile()
    with pytest.raises(ValueError, match="name"):
        get_profile("huge")


def test_auto_follows_cuda_availability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert get_profile("auto").name == "tiny"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_profile("AUTO").name == "gpu"


def test_overrides_and_replace():
    profile = get_profile("tiny", total_steps=3, kl_coef=0.0)
    assert profile.ppo.total_steps == 3 and profile.ppo.kl_coef == 0.0
    assert profile.replace(seed=5).seed == 5
    with pytest.raises(ValueError, match="unknown profile setting"):
        get_profile("tiny", not_a_field=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.seed = 1  # type: ignore[misc]


def test_every_field_has_a_type_and_a_doc_comment():
    source = inspect.getsource(Profile)
    lines = source.splitlines()
    for field in dataclasses.fields(Profile):
        assert field.type, field.name
        i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"{field.name}:"))
        # the doc comment ends the field's line, or (a long one) stands on the lines above it
        assert "#:" in lines[i] or lines[i - 1].strip().startswith("#:"), \
            f"field {field.name} has no #: comment"


def test_profiles_and_data_import_no_heavy_library():
    code = (
        "import sys, rlhf_helpers.runtime.profiles, rlhf_helpers.runtime.data, rlhf_helpers.world; "
        "print(sorted({'torch', 'transformers', 'trl', 'peft'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_overrides_from_the_environment(monkeypatch):
    monkeypatch.delenv("RLHF_PROFILE", raising=False)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES",
                       '{"total_steps": 3, "lora": {"target_modules": ["c_attn"]}}')
    profile = get_profile()
    assert profile.ppo.total_steps == 3
    assert profile.lora.target_modules == ("c_attn",)
    assert get_profile(total_steps=7).ppo.total_steps == 7  # keyword overrides win
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"ppo_stepz": 3}')
    with pytest.raises(ValueError, match="ppo_stepz"):
        get_profile()
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", "total_steps=3")
    with pytest.raises(ValueError, match="RLHF_PROFILE_OVERRIDES"):
        get_profile()


def test_a_ppo_mapping_changes_only_its_fields():
    """{"ppo": {...}} is a set of changes to the profile's PPO config, not a fresh default
    config."""
    tiny = get_profile("tiny")
    changed = tiny.replace(ppo={"clip_eps": 0.1})
    assert changed.ppo.clip_eps == 0.1
    # the tiny profile's kl_coef 0.2 and the rest kept
    assert changed.ppo == tiny.ppo.replace(clip_eps=0.1)
    assert changed.ppo.kl_coef == 0.2 != type(tiny.ppo)().kl_coef


@pytest.mark.parametrize("overrides, message", [
    ({"reward_batch_size": 0}, "reward_batch_size must be an int >= 1, got 0"),
    ({"sft_batch_size": -2}, "sft_batch_size must be an int >= 1, got -2"),
    ({"compare_batches": 0}, "compare_batches must be None or an int >= 1, got 0"),
    ({"reward_epochs": 0}, "reward_epochs must be a finite number > 0, got 0"),
    ({"reward_lr": float("nan")}, "reward_lr must be a finite number > 0, got nan"),
    ({"sft_epochs": -1.0}, "sft_epochs must be a finite number > 0, got -1.0"),
    ({"sft_lr": 0.0}, "sft_lr must be a finite number > 0, got 0.0"),
    ({"compare_seconds": float("inf")}, "compare_seconds must be a finite number > 0, got inf"),
    ({"max_length": 4},
     "max_length must be an int > max_prompt_length (16): a prompt and at least one"),
    ({"max_length": 16}, "max_length must be an int > max_prompt_length (16)"),
    ({"max_length": 20, "max_prompt_length": 24},
     "max_length must be an int > max_prompt_length (24)"),
    ({"sft_model_path": "/nonexistent"},
     "sft_model_path must be a model folder (config.json and model.safetensors or "
     "pytorch_model.bin), got '/nonexistent'"),
])
def test_a_profile_setting_out_of_range_is_refused_by_name(overrides, message):
    """Each was accepted once and failed later, after a model was built (or trained on nothing)."""
    import re

    with pytest.raises(ValueError, match=re.escape(message)):
        get_profile("tiny", **overrides)


def test_the_edges_of_the_ranges_are_accepted():
    profile = get_profile("tiny", max_length=17, reward_batch_size=1, sft_batch_size=1,
                          compare_batches=1)
    assert (profile.max_length, profile.reward_batch_size, profile.compare_batches) == (17, 1, 1)


def test_the_reward_command_refuses_bad_settings_with_exit_2_before_any_model(monkeypatch,
                                                                              tmp_path, capsys):
    from rlhf_helpers.stages import reward

    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    for argv, env, message in [
        (["--max-train-pairs=-3990"], None,
         "max_train_pairs must be None or an int >= 1, got -3990"),
        (["--max-train-pairs=0"], None, "max_train_pairs must be None or an int >= 1, got 0"),
        (["--profile", "cpu"], None, "argument --profile: invalid choice: 'cpu'"),
        ([], '{"reward_batch_size": 0}', "reward_batch_size must be an int >= 1, got 0"),
        ([], '{"lora": {"r": "4"}}', "lora.r must be an int, got str '4'"),
    ]:
        if env is None:
            monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
        else:
            monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", env)
        with pytest.raises(SystemExit) as stopped:
            reward.main(["--out", str(tmp_path / "reward"), *argv])
        assert stopped.value.code == 2, argv
        assert message in capsys.readouterr().err, (argv, env)
    # nothing built or written
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reward").exists()


@pytest.mark.parametrize("call, message", [
    (lambda: get_profile(5), "name must be one of ('tiny', 'gpu', 'auto'), got int 5"),
    (lambda: get_profile(True), "name must be one of ('tiny', 'gpu', 'auto'), got bool True"),
    (lambda: get_profile("tiny", ppo=5),
     "ppo must be a PPOConfig or a mapping of its fields, got int 5"),
    (lambda: get_profile("tiny", ppo=None, clip_eps=0.1), "ppo must be a PPOConfig or a mapping of "
                                                          "its fields, got NoneType None"),
    # a tiny profile renamed
    (lambda: get_profile("tiny").replace(name="gpu"), "name is not a setting"),
    (lambda: get_profile("tiny", device="banana"),
     "device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got 'banana'"),
    (lambda: get_profile("tiny", device=""),
     "device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got ''"),
    (lambda: get_profile("tiny", base_model=" "),
     "base_model must be a hub id or a folder, got an empty string"),
    (lambda: get_profile("tiny", output_dir=""),
     "output_dir must be None or a folder, got an empty string"),
])
def test_a_setting_of_the_wrong_kind_is_a_value_error_naming_it(call, message):
    """Each was an AttributeError traceback, or was accepted and failed (or did something else)
    later."""
    import re

    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_the_environment_names_a_setting_given_twice_or_a_profile_name_inside_it(monkeypatch):
    import re

    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"total_steps": 1, "total_steps": 2}')
    with pytest.raises(ValueError,
                       match=re.escape("$RLHF_PROFILE_OVERRIDES sets total_steps twice")):
        get_profile("tiny")
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"name": "foo"}')
    with pytest.raises(ValueError, match=re.escape("name is not a setting: choose the profile with "
                                                   "get_profile(name) or $RLHF_PROFILE")):
        get_profile("tiny")


def test_a_tiny_model_folder_without_weights_is_refused(tmp_path):
    """config.json alone is not a model: transformers fails on it only when the model is built."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="sft_model_path must be a model folder"):
        get_profile("tiny", sft_model_path=str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert get_profile("tiny", sft_model_path=str(tmp_path)).sft_model_path == str(tmp_path)


def test_the_tiny_profile_has_no_base_model_apart_from_its_sft_model(monkeypatch, tmp_path):
    """Before: {"base_model": "/nonexistent/model"} trained (the tiny profile never reads it) and
    run.json recorded a base the run did not use."""
    import re
    import shutil

    from rlhf_helpers.runtime.data import data_dir

    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"base_model": "/nonexistent/model"}')
    with pytest.raises(ValueError, match=re.escape("base_model is not used by the tiny profile")):
        get_profile("tiny")
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES")
    other = tmp_path / "other-tiny"
    shutil.copytree(data_dir() / "models" / "tiny-sft", other)
    profile = get_profile("tiny", sft_model_path=str(other))
    # what run.json records is what ran
    assert profile.base_model == profile.sft_model_path == str(other)
    assert get_profile("tiny", base_model=str(other),
                       sft_model_path=str(other)).base_model == str(other)
    # the same folder spelled another way is the same folder
    assert get_profile("tiny", base_model=f"{other}/",
                       sft_model_path=str(other)).base_model == str(other)
