"""The run doctor's rules: each reads a run's per-step metrics and returns one Finding, or None.

A rule is a function (rows, facts, thresholds) -> Finding | None; `RULES` lists them in the order
they run. Rows are per-step metric dicts with an int "step", one per step, every value a float or
None (`diagnosis_rows`). A rule whose metrics the history lacks stays silent. Every threshold of
`Thresholds` says where its value comes from. Each rule makes a fixed number of passes over the
rows: the doctor is linear in the history.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rlhf_helpers.ppo.diagnosis_progress import critic_never_trains, nothing_trains
from rlhf_helpers.ppo.diagnosis_rows import (
    GLOSSARY_PAGE,
    LAB,
    Rows,
    fmt,
    logged,
    longest_run,
    metric,
    passing,
    sustained,
)
from rlhf_helpers.ppo.diagnosis_types import Finding, RunFacts, Thresholds


def non_finite(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    # explained_variance is NaN by definition when returns do not vary (no_learning_signal's case)
    bad = [(int(row["step"]), key) for row in rows for key, value in row.items()
           if key not in ("step", "explained_variance")
           and (value is None or (isinstance(value, float)
                                                                             and not math.isfinite(
                                                                                 value)))]
    if not bad:
        return None
    steps = sorted({s for s, _ in bad})
    return Finding("non_finite", "error", "NaN or infinite metrics", tuple(steps),
                   ", ".join(f"step {s}: {k}" for s, k in bad[:6])
                   + (" ..." if len(bad) > 6 else ""),
                   "a loss, a reward or a log-prob overflowed: the weights after it are not usable",
                   "the first step named: its rewards (NaN scores), learning rates, and 16-bit "
                   "overflow (fp16 without loss scaling)", f"{GLOSSARY_PAGE}#policy_grad_norm")


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
        return Finding("no_learning_signal", "error", "the rewards have no spread to learn from",
                       tuple(steps), evidence,
                       "the reward carries no information: every advantage from it is 0 "
                       "(GRPO/RLOO) or only "
                       "the KL penalty and the critic's noise move the policy (PPO)",
                       "the reward function's output on a few responses by hand (a constant such "
                       "as 0.0 from a parsing failure), the reward model's head, and score_clip",
                       f"{GLOSSARY_PAGE}#score and notebooks/07_beyond_ppo.ipynb (group "
                       "advantages)")
    if sustained(groups, logged(rows, "zero_std_fraction"), t):
        return Finding("no_learning_signal", "warning", "most prompt groups got equal rewards",
                       tuple(s for s, _ in groups), fmt(groups, "zero_std_fraction"),
                       "a group whose completions all score the same gives them all advantage 0: "
                       f"at least {t.zero_std_share:.0%} of the batch trains nothing",
                       "whether the reward is too coarse (0/1) for the prompts' difficulty; more "
                       "completions per prompt, or a graded reward",
                       "notebooks/07_beyond_ppo.ipynb (group advantages)")
    return None


def first_ratio_not_one(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    tolerance = t.ratio_tolerance_for(facts.dtype)
    hits = passing(rows, "first_ratio", lambda v: abs(v - 1.0) > tolerance)
    if not hits:
        return None
    return Finding("first_ratio_not_one", "error", "the first minibatch's ratio is not 1",
                   tuple(s for s, _ in hits),
                   fmt(hits, "first_ratio") + f" (allowed in {facts.dtype}: 1 +- {tolerance:g})",
                   "the old log-probs are not those of the policy that sampled: the reference's "
                   "log-probs used as old ones, dropout left on, or a sampling temperature the "
                   "log-probs do not use",
                   "which log-probs become old_logprobs (the sampling policy's, not the "
                   "reference's), model.eval() during rollouts, and the temperature in both places",
                   f"{LAB}, section (a)")


def eos_masked(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    # a share of counts: 1 when the mask is built from the first EOS, whatever the batch (up to the
    # rounding of the float32 arithmetic that may have computed it: share_tolerance)
    hits = passing(rows, "eos_in_mask", lambda v: v < 1.0 - t.share_tolerance)
    if not hits:
        return None
    return Finding("eos_masked", "error", "the loss mask hides the sampled EOS tokens",
                   tuple(s for s, _ in hits), fmt(hits, "eos_in_mask")
                   + " (the share of sampled EOS tokens the update trains on; 1 when right)",
                   "the decision to stop is never trained: a mask of 'not padding' with pad == EOS "
                   "drops the EOS too, and the score lands on the token before it",
                   "pad_token_id != eos_token_id " "(ensure_distinct_pad) and a response mask "
                                                   "built up to and including the first EOS",
                   f"{LAB}, section (b)")


def negative_kl(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    best = longest_run(rows, "kl", lambda v: v < 0)
    if len(best) < t.negative_kl_steps:
        return None
    return Finding("negative_kl", "warning", "the k1 KL stays negative", tuple(s for s, _ in best),
                   f"{len(best)} consecutive steps below 0: " + fmt(best, "kl"),
                   "one negative k1 batch is noise; a run of them means the samples do not come "
                   "from the distribution their log-probs were computed under (a temperature or "
                   "top-k/top-p the log-probs ignore, or mismatched log-probs)",
                   "that sampling settings and log-prob computation agree (temperature, top-k, "
                   "top-p); report k3 beside k1", f"{LAB}, section (d)")


def off_policy(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    clip = passing(rows, "clipfrac", lambda v: v > t.clipfrac_high)
    kl = passing(rows, "approx_kl", lambda v: v > t.approx_kl_high)
    available = max(logged(rows, "clipfrac"), logged(rows, "approx_kl"))
    hits = sorted({s for s, _ in clip} | {s for s, _ in kl})
    if not sustained([(s, 0.0) for s in hits], available, t):
        return None
    evidence = "; ".join(part for part in (fmt(clip, "clipfrac"), fmt(kl, "approx_kl")) if part)
    return Finding(
        "off_policy", "warning", "the updates move the policy far from the one that sampled",
        tuple(hits), evidence
        + f" (fires above clipfrac {t.clipfrac_high:g} or approx_kl {t.approx_kl_high:g})",
        "the trust region does not hold: many ratios leave the clip band, their tokens get no "
        "gradient, and the update drifts from the batch's policy",
        "the learning rate, ppo_epochs and the number of minibatches per epoch (lower them); and "
        "first_ratio: old log-probs that are not the sampling policy's show the same numbers",
        f"{GLOSSARY_PAGE}#clipfrac and notebooks/04_clip_loss.ipynb")


def critic(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    if not logged(rows, "explained_variance"):
        return None
    start = facts.value_warmup_steps + t.critic_grace_steps
    late = [r for r in rows if r["step"] > start]
    stuck = passing(late, "explained_variance", lambda v: v <= 0.0)
    if late and sustained(stuck, logged(late, "explained_variance"),
                          t) and len(stuck) * 2 > len(late):
        return Finding("critic_not_learning", "warning", "the critic explains nothing",
                       tuple(s for s, _ in stuck), fmt(stuck, "explained_variance")
                       + f" (after step {start}: the warm-up plus {t.critic_grace_steps} steps)",
                       "the advantages are the returns' noise: the policy learns slowly or from "
                       "chance",
                       "value_lr, that the value adapter and head are trained (their grad norm), "
                       "and the value mask's alignment with the states",
                       f"{GLOSSARY_PAGE}#explained_variance and {LAB}, " "section (e)")
    first_policy = [r for r in rows if r["step"] == facts.value_warmup_steps + 1]
    cold = passing(first_policy, "explained_variance", lambda v: v < t.cold_critic_ev)
    if cold:
        return Finding("untrained_critic", "info",
                       "the policy's first update used an untrained critic",
                       tuple(s for s, _ in cold), fmt(cold, "explained_variance")
                       + f" (below {t.cold_critic_ev:g}: the critic has not learned the returns "
                         "yet)",
                       "the first advantages have no state-dependent baseline: the policy's first "
                       "update follows the raw, lambda-faded returns, a high-variance signal "
                       "(expected with fresh value adapters and no value warm-up)",
                       "value_warmup_steps: a few critic-only steps before the policy moves",
                       f"{LAB}, section (e)")
    return None


def collapse(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    start = next((v for row in rows if (v := metric(row, "entropy")) is not None), None)
    low = passing(rows, "entropy", lambda v: start is not None and v < t.entropy_drop * start)
    same = passing(rows, "distinct_responses", lambda v: v < t.distinct_floor)
    if sustained(low, logged(rows, "entropy"),
                 t) or sustained(same, logged(rows, "distinct_responses"), t):
        parts = [p for p in (
            fmt(low, "entropy") + (f" (below {t.entropy_drop:g} x step 1's {start:.4g})"
                                                        if low else ""),
            fmt(same, "distinct_responses") + (f" (below {t.distinct_floor:g})" if same else ""))
                 if p]
        return Finding("collapse", "warning", "the policy collapses onto a few responses",
                       tuple(sorted({s for s, _ in low} | {s for s, _ in same})), "; ".join(parts),
                       "mode collapse: every prompt gets (nearly) the same reply, often one the "
                       "reward model overrates",
                       "the learning rate (lower it), kl_coef (raise it), entropy_coef, and a few "
                       "samples by eye", f"{GLOSSARY_PAGE}#entropy and {LAB}, 'Your turn'")
    return None


def length(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    short = passing(rows, "response_length", lambda v: v <= t.short_length)
    if sustained(short, logged(rows, "response_length"), t):
        return Finding("length_collapse", "warning", "responses collapse towards 0 tokens",
                       tuple(s for s, _ in short), fmt(short, "response_length"),
                       "a shorter response returns more: the KL penalty is paid per token, so "
                       "a policy far from the reference (after too large an update) pays less "
                       "the sooner it stops; or the reward model scores short or empty "
                       "responses well. A negative score alone is no reason: with gamma = 1 "
                       "every response is paid its score once, whatever its length",
                       "kl_coef x kl against the score (a KL penalty that outweighs it), the "
                       "learning rate, and the reward of an empty response",
                       f"{GLOSSARY_PAGE}#response_length and {LAB}, 'Your turn'")
    if facts.max_new_tokens:
        at_limit = [(int(r["step"]), e) for r in rows
                    if (e := metric(r, "eos_fraction")) is not None and e < t.eos_floor
                    and (metric(r, "response_length") or 0) >= t.long_share * facts.max_new_tokens]
        if sustained(at_limit, logged(rows, "eos_fraction"), t):
            return Finding("length_runaway", "warning",
                           "responses run to max_new_tokens without an EOS",
                           tuple(s for s, _ in at_limit), fmt(at_limit, "eos_fraction")
                           + f" with the mean length >= {t.long_share:.0%} of max_new_tokens "
                             f"{facts.max_new_tokens}", "length hacking (the reward pays for "
                           "length), or the EOS token never trained (pad equal to EOS masks it "
                           "out)", "pad_token_id != eos_token_id, that the response mask "
                           "keeps the first EOS, and missing_eos_penalty", f"{LAB}, section (b)")
    return None


def reward_saturation(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    hits = passing(rows, "score_clipped", lambda v: v >= t.clipped_share)
    if not sustained(hits, logged(rows, "score_clipped"), t):
        return None
    return Finding("reward_saturated", "warning", "the reward model's scores sit at score_clip",
                   tuple(s for s, _ in hits),
                   fmt(hits, "score_clipped") + f" (score_clip {facts.score_clip})",
                   "clipped scores are all equal: the reward no longer tells the better of two "
                   "clipped responses",
                   "score_clip (raise it) and whether the policy found responses the reward model "
                   "overrates", f"{GLOSSARY_PAGE}#score")


def over_optimisation(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    for hidden, learned, test in (("hidden_score", "score", _thirds_fall),
                                  ("eval_hidden_score", "eval_score",
                                                                             _eval_fall)):
        found = test(rows, hidden, learned, t)
        if found:
            steps, evidence = found
            return Finding("over_optimisation", "warning",
                           "the hidden score falls while the learned score holds", steps, evidence,
                           "the policy exploits the reward model's errors (reward hacking); "
                           "the " "best checkpoint is before the fall", "kl_coef (raise it), stop "
                           "earlier, and read samples of the late steps", f"{LAB}, section (c)")
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


#: every rule, in the order `diagnose` runs them
RULES: tuple[Callable[[Rows, RunFacts, Thresholds], Finding | None], ...] = (
    non_finite, no_learning_signal, first_ratio_not_one, eos_masked, nothing_trains,
    critic_never_trains, negative_kl, off_policy, critic,
    collapse, length, reward_saturation, over_optimisation)
