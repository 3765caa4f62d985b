"""The run doctor's rule thresholds (`Thresholds`) and the runs each was checked on (`CHECKED_ON`).

Every threshold says where its value comes from: docs/metrics.md's healthy ranges (one 60-step
tiny-profile run, seed 0, and its --kl-coef 0 / 0.05 variants), measured runs, or plain arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from rlhf_helpers.core.tolerances import (
    FLOAT32_RATIO_TOLERANCE,
    FLOAT32_SPREAD_TOLERANCE,
    SHARE_TOLERANCE,
    ratio_tolerance,
    spread_tolerance,
)

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
