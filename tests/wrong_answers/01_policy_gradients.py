"""Plausible wrong answers to notebook 01's exercises (td_advantage, policy_kl,
response_logprobs)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("the value of the wrong state: V(s_{t-1}) instead of V(s_{t+1})",
                "F.pad(values[:, 1:], (0, 1))", "F.pad(values[:, :-1], (1, 0))"),
        Mistake("the bootstrap is missing: r_t - V(s_t)",
                "rewards + next_values - values", "rewards - values"),
        Mistake("torch.roll for the next value: after the last step it wraps around to V(s_0) "
                "instead of 0",
                "F.pad(values[:, 1:], (0, 1))", "values.roll(-1, dims=1)"),
    ],
    "2": [
        Mistake("the KL direction swapped: KL(new || old), an expectation over the new policy",
                "(old_logp.exp() * (old_logp - new_logp))",
                "(new_logp.exp() * (new_logp - old_logp))"),
        Mistake("probabilities where the formula has log-probabilities: sum p_old (p_old - p_new)",
                "(old_logp - new_logp)", "(old_logp.exp() - new_logp.exp())"),
        Mistake("no sum over the actions: one term per action comes back, shape (..., V)",
                ".sum(-1)", ""),
        Mistake("the new policy's log-probs detached: the value is right, but a KL penalty would "
                "never move the new policy", "new_logp = new_logits.log_softmax(-1)",
                "new_logp = new_logits.log_softmax(-1).detach()"),
    ],
    "3": [
        Mistake("no shift: token t scored by the logits at position t, which predict token t+1",
                "z = logits[:, :-1]", "z = logits[:, 1:]"),
        Mistake("the log-probs padded on the wrong side: column t holds token t+1's log-prob",
                "F.pad(token_logp, (1, 0))", "F.pad(token_logp, (0, 1))"),
        Mistake("the response start counted from column 0, ignoring the left padding",
                "(L - attention_mask.sum(dim=1)) + prompt_lengths", "prompt_lengths"),
        Mistake("the prompt not masked: its tokens are scored as if the policy had chosen them",
                "(L - attention_mask.sum(dim=1)) + prompt_lengths",
                "(L - attention_mask.sum(dim=1))"),
        Mistake("off by one at the start: > where >= belongs drops the first response token",
                "[None, :] >= start", "[None, :] > start"),
        Mistake("the normaliser detached: the values are right, the gradient only pushes the "
                "chosen logit",
                "torch.logsumexp(z, dim=-1)", "torch.logsumexp(z, dim=-1).detach()"),
    ],
}
