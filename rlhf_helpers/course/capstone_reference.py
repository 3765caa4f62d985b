"""Notebook 08's worked solution as one plain loop, with one named mistake at a time.

    record = run_iteration(plain_iteration, model, tok, prompts, config, seeds, lrs)
    wrong = run_iteration(functools.partial(plain_iteration, mistake="biased_variance"), ...)
    early = run_iteration(functools.partial(plain_iteration, stop_kl=0.01), ...)

The notebook's deep dive runs it to measure how much of the check's rounding budget a correct
iteration uses and how far a subtle bug exceeds it; the tests run it, with each mistake of MISTAKES,
to prove that the check names each one by its cause. It is the notebook's Solutions 1-3 (the
experience, the iteration and the early stop) in plain torch: the notebook hides it while a check
runs, so that a learner cannot pass by calling it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlhf_helpers.ppo.model.samples import Samples, sample_responses
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: the mistakes `plain_iteration` can make, each as a learner would write it
MISTAKES = {
    "kl_sign": "the KL penalty added with a + sign",
    "k3": "k3 = (w - 1) - log w, w = pi_ref / pi_old, in the reward in place of k1",
    "no_whitening": "the advantages left unwhitened",
    "biased_variance": "the whitening's variance divided by n, not n - 1",
    "ratio_ref": "the ratio taken against the reference's log-probs",
    "update_temperature": "the update's log-probs at temperature 1",
    "detach": "the clipped branch of the min detached",
    "no_vf_coef": "the value loss in the backward pass without vf_coef",
    "vf_coef_0.5": "the value loss weighted by a written-in 0.5",
    "logged_vf_coef": "vf_coef x L^V logged as the value loss",
    "band_0.2": "the clip band written in at 0.2",
    "one_shuffle": "one shuffle for every epoch",
    "joint_clip": "one gradient clip over both adapters",
    "no_zero_grad": "the policy's gradients never zeroed",
    "stop_k1": "the early stop on k1, mean(-log rho), in place of k3",
    "stop_each_minibatch": "the early stop tested after every minibatch, not after each epoch",
}


@dataclass
class PlainRollout:
    """One experience batch under the library's `Experience` names (the notebook's `Rollout`)."""

    prompts: list[str]
    responses: list[str]
    sequences: torch.Tensor  #: (B, P + R)
    attention_mask: torch.Tensor  #: (B, P + R)
    context_length: int  #: P
    mask: torch.Tensor  #: (B, R)
    old_logprobs: torch.Tensor  #: (B, R)
    ref_logprobs: torch.Tensor  #: (B, R)
    values: torch.Tensor  #: (B, R)
    scores: torch.Tensor  #: (B,)
    rewards: torch.Tensor  #: (B, R)
    advantages: torch.Tensor  #: (B, R) whitened
    returns: torch.Tensor  #: (B, R) raw advantages + values

    def __len__(self) -> int:
        return self.sequences.shape[0]


@torch.no_grad()
def plain_experience(model: Any, samples: Samples, config: PPOConfig,
                     mistake: str | None = None) -> PlainRollout:
    """Solution 1: log-probs, values, scores, shaped rewards, GAE and whitening of one batch."""
    seq, attn, P = samples.sequences, samples.attention_mask, samples.context_length
    mask = samples.mask  # (B, R)
    logp = model.policy_logprobs(seq, attn, P, temperature=config.temperature).float()  # (B, R)
    ref = model.ref_logprobs(seq, attn, P, temperature=config.temperature).float()  # (B, R)
    values = model.values(seq, attn, P).float() * mask  # (B, R)
    scores = model.reward_scores(seq, attn).float()  # (B,)
    log_w = ref - logp  # (B, R): log pi_ref / pi_old
    kl = torch.expm1(log_w) - log_w if mistake == "k3" else logp - ref  # (B, R)
    sign = 1.0 if mistake == "kl_sign" else -1.0
    rewards = sign * config.kl_coef * torch.where(mask.bool(), kl, 0.0)  # (B, R)
    rewards[torch.arange(len(scores)), mask.sum(1).long() - 1] += scores
    B, T = rewards.shape
    adv, running, next_value = torch.zeros_like(rewards), torch.zeros(B), torch.zeros(B)
    for t in reversed(range(T)):  # A_t = delta_t + gamma lambda A_{t+1}, 0 past each row's end
        delta = rewards[:, t] + config.gamma * next_value - values[:, t]  # (B,)
        running = (delta + config.gamma * config.lam * running) * mask[:, t]
        adv[:, t], next_value = running, values[:, t]
    returns = adv + values  # (B, R): before whitening
    real = adv[mask.bool()]
    if mistake != "no_whitening":
        var = real.var(unbiased=mistake != "biased_variance")
        adv = (adv - real.mean()) / torch.sqrt(var + 1e-8) * mask
    return PlainRollout(samples.prompts, samples.responses, seq, attn, P, mask, logp, ref, values,
                        scores, rewards, adv, returns)


def _losses(model: Any, batch: PlainRollout, rows: torch.Tensor, config: PPOConfig,
            mistake: str | None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """L^CLIP, L^V (with gradient) and the approx-KL (k3, or k1 for "stop_k1") of one minibatch."""
    P, m = batch.context_length, batch.mask[rows]  # (b, R)
    seq, attn = batch.sequences[rows], batch.attention_mask[rows]  # (b, L) each
    A, G, V_old = batch.advantages[rows], batch.returns[rows], batch.values[rows]  # (b, R) each
    old = (batch.ref_logprobs if mistake == "ratio_ref" else batch.old_logprobs)[rows]  # (b, R)
    temperature = 1.0 if mistake == "update_temperature" else config.temperature
    logp = model.policy_logprobs(seq, attn, P, temperature=temperature).float()  # (b, R)
    log_rho = torch.where(m.bool(), logp - old, 0.0)  # (b, R)
    rho = torch.exp(log_rho)
    eps = 0.2 if mistake == "band_0.2" else config.clip_eps
    clipped = rho.clamp(1 - eps, 1 + eps)  # (b, R)
    clipped = clipped.detach() if mistake == "detach" else clipped
    pg_loss = -(torch.min(rho * A, clipped * A) * m).sum() / m.sum()
    V = model.values(seq, attn, P).float()  # (b, R)
    V_clip = V_old + (V - V_old).clamp(-config.value_clip, config.value_clip)  # (b, R)
    v_loss = 0.5 * (torch.max((V - G) ** 2, (V_clip - G) ** 2) * m).sum() / m.sum()
    with torch.no_grad():  # k3 = (rho - 1) - log rho, notebook 04's approx_kl
        per_token = -log_rho if mistake == "stop_k1" else torch.expm1(log_rho) - log_rho
        approx_kl = float((per_token * m).sum() / m.sum())
    return pg_loss, v_loss, approx_kl


def plain_update(model: Any, batch: PlainRollout, policy_opt: torch.optim.Optimizer,
                 value_opt: torch.optim.Optimizer, config: PPOConfig, generator: torch.Generator,
                 mistake: str | None = None,
                 stop_kl: float | None = None) -> list[tuple[float, float]]:
    """Solution 2's loop (Solution 3's with `stop_kl`): epochs of shuffled minibatches, one
    backward of L^CLIP + c_V L^V, each adapter's gradient clipped, both steps; after an epoch whose
    last minibatch's approx-KL exceeds `stop_kl`, no further epoch."""
    weight = {"no_vf_coef": 1.0, "vf_coef_0.5": 0.5}.get(mistake, config.vf_coef)
    losses, order = [], None
    for _ in range(config.ppo_epochs):
        if mistake != "one_shuffle" or order is None:
            order = torch.randperm(len(batch), generator=generator)  # (B,)
        approx_kl = 0.0
        for first in range(0, len(batch), config.mini_batch_size):
            rows = order[first : first + config.mini_batch_size]  # (b,)
            pg_loss, v_loss, approx_kl = _losses(model, batch, rows, config, mistake)
            if mistake != "no_zero_grad":
                policy_opt.zero_grad()
            value_opt.zero_grad()
            (pg_loss + weight * v_loss).backward()
            if mistake == "joint_clip":
                both = model.policy_parameters() + model.value_parameters()
                torch.nn.utils.clip_grad_norm_(both, config.max_grad_norm)
            else:
                torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)
                torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)
            policy_opt.step()
            value_opt.step()
            logged = config.vf_coef * v_loss if mistake == "logged_vf_coef" else v_loss
            losses.append((pg_loss.item(), logged.item()))
            if mistake == "stop_each_minibatch" and stop_kl is not None and approx_kl > stop_kl:
                return losses
        if stop_kl is not None and approx_kl > stop_kl:  # the epoch's last minibatch, as CleanRL
            break
    return losses


def plain_iteration(model: Any, tokenizer: Any, prompts: list[str],
                    policy_opt: torch.optim.Optimizer, value_opt: torch.optim.Optimizer,
                    config: PPOConfig, generator: torch.Generator, mistake: str | None = None,
                    stop_kl: float | None = None) -> tuple[PlainRollout, list[tuple[float, float]]]:
    """Sample, make the experience, update: one iteration as the notebook's worked solutions write
    it, with `mistake` (a key of MISTAKES) made and, given `stop_kl`, Solution 3's early stop."""
    if mistake is not None and mistake not in MISTAKES:
        raise ValueError(f"mistake must be None or one of {sorted(MISTAKES)}, got {mistake!r}")
    samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length,
                               config.max_new_tokens, temperature=config.temperature)
    batch = plain_experience(model, samples, config, mistake)
    return batch, plain_update(model, batch, policy_opt, value_opt, config, generator, mistake,
                               stop_kl)
