"""Plausible wrong answers to notebook 08's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("the KL penalty with the wrong sign", "rewards = -beta * torch.where",
                "rewards = beta * torch.where"),
        Mistake("the score on the last column, not the last real token",
                "rewards[torch.arange(len(scores)), last] += scores", "rewards[:, -1] += scores"),
        Mistake("the advantages not whitened",
                "advantages = (advantages - mean) / torch.sqrt(var + 1e-8) * mask",
                "advantages = advantages * mask"),
        Mistake("the advantages whitened over the padding too",
                "mean = (advantages * mask).sum() / n\n    var = (((advantages - mean) * mask) ** "
                "2).sum() / (n - 1)",
                "mean, var = advantages.mean(), advantages.var()"),
        Mistake("the policy's log-probs without the temperature",
                "model.policy_logprobs(seq, attn, P, temperature=config.temperature)",
                "model.policy_logprobs(seq, attn, P)"),
        Mistake("the reference's log-probs without the temperature",
                "model.ref_logprobs(seq, attn, P, temperature=config.temperature)",
                "model.ref_logprobs(seq, attn, P)"),
        Mistake("the returns taken after whitening",
                "advantages = (advantages - mean) / torch.sqrt(var + 1e-8) * mask",
                "advantages = (advantages - mean) / torch.sqrt(var + 1e-8) * mask\n"
                "    returns = (advantages + values) * mask"),
        Mistake("the last real token bootstraps from the value at the padding",
                "next_value = values[:, t] * mask[:, t]", "next_value = values[:, t]"),
        Mistake("gamma left out of GAE's decay", "running = (delta + gamma * lam * running)",
                "running = (delta + lam * running)"),
    ],
    "2": [
        Mistake("the ratio against the reference's log-probs", "logp - batch.old_logprobs[rows]",
                "logp - batch.ref_logprobs[rows]"),
        Mistake("the clipped branch detached (the in-band gradient halves)",
                "rho.clamp(1 - config.clip_eps, 1 + config.clip_eps) * A",
                "rho.clamp(1 - config.clip_eps, 1 + config.clip_eps).detach() * A"),
        Mistake("max instead of min in the clipped objective", "torch.min(rho * A",
                "torch.max(rho * A"),
        Mistake("no value clip",
                "V_clip = V if eps_v is None else V_old + (V - V_old).clamp(-eps_v, eps_v)",
                "V_clip = V"),
        Mistake("the value clipped with clip_eps", "len(batch), config.value_clip",
                "len(batch), config.clip_eps"),
        Mistake("one shuffle for all epochs",
                "    for epoch in range(config.ppo_epochs):\n        order = torch.randperm(B, "
                "generator=generator)",
                "    order = torch.randperm(B, generator=generator)\n    for epoch in "
                "range(config.ppo_epochs):"),
        Mistake("one gradient clip over both adapters",
                "torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)  "
                "# each adapter on its own\n            "
                "torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)",
                "torch.nn.utils.clip_grad_norm_(model.policy_parameters() + "
                "model.value_parameters(), config.max_grad_norm)"),
        Mistake("the advantages whitened again in every minibatch (CleanRL's norm_adv)",
                "A, G, V_old = batch.advantages[rows], batch.returns[rows], batch.values[rows]",
                "A, G, V_old = batch.advantages[rows], batch.returns[rows], batch.values[rows]\n"
                "            A = (A - A[m.bool()].mean()) / (A[m.bool()].std() + 1e-8) * m"),
        Mistake("the update's log-probs without the temperature",
                "logp = model.policy_logprobs(seq, attn, P, temperature=config.temperature)",
                "logp = model.policy_logprobs(seq, attn, P)"),
        Mistake("vf_coef left out", "(pg_loss + config.vf_coef * v_loss).backward()",
                "(pg_loss + v_loss).backward()"),
        Mistake("vf_coef written in at 0.5 (CleanRL's and SB3's default)",
                "(pg_loss + config.vf_coef * v_loss).backward()",
                "(pg_loss + 0.5 * v_loss).backward()"),
        Mistake("the clip band written in at the usual 0.2",
                "rho.clamp(1 - config.clip_eps, 1 + config.clip_eps) * A",
                "rho.clamp(0.8, 1.2) * A"),
        Mistake("the policy's gradients never zeroed",
                "policy_opt.zero_grad()\n            value_opt.zero_grad()",
                "value_opt.zero_grad()"),
        Mistake("min instead of max of the two squared value errors", "torch.max((V - G) ** 2",
                "torch.min((V - G) ** 2"),
    ],
}
