"""Plausible wrong answers to notebook 05's exercises (tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("the score on the last column instead of the last real token",
                "last = mask.sum(dim=1).long() - 1", "last = torch.full_like(scores, mask.shape[1] - 1).long()"),
        Mistake("the mask multiplied in, so NaN padding leaks (NaN x 0 is NaN)",
                "torch.where(real, logprobs - ref_logprobs, torch.zeros_like(logprobs))",
                "(logprobs - ref_logprobs) * mask"),
        Mistake("the KL penalty with the wrong sign", "rewards = -beta * k1", "rewards = beta * k1"),
        Mistake("the KL the wrong way round (ref minus policy)",
                "logprobs - ref_logprobs, torch.zeros_like", "ref_logprobs - logprobs, torch.zeros_like"),
    ],
    "2": [
        Mistake("the padding's value bootstraps the last real token",
                "next_value = values[:, t] * real", "next_value = values[:, t]"),
        Mistake("gamma left out of the recursion", "running = (delta + gamma * lam * running) * real",
                "running = (delta + lam * running) * real"),
        Mistake("the returns without the values", "return advantages, (advantages + values) * mask",
                "return advantages, advantages * mask"),
        Mistake("a forward loop instead of a reverse one", "for t in reversed(range(T)):", "for t in range(T):"),
    ],
    "3": [
        Mistake("max instead of min", "surrogate = torch.min(", "surrogate = torch.max("),
        Mistake("the loss not negated (the objective returned)", "    return -surrogate.sum() / mask.sum()",
                "    return surrogate.sum() / mask.sum()"),
        Mistake("padding's garbage reaches exp (no torch.where)",
                "log_rho = torch.where(real, logprobs - old_logprobs, torch.zeros_like(logprobs))",
                "log_rho = logprobs - old_logprobs"),
        Mistake("per sequence divided by the padded width, not the response's length",
                "surrogate.sum(dim=1) / mask.sum(dim=1)", "surrogate.sum(dim=1) / mask.shape[1]"),
    ],
    "4": [
        Mistake("the ratio against the reference's log-probs instead of the stored ones",
                "batch.old_logprobs[rows]", "batch.ref_logprobs[rows]"),
        Mistake("one shuffle for all epochs",
                "    for epoch in range(config.ppo_epochs):\n        order = torch.randperm(B, generator=generator)",
                "    order = torch.randperm(B, generator=generator)\n"
                "    for epoch in range(config.ppo_epochs):\n        order = order"),
        Mistake("the value loss not scaled by vf_coef", "(config.vf_coef * v_loss).backward()", "v_loss.backward()"),
        Mistake("no gradient clip on the policy step",
                "torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)", "pass"),
        Mistake("one gradient clip over both adapters at once",
                "torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)",
                "torch.nn.utils.clip_grad_norm_(model.policy_parameters() + model.value_parameters(), "
                "config.max_grad_norm)"),
        Mistake("no value clip", "V_clip = V if eps_v is None else V_old + (V - V_old).clamp(-eps_v, eps_v)",
                "V_clip = V"),
        Mistake("the value loss averaged over padding too",
                "v_loss = 0.5 * (torch.max((V - G) ** 2, (V_clip - G) ** 2) * m).sum() / m.sum()",
                "v_loss = 0.5 * torch.max((V - G) ** 2, (V_clip - G) ** 2).mean()"),
    ],
    "5": [
        Mistake("the (n - 1) / n term left out", "return math.log(n) - (n - 1) / n", "return math.log(n)"),
        Mistake("(n - 1) without the division by n", "return math.log(n) - (n - 1) / n",
                "return math.log(n) - (n - 1)"),
        Mistake("log base 2 instead of nats", "return math.log(n) - (n - 1) / n", "return math.log2(n) - (n - 1) / n"),
    ],
}
