"""Notebook 08's hints: the likely cause of the first difference `course.capstone` finds between a
learner's iteration and the library's.

    cause = experience_hint("rewards", got, record, i, t)   # got: the learner's (B, R) rewards
    cause = loss_hint("policy", k, got, expected, config, rtol)

A hint names a cause only when that cause gives the learner's numbers: the tensor the mistake would
make is rebuilt from the library's record (the reward with k3, the variance divided by n, ...),
the first minibatch is recomputed with the mistake (the ratio against the reference, the update's
log-probs at temperature 1), or the gradient norms decide between two causes (half the library's
norm, or more). Where none fits, the hint says what the quantity should be. Plain torch only: the
library's maths are hidden from the learner while the check runs.
"""

from __future__ import annotations

import torch

from rlhf_helpers.course.capstone_run import IterationRecord
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: relative tolerance of "the learner's tensor equals the one this mistake makes" (two computations
#: of one mistake differ by rounding only; each mistake here moves a number by far more)
SAME = 1e-4


def far(got: torch.Tensor, expected: torch.Tensor, rtol: float,
        scale: float | None = None) -> torch.Tensor:
    """Where got differs from expected by more than rtol times `scale` (default: expected's largest
    entry): the rounding budget is relative to the numbers a computation combines, which are at
    most that large. NaN differs."""
    if scale is None:
        scale = float(expected.abs().max()) if expected.numel() else 0.0
    return ~((got.double() - expected.double()).abs() <= rtol * max(scale, 1e-12))


def _same(got: torch.Tensor, candidate: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether got equals candidate on the real tokens, up to rounding."""
    return not bool(far(got, candidate, SAME)[mask.bool()].any())


def _whiten(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the real tokens, 0 at padding: plain torch."""
    real = x[mask.bool()]
    return (x - real.mean()) * torch.rsqrt(real.var(unbiased=unbiased) + 1e-8) * mask


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


def _logprob_hint(name: str, got: torch.Tensor, record: IterationRecord) -> str:
    """Log-probs at temperature 1, or the other role's: recomputed with the record's model (at the
    weights the iteration started from)."""
    exp, mask, model = record.experience, record.mask, record.model
    other = "ref_logprobs" if name == "old_logprobs" else "old_logprobs"
    if _same(got, exp[other], mask):
        return (f"your {name} are the {'reference' if name == 'old_logprobs' else 'policy'}'s: "
                "log pi_old is the policy's (its adapter on), log pi_ref the reference's (every "
                "adapter off)")
    if model is not None and record.config.temperature != 1.0:
        seq = record.sequences.to(model.device)
        attn = record.rollout.attention_mask.to(model.device)
        forward = model.policy_logprobs if name == "old_logprobs" else model.ref_logprobs
        with torch.no_grad():
            at_one = forward(seq, attn, seq.shape[1] - mask.shape[1]).float().cpu()  # (B, R)
        if _same(got, at_one, mask):
            return (f"they are the log-probs at temperature 1: the batch was sampled from "
                    f"softmax(z / T_samp) with T_samp = config.temperature "
                    f"({record.config.temperature:g}), so pass temperature=config.temperature")
    return _CAUSES[name]


def _reward_hint(got: torch.Tensor, record: IterationRecord, i: int, t: int) -> str:
    """Which plausible reward gives the learner's: the sign flipped, k3 or k2 in place of k1."""
    exp, mask = record.experience, record.mask
    beta = record.config.kl_coef
    log_ratio = torch.where(mask.bool(), exp["old_logprobs"] - exp["ref_logprobs"], 0.0)  # (B, R)
    score_at_end = exp["rewards"] + beta * log_ratio  # (B, R): the score on each last token
    for penalty, cause in (
            (-log_ratio, "the KL penalty has the wrong sign: r_t = -config.kl_coef (log pi_old - "
                         "log pi_ref), a cost for moving away from the reference, not a bonus"),
            (torch.expm1(-log_ratio) + log_ratio,
             "your penalty is k3 = (w - 1) - log w with w = pi_ref / pi_old: the reward here uses "
             "k1 = log pi_old - log pi_ref (notebook 03: k1's sum over a response is the "
             "sequence's log-ratio, whose mean is the KL)"),
            (0.5 * log_ratio**2, "your penalty is k2 = (log w)^2 / 2: the reward here uses k1 = "
                                 "log pi_old - log pi_ref")):
        if _same(got, score_at_end - beta * penalty, mask):
            return cause
    if t == int(mask[i].sum()) - 1:
        return ("the last real token carries -kl_coef k1 plus the response's score; its column "
                "is mask.sum(1) - 1 (the last column is padding for every shorter response)")
    return "r_t = -config.kl_coef (log pi_old(y_t) - log pi_ref(y_t)) on every real token"


def experience_hint(name: str, got: torch.Tensor, record: IterationRecord, i: int, t: int) -> str:
    """The likely cause of a difference in one experience tensor at row i, token t (real tokens
    only)."""
    exp, mask = record.experience, record.mask
    if name == "rewards":
        return _reward_hint(got, record, i, t)
    if name in ("old_logprobs", "ref_logprobs"):
        return _logprob_hint(name, got, record)
    if name == "returns" and _same(got, exp["advantages"] + exp["values"], mask):
        return ("they equal the whitened advantages plus the values: take the returns before "
                "whitening")
    if name == "advantages":
        raw = (exp["returns"] - exp["values"]) * mask  # (B, R)
        for candidate, cause in (
                (raw, "they are not whitened: whiten them over the batch's real tokens"),
                (_whiten(raw, torch.ones_like(mask)) * mask,
                 "they are whitened over the padding too: take the mean and the variance over the "
                 "real tokens only"),
                (_whiten(raw, mask, unbiased=False),
                 "your variance divides by n, the number of real tokens: the unbiased variance "
                 "divides by n - 1 (torch.var's default)")):
            if _same(got, candidate, mask):
                return cause
        return ("your returns match, so the GAE is right and the whitening differs: (A - mean) / "
                "sqrt(var + 1e-8) with the mean and the unbiased variance over the real tokens, 0 "
                "at padding")
    return _CAUSES[name]


def _first_minibatch_loss(record: IterationRecord, config: PPOConfig, old: torch.Tensor,
                          temperature: float | None = None) -> float:
    """Minibatch 0's clipped loss on the starting weights, against `old`, with the new log-probs
    recomputed at `temperature` (None: on those weights they equal the stored old ones)."""
    shuffle = torch.Generator().manual_seed(record.shuffle_seed)
    rows = torch.randperm(len(record.mask), generator=shuffle)[: config.mini_batch_size]  # (b,)
    m, adv = record.mask[rows], record.experience["advantages"][rows]  # (b, R)
    new = record.experience["old_logprobs"][rows]  # (b, R): the stored ones, on these weights
    if temperature is not None:
        model = record.model
        seq = record.sequences[rows].to(model.device)
        attn = record.rollout.attention_mask[rows].to(model.device)
        with torch.no_grad():
            new = model.policy_logprobs(seq, attn, seq.shape[1] - m.shape[1],
                                        temperature=temperature).float().cpu()  # (b, R)
    rho = torch.exp(torch.where(m.bool(), new - old[rows], 0.0))  # (b, R)
    eps = config.clip_eps
    surrogate = torch.min(rho * adv, rho.clamp(1 - eps, 1 + eps) * adv)  # (b, R)
    return float(-(surrogate * m).sum() / m.sum())


def _first_policy_loss_hint(got: float, record: IterationRecord, config: PPOConfig,
                            rtol: float) -> str:
    """Minibatch 0 runs on unchanged weights, so its ratios are 1 and its loss is -mean(A) over its
    real tokens: recompute it with each mistake that changes that."""
    exp, scale = record.experience, float(record.experience["advantages"].abs().max())
    if abs(got - _first_minibatch_loss(record, config, exp["ref_logprobs"])) <= rtol * scale:
        return ("your ratio is taken against the reference's log-probs: the old log-probs are "
                "those stored at sampling (rollout.old_logprobs), never the reference's")
    if (record.model is not None and config.temperature != 1.0 and abs(
            got - _first_minibatch_loss(record, config, exp["old_logprobs"], 1.0)) <= rtol * scale):
        return ("your update's log-probs are at temperature 1: the old ones are at T_samp = "
                f"config.temperature ({config.temperature:g}), so every ratio starts away from "
                "1; recompute them with temperature=config.temperature")
    if abs(got) <= rtol * scale:  # whitened advantages have mean 0, so their loss is 0 at ratio 1
        return ("your loss is 0, as it is when a minibatch's advantages are whitened again: whiten "
                "them once, over the whole batch (make_experience did), and use them as stored")
    return ("on unchanged weights every ratio is 1 and the loss is minus the mean advantage over "
            "the minibatch's real tokens: take the rows of torch.randperm(B, generator=generator), "
            "the log-probs at config.temperature and the advantages as stored, in a masked mean "
            "over real tokens")


def _gradient_cause(role: str, g: float, e: float, allowed: float) -> str:
    """A gradient that differs although the loss matched: the norm ratio decides which cause comes
    first (exactly half: a detached branch; larger: gradients left over)."""
    detach = (".detach() on one branch of the objective: inside the clip band the min's two "
              "branches tie and autograd sends half the gradient through each, so a detached "
              "branch halves the gradient of every in-band token")
    left_over = (f"gradients left over from an earlier minibatch: backward() adds into .grad, so "
                 f"call {role}_opt.zero_grad() before each backward pass")
    ratio = g / e if e else float("inf")
    if abs(g - 0.5 * e) <= allowed:
        return f"your norm is exactly half the library's: a {detach}"
    if g > e:
        return (f"your norm is {ratio:.3f} times the library's, larger: {left_over}; less likely, "
                f"a {detach}")
    return f"your norm is {ratio:.3f} times the library's, smaller: a {detach}; or {left_over}"


def step_hint(role: str, got: IterationRecord, expected: IterationRecord, before: int,
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
        allowed = (j + 1) * rtol * scale  # one budget per step taken so far
        if abs(g - e) <= allowed:
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
        return (head + f"the gradient of your {role} loss differs although the loss matched; "
                + _gradient_cause(role, g, e, allowed))
    return None


def loss_hint(role: str, k: int, got: IterationRecord, expected: IterationRecord,
              config: PPOConfig, rtol: float) -> str:
    """The likely cause of a difference in minibatch k's `role` loss."""
    per_epoch = -(-len(expected.mask) // config.mini_batch_size)
    epoch, index = divmod(k, per_epoch)
    if k == 0 and role == "policy":
        return _first_policy_loss_hint(float(got.losses[0, 0]), expected, config, rtol)
    if k == 0:
        g, e = float(got.losses[0, 1]), float(expected.losses[0, 1])
        scale = float(expected.losses[:, 1].abs().max())  # as the losses' comparison
        if abs(g - config.vf_coef * e) <= rtol * scale:
            return (f"your logged value loss is config.vf_coef ({config.vf_coef:g}) x L^V: log "
                    "L^V itself (v_loss.item()); vf_coef weighs it only in the backward pass")
        return ("on unchanged weights V is the rollout's values: 1/2 x the mean over real tokens "
                "of max((V - G)^2, (V_clip - G)^2), with the returns G as stored")
    step = step_hint(role, got, expected, k, config, rtol)
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
