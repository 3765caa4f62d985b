"""The run doctor's rules on the reward model's limits: its scores sit at score_clip
(`reward_saturated`), or the policy exploits its errors: the hidden score falls while the learned
score holds (`over_optimisation`).

Each rule reads the rows (`rows.Rows`: one per step, every value a float or None) and returns one
Finding or None; a rule whose metrics the history lacks stays silent.
"""

from __future__ import annotations

import math

from rlhf_helpers.doctor.facts import RunFacts
from rlhf_helpers.doctor.findings import Finding
from rlhf_helpers.doctor.registry import finding, rule
from rlhf_helpers.doctor.rows import (
    GLOSSARY_PAGE,
    LAB,
    Rows,
    fmt,
    logged,
    metric,
    passing,
    sustained,
)
from rlhf_helpers.doctor.thresholds import Thresholds


@rule("reward_saturated", "warning", reads=("score_clipped",),
      fires=lambda t: f"score_clipped >= {t.clipped_share:g} at {t.sustain_steps} steps",
      teaches=f"{GLOSSARY_PAGE}#score")
def reward_saturated(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    hits = passing(rows, "score_clipped", lambda v: v >= t.clipped_share)
    if not sustained(hits, logged(rows, "score_clipped"), t):
        return None
    return finding("reward_saturated", [s for s, _ in hits],
                   fmt(hits, "score_clipped") + f" (score_clip {facts.score_clip})",
                   title="the reward model's scores sit at score_clip",
                   meaning="clipped scores are all equal: the reward no longer tells the better of "
                           "two clipped responses",
                   check_first="score_clip (raise it) and whether the policy found responses the "
                               "reward model overrates")


@rule("over_optimisation", "warning",
      reads=("hidden_score", "score", "eval_hidden_score", "eval_score"),
      fires=lambda t: "hidden_score's last third below its best third by > "
                      f"{t.overoptimisation_z:g} standard errors while score did not fall (>= 6 "
                      f"steps); or eval_hidden_score falls > {t.eval_fall:g} from its best "
                      "evaluation to the last while eval_score did not fall",
      teaches=f"{LAB}, section (c)")
def over_optimisation(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    for hidden, learned, test in (("hidden_score", "score", _thirds_fall),
                                  ("eval_hidden_score", "eval_score", _eval_fall)):
        found = test(rows, hidden, learned, t)
        if found:
            steps, evidence = found
            return finding("over_optimisation", steps, evidence,
                           title="the hidden score falls while the learned score holds",
                           meaning="the policy exploits the reward model's errors (reward "
                                   "hacking); the best checkpoint is before the fall",
                           check_first="kl_coef (raise it), stop earlier, and read samples of the "
                                       "late steps")
    return None


def _thirds(values: list[float]) -> list[tuple[float, float]]:
    """(mean, standard error) of the first, middle and last third (as failure_runs.third_stats)."""
    n = len(values)
    cuts = [0, max(1, n // 3), max(2, 2 * n // 3), n]
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        part = values[a:b]
        mean = sum(part) / len(part)
        spread = math.sqrt(sum((v - mean) ** 2 for v in part)
                           / (len(part) - 1)) if len(part) > 1 else math.inf
        out.append((mean, spread / math.sqrt(len(part))))
    return out


def _thirds_fall(rows: Rows, hidden: str, learned: str,
                 t: Thresholds) -> tuple[tuple[int, ...], str] | None:
    pairs = [(int(r["step"]), h, s) for r in rows if (h := metric(r, hidden)) is not None
             and (s := metric(r, learned)) is not None]
    if len(pairs) < 6:
        return None
    h3, s3 = _thirds([h for _, h, _ in pairs]), _thirds([s for _, _, s in pairs])
    best = max(range(2), key=lambda i: h3[i][0])
    fall = h3[best][0] - h3[2][0]
    noise = math.sqrt(h3[best][1] ** 2 + h3[2][1] ** 2)
    if not (fall > t.overoptimisation_z * noise and s3[2][0] >= s3[best][0]):
        return None
    last = tuple(s for s, _, _ in pairs[max(2, 2 * len(pairs) // 3):])
    return last, (f"{hidden} {h3[best][0]:.3g} -> {h3[2][0]:.3g} (best third -> last third: a fall "
                  f"of {fall:.3g}, over {t.overoptimisation_z:g} standard errors of {noise:.2g}) "
                  f"while {learned} {s3[best][0]:.3g} -> {s3[2][0]:.3g}")


def _eval_fall(rows: Rows, hidden: str, learned: str,
               t: Thresholds) -> tuple[tuple[int, ...], str] | None:
    pairs = [(int(r["step"]), h, s) for r in rows if (h := metric(r, hidden)) is not None
             and (s := metric(r, learned)) is not None]
    if len(pairs) < 2:
        return None
    peak = max(range(len(pairs)), key=lambda i: pairs[i][1])
    fall = pairs[peak][1] - pairs[-1][1]
    if not (fall > t.eval_fall and pairs[-1][2] >= pairs[peak][2]):
        return None
    return tuple(s for s, _, _ in pairs[peak + 1:]), (
        f"{hidden} {pairs[peak][1]:.3g} at step {pairs[peak][0]} -> {pairs[-1][1]:.3g} at step "
        f"{pairs[-1][0]} (fall {fall:.3g} > {t.eval_fall:g}) while {learned} {pairs[peak][2]:.3g} "
        f"-> {pairs[-1][2]:.3g}")
