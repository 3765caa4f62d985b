"""The ranges numeric settings must keep: what the float32 arithmetic they enter can hold, and what
means something.

    check_limits(config, PPO_LIMITS)   # ValueError: clip_eps must be in [1e-6, 1e9], got 1e+308...
    check_counts(config, ("total_steps", "ppo_epochs"))   # ValueError: total_steps must be <= 10^9
    check_ints_from(config, 1, ("batch_size",))   # ValueError: batch_size must be an int >= 1, ...
    check_positive(config, ("learning_rate",))    # ValueError: ... must be a finite number > 0, ...
    check_seed(config)                            # ValueError: seed must be an int in [0, 2^32 - 1]

"Finite and > 0" is not enough: the rollouts, rewards, losses and gradients are float32 tensors
(largest value 3.4e38, spacing near 1 of 1.2e-7), so a clip epsilon of 1e308 cannot even be handed
to `torch.clamp`, and a coefficient of 1e-320 is 0 in float32. Each float setting therefore has a
range, with the reason beside it; the configs check it in their validation, so the training command
refuses it with one line before any model is built. Most reasons bound a square: a value of size x
in the rewards or values enters the value loss and the advantage whitening as x^2, summed over a
batch of up to ~1e6 tokens, so x must stay far below sqrt(3.4e38 / 1e6) ~ 2e16.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

#: The largest float32 (torch's default dtype for rewards, advantages and losses).
FLOAT32_MAX = 3.4028234663852886e38
#: The smallest normal float32: a nonzero factor below it is subnormal (digits lost) or 0 in
#: float32.
FLOAT32_TINY = 1.1754943508222875e-38
#: The largest count or size (steps, epochs, batch sizes, token lengths, LoRA shapes). A billion
#: iterations or tokens is beyond any run; steps are logged as floats (exact to 2^53) and enter the
#: per-step seeds, which must stay below 2^63 (MAX_SEED), and lengths reach the tokenizers as 64-bit
#: ints.
MAX_COUNT = 10**9
#: The largest seed of every stage. PPO's per-step seeds, (seed * 1_000_003 + step) * 64 + process
#: (trainer._step_seed), must stay below 2^63 for torch's generators; TRL and transformers'
#: set_seed hand the seed to numpy, whose seeds are 32-bit. 2^32 - 1 meets both, with room for
#: 10^11 steps.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class Limit:
    """The magnitudes a float setting may take: [low, high], and 0 as well when `zero` (0 switches
    it off)."""

    low: float  #: smallest magnitude (of a nonzero value when `zero`)
    high: float  #: largest magnitude
    why: str  #: what the setting multiplies or bounds, and so why the range is what it is
    zero: bool = False  #: 0 is allowed too
    signed: bool = False  #: negative values are allowed too (their magnitude in [low, high])
    none: bool = False  #: None is allowed too (it switches the setting off)


# How the ranges are derived. Rewards, values, advantages and losses are float32 (max 3.4e38, 7
# significant digits, spacing 1.2e-7 near 1 and 1e-6 near 10). A setting of the size of the rewards
# (a score clip, a value clip, a penalty added to scores) is squared by the value loss and the
# advantage whitening and summed over a batch of up to ~1e6 tokens: 1e9 gives 1e18 per token, 1e24
# per batch, far inside 3.4e38 (1e20 would overflow). A weight of a loss term (vf, entropy, ptx, KL
# coefficient) multiplies per-token KLs and LM losses of up to ~100 nats: 1e3 keeps every product
# small, and below 1e-6 a term is lost when float32 adds it to terms of order 1.
_REWARD_SCALE = (
    "it is of the size of the rewards, whose squares float32 sums over the batch (1e9 squared is "
    "far inside its 3.4e38); below 1e-6 it is lost against values of order 10")
_WEIGHT = ("it weights a term of the objective in float32: below 1e-6 the term is lost against "
           "terms of order 1 (use 0 to switch it off), and above 1e3 it swamps the rest")
_LEARNING_RATE = (
    "Adam moves each weight by about this much per step: float32 cannot move a weight of order "
    "1e-2 by less than 1e-9, and above 10 one step throws every weight far beyond its scale")
_EPOCHS = "passes over the data (TRL makes an int step count of them): 1e4 is beyond any use"
_DISCOUNT = "a nonzero float32 factor below 1.2e-38 is 0 or subnormal"

#: PPOConfig's float settings (None, where a field allows it, is checked apart: it switches the
#: setting off).
PPO_LIMITS: dict[str, Limit] = {
    "temperature": Limit(1e-2, 1e2, "the logits are divided by it: below 0.01 log-probs and KLs "
                                    "grow like 1/T and sampling is greedy in all but name; above "
                                    "100 it flattens every distribution"),
    "clip_eps": Limit(1e-6, 1e9,
                      "float32 cannot tell 1 +- 6e-8 from 1, and the ratio never exceeds e^20 ~ "
                                 "4.9e8 (the loss's log-ratio bound), so 1e9 already never clips"),
    "value_clip": Limit(1e-6, 1e9, _REWARD_SCALE, none=True),
    "score_clip": Limit(1e-6, 1e9, _REWARD_SCALE, none=True),
    "missing_eos_penalty": Limit(1e-6, 1e9, _REWARD_SCALE, zero=True, signed=True, none=True),
    "vf_coef": Limit(1e-6, 1e3, _WEIGHT, zero=True),
    "entropy_coef": Limit(1e-6, 1e3, _WEIGHT, zero=True),
    "ptx_coef": Limit(1e-6, 1e3, _WEIGHT, zero=True),
    "kl_coef": Limit(1e-6, 1e3, _WEIGHT, zero=True),
    "max_grad_norm": Limit(1e-6, 1e9, "gradients are scaled to this norm: below 1e-6 every element "
                                      "falls under Adam's epsilon (1e-8), and a healthy update "
                                      "never nears 1e6 (the usual 'no clip')"),
    "target_kl": Limit(1e-6, 1e6, "the KL (nats per sequence) is divided by it: below 1e-6 it is "
                                  "float32 noise, and no sequence's KL reaches 1e6", none=True),
    "policy_lr": Limit(1e-9, 10.0, _LEARNING_RATE),
    "value_lr": Limit(1e-9, 10.0, _LEARNING_RATE),
    "gamma": Limit(FLOAT32_TINY, 1.0, _DISCOUNT, zero=True),
    "lam": Limit(FLOAT32_TINY, 1.0, _DISCOUNT, zero=True),
}

#: The profile's own float settings ($RLHF_PROFILE_OVERRIDES reaches them; the reward and SFT
#: trainings use them).
PROFILE_LIMITS: dict[str, Limit] = {
    "reward_epochs": Limit(1e-6, 1e4, _EPOCHS),
    "sft_epochs": Limit(1e-6, 1e4, _EPOCHS),
    "reward_lr": Limit(1e-9, 10.0, _LEARNING_RATE),
    "sft_lr": Limit(1e-9, 10.0, _LEARNING_RATE),
    "compare_seconds": Limit(1e-3, 1e7, "a budget in seconds: under a millisecond no batch runs, "
                                        "and 1e7 s is 116 days"),
}


def show(value: float) -> str:
    """A bound as people write it: 1e-06 -> 1e-6, 1000.0 -> 1000, 1e+09 -> 1e9, 1.1754e-38 ->
    1.2e-38."""
    text = f"{value:g}" if 1e-3 <= value < 1e4 else f"{value:.2g}"
    return re.sub(r"e([+-])0*(\d)",
                  lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), text)


def allowed(limit: Limit) -> str:
    """The range in words: 'in [1e-6, 1e9]', '0 or in [1e-6, 1000]', 'None, 0 or of magnitude in
    [1e-6, 1e9]'."""
    span = f"[{show(limit.low)}, {show(limit.high)}]"
    words = [*(["None"] if limit.none else []), *(["0"] if limit.zero else []),
             f"of magnitude in {span} (either sign)" if limit.signed else f"in {span}"]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def limit_problem(name: str, value: Any, limit: Limit) -> str | None:
    """The error for a number outside `limit` (names the field, the range and why), or None when it
    is inside. NaN and inf are outside every range; a value of the wrong type is the type check's
    business (None here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value == 0 and limit.zero:
        return None
    try:
        magnitude = abs(float(value))
    except OverflowError:  # an int beyond any float
        magnitude = math.inf
    if (limit.signed or value > 0) and limit.low <= magnitude <= limit.high:
        return None
    return f"{name} must be {allowed(limit)}, got {value!r}: {limit.why}"


def check_limits(config: Any, limits: dict[str, Limit], prefix: str = "") -> None:
    """ValueError naming the first field of `config` in `limits` whose value (when not None) is
    outside its range."""
    for name, limit in limits.items():
        value = getattr(config, name)
        problem = None if value is None else limit_problem(prefix + name, value, limit)
        if problem is not None:
            raise ValueError(problem)


def check_big_ints(config: Any, limits: dict[str, Limit]) -> None:
    """`check_limits` for the float fields that hold an int beyond their range: run first, since an
    int too big for a float (a JSON override of 400 digits) makes the plain checks (`math.isfinite`)
    raise OverflowError."""
    for name, limit in limits.items():
        value = getattr(config, name)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit.high:
            raise ValueError(limit_problem(name, value, limit))


def check_counts(config: Any, names: tuple[str, ...], prefix: str = "") -> None:
    """ValueError naming the first of these int fields above MAX_COUNT (the lower bounds are the
    config's own)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value > MAX_COUNT:
            raise ValueError(
                f"{prefix}{name} must be <= 10^9, got {value!r}: a count or size above a billion "
                "is beyond any run (and steps must keep the per-step seeds below 2^63)")


def ints_from(low: int, optional: bool = False) -> str:
    """What an int field bounded below must be, in words: 'an int >= 1', 'None or an int >= 1'."""
    return ("None or " if optional else "") + f"an int >= {low}"


def check_ints_from(config: Any, low: int, names: tuple[str, ...], why: str = "",
                    optional: bool = False) -> None:
    """ValueError naming the first of these int fields below `low` (`why`, if given, in brackets
    after the bound); `optional`: None is allowed too. Types are `check_field_types`' business."""
    for name in names:
        value = getattr(config, name)
        if not (optional and value is None) and value < low:
            reason = f" ({why})" if why else ""
            raise ValueError(f"{name} must be {ints_from(low, optional)}{reason}, got {value!r}")


def _check_finite(config: Any, names: tuple[str, ...], zero: bool) -> None:
    for name in names:
        value = getattr(config, name)
        # compared, not math.isfinite: an int too big for a float is finite, not an OverflowError
        if not ((0 <= value if zero else 0 < value) and value < math.inf):
            bound = ">= 0" if zero else "> 0"
            raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def check_positive(config: Any, names: tuple[str, ...]) -> None:
    """ValueError naming the first of these number fields not finite and > 0 (NaN is neither)."""
    _check_finite(config, names, zero=False)


def check_non_negative(config: Any, names: tuple[str, ...]) -> None:
    """ValueError naming the first of these number fields not finite and >= 0 (NaN is neither)."""
    _check_finite(config, names, zero=True)


def check_seed(config: Any) -> None:
    """ValueError unless the config's int `seed` is in [0, MAX_SEED]."""
    if not 0 <= config.seed <= MAX_SEED:
        raise ValueError(f"seed must be an int in [0, {MAX_SEED}], got {config.seed!r}")
