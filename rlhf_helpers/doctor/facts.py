"""The run's settings the doctor's rules need (RunFacts), and the one way they are built.

    facts = facts_of_trainer(trainer)               # a live PPOTrainer: its config and its model
    facts = facts_of_run_json(Path("runs/ppo-tiny/run.json"))  # what the training command recorded
    facts = RunFacts(max_new_tokens=40)             # given by hand, for a bare list of metrics

Both the trainer and run.json go through `run_facts`: the same settings (`SETTINGS`, PPOConfig's
fields) and the same compute record (`compute_record`: the dtype the forward passes compute in and
whether a loss scaler runs), checked the same way, so a run's facts cannot differ by where they were
read from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_helpers.core.tolerances import dtype_name
from rlhf_helpers.doctor.reading import read_json


@dataclass(frozen=True)
class RunFacts:
    """The run's settings the rules need (from the trainer, run.json, or given)."""

    #: the response length limit (None: unknown; the long-length rule is off)
    max_new_tokens: int | None = None
    #: the reward clip (None: off; the saturation rule reads `score_clipped`)
    score_clip: float | None = None
    value_warmup_steps: int = 0  #: critic-only steps before the policy's first update
    #: the dtype the forward passes compute in (the frozen base's, or autocast's), not the float32
    #: masters'; any spelling ("bf16", "torch.bfloat16") is stored as its one name
    #: (`core.tolerances.dtype_name`)
    dtype: str = "float32"
    source: str = "rlhf_helpers"  #: who wrote the history: "rlhf_helpers" or "trl"
    #: float16 with a gradient scaler (skipped steps on overflow are expected)
    loss_scaling: bool = False
    #: the steps the run was set to take (None: unknown); a warm-up this long means the policy never
    #: trains
    total_steps: int | None = None

    def __post_init__(self) -> None:
        # an unknown dtype is an error, never float32
        object.__setattr__(self, "dtype", dtype_name(self.dtype))


#: the PPOConfig settings the rules read (a trainer's config, or run.json's ppo_config)
SETTINGS = ("max_new_tokens", "score_clip", "value_warmup_steps", "total_steps")
#: the largest int setting read: the rules multiply settings by floats, and every int up to 2**53 is
#: exactly a float
MAX_SETTING = 2**53


def run_facts(settings: Mapping[str, Any], compute: Any, where: str) -> RunFacts:
    """A run's facts from its PPOConfig `settings` (SETTINGS; a missing one is None) and its
    `compute` record ({"dtype", "loss_scaling"}, as `compute_record` gives it and run.json holds
    it), each checked before a rule multiplies by it. ValueError starting with `where` (the file or
    object they came from) for a value no run has: a count that is not an int, a negative clip, a
    number a float cannot hold, an unknown dtype, a loss_scaling that is not a bool."""
    warmup = _checked(where, settings, "value_warmup_steps", (int,), 0) or 0
    checked = {"max_new_tokens": _checked(where, settings, "max_new_tokens", (int,), 1),
               "score_clip": _checked(where, settings, "score_clip", (int, float), 0),
               "value_warmup_steps": warmup,
               "total_steps": _checked(where, settings, "total_steps", (int,), 1)}
    if not isinstance(compute, Mapping):
        raise ValueError(f"{where}: compute must be an object ({{\"dtype\": ..., "
                         f"\"loss_scaling\": ...}}), got {type(compute).__name__} {compute!r:.40}")
    dtype, scaling = compute.get("dtype"), compute.get("loss_scaling", False)
    if not isinstance(dtype, str):  # None too: a record that does not say how the run computed
        raise ValueError(
            f"{where}: dtype must be a dtype name, got {type(dtype).__name__} {dtype!r:.40}")
    if not isinstance(scaling, bool):
        raise ValueError(f"{where}: loss_scaling must be true or false, got "
                         f"{type(scaling).__name__} {scaling!r:.40}")
    # "bf16", "torch.bfloat16" are read; an unknown name is refused, never float32
    try:
        return RunFacts(dtype=dtype, loss_scaling=scaling, **checked)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _checked(where: str, section: Mapping[str, Any], key: str, kinds: tuple[type, ...],
             low: float) -> Any:
    """section[key] when it is None or a number of `kinds` >= low (never a bool) that a float holds
    (an int up to MAX_SETTING, a finite float); else ValueError naming it."""
    value = section.get(key)
    if value is None or (isinstance(value, kinds) and not isinstance(value, bool) and value >= low
                         and (value <= MAX_SETTING if isinstance(value, int)
                              else math.isfinite(value))):
        return value
    kind = "an int" if kinds == (int,) else "a number"
    # too big, inf or NaN
    beyond = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low
    raise ValueError(
        f"{where}: {key} must be {kind} >= {low:g}, got {type(value).__name__} {value!r:.60}"
        + (" (beyond what the doctor reads: an int up to 2**53, a finite number)"
           if beyond else ""))


def compute_record(trainer: Any) -> dict[str, Any]:
    """{"dtype", "loss_scaling"}: the dtype a trainer's forward passes compute in (its model's
    `compute_dtype`: the frozen base's, bf16 or fp16 over float32 masters on a GPU) and whether a
    loss scaler runs (fp16). run.json records it; the doctor's float tolerances follow it.
    ValueError for a model that does not say."""
    dtype = getattr(trainer.model, "compute_dtype", None)
    # never guessed: a float32 guess would judge a bf16 run by float32's tolerances
    if dtype is None:
        raise ValueError(f"trainer.model ({type(trainer.model).__name__}) has no compute_dtype: "
                         "pass facts=RunFacts(dtype=...) to diagnose")
    scaler = getattr(getattr(trainer, "policy_opt", None), "scaler", None)
    return {"dtype": dtype_name(dtype),
            "loss_scaling": bool(scaler is not None and scaler.is_enabled())}


def facts_of_trainer(trainer: Any) -> RunFacts:
    """The facts of a live trainer: its config's SETTINGS and its model's compute record, through
    `run_facts`. TypeError naming what it lacks."""
    config = trainer.config
    missing = [name for name in SETTINGS if not hasattr(config, name)]
    if missing or not hasattr(trainer, "model"):
        lacks = (f"a config without {', '.join(missing)}" if missing
                 else "no model (its compute dtype)")
        raise TypeError(f"source looks like a PPOTrainer (history and config) but has {lacks}: "
                        "pass a PPOTrainer, or its history with facts=RunFacts(...)")
    settings = {name: getattr(config, name) for name in SETTINGS}
    return run_facts(settings, compute_record(trainer), f"{type(trainer).__name__}.config")


def facts_of_run_json(run_file: Path) -> RunFacts:
    """The facts run.json records (its ppo_config's SETTINGS and its compute record; an older record
    without one: the profile's dtype, no loss scaling), through `run_facts`. RunFacts() when there
    is no run.json; ValueError naming the file when it is not a run record."""
    # never read as "none recorded"
    if (run_file.exists() or run_file.is_symlink()) and not run_file.is_file():
        raise ValueError(
            f"{run_file} is not a readable file (a folder, a broken link or a pipe), so the run's "
            "settings are unknown; move it away to diagnose the metrics alone")
    if not run_file.is_file():
        return RunFacts()
    record = read_json(run_file)
    config = record.get("ppo_config", {}) if isinstance(record, dict) else None
    profile = record.get("profile", {}) if isinstance(record, dict) else None
    if not isinstance(config, dict) or not isinstance(profile, dict):
        raise ValueError(
            f"{run_file}: not a run record (an object whose ppo_config and profile are objects)")
    # what the run computed in; older records hold the profile's dtype only
    compute = record.get("compute")
    return run_facts(config, compute if compute is not None else {"dtype": profile.get("dtype")},
                     str(run_file))
