"""Notebook 05 Exercise 4's hints: which plausible mistake in a PPO update loop gives a learner's
numbers.

The exercise's check compares a learner's `ppo_update` with the library's update
(`PPOTrainer.update`, run before the check hides it) minibatch by minibatch. Where they part, a
position alone does not say why: a dropped temperature, the reference's log-probs as the old ones
and advantages re-normalised per minibatch all change the first minibatch's policy loss. So this
module replays the update as a plain loop with one named mistake at a time, up to a little past the
first differing minibatch, and names the mistake whose losses equal the learner's:

    hint = explain_update_difference(got, expected, config, replay)  # replay(mistake, n): (n, 2)

`update_loop` is that plain loop; with no mistake it is the update the exercise asks for, so a hint
names a cause only when replaying exactly that cause gives the learner's numbers. It calls no
library loss (the check hides them while it runs), only the model's forward passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: two losses agree when |got - expected| <= ATOL + RTOL |expected| (float32 rounding of two loops)
ATOL, RTOL = 1e-5, 1e-4
#: minibatches replayed past the first differing one, so that two mistakes rarely fit the same
#: numbers
EXTRA_MINIBATCHES = 2


@dataclass(frozen=True)
class LoopMistake:
    """One plausible mistake in an update loop: the learner's cause in words, and the loop's changed
    settings."""

    #: what the learner's loop does, and what it should do instead
    cause: str
    #: keyword arguments of `update_loop` that make the mistake
    changes: Mapping[str, Any] = field(default_factory=dict)


def losses_agree(got: float, expected: float) -> bool:
    """Whether two minibatch losses agree up to the rounding of two correct loops."""
    return abs(got - expected) <= ATOL + RTOL * abs(expected)


def first_difference(got: torch.Tensor, expected: torch.Tensor) -> tuple[int, int] | None:
    """(minibatch, column) of the first loss that differs, policy (0) before value (1); None when
    all agree."""
    for k in range(len(expected)):
        for column in (0, 1):
            if not losses_agree(float(got[k, column]), float(expected[k, column])):
                return k, column
    return None


def _whiten(x: torch.Tensor, m: torch.Tensor, unbiased: bool) -> torch.Tensor:
    """(x - mean) / (std + 1e-8) over the positions where m is 1 (every position when m is all
    ones)."""
    real = m.bool()  # (b, R)
    mean = x[real].mean()
    std = x[real].std(unbiased=unbiased)
    return (x - mean) / (std + 1e-8) * m


def update_loop(model: Any, batch: Any, policy_opt: torch.optim.Optimizer,
                value_opt: torch.optim.Optimizer, config: Any, generator: torch.Generator,
                policy_loss_fn: Callable[..., torch.Tensor], *, minibatches: int | None = None,
                old: str = "stored", temperature: bool = True, renormalise: str | None = None,
                shuffle_each_epoch: bool = True, policy_eps: float | None = None, value_eps: float
                | None | str = "config", vf_scale: float | None = None, half: bool = True,
                value_mean_over_padding: bool = False, policy_clip: float | None | str = "config",
                value_clip_norm: float | None | str = "config", one_clip_for_both: bool = False
                ) -> list[tuple[float, float]]:
    """PPO's update as Exercise 4 asks for it, with the named settings changed (the defaults change
    nothing); stops after `minibatches` minibatches when given. Returns the (policy loss, value
    loss) of each."""
    P, B = batch.context_length, len(batch)
    eps = config.clip_eps if policy_eps is None else policy_eps
    eps_v = config.value_clip if value_eps == "config" else value_eps
    scale = config.vf_coef if vf_scale is None else vf_scale
    clip_p = config.max_grad_norm if policy_clip == "config" else policy_clip
    clip_v = config.max_grad_norm if value_clip_norm == "config" else value_clip_norm
    stored = batch.ref_logprobs if old == "reference" else batch.old_logprobs
    losses: list[tuple[float, float]] = []
    order = torch.randperm(B, generator=generator)  # (B,)
    for epoch in range(config.ppo_epochs):
        if shuffle_each_epoch and epoch > 0:
            order = torch.randperm(B, generator=generator)  # (B,)
        for first in range(0, B, config.mini_batch_size):
            if minibatches is not None and len(losses) == minibatches:
                return losses
            rows = order[first : first + config.mini_batch_size]  # (b,)
            seq, attn = batch.sequences[rows], batch.attention_mask[rows]  # (b, L) each
            m = batch.mask[rows]  # (b, R)
            A, G, V_old = batch.advantages[rows], batch.returns[rows], batch.values[rows]  # (b, R)
            if renormalise is not None:  # "masked"(-biased): over real tokens; "all": padding too
                A = _whiten(A, m if renormalise.startswith("masked") else torch.ones_like(m),
                            unbiased=renormalise != "masked-biased")
            T = config.temperature if temperature else 1.0
            logp = model.policy_logprobs(seq, attn, P, temperature=T).float()  # (b, R)
            pg_loss = policy_loss_fn(logp, stored[rows], A, m, eps)
            policy_opt.zero_grad()
            pg_loss.backward()
            if one_clip_for_both:  # the previous minibatch's value gradients are still there
                both = model.policy_parameters() + model.value_parameters()
                torch.nn.utils.clip_grad_norm_(both, clip_p)
            elif clip_p is not None:
                torch.nn.utils.clip_grad_norm_(model.policy_parameters(), clip_p)
            policy_opt.step()
            V = model.values(seq, attn, P).float()  # (b, R)
            V_clip = V if eps_v is None else V_old + (V - V_old).clamp(-eps_v, eps_v)  # (b, R)
            factor = 0.5 if half else 1.0
            per_token = torch.max((V - G) ** 2, (V_clip - G) ** 2) * factor  # (b, R)
            if value_mean_over_padding:
                v_loss = per_token.mean()
            else:
                v_loss = (per_token * m).sum() / m.sum()
            value_opt.zero_grad()
            (scale * v_loss).backward()
            if clip_v is not None:
                torch.nn.utils.clip_grad_norm_(model.value_parameters(), clip_v)
            value_opt.step()
            losses.append((pg_loss.item(), v_loss.item()))
    return losses


#: the numeric settings a loop might read in place of another: a mistake is named by the field it
#: read
SETTINGS = ("clip_eps", "value_clip", "vf_coef", "temperature", "kl_coef", "lam", "max_grad_norm")


def loop_mistakes(config: Any) -> list[LoopMistake]:
    """The plausible mistakes of an update loop under `config`, each with the hint it earns."""
    mistakes = [
        LoopMistake("the ratio is taken against the reference's log-probs (batch.ref_logprobs); "
                    "the old log-probs are those stored at sampling, batch.old_logprobs",
                    {"old": "reference"}),
        LoopMistake("the policy's log-probs are computed without config.temperature "
                    f"({config.temperature:g}): the batch was sampled, and its old log-probs "
                    "stored, at that temperature, so pass temperature=config.temperature to "
                    "model.policy_logprobs", {"temperature": False}),
        *[LoopMistake("the advantages are re-normalised inside each minibatch (as CleanRL's "
                      "norm_adv does): here they were whitened once, over the whole batch, when it "
                      "was collected, so use "
                      "batch.advantages[rows] as they are", {"renormalise": kind})
          for kind in ("masked", "masked-biased", "all")],
        LoopMistake("one shuffle serves every epoch: draw torch.randperm(B, generator=generator) "
                    "once per epoch, inside the epoch loop", {"shuffle_each_epoch": False}),
        LoopMistake(f"the value is clipped with config.clip_eps ({config.clip_eps:g}); its clip "
                    f"range is config.value_clip ({config.value_clip:g})",
                    {"value_eps": config.clip_eps}),
        LoopMistake("the value loss has no clip: V_clip = V_old + clip(V - V_old, -value_clip, "
                    "value_clip), and "
                    "the loss takes the max of the two squared errors", {"value_eps": None}),
        LoopMistake(f"the policy loss gets config.value_clip ({config.value_clip:g}) as its clip "
                    f"range; it is config.clip_eps ({config.clip_eps:g})",
                    {"policy_eps": config.value_clip}),
        LoopMistake("the value loss lacks the factor 1/2", {"half": False}),
        LoopMistake("the value loss is averaged over the padding too: divide the masked sum by the "
                    "number of real tokens, m.sum()", {"value_mean_over_padding": True}),
        *[LoopMistake(f"the {role} adapter's gradient norm is not clipped to config.max_grad_norm "
                      f"({config.max_grad_norm:g}) (no clip, or a clip at a norm that never binds "
                      f"here): clip it between backward() and {role}_opt.step()", {key: None})
          for role, key in (("policy", "policy_clip"), ("value", "value_clip_norm"))],
        LoopMistake("one gradient clip covers both adapters together; clip each adapter's own "
                    "parameters before its own step", {"one_clip_for_both": True}),
        *[LoopMistake(f"the {who} gradient clip uses 1.0 (PPOConfig's default) instead of "
                      f"config.max_grad_norm ({config.max_grad_norm:g})", changes)
          for who, changes in (("policy's", {"policy_clip": 1.0}),
                               ("value's", {"value_clip_norm": 1.0}), ("policy's and the value's", {
                                   "policy_clip": 1.0, "value_clip_norm": 1.0}))],
        LoopMistake("the policy loss's clip range is 0.2 (PPOConfig's default) instead of "
                    f"config.clip_eps ({config.clip_eps:g})", {"policy_eps": 0.2}),
        LoopMistake(f"the value loss is not scaled by config.vf_coef ({config.vf_coef:g}) before "
                    "backward() (or is scaled by 1.0, PPOConfig's default)", {"vf_scale": 1.0}),
    ]
    seen = {config.vf_coef, 1.0}
    for name in SETTINGS:  # vf_coef read from another field
        value = getattr(config, name, None)
        if isinstance(value, float) and value not in seen:
            seen.add(value)
            mistakes.append(
                LoopMistake(f"the value loss is scaled by config.{name} ({value:g}) instead of "
                            f"config.vf_coef ({config.vf_coef:g})", {"vf_scale": value}))
    return mistakes


def _agree_up_to(got: torch.Tensor, replayed: list[tuple[float, float]], n: int) -> bool:
    return len(replayed) >= n and all(losses_agree(float(got[k, c]), replayed[k][c])
                                      for k in range(n) for c in (0, 1))


def explain_update_difference(got: torch.Tensor, expected: torch.Tensor, config: Any,
                              replay: Callable[[Mapping[str, Any], int],
                                               list[tuple[float, float]]]) -> str | None:
    """Where a learner's (n, 2) minibatch losses first part from the expected ones and why; None
    when they agree.

    `replay(changes, n)` runs `update_loop` with `changes` from the check's starting weights for n
    minibatches. The cause named is the first of `loop_mistakes(config)` whose replay equals the
    learner's losses up to EXTRA_MINIBATCHES past the first difference; when none does, the message
    says so and what differs."""
    found = first_difference(got, expected)
    if found is None:
        return None
    k, column = found
    per_epoch = -(-config.rollout_batch_size // config.mini_batch_size)
    epoch, index = divmod(k, per_epoch)
    role = ("policy", "value")[column]
    where = (f"your {role} losses match up to minibatch {k} (epoch {epoch}, #{index}) and differ "
             f"there: got {float(got[k, column]):.5f}, expected {float(expected[k, column]):.5f}")
    n = min(len(expected), k + 1 + EXTRA_MINIBATCHES)
    for mistake in loop_mistakes(config):
        if _agree_up_to(got, replay(mistake.changes, n), n):
            return f"{where}. Your numbers are those of a loop where {mistake.cause}"
    if k == 0 and column == 0:
        return (f"{where}. On unchanged weights the policy loss depends only on the new log-probs "
                "(at config.temperature), the stored old log-probs, the advantages and the mask, "
                "and config.clip_eps; none of the usual mistakes with these gives your number")
    if k == 0:
        return (f"{where}. On unchanged weights the value loss is 1/2 x the masked mean of "
                "max((V - G)^2, (V_clip - G)^2); none of the usual mistakes gives your number")
    return (
        f"{where}. The weights moved differently in an earlier step, in a way none of the usual "
        "mistakes reproduces: compare your loop with the exercise's description line by line")
