"""Notebook 08's check: a learner's whole PPO iteration against the library's, on the same batch and
seed.

    seeds, lrs = (3, 4), (2.0, 0.05)
    expected = run_iteration(library_iteration, model, tok, prompts, config, seeds, lrs)
    got = run_iteration(ppo_iteration, model, tok, prompts, config, seeds, lrs)
    problem = first_difference(got, expected, config, rounding_rtol(model, config))  # None or where

An iteration is `iteration(model, tokenizer, prompts, policy_opt, value_opt, config, generator) ->
(rollout, [(policy loss, value loss) of every minibatch])`, the rollout holding the experience under
`Experience`'s names. `run_iteration` (`course.capstone_run`, imported here) runs one from given
weights with plain SGD (the notebook says why), records what it made and puts the weights back.
`first_difference` names the first thing that differs, in the order the iteration makes it: the
experience (tokens, log-probs, values, scores, rewards, returns, advantages), then each minibatch's
losses, then the gradient norm of each optimiser step and the weights' updates, with the likely
cause. The check code uses plain torch only: the library's maths are hidden from the learner while
it runs.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from rlhf_helpers.course.capstone_run import (
    EXPERIENCE,
    FLOAT32_UNIT_ROUNDOFF,
    IterationRecord,
    left_out_settings,
    library_iteration,
    rounding_rtol,
    run_iteration,
)
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: the check's names, with those of the recording half (`course.capstone_run`): the notebook and
#: the tests call them from here
__all__ = ["EXPERIENCE", "FLOAT32_UNIT_ROUNDOFF", "IterationRecord", "PassedCode",
           "experience_difference", "first_difference", "left_out_settings", "library_iteration",
           "rounding_rtol", "run_iteration"]


def _far(got: torch.Tensor, expected: torch.Tensor, rtol: float,
         scale: float | None = None) -> torch.Tensor:
    """Where got differs from expected by more than rtol times `scale` (default: expected's largest
    entry): every rounding is relative to the numbers it combines, which are at most that large. NaN
    differs."""
    if scale is None:
        scale = float(expected.abs().max()) if expected.numel() else 0.0
    return ~((got.double() - expected.double()).abs() <= rtol * max(scale, 1e-12))


def _where(mask: torch.Tensor, i: int, t: int) -> str:
    n = int(mask[i].sum())
    return (f"row {i}, token {t}: "
            + ["the last real token", "a real token before the last"][int(t < n - 1)]
            + f" of a row with {n} real tokens")


def _whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the real tokens (unbiased variance), 0 at padding: plain
    torch."""
    real = x[mask.bool()]
    return (x - real.mean()) * torch.rsqrt(real.var() + 1e-8) * mask


_CAUSES = {
    "old_logprobs": "log pi_old: the policy's log-probs of the sampled tokens at the sampling "
                    "temperature, model.policy_logprobs(sequences, attention_mask, P, "
                    "temperature=config.temperature)",
    "ref_logprobs": "log pi_ref: the reference (every adapter off) at the same temperature as the "
                    "policy, model.ref_logprobs(sequences, attention_mask, P, "
                    "temperature=config.temperature)",
    "values": "the critic's values model.values(sequences, attention_mask, P) at the real tokens",
    "scores": "the reward model's score of each response, model.reward_scores(sequences, "
              "attention_mask)",
    "returns": "the returns are the raw GAE advantages plus the values, before whitening: delta_t "
               "= r_t + config.gamma V_{t+1} - V_t with V = 0 after the last real token, A_t = "
               "delta_t + config.gamma config.lam A_{t+1}",
}


def _experience_hint(name: str, got: torch.Tensor, record: IterationRecord, i: int, t: int) -> str:
    """The likely cause of a difference in one experience tensor at row i, token t (real tokens
    only)."""
    exp, mask = record.experience, record.mask
    if name == "rewards":
        if t == int(mask[i].sum()) - 1:
            return ("the last real token carries -kl_coef k1 plus the response's score; its column "
                    "is mask.sum(1) - 1 (the last column is padding for every shorter response)")
        return ("r_t = -config.kl_coef (log pi_old(y_t) - log pi_ref(y_t)) on every real token: "
                "check the sign")
    if name == "returns":
        after_whitening = exp["advantages"] + exp["values"]  # (B, R)
        if not bool(_far(got, after_whitening, 1e-4)[mask.bool()].any()):
            return ("they equal the whitened advantages plus the values: take the returns before "
                    "whitening")
    if name == "advantages":
        raw = (exp["returns"] - exp["values"]) * mask  # (B, R)
        for candidate, cause in (
                (raw, "they are not whitened: whiten them over the batch's real tokens"),
                (_whiten(raw, torch.ones_like(mask)) * mask,
                 "they are whitened over the padding too: take the mean and the variance over "
                 "the real tokens only")):
            if not bool(_far(got, candidate, 1e-4)[mask.bool()].any()):
                return cause
        return ("your returns match, so the GAE is right and the whitening differs: (A - mean) / "
                "sqrt(var + 1e-8) with the mean and the unbiased variance over the real tokens, 0 "
                "at padding")
    return _CAUSES[name]


def experience_difference(rollout: Any, record: IterationRecord, rtol: float) -> str | None:
    """The first experience tensor of `rollout` that differs from `record`'s, where, and the likely
    cause."""
    for name, tensor in (("sequences", rollout.sequences), ("mask", rollout.mask)):
        mine = getattr(record, name)
        same_shape = tuple(tensor.shape) == tuple(mine.shape)
        if not same_shape or not torch.equal(tensor.detach().cpu().to(mine.dtype), mine):
            return (f"your {name} differ from the sampled batch's: sample first, with the call "
                    "given (at config.temperature), keep the samples' mask, and draw no random "
                    "numbers before it")
    real = record.mask.bool()  # (B, R)
    for name in EXPERIENCE:
        got, expected = getattr(rollout, name).detach().float().cpu(), record.experience[name]
        if got.shape != expected.shape:
            return f"your {name} have shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        per_token = got.dim() == 2  # (B, R); the scores are (B,)
        on_real = expected[real] if per_token else expected
        far = _far(got, expected, rtol, float(on_real.abs().max())) & (real if per_token else True)
        if bool(far.any()):
            i, t = (int(k) for k in far.nonzero()[0]) if per_token else (int(far.nonzero()[0]), 0)
            at = _where(record.mask, i, t) if per_token else f"row {i}"
            return (
                f"your {name} differ first at {at}: got "
                f"{float(got[i, t] if per_token else got[i]):.5f}, expected "
                f"{float(expected[i, t] if per_token else expected[i]):.5f}. Likely cause: "
                + _experience_hint(name, got, record, i, t))
    return None


def _first_policy_loss_hint(got: float, record: IterationRecord, config: PPOConfig,
                            rtol: float) -> str:
    """Minibatch 0 runs on unchanged weights, so its ratios are 1 and its loss is -mean(A) over its
    real tokens: test the two mistakes that change that (plain torch: the library's losses are
    hidden during the check)."""
    shuffle = torch.Generator().manual_seed(record.shuffle_seed)
    rows = torch.randperm(len(record.mask), generator=shuffle)[: config.mini_batch_size]
    m, adv = record.mask[rows], record.experience["advantages"][rows]  # (b, R)
    old, ref = record.experience["old_logprobs"][rows], record.experience["ref_logprobs"][rows]
    log_rho = torch.where(m.bool(), old - ref, 0.0)  # (b, R): the ratio against the reference
    rho, eps = torch.exp(log_rho), config.clip_eps
    surrogate = torch.min(rho * adv, rho.clamp(1 - eps, 1 + eps) * adv)  # (b, R)
    against_ref = float(-(surrogate * m).sum() / m.sum())
    scale = float(adv.abs().max())
    if abs(got - against_ref) <= rtol * scale:
        return ("your ratio is taken against the reference's log-probs: the old log-probs are "
                "those stored at sampling (rollout.old_logprobs), never the reference's")
    if abs(got) <= rtol * scale:  # whitened advantages have mean 0, so their loss is 0 at ratio 1
        return ("your loss is 0, as it is when a minibatch's advantages are whitened again: whiten "
                "them once, over the whole batch (make_experience did), and use them as stored")
    return ("on unchanged weights every ratio is 1 and the loss is minus the mean advantage over "
            "the minibatch's real tokens: take the rows of torch.randperm(B, generator=generator), "
            "the log-probs at config.temperature and the advantages as stored, in a masked mean "
            "over real tokens")


def _step_hint(role: str, got: IterationRecord, expected: IterationRecord, before: int,
               config: PPOConfig, rtol: float) -> str | None:
    """The first of the `role` optimiser's steps before `before` whose gradient norm differs, and
    why."""
    mine, theirs = got.step_norms[role], expected.step_norms[role]
    if len(mine) != len(theirs) and len(mine) < before:
        return (f"you stepped {role}_opt {len(mine)} times, expected {len(theirs)}: once per "
                f"minibatch, {config.ppo_epochs} epochs of {len(theirs) // config.ppo_epochs} "
                "minibatches")
    scale = max(theirs) if theirs else 0.0
    for j in range(min(before, len(theirs))):
        g, e = mine[j], theirs[j]
        if abs(g - e) <= (j + 1) * rtol * scale:  # one budget per step taken so far
            continue
        head = (f"the {role} step of minibatch {j} applied a gradient of norm {g:.5f}, the "
                f"library's {e:.5f}: ")
        clip = config.max_grad_norm
        # no coefficient (PPOConfig's default); CleanRL's and SB3's 0.5 written in
        for weight in (1.0, 0.5):
            if role == "value" and abs(g * config.vf_coef / weight - e) <= rtol * scale:
                return (head + f"your value loss enters the backward pass with weight {weight:g}: "
                        "scale it by config.vf_coef, whatever its value")
        if g > clip * (1 + rtol):
            return (head + f"clip the gradient norm of the {role} adapter's own parameters "
                    f"(model.{role}_parameters()) to config.max_grad_norm ({clip:.4g}) before "
                    f"{role}_opt.step()")
        if e >= clip * (1 - rtol) and g < e:
            return (head + "each adapter's gradient is clipped on its own: one clip over both "
                    "adapters scales each by the norm of both")
        return (head + f"the gradient of your {role} loss differs although the loss matched: a "
                ".detach() on one branch of the objective (it halves the in-band gradient of the "
                "clipped loss), or gradients left from an earlier minibatch (zero the gradients "
                "before each backward pass)")
    return None


def _loss_hint(role: str, k: int, got: IterationRecord, expected: IterationRecord,
               config: PPOConfig, rtol: float) -> str:
    per_epoch = -(-len(expected.mask) // config.mini_batch_size)
    epoch, index = divmod(k, per_epoch)
    if k == 0 and role == "policy":
        return _first_policy_loss_hint(float(got.losses[0, 0]), expected, config, rtol)
    if k == 0:
        return ("on unchanged weights V is the rollout's values: 1/2 x the mean over real tokens "
                "of max((V - G)^2, (V_clip - G)^2), with the returns G as stored")
    step = _step_hint(role, got, expected, k, config, rtol)
    if step is not None:
        return step
    if index == 0 and epoch > 0:
        return ("every epoch needs a fresh shuffle: torch.randperm(B, generator=generator) inside "
                "the epoch loop")
    if role == "policy":
        return ("with the weights moved the ratios leave the clip band: the loss is minus the "
                "masked mean of min(rho A, clip(rho, 1 - config.clip_eps, 1 + config.clip_eps) A), "
                "rho against rollout.old_logprobs")
    return ("with the value weights moved the value clip acts: V_clip = V_old + clip(V - V_old, "
            "-config.value_clip, config.value_clip) around the rollout's values, and the larger of "
            "the two squared errors")


def first_difference(got: IterationRecord, expected: IterationRecord, config: PPOConfig,
                     rtol: float) -> str | None:
    """The first difference between a learner's iteration (`got`) and the library's (`expected`), in
    the order the iteration makes things (experience, losses, steps and updates), with the likely
    cause; None if none.

    `rtol` is one forward pass's rounding budget (`rounding_rtol`): the experience gets one; what
    follows k optimiser steps gets k + 1, since each step moves the two runs' weights apart by its
    own rounding."""
    problem = experience_difference(got.rollout, expected, rtol)
    if problem is not None:
        return problem
    if got.losses.shape != expected.losses.shape:
        return (f"you returned {len(got.losses)} (policy loss, value loss) pairs, expected "
                f"{len(expected.losses)}: one per minibatch, {config.ppo_epochs} epochs of "
                f"{len(expected.losses) // config.ppo_epochs}")
    per_epoch = -(-len(expected.mask) // config.mini_batch_size)
    for k in range(len(expected.losses)):
        for column, role in enumerate(("policy", "value")):
            g, e = float(got.losses[k, column]), float(expected.losses[k, column])
            scale = float(expected.losses[:, column].abs().max())  # the column's largest loss
            # minibatch k runs on weights that k steps have moved: a rounding budget for each
            budget = (k + 1) * rtol
            if not bool(_far(got.losses[k, column], expected.losses[k, column], budget, scale)):
                continue
            epoch, index = divmod(k, per_epoch)
            return (f"your {role} losses match up to minibatch {k} (epoch {epoch}, #{index}) and "
                    f"differ there: got {g:.6f}, expected {e:.6f}. Likely cause: "
                    + _loss_hint(role, k, got, expected, config, rtol))
    for role in ("policy", "value"):
        step = _step_hint(role, got, expected, len(expected.losses) + 1, config, rtol)
        if step is not None:
            return f"every loss matches, but {step}"
        for mine, theirs, size in zip(got.updates[role], expected.updates[role],
                                      expected.weight_sizes[role], strict=True):
            # an update is w_after - w_before in float32 (adapters train in float32): each run's is
            # off by up to one unit in the last place of w, 2 u |w|, so two runs by 4 u |w| (u: the
            # unit roundoff); this floor decides for a matrix whose own change is tiny (LoRA A while
            # B is still near 0)
            floor = 4 * FLOAT32_UNIT_ROUNDOFF * (size + float(theirs.abs().max()))
            steps = len(expected.losses) + 1
            budget = steps * rtol * max(float(theirs.abs().max()), 1e-12) + floor
            if bool(((mine.double() - theirs.double()).abs() > budget).any()):
                return (f"every loss matches, but the {role} adapter's weights after the update "
                        f"differ: the last minibatch's {role} step (backward, clip, "
                        f"{role}_opt.step()) moved them differently")
    return None


class PassedCode:
    """The function objects a check passed with: a pass belongs to them, not to their names (a
    function redefined after its check is another function, checked again before it is used)."""

    def __init__(self) -> None:
        self.functions: dict[str, Any] = {}  #: name -> the function object that passed

    def record(self, **functions: Any) -> None:
        """Record that the check passed with these functions (unwrapped from the check's in-place
        guard)."""
        self.functions = {name: inspect.unwrap(fn) for name, fn in functions.items()}

    def holds_for(self, **functions: Any) -> bool:
        """True when the check passed with exactly these function objects."""
        return bool(self.functions) and self.functions.keys() == functions.keys() and all(
            self.functions[name] is inspect.unwrap(fn) for name, fn in functions.items())
