"""`reward_config_kwargs`: the run-setup half of a RewardConfig, checked on the RewardConfig it
builds."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from rlhf_helpers.runtime.precision import amp_flags
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.reward_training import reward_config_kwargs

trl = pytest.importorskip("trl")


def checkpointing_fields(args) -> dict[str, object]:
    """Every checkpointing switch this transformers version has, with its value after
    __post_init__."""
    names = {f.name for f in dataclasses.fields(args)}
    return {name: getattr(args, name)
            for name in ("activation_checkpointing", "gradient_checkpointing") if name in names}


def test_tiny_profile_builds_a_cpu_float32_config_without_checkpointing_or_trackers(tmp_path):
    profile = get_profile("tiny")
    args = trl.RewardConfig(output_dir=str(tmp_path), **reward_config_kwargs(profile))
    assert args.use_cpu is True
    assert not args.bf16 and not args.fp16, (
        "no autocast on a CPU (TRL's bf16 default must be overridden)")
    assert args.report_to == [] or args.report_to == "none"
    assert not any(checkpointing_fields(args).values()), checkpointing_fields(args)
    assert str(args.save_strategy).lower().endswith("no")
    assert args.dataloader_num_workers == 0


def test_the_defaults_would_differ_so_the_helper_matters(tmp_path):
    """RewardConfig on its own turns checkpointing on: what the helper must switch off."""
    # TRL's own default sets the deprecated gradient_checkpointing name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        plain = trl.RewardConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert any(checkpointing_fields(plain).values()), \
        "RewardConfig no longer defaults checkpointing on"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_cuda_profile_takes_its_autocast_flags_from_amp_flags(dtype):
    profile = get_profile("gpu", dtype=dtype)
    kwargs = reward_config_kwargs(profile)
    assert kwargs["use_cpu"] is False
    assert {"bf16": kwargs["bf16"], "fp16": kwargs["fp16"]} == amp_flags(profile)
    assert kwargs["bf16"] == (dtype == "bfloat16") and kwargs["fp16"] == (dtype == "float16")


def test_overrides_win_and_add():
    kwargs = reward_config_kwargs(get_profile("tiny"), save_strategy="epoch", disable_tqdm=True)
    assert kwargs["save_strategy"] == "epoch" and kwargs["disable_tqdm"] is True
    assert kwargs["use_cpu"] is True
