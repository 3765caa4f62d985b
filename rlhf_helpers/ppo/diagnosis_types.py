"""What the run doctor reports and reads: a Finding, the run's settings (RunFacts) and the rules' Thresholds.

Every threshold says where its value comes from: docs/metrics.md's healthy ranges (one 60-step tiny-profile
run, seed 0, and its --kl-coef 0 / 0.05 variants), measured runs, or plain arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rlhf_helpers.core.tolerances import HALF_RTOL_EPS

#: machine epsilon of the float formats a run computes in (torch.finfo(dtype).eps)
EPS = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


@dataclass(frozen=True)
class Finding:
    """One failure signature a run shows."""

    rule: str  #: the rule's name, e.g. "first_ratio_not_one"
    severity: str  #: "error" (the run is broken), "warning" (likely a problem), "info" (worth knowing)
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

    max_new_tokens: int | None = None  #: the response length limit (None: unknown; the long-length rule is off)
    score_clip: float | None = None  #: the reward clip (None: off; the saturation rule reads `score_clipped`)
    value_warmup_steps: int = 0  #: critic-only steps before the policy's first update
    dtype: str = "float32"  #: the precision of the forward passes ("float32", "bfloat16", "float16")
    source: str = "rlhf_helpers"  #: who wrote the history: "rlhf_helpers" or "trl"


@dataclass(frozen=True)
class Thresholds:
    """The rules' thresholds, each with where its value comes from (docs/metrics.md has the healthy ranges:
    one 60-step tiny-profile run, seed 0, and its --kl-coef 0 / 0.05 variants)."""

    #: score_std <= this x max(1, |score|): the batch's scores are equal. float32 keeps equal scores equal and
    #: rounds different ones apart by more than its eps (1.2e-7); a healthy tiny batch has score_std 0.27-1.78.
    score_spread: float = 1e-6
    #: share of prompt groups with equal rewards (TRL's frac_reward_zero_std) from which at most half the batch
    #: carries an advantage: the group advantage of such a group is 0 for every completion.
    zero_std_share: float = 0.5
    #: |first_ratio - 1| allowed in float32/64. A correct update measured < 1.2e-7 (60 tiny steps); 1e-4 is the
    #: course's float32 tolerance for two roundings of one computation. 16-bit runs: HALF_RTOL_EPS x eps.
    ratio_tolerance: float = 1e-4
    #: consecutive steps with a negative mean k1 sequence KL. k1's batch mean is an unbiased, roughly
    #: symmetric estimate of a KL >= 0: at a true KL of 0 each step is negative with probability <= 1/2, five
    #: in a row with <= 1/32; a learning policy's KL is positive from step 2 on (glossary: kl).
    negative_kl_steps: int = 5
    #: clip fraction above which most of an update's tokens get no gradient: glossary "above ~0.2-0.3"
    #: (healthy 0.016-0.064; 0.08-0.11 with kl_coef 0).
    clipfrac_high: float = 0.2
    #: approx-KL (nats per token) of one update above which the trust region does not hold: glossary
    #: "above ~0.05-0.1" (healthy 0.003-0.03; 0.02-0.05 with kl_coef 0).
    approx_kl_high: float = 0.05
    #: steps a condition must hold (or every step of a shorter run) to count as sustained, not one noisy step
    sustain_steps: int = 3
    #: steps after the warm-up before the critic must explain something: glossary explained_variance "about 0
    #: at step 1 (untrained critic), 0.2-0.55 within a few steps".
    critic_grace_steps: int = 5
    #: explained variance at the policy's first update below which the critic counts as untrained: an untrained
    #: critic measured within 0.03 of 0, one after 4 warm-up steps 0.15-0.3 (notebook 06, (e), three seeds).
    cold_critic_ev: float = 0.1
    #: entropy below this share of the first step's: collapse. A healthy tiny run keeps >= 0.87 of it
    #: (glossary: 1.6-1.76 early, 1.54-1.67 late); half of it is far outside that.
    entropy_drop: float = 0.5
    #: share of distinct responses in a batch below which the policy has collapsed onto a few replies
    #: (a healthy tiny batch: 0.97-1.0 distinct).
    distinct_floor: float = 0.5
    #: mean response length (tokens) at or below which responses have collapsed (glossary response_length:
    #: "collapsing to 1-2 tokens"; healthy 17-24).
    short_length: float = 2.0
    #: eos_fraction below this with the mean length near max_new_tokens: responses run to the limit
    #: (glossary eos_fraction: healthy 0.97-1.0).
    eos_floor: float = 0.5
    #: mean length at or above this share of max_new_tokens counts as "at the limit"
    long_share: float = 0.9
    #: share of scores at +-score_clip from which the reward model is saturated: half the batch no longer
    #: tells a better response from a worse one.
    clipped_share: float = 0.5
    #: over-optimisation: the hidden score's last third below its best third by more than this many standard
    #: errors of the difference (thirds of a curve: `third_stats`), while the learned score did not fall.
    overoptimisation_z: float = 2.0
    #: the same on held-out evaluations: a fall of the hidden score from its best evaluation to the last one
    #: beyond this (glossary eval_hidden_score: healthy 0.87-1.01, range 0.14; kl_coef 0: 0.02 to -2.84).
    eval_fall: float = 0.5

    def ratio_tolerance_for(self, dtype: str) -> float:
        """The first-ratio tolerance of a precision: 16-bit floats round a log-prob to HALF_RTOL_EPS x eps."""
        return max(self.ratio_tolerance, HALF_RTOL_EPS * EPS[dtype]) if dtype in EPS else self.ratio_tolerance


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
    """rule -> (the metrics it reads, when it fires under thresholds `t`): what docs/metrics.md lists."""
    t = t or Thresholds()
    n = t.sustain_steps
    return {
        "non_finite": ((),  # every metric
                       "error: any logged value is NaN or infinite (explained_variance aside: NaN when the returns "
                       "are constant)"),
        "no_learning_signal": (("score_std", "score"),
                               f"error: score_std <= {t.score_spread:g} x max(1, |score|) at a step (all scores "
                               f"equal); from TRL logs also frac_reward_zero_std = 1, and a warning when it is >= "
                               f"{t.zero_std_share:g} at {n} steps"),
        "first_ratio_not_one": (("first_ratio",),
                                f"error: |first_ratio - 1| > {t.ratio_tolerance:g} in float32 (bf16: "
                                f"{t.ratio_tolerance_for('bfloat16'):g}, fp16: {t.ratio_tolerance_for('float16'):g}) "
                                "at a step; a correct update measured < 1e-6"),
        "eos_masked": (("eos_in_mask",), "error: eos_in_mask < 1 at a step (exactly 1 when the mask is right)"),
        "negative_kl": (("kl",), f"warning: kl < 0 at {t.negative_kl_steps} steps in a row (by chance at most "
                                 f"1/{2 ** t.negative_kl_steps} when the true KL is 0)"),
        "off_policy": (("clipfrac", "approx_kl"),
                       f"warning: clipfrac > {t.clipfrac_high:g} or approx_kl > {t.approx_kl_high:g} at {n} steps "
                       "(healthy: 0.016-0.064 and 0.003-0.03)"),
        "critic_not_learning": (("explained_variance",),
                                f"warning: explained_variance <= 0 at {n} steps, and at more than half the steps, "
                                f"after the warm-up plus {t.critic_grace_steps} steps (healthy: 0.2-0.55 within a "
                                "few steps)"),
        "untrained_critic": (("explained_variance",),
                             f"info: explained_variance < {t.cold_critic_ev:g} at the policy's first update (no "
                             "value warm-up)"),
        "collapse": (("entropy", "distinct_responses"),
                     f"warning: entropy below {t.entropy_drop:g} x its step-1 value, or distinct_responses < "
                     f"{t.distinct_floor:g}, at {n} steps"),
        "length_collapse": (("response_length",), f"warning: response_length <= {t.short_length:g} tokens at {n} "
                                                  "steps"),
        "length_runaway": (("eos_fraction", "response_length"),
                           f"warning: eos_fraction < {t.eos_floor:g} with response_length >= {t.long_share:.0%} of "
                           f"max_new_tokens at {n} steps"),
        "reward_saturated": (("score_clipped",), f"warning: score_clipped >= {t.clipped_share:g} at {n} steps"),
        "over_optimisation": (("hidden_score", "score", "eval_hidden_score", "eval_score"),
                              f"warning: hidden_score's last third below its best third by > {t.overoptimisation_z:g} "
                              "standard errors while score did not fall (>= 6 steps); or eval_hidden_score falls > "
                              f"{t.eval_fall:g} from its best evaluation to the last while eval_score did not fall"),
    }
