"""`checkpointing_off` turns checkpointing off on every transformers the course admits (5.15 to
5.23)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from rlhf_helpers.runtime.compat import checkpointing_off


@dataclasses.dataclass
class _Old:  # transformers 5.15: only the old name
    gradient_checkpointing: bool = False


@dataclasses.dataclass
class _New:  # transformers 5.23: the new name, the old one a deprecated alias
    activation_checkpointing: bool | None = None
    gradient_checkpointing: bool | None = None


def test_picks_the_name_each_version_knows():
    assert checkpointing_off(_Old) == {"gradient_checkpointing": False}
    assert checkpointing_off(_New) == {"activation_checkpointing": False}


def test_rejects_what_is_not_training_arguments():
    with pytest.raises(TypeError, match="config_class"):
        checkpointing_off(dict)

    @dataclasses.dataclass
    class Other:
        lr: float = 0.1

    with pytest.raises(TypeError, match="neither"):
        checkpointing_off(Other)


@pytest.mark.parametrize("name", ["RewardConfig", "SFTConfig"])
def test_trl_configs_get_checkpointing_off_without_a_deprecation_warning(name, tmp_path):
    """TRL defaults checkpointing ON; the installed transformers must accept the keyword and end
    OFF."""
    import trl

    config_class = getattr(trl, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # 5.23 warns on the deprecated old name
        args = config_class(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                            **checkpointing_off(config_class))
    assert args.gradient_checkpointing is False
    assert getattr(args, "activation_checkpointing", False) is False


def test_the_course_sft_config_has_checkpointing_off(tmp_path):
    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.stages.sft import sft_config

    args = sft_config(get_profile("tiny"), tmp_path, max_steps=2)
    assert args.gradient_checkpointing is False and args.use_cpu is True
