"""The run doctor's rules for a run in which the policy, or the critic, never trains (rules of
`diagnosis_rules.RULES`). The critic's: `value_grad_norm` exactly 0 at every step
(`critic_never_trains`).

The policy's, three signatures by what the history shows:
- the value warm-up covers the whole run: every step trained the critic alone;
- `policy_grad_norm` (the library's update logs it, 0.0 for a warm-up step or a skipped fp16 step)
  is 0 at every policy step: the loss does not depend on the policy's weights (a loss times 0, every
  advantage 0). Adam moves a weight for any gradient that is not exactly 0, so only exactly 0
  counts;
- without a gradient norm (an `update_fn` of one's own logs only its losses): the rollouts' `kl` to
  the reference stays within rounding of 0 at every step after the first policy update, and the
  update's `approx_kl` within rounding of 0 wherever it is logged: the policy still is the reference
  it started as (a loop that never steps its optimiser). A policy that moved by more than rounding
  is not named, whatever its learning rate.
"""

from __future__ import annotations

from rlhf_helpers.ppo.diagnosis_rows import GLOSSARY_PAGE, LAB, Rows, fmt, metric
from rlhf_helpers.ppo.diagnosis_types import Finding, RunFacts, Thresholds, spans

RULE = "nothing_trains"


def nothing_trains(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    """An error when the policy never trained: a warm-up as long as the run, a policy gradient of
    exactly 0 at every policy step, or (no gradient norm logged) a policy that never left the
    reference."""
    if not rows:
        return None
    warmup = facts.value_warmup_steps
    # the steps whose update trained the policy too
    policy = [row for row in rows if row["step"] > warmup]
    if not policy:
        return _warmup_only(rows, facts)
    norms = [(int(row["step"]), v) for row in policy
             if (v := metric(row, "policy_grad_norm")) is not None]
    if norms:
        return _zero_gradient(norms, warmup) if all(v == 0.0 for _, v in norms) else None
    return _never_moved(rows, policy, facts, t)


def _warmup_only(rows: Rows, facts: RunFacts) -> Finding | None:
    warmup, last = facts.value_warmup_steps, max(int(row["step"]) for row in rows)
    if facts.total_steps is not None and warmup < facts.total_steps:
        # a run still in (or stopped during) its warm-up: the policy's steps are still to come
        return None
    planned = f" (total_steps {facts.total_steps})" if facts.total_steps is not None else ""
    return Finding(
        RULE,
        "error",
        "the policy was never trained",
        tuple(int(row["step"]) for row in rows),
        f"value_warmup_steps {warmup} >= the {last} steps run{planned}: every step trained the "
        "critic alone",
        "a value warm-up as long as the run: the policy's weights are those it started from, and "
        "every score is the SFT model's",
        "value_warmup_steps: a few critic-only steps, far fewer than total_steps",
        f"{LAB}, section (e)",
    )


def _zero_gradient(norms: list[tuple[int, float]], warmup: int) -> Finding:
    after = f" (after the {warmup} warm-up steps)" if warmup else ""
    return Finding(
        RULE,
        "error",
        "the policy's gradient is 0 at every update",
        tuple(s for s, _ in norms),
        f"policy_grad_norm exactly 0 at all {len(norms)} policy steps{after} (steps "
        f"{spans([s for s, _ in norms])}): no update had a gradient to step on",
        "no update moved the policy: its loss does not depend on the policy's weights (multiplied "
        "by 0, or built from detached log-probs), or every advantage is 0",
        "the policy loss (its gradient reaches logprobs: no .detach(), no factor 0), the "
        "advantages (all 0 "
        "when the rewards are constant or the advantage function returns zeros), and policy_lr",
        f"{GLOSSARY_PAGE}#policy_grad_norm",
    )


def _never_moved(rows: Rows, policy: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    # per token, two roundings of one log-prob differ by at most the dtype's ratio tolerance: a
    # sequence's k1 KL by at most that times its length, and approx_kl (about half the squared
    # log-ratio) by its square
    tolerance = t.ratio_tolerance_for(facts.dtype)
    # rollouts after the first policy update come from a moved policy
    moved_since = facts.value_warmup_steps + 1
    later = [row for row in rows if row["step"] > moved_since]
    kls = [
        (int(row["step"]), kl)
        for row in later
        if (kl := metric(row, "kl")) is not None
        and abs(kl) <= tolerance * max(1.0, metric(row, "response_length") or 1.0)
    ]
    if not later or len(kls) < len(later):
        return None
    if any((v := metric(row, "approx_kl")) is not None and v > tolerance**2 for row in policy):
        return None
    return Finding(
        RULE,
        "error",
        "the policy never moved from the reference",
        tuple(s for s, _ in kls),
        fmt(kls, "kl") + " (within rounding of 0 at every step after the first policy update: "
        f"|kl| <= {tolerance:g} per token in {facts.dtype}; no policy_grad_norm logged)",
        "the rollouts still come from the policy the run started with: no update changed its "
        "weights "
        "(an update loop that never calls the policy optimiser's step, or a policy_lr of 0)",
        "that the update loop calls zero_grad, backward and the policy optimiser's step on every "
        "minibatch, with the policy's parameters in that optimiser",
        f"{GLOSSARY_PAGE}#kl",
    )


def critic_never_trains(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    """An error when `value_grad_norm` is logged and exactly 0 at every step that logs it: no update
    gave the critic a gradient (its loss does not depend on the value adapter's weights, or is
    multiplied by 0). The value adapter trains from step 1, warm-up included, so every step counts;
    Adam moves a weight for any gradient that is not exactly 0."""
    norms = [(int(row["step"]), v) for row in rows
             if (v := metric(row, "value_grad_norm")) is not None]
    if not norms or any(v != 0.0 for _, v in norms):
        return None
    return Finding(
        "critic_never_trains",
        "error",
        "the critic's gradient is 0 at every update",
        tuple(s for s, _ in norms),
        f"value_grad_norm exactly 0 at all {len(norms)} steps (steps "
        f"{spans([s for s, _ in norms])}): no update had a gradient to step the critic on",
        "the critic never learns the returns: every advantage keeps the untrained critic's "
        "baseline (its loss does not depend on the value adapter's weights, or is multiplied by 0)",
        "the value loss (its gradient reaches the values: no .detach(), no factor 0) and value_lr",
        f"{GLOSSARY_PAGE}#value_grad_norm",
    )
