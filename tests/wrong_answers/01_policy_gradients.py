"""Plausible wrong answers to notebook 01's exercises (reward_to_go, td_advantage, policy_kl)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("a forward cumulative sum: the rewards up to t instead of from t to the end",
                "rewards.flip(1).cumsum(1).flip(1)", "rewards.cumsum(1)"),
        Mistake("the reversed cumulative sum is not flipped back, so G_t sits at position T-1-t",
                ".cumsum(1).flip(1)", ".cumsum(1)"),
        Mistake("off by one: r_t itself left out, the sum runs from t+1",
                ".flip(1)  # (N, T)", ".flip(1) - rewards  # (N, T)"),
    ],
    "2": [
        Mistake("the value of the wrong state: V(s_{t-1}) instead of V(s_{t+1})",
                "F.pad(values[:, 1:], (0, 1))", "F.pad(values[:, :-1], (1, 0))"),
        Mistake("the bootstrap is missing: r_t - V(s_t)",
                "rewards + next_values - values", "rewards - values"),
        Mistake("torch.roll for the next value: after the last step it wraps around to V(s_0) instead of 0",
                "F.pad(values[:, 1:], (0, 1))", "values.roll(-1, dims=1)"),
    ],
    "3": [
        Mistake("the KL direction swapped: KL(new || old), an expectation over the new policy",
                "(old_logp.exp() * (old_logp - new_logp))", "(new_logp.exp() * (new_logp - old_logp))"),
        Mistake("probabilities where the formula has log-probabilities: sum p_old (p_old - p_new)",
                "(old_logp - new_logp)", "(old_logp.exp() - new_logp.exp())"),
        Mistake("no sum over the actions: one term per action comes back, shape (..., V)",
                ".sum(-1)", ""),
    ],
}
