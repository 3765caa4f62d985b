"""The run doctor's rules on whether the policy and the critic learn: the policy never trains
(`nothing_trains`), the critic never trains (`critic_never_trains`: `value_grad_norm` exactly 0 at
every step), explains nothing after its warm-up (`critic_not_learning`), or was untrained at the
policy's first update (`untrained_critic`, info: expected without a value warm-up).

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

from rlhf_helpers.doctor.facts import RunFacts
from rlhf_helpers.doctor.findings import Finding, spans
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

RULE = "nothing_trains"


@rule(RULE, "error", reads=("policy_grad_norm", "kl", "approx_kl"),
      fires=lambda t: "value_warmup_steps >= total_steps (or the steps run); or policy_grad_norm "
                      "exactly 0 at every policy step; or, without a policy_grad_norm, |kl| within "
                      f"the dtype's rounding ({t.ratio_tolerance:g} per token in float32, "
                      f"{t.ratio_tolerance_for('bfloat16'):g} in bf16) at every step after the "
                      "first policy update and approx_kl within its square",
      teaches=f"{GLOSSARY_PAGE}#policy_grad_norm")
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
    return finding(
        RULE, [int(row["step"]) for row in rows],
        f"value_warmup_steps {warmup} >= the {last} steps run{planned}: every step trained the "
        "critic alone",
        title="the policy was never trained",
        meaning="a value warm-up as long as the run: the policy's weights are those it started "
                "from, and every score is the SFT model's",
        check_first="value_warmup_steps: a few critic-only steps, far fewer than total_steps",
        learn_more=f"{LAB}, section (e)")


def _zero_gradient(norms: list[tuple[int, float]], warmup: int) -> Finding:
    after = f" (after the {warmup} warm-up steps)" if warmup else ""
    return finding(
        RULE, [s for s, _ in norms],
        f"policy_grad_norm exactly 0 at all {len(norms)} policy steps{after} (steps "
        f"{spans([s for s, _ in norms])}): no update had a gradient to step on",
        title="the policy's gradient is 0 at every update",
        meaning="no update moved the policy: its loss does not depend on the policy's weights "
                "(multiplied by 0, or built from detached log-probs), or every advantage is 0",
        check_first="the policy loss (its gradient reaches logprobs: no .detach(), no factor 0), "
                    "the advantages (all 0 when the rewards are constant or the advantage "
                    "function returns zeros), and policy_lr")


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
    return finding(
        RULE, [s for s, _ in kls],
        fmt(kls, "kl") + " (within rounding of 0 at every step after the first policy update: "
        f"|kl| <= {tolerance:g} per token in {facts.dtype}; no policy_grad_norm logged)",
        title="the policy never moved from the reference",
        meaning="the rollouts still come from the policy the run started with: no update changed "
                "its weights (an update loop that never calls the policy optimiser's step, or a "
                "policy_lr of 0)",
        check_first="that the update loop calls zero_grad, backward and the policy optimiser's "
                    "step on every minibatch, with the policy's parameters in that optimiser",
        learn_more=f"{GLOSSARY_PAGE}#kl")


@rule("critic_never_trains", "error", reads=("value_grad_norm",),
      fires=lambda t: "value_grad_norm exactly 0 at every step that logs it",
      teaches=f"{GLOSSARY_PAGE}#value_grad_norm")
def critic_never_trains(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    """An error when `value_grad_norm` is logged and exactly 0 at every step that logs it: no update
    gave the critic a gradient (its loss does not depend on the value adapter's weights, or is
    multiplied by 0). The value adapter trains from step 1, warm-up included, so every step counts;
    Adam moves a weight for any gradient that is not exactly 0."""
    norms = [(int(row["step"]), v) for row in rows
             if (v := metric(row, "value_grad_norm")) is not None]
    if not norms or any(v != 0.0 for _, v in norms):
        return None
    return finding(
        "critic_never_trains", [s for s, _ in norms],
        f"value_grad_norm exactly 0 at all {len(norms)} steps (steps "
        f"{spans([s for s, _ in norms])}): no update had a gradient to step the critic on",
        title="the critic's gradient is 0 at every update",
        meaning="the critic never learns the returns: every advantage keeps the untrained "
                "critic's baseline (its loss does not depend on the value adapter's weights, or is "
                "multiplied by 0)",
        check_first="the value loss (its gradient reaches the values: no .detach(), no factor 0) "
                    "and value_lr")


@rule("critic_not_learning", "warning", reads=("explained_variance",),
      fires=lambda t: f"explained_variance <= 0 at {t.sustain_steps} steps, and at more than half "
                      f"the steps, after the warm-up plus {t.critic_grace_steps} steps (healthy: "
                      "0.2-0.55 within a few steps)",
      teaches=f"{GLOSSARY_PAGE}#explained_variance and {LAB}, section (e)")
def critic_not_learning(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    if not logged(rows, "explained_variance"):
        return None
    start = facts.value_warmup_steps + t.critic_grace_steps
    late = [r for r in rows if r["step"] > start]
    stuck = passing(late, "explained_variance", lambda v: v <= 0.0)
    if not (late and sustained(stuck, logged(late, "explained_variance"), t)
            and len(stuck) * 2 > len(late)):
        return None
    return finding("critic_not_learning", [s for s, _ in stuck], fmt(stuck, "explained_variance")
                   + f" (after step {start}: the warm-up plus {t.critic_grace_steps} steps)",
                   title="the critic explains nothing",
                   meaning="the advantages are the returns' noise: the policy learns slowly or "
                           "from chance",
                   check_first="value_lr, that the value adapter and head are trained (their grad "
                               "norm), and the value mask's alignment with the states")


@rule("untrained_critic", "info", reads=("explained_variance",),
      fires=lambda t: f"explained_variance < {t.cold_critic_ev:g} at the policy's first update "
                      "(no value warm-up)",
      teaches=f"{LAB}, section (e)")
def untrained_critic(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    # a critic that never learns is the warning: that it also started cold adds nothing
    if critic_not_learning(rows, facts, t) is not None:
        return None
    first_policy = [r for r in rows if r["step"] == facts.value_warmup_steps + 1]
    cold = passing(first_policy, "explained_variance", lambda v: v < t.cold_critic_ev)
    if not cold:
        return None
    return finding("untrained_critic", [s for s, _ in cold], fmt(cold, "explained_variance")
                   + f" (below {t.cold_critic_ev:g}: the critic has not learned the returns yet)",
                   title="the policy's first update used an untrained critic",
                   meaning="the first advantages have no state-dependent baseline: the policy's "
                           "first update follows the raw, lambda-faded returns, a high-variance "
                           "signal (expected with fresh value adapters and no value warm-up)",
                   check_first="value_warmup_steps: a few critic-only steps before the policy "
                               "moves")
