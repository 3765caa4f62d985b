"""What the run doctor reports and reads: a Finding, the run's settings (RunFacts), rule Thresholds.

Every threshold says where its value comes from: docs/metrics.md's healthy ranges (one 60-step
tiny-profile run, seed 0, and its --kl-coef 0 / 0.05 variants), measured runs, or plain arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rlhf_helpers.core.tolerances import (
    FLOAT32_RATIO_TOLERANCE,
    FLOAT32_SPREAD_TOLERANCE,
    SHARE_TOLERANCE,
    dtype_name,
    ratio_tolerance,
    spread_tolerance,
)


@dataclass(frozen=True)
class Finding:
    """One failure signature a run shows."""

    rule: str  #: the rule's name, e.g. "first_ratio_not_one"
    #: "error" (the run is broken), "warning" (likely a problem), "info" (worth knowing)
    severity: str
    title: str  #: the signature in a few words
    steps: tuple[int, ...]  #: the steps where it holds
    evidence: str  #: the numbers that show it
    meaning: str  #: what it usually means
    check_first: str  #: what to check first
    learn_more: str  #: the notebook section or glossary entry that teaches it

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "steps": list(self.steps)}

    def where(self) -> str:
        """"step 3" or "steps 1-3, 7"."""
        return f"step {self.steps[0]}" if len(self.steps) == 1 else f"steps {spans(self.steps)}"

    def text(self) -> str:
        """A few lines for a terminal or a notebook."""
        return (f"[{self.severity}] {self.rule}: {self.title} ({self.where()})\n"
                f"    evidence: {self.evidence}\n    usually: {self.meaning}\n"
                f"    check first: {self.check_first}\n    learn more: {self.learn_more}")


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


#: Thresholds that count steps (ints >= 1; critic_grace_steps >= 0), that are shares (in [0, 1]) and
#: that are sizes (>= 0); the other (cold_critic_ev, an explained variance) is any finite number
COUNTS = ("negative_kl_steps", "sustain_steps", "critic_grace_steps")
SHARES = ("zero_std_share", "share_tolerance", "clipfrac_high", "entropy_drop", "distinct_floor",
          "eos_floor", "long_share", "clipped_share")
NON_NEGATIVE = ("score_spread", "ratio_tolerance", "approx_kl_high", "short_length",
                "overoptimisation_z", "eval_fall")


@dataclass(frozen=True)
class Thresholds:
    """The rules' thresholds, each with where its value comes from (docs/metrics.md has the healthy
    ranges: one 60-step tiny-profile run, seed 0, and its --kl-coef 0 / 0.05 variants) and the runs
    it was checked on (`CHECKED_ON`). The comparisons that rounding can tip (first_ratio, the shares
    of counts, equal scores) take their tolerance from the run's compute dtype
    (`core.tolerances`)."""

    #: score_std <= this x max(1, |score|): the batch's scores are equal. float32 keeps equal scores
    #: equal and rounds different ones apart by more than its eps (1.2e-7); a healthy tiny batch has
    #: score_std 0.27-1.78. 16-bit runs: one eps of their dtype (`spread_for`; the H200 bf16 run's
    #: score_std: 0.6-0.76).
    score_spread: float = FLOAT32_SPREAD_TOLERANCE
    #: share of prompt groups with equal rewards (TRL's frac_reward_zero_std) from which at most
    #: half the batch carries an advantage: the group advantage of such a group is 0 for every
    #: completion.
    zero_std_share: float = 0.5
    #: |first_ratio - 1| allowed in float32/64. A correct update measured < 1.2e-7 (60 tiny steps);
    #: 1e-4 is the course's float32 tolerance for two roundings of one computation. 16-bit runs: eps
    #: / 8 (`ratio_tolerance_for`, core.tolerances.HALF_RATIO_EPS says why: bf16 9.8e-4, fp16
    #: 1.2e-4).
    ratio_tolerance: float = FLOAT32_RATIO_TOLERANCE
    #: a share of counts (eos_in_mask, zero_std_fraction) within this of 1 is 1: a share missing one
    #: count in 10^5 is 1 - 1e-5; float32 arithmetic on an exact 1 errs by ~6e-8 (the H200 run
    #: logged 0.99999994).
    share_tolerance: float = SHARE_TOLERANCE
    #: consecutive steps with a negative mean k1 sequence KL. k1's batch mean is an unbiased,
    #: roughly symmetric estimate of a KL >= 0: at a true KL of 0 each step is negative with
    #: probability <= 1/2, five in a row with <= 1/32; a learning policy's KL is positive from step
    #: 2 on (glossary: kl).
    negative_kl_steps: int = 5
    #: clip fraction above which most of an update's tokens get no gradient: glossary "above
    #: ~0.2-0.3" (healthy 0.016-0.064; 0.08-0.11 with kl_coef 0).
    clipfrac_high: float = 0.2
    #: approx-KL (nats per token) of one update above which the trust region does not hold: glossary
    #: "above ~0.05-0.1" (healthy 0.003-0.03; 0.02-0.05 with kl_coef 0).
    approx_kl_high: float = 0.05
    #: steps a condition must hold (or all steps of a shorter run) to be sustained, not a noisy step
    sustain_steps: int = 3
    #: steps after the warm-up before the critic must explain something: glossary explained_variance
    #: "about 0 at step 1 (untrained critic), 0.2-0.55 within a few steps".
    critic_grace_steps: int = 5
    #: explained variance at the policy's first update below which the critic counts as untrained:
    #: an untrained critic measured within 0.03 of 0, one after 4 warm-up steps 0.15-0.3 (notebook
    #: 06, (e), three seeds).
    cold_critic_ev: float = 0.1
    #: entropy below this share of the first step's: collapse. A healthy tiny run keeps >= 0.87 of
    #: it (glossary: 1.6-1.76 early, 1.54-1.67 late); half of it is far outside that.
    entropy_drop: float = 0.5
    #: share of distinct responses in a batch below which the policy has collapsed onto a few
    #: replies (a healthy tiny batch: 0.97-1.0 distinct).
    distinct_floor: float = 0.5
    #: mean response length (tokens) at or below which responses have collapsed (glossary
    #: response_length: "collapsing to 1-2 tokens"; healthy 17-24).
    short_length: float = 2.0
    #: eos_fraction below this with the mean length near max_new_tokens: responses run to the limit
    #: (glossary eos_fraction: healthy 0.97-1.0).
    eos_floor: float = 0.5
    #: mean length at or above this share of max_new_tokens counts as "at the limit"
    long_share: float = 0.9
    #: share of scores at +-score_clip from which the reward model is saturated: half the batch no
    #: longer tells a better response from a worse one.
    clipped_share: float = 0.5
    #: over-optimisation: the hidden score's last third below its best third by more than this many
    #: standard errors of the difference (thirds of a curve: `third_stats`), while the learned score
    #: did not fall.
    overoptimisation_z: float = 2.0
    #: the same on held-out evaluations: a fall of the hidden score from its best evaluation to the
    #: last one beyond this (glossary eval_hidden_score: healthy 0.87-1.01, range 0.14; kl_coef 0:
    #: 0.02 to -2.84).
    eval_fall: float = 0.5

    def __post_init__(self) -> None:
        # a threshold out of its range fires a rule on a healthy run (a count of -1 steps) or turns
        # it off silently (NaN compares false): each is refused by name
        for name, value in asdict(self).items():
            if name in COUNTS:
                low = 0 if name == "critic_grace_steps" else 1
                if type(value) is not int or value < low:
                    raise ValueError(f"Thresholds.{name} must be an int >= {low}, got "
                                     f"{type(value).__name__} {value!r:.40}")
                continue
            low, high = ((0, 1) if name in SHARES else (0, None) if name in NON_NEGATIVE
                         else (None, None))
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)
                    or (low is not None and value < low) or (high is not None and value > high)):
                wanted = (f" in [{low}, {high}]" if high is not None else f" >= {low}"
                          if low is not None else "")
                raise ValueError(f"Thresholds.{name} must be a finite number{wanted}, got "
                                 f"{type(value).__name__} {value!r:.40}")

    def ratio_tolerance_for(self, dtype: str) -> float:
        """The first-ratio tolerance of a compute dtype (any spelling): `ratio_tolerance` in
        float32/64, at least eps / 8 in a 16-bit dtype (`core.tolerances.ratio_tolerance`)."""
        return ratio_tolerance(dtype, float32=self.ratio_tolerance)

    def spread_for(self, dtype: str) -> float:
        """Relative spread under which a batch's scores are equal in a dtype (any spelling)."""
        return spread_tolerance(dtype, float32=self.score_spread)


#: threshold -> the runs it was checked on: the healthy ones stay on its healthy side, the broken
#: ones (where named) cross it. "tiny float32": the tiny profile's 60-step runs (docs/metrics.md)
#: and the tests' healthy histories; "CPU bf16/fp16": tests/stages/test_gpu_paths.py's gpu-profile
#: runs on the CPU (random SmolLM2-shaped weights, and the GGUF weights in bf16); "H200":
#: tests/fixtures/gpu-runs/h200-2026-11-27-cli (bf16, 20 steps).
CHECKED_ON: dict[str, str] = {
    "score_spread": "tiny float32 (score_std 0.27-1.78), CPU bf16/fp16, H200 (0.6-0.76); a "
                    "constant reward crosses it",
    "zero_std_share": "TRL GRPO logs of the tests (a constant reward crosses it); our runs do not "
                      "log it",
    "ratio_tolerance": "tiny float32 (< 1.2e-7), CPU bf16/fp16 (0), H200 bf16 (<= 2.3e-4 against "
                       "9.8e-4); the reference as old log-probs crosses it in float32, bf16 and "
                       "fp16 from the policy's first move (toy runs); not yet checked: fp16 or "
                       "real weights on a GPU. nothing_trains scales it by the length: a policy "
                       "that never moved samples a kl of 0 to 1.2e-7 (toy float32), one that moved "
                       "0.19 (toy), 0.22 (tiny), 0.27 (H200) at step 2",
    "share_tolerance": "tiny float32 and CPU bf16/fp16 (exactly 1), H200 (0.99999994); pad == EOS "
                       "crosses it (0)",
    "negative_kl_steps": "tiny float32, CPU bf16/fp16, H200 (KL >= 0 from step 2); a count of "
                         "steps, not a value: rounding is as likely to push a step's KL up as down",
    "clipfrac_high": "tiny float32 (0.016-0.064), H200 (0.0094-0.047); notebook 06's 30x learning "
                     "rate crosses it",
    "approx_kl_high": "tiny float32 (0.003-0.03), H200 (0.0014-0.0073); notebook 06's 30x learning "
                      "rate crosses it",
    "sustain_steps": "a count of steps: the same in every dtype",
    "critic_grace_steps": "tiny float32 (explained variance 0.2-0.55 within a few steps), H200 (up "
                          "to 0.64)",
    "cold_critic_ev": "tiny float32 (within 0.03 of 0 untrained, 0.15-0.3 warmed up), H200 (-0.07 "
                      "at step 1)",
    "entropy_drop": "tiny float32 (>= 0.87 of step 1's), H200 (5.8-7.3 nats: >= 0.79 of step 1's)",
    "distinct_floor": "tiny float32 (0.97-1.0), H200 (0.99-1.0)",
    "short_length": "tiny float32 (17-24 tokens), H200 (16-26)",
    "eos_floor": "tiny float32 (0.97-1.0), H200 (0.95-1.0)",
    "long_share": "a share of max_new_tokens: the same in every dtype",
    "clipped_share": "a share of the batch: the same in every dtype (no run of these logs "
                     "score_clip)",
    "overoptimisation_z": "tiny float32 (docs/metrics.md's runs), CPU bf16/fp16 and H200 (silent, "
                          "20 steps)",
    "eval_fall": "tiny float32 (healthy range 0.14; kl_coef 0 falls 2.86), H200 (silent: 2 "
                 "evaluations)",
}


def spans(steps: Sequence[int]) -> str:
    """1, 2, 3, 7 -> "1-3, 7"."""
    out, start = [], None
    steps = sorted(set(steps))
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(f"{start}" if start == s else f"{start}-{s}")
            start = None
    return ", ".join(out) or "-"


def rule_docs(t: Thresholds | None = None) -> dict[str, tuple[tuple[str, ...], str]]:
    """rule -> (metrics it reads, when it fires under thresholds `t`), as docs/metrics.md lists."""
    t = t or Thresholds()
    return {**_error_rule_docs(t), **_warning_rule_docs(t)}


def _error_rule_docs(t: Thresholds) -> dict[str, tuple[tuple[str, ...], str]]:
    """The error rules' part of `rule_docs`."""
    n = t.sustain_steps
    return {
        "non_finite": ((),  # every metric
                       "error: any logged value is NaN or infinite (explained_variance aside: NaN "
                       "when the returns are constant)"),
        "no_learning_signal": (("score_std", "score"),
                               f"error: score_std <= {t.score_spread:g} x max(1, |score|) in "
                               f"float32 (bf16: {t.spread_for('bfloat16'):g}, fp16: "
                               f"{t.spread_for('float16'):g}) at a step (all scores equal); from "
                               "TRL logs also frac_reward_zero_std = 1, and a warning when it "
                               f"is >= {t.zero_std_share:g} at {n} steps"),
        "first_ratio_not_one": (("first_ratio",),
                                f"error: |first_ratio - 1| > {t.ratio_tolerance:g} in float32 "
                                f"(bf16: {t.ratio_tolerance_for('bfloat16'):g}, fp16: "
                                f"{t.ratio_tolerance_for('float16'):g}) at a step; correct updates "
                                "measured < 1e-6 in float32, <= 2.3e-4 in bf16 on an H200"),
        "eos_masked": (("eos_in_mask",), f"error: eos_in_mask < 1 - {t.share_tolerance:g} at a "
                                         "step (1 when the mask is right)"),
        "nothing_trains": (("policy_grad_norm", "kl", "approx_kl"),
                           "error: value_warmup_steps >= total_steps (or the steps run); or "
                           "policy_grad_norm exactly 0 at every policy step; or, without a "
                           "policy_grad_norm, |kl| within the dtype's rounding "
                           f"({t.ratio_tolerance:g} per token in float32, "
                           f"{t.ratio_tolerance_for('bfloat16'):g} in bf16) at every step after "
                           "the first policy update and approx_kl within its square"),
        "critic_never_trains": (("value_grad_norm",),
                                "error: value_grad_norm exactly 0 at every step that logs it"),
        "damaged_checkpoint": ((),
                               "error: a step-NNNNNN checkpoint of the run folder whose files do "
                                   "not match their SHA-256 in its manifest.json (or are missing); "
                                   "the evidence names the newest intact checkpoint. A checkpoint "
                                   "saved without a manifest is read back, a note at most"),
    }


def _warning_rule_docs(t: Thresholds) -> dict[str, tuple[tuple[str, ...], str]]:
    """The warning and info rules' part of `rule_docs`."""
    n = t.sustain_steps
    return {
        "negative_kl": (("kl",),
                        f"warning: kl < 0 at {t.negative_kl_steps} steps in a row (by chance at "
                                 f"most 1/{2 ** t.negative_kl_steps} when the true KL is 0)"),
        "off_policy": (("clipfrac", "approx_kl"),
                       f"warning: clipfrac > {t.clipfrac_high:g} or approx_kl > "
                       f"{t.approx_kl_high:g} at {n} steps (healthy: 0.016-0.064 and 0.003-0.03)"),
        "critic_not_learning": (("explained_variance",),
                                f"warning: explained_variance <= 0 at {n} steps, and at more than "
                                f"half the steps, after the warm-up plus {t.critic_grace_steps} "
                                "steps (healthy: 0.2-0.55 within a few steps)"),
        "untrained_critic": (("explained_variance",),
                             f"info: explained_variance < {t.cold_critic_ev:g} at the policy's "
                             "first update (no value warm-up)"),
        "collapse": (("entropy", "distinct_responses"),
                     f"warning: entropy below {t.entropy_drop:g} x its step-1 value, or "
                     f"distinct_responses < {t.distinct_floor:g}, at {n} steps"),
        "length_collapse": (("response_length",), f"warning: response_length <= {t.short_length:g} "
                                                  f"tokens at {n} steps"),
        "length_runaway": (("eos_fraction", "response_length"),
                           f"warning: eos_fraction < {t.eos_floor:g} with response_length >= "
                           f"{t.long_share:.0%} of max_new_tokens at {n} steps"),
        "reward_saturated": (("score_clipped",),
                             f"warning: score_clipped >= {t.clipped_share:g} at {n} steps"),
        "over_optimisation": (("hidden_score", "score", "eval_hidden_score", "eval_score"),
                              "warning: hidden_score's last third below its best third by > "
                              f"{t.overoptimisation_z:g} standard errors while score did not fall "
                              f"(>= 6 steps); or eval_hidden_score falls > {t.eval_fall:g} from "
                              "its best evaluation to the last while eval_score did not fall"),
    }


def rule_reads() -> dict[str, tuple[str, ...]]:
    """rule -> the metrics it reads (`rule_docs`'s first part, which thresholds do not change)."""
    return {rule: metrics for rule, (metrics, _) in rule_docs().items()}
