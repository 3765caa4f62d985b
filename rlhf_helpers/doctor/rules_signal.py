"""The run doctor's rules on whether a run has anything to learn from: every logged number finite
(`non_finite`), and rewards with a spread (`no_learning_signal`).

Each rule reads the rows (`rows.Rows`: one per step, every value a float or None) and returns one
Finding or None; a rule whose metrics the history lacks stays silent.
"""

from __future__ import annotations

import math

from rlhf_helpers.doctor.facts import RunFacts
from rlhf_helpers.doctor.findings import Finding
from rlhf_helpers.doctor.registry import finding, rule
from rlhf_helpers.doctor.rows import GLOSSARY_PAGE, Rows, fmt, logged, metric, passing, sustained
from rlhf_helpers.doctor.thresholds import Thresholds

GROUPS_LESSON = "notebooks/07_beyond_ppo.ipynb (group advantages)"


@rule("non_finite", "error", reads=(),  # every metric
      fires=lambda t: "any logged value is NaN or infinite (explained_variance aside: NaN when "
                      "the returns are constant)",
      teaches=f"{GLOSSARY_PAGE}#policy_grad_norm")
def non_finite(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    # explained_variance is NaN by definition when returns do not vary (no_learning_signal's case)
    bad = [(int(row["step"]), key) for row in rows for key, value in row.items()
           if key not in ("step", "explained_variance")
           and (value is None or (isinstance(value, float) and not math.isfinite(value)))]
    if not bad:
        return None
    steps = sorted({s for s, _ in bad})
    return finding("non_finite", steps,
                   ", ".join(f"step {s}: {k}" for s, k in bad[:6])
                   + (" ..." if len(bad) > 6 else ""),
                   title="NaN or infinite metrics",
                   meaning="a loss, a reward or a log-prob overflowed: the weights after it are "
                           "not usable",
                   check_first="the first step named: its rewards (NaN scores), learning rates, "
                               "and 16-bit overflow (fp16 without loss scaling)")


@rule("no_learning_signal", "error", reads=("score_std", "score"),
      fires=lambda t: f"score_std <= {t.score_spread:g} x max(1, |score|) in float32 (bf16: "
                      f"{t.spread_for('bfloat16'):g}, fp16: {t.spread_for('float16'):g}) at a "
                      "step (all scores equal); from TRL logs also frac_reward_zero_std = 1, and "
                      f"a warning when it is >= {t.zero_std_share:g} at {t.sustain_steps} steps",
      teaches=f"{GLOSSARY_PAGE}#score and {GROUPS_LESSON}")
def no_learning_signal(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    spread = t.spread_for(facts.dtype)  # scores one rounding step apart are equal
    flat = [(int(row["step"]), std) for row in rows if (std := metric(row, "score_std")) is not None
            and std <= spread * max(1.0, abs(metric(row, "score") or 0.0))]
    groups = passing(rows, "zero_std_fraction", lambda v: v >= t.zero_std_share)
    # a share of counts: 1 up to rounding
    all_groups = [(s, v) for s, v in groups if v >= 1.0 - t.share_tolerance]
    if flat or all_groups:
        steps = sorted({s for s, _ in flat} | {s for s, _ in all_groups})
        evidence = fmt(flat, "score_std") if flat else fmt(all_groups, "zero_std_fraction")
        # TRL's reward_std is the mean spread within prompt groups: 0 there is "every group flat",
        # the same verdict
        return finding("no_learning_signal", steps, evidence,
                       title="the rewards have no spread to learn from",
                       meaning="the reward carries no information: every advantage from it is 0 "
                               "(GRPO/RLOO) or only the KL penalty and the critic's noise move the "
                               "policy (PPO)",
                       check_first="the reward function's output on a few responses by hand (a "
                                   "constant such as 0.0 from a parsing failure), the reward "
                                   "model's head, and score_clip")
    if sustained(groups, logged(rows, "zero_std_fraction"), t):
        return finding("no_learning_signal", [s for s, _ in groups],
                       fmt(groups, "zero_std_fraction"), severity="warning",
                       title="most prompt groups got equal rewards",
                       meaning="a group whose completions all score the same gives them all "
                               f"advantage 0: at least {t.zero_std_share:.0%} of the batch trains "
                               "nothing",
                       check_first="whether the reward is too coarse (0/1) for the prompts' "
                                   "difficulty; more completions per prompt, or a graded reward",
                       learn_more=GROUPS_LESSON)
    return None
