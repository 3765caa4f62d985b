"""The run doctor's rules on whether the update trains the policy that sampled, on the tokens it
sampled: the first minibatch's ratio is 1 (`first_ratio_not_one`), the loss mask keeps the sampled
EOS (`eos_masked`), the k1 KL is not negative beyond chance (`negative_kl`), and the updates stay
in their trust region (`off_policy`). Notebook 06's sections (a), (b) and (d) break each on purpose.

Each rule reads the rows (`rows.Rows`: one per step, every value a float or None) and returns one
Finding or None; a rule whose metrics the history lacks stays silent.
"""

from __future__ import annotations

from rlhf_helpers.doctor.facts import RunFacts
from rlhf_helpers.doctor.findings import Finding
from rlhf_helpers.doctor.registry import finding, rule
from rlhf_helpers.doctor.rows import (
    GLOSSARY_PAGE,
    LAB,
    Rows,
    fmt,
    logged,
    longest_run,
    passing,
    sustained,
)
from rlhf_helpers.doctor.thresholds import Thresholds


@rule("first_ratio_not_one", "error", reads=("first_ratio",),
      fires=lambda t: f"|first_ratio - 1| > {t.ratio_tolerance:g} in float32 (bf16: "
                      f"{t.ratio_tolerance_for('bfloat16'):g}, fp16: "
                      f"{t.ratio_tolerance_for('float16'):g}) at a step; correct updates measured "
                      "< 1e-6 in float32, <= 2.3e-4 in bf16 on an H200",
      teaches=f"{LAB}, section (a)")
def first_ratio_not_one(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    tolerance = t.ratio_tolerance_for(facts.dtype)
    hits = passing(rows, "first_ratio", lambda v: abs(v - 1.0) > tolerance)
    if not hits:
        return None
    return finding("first_ratio_not_one", [s for s, _ in hits],
                   fmt(hits, "first_ratio") + f" (allowed in {facts.dtype}: 1 +- {tolerance:g})",
                   title="the first minibatch's ratio is not 1",
                   meaning="the old log-probs are not those of the policy that sampled: the "
                           "reference's log-probs used as old ones, dropout left on, or a sampling "
                           "temperature the log-probs do not use",
                   check_first="which log-probs become old_logprobs (the sampling policy's, not "
                               "the reference's), model.eval() during rollouts, and the "
                               "temperature in both places")


@rule("eos_masked", "error", reads=("eos_in_mask",),
      fires=lambda t: f"eos_in_mask < 1 - {t.share_tolerance:g} at a step (1 when the mask is "
                      "right)",
      teaches=f"{LAB}, section (b)")
def eos_masked(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    # a share of counts: 1 when the mask is built from the first EOS, whatever the batch (up to the
    # rounding of the float32 arithmetic that may have computed it: share_tolerance)
    hits = passing(rows, "eos_in_mask", lambda v: v < 1.0 - t.share_tolerance)
    if not hits:
        return None
    return finding("eos_masked", [s for s, _ in hits], fmt(hits, "eos_in_mask")
                   + " (the share of sampled EOS tokens the update trains on; 1 when right)",
                   title="the loss mask hides the sampled EOS tokens",
                   meaning="the decision to stop is never trained: a mask of 'not padding' with "
                           "pad == EOS drops the EOS too, and the score lands on the token before "
                           "it",
                   check_first="pad_token_id != eos_token_id (ensure_distinct_pad) and a response "
                               "mask built up to and including the first EOS")


@rule("negative_kl", "warning", reads=("kl",),
      fires=lambda t: f"kl < 0 at {t.negative_kl_steps} steps in a row (by chance at most "
                      f"1/{2 ** t.negative_kl_steps} when the true KL is 0)",
      teaches=f"{LAB}, section (d)")
def negative_kl(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    best = longest_run(rows, "kl", lambda v: v < 0)
    if len(best) < t.negative_kl_steps:
        return None
    return finding("negative_kl", [s for s, _ in best],
                   f"{len(best)} consecutive steps below 0: " + fmt(best, "kl"),
                   title="the k1 KL stays negative",
                   meaning="one negative k1 batch is noise; a run of them means the samples do not "
                           "come from the distribution their log-probs were computed under (a "
                           "temperature or top-k/top-p the log-probs ignore, or mismatched "
                           "log-probs)",
                   check_first="that sampling settings and log-prob computation agree "
                               "(temperature, top-k, top-p); report k3 beside k1")


@rule("off_policy", "warning", reads=("clipfrac", "approx_kl"),
      fires=lambda t: f"clipfrac > {t.clipfrac_high:g} or approx_kl > {t.approx_kl_high:g} at "
                      f"{t.sustain_steps} steps (healthy: 0.016-0.064 and 0.003-0.03)",
      teaches=f"{GLOSSARY_PAGE}#clipfrac and notebooks/04_clip_loss.ipynb")
def off_policy(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    clip = passing(rows, "clipfrac", lambda v: v > t.clipfrac_high)
    kl = passing(rows, "approx_kl", lambda v: v > t.approx_kl_high)
    available = max(logged(rows, "clipfrac"), logged(rows, "approx_kl"))
    hits = sorted({s for s, _ in clip} | {s for s, _ in kl})
    if not sustained([(s, 0.0) for s in hits], available, t):
        return None
    evidence = "; ".join(part for part in (fmt(clip, "clipfrac"), fmt(kl, "approx_kl")) if part)
    return finding("off_policy", hits, evidence
                   + f" (fires above clipfrac {t.clipfrac_high:g} or approx_kl "
                     f"{t.approx_kl_high:g})",
                   title="the updates move the policy far from the one that sampled",
                   meaning="the trust region does not hold: many ratios leave the clip band, their "
                           "tokens get no gradient, and the update drifts from the batch's policy",
                   check_first="the learning rate, ppo_epochs and the number of minibatches per "
                               "epoch (lower them); and first_ratio: old log-probs that are not "
                               "the sampling policy's show the same numbers")
