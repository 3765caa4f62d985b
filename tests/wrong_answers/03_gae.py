"""Plausible wrong answers to notebook 03's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("left the count as a float (no .long()), so the indices cannot index a tensor",
                "mask.sum(dim=1).long() - 1", "mask.sum(dim=1) - 1"),
        Mistake("returned the number of real tokens: the first padding position, one past the last "
                "real token",
                "mask.sum(dim=1).long() - 1", "mask.sum(dim=1).long()"),
        Mistake("used argmax, which finds the first 1 of each row, not the last",
                "mask.sum(dim=1).long() - 1", "mask.argmax(dim=1)"),
    ],
    "2": [
        Mistake("looped forwards over t instead of backwards", "reversed(range(rewards.shape[1]))",
                "range(rewards.shape[1])"),
        Mistake("left the mask out of the running advantage, so padding feeds the last real token",
                "running = (delta + gamma * lam * running) * mask[:, t]",
                "running = delta + gamma * lam * running"),
        Mistake("bootstrapped the last real token from the value stored at the padding after it",
                "next_value = values[:, t] * mask[:, t]", "next_value = values[:, t]"),
        Mistake("discounted the next value in the TD error by lambda instead of gamma",
                "rewards[:, t] + gamma * next_value", "rewards[:, t] + lam * next_value"),
        Mistake("no bootstrap: the TD error without gamma V(s_t+1)",
                "delta = rewards[:, t] + gamma * next_value - values[:, t]",
                "delta = rewards[:, t] - values[:, t]"),
        Mistake("the Monte-Carlo reward-to-go as the returns instead of A + V (the lambda-return)",
                "    return advantages, (advantages + values) * mask",
                "    returns = torch.zeros_like(rewards)  # (B, T): the reward-to-go\n"
                "    to_go = torch.zeros_like(rewards[:, 0])  # (B,)\n"
                "    for t in reversed(range(rewards.shape[1])):\n"
                "        to_go = (rewards[:, t] + gamma * to_go) * mask[:, t]\n"
                "        returns[:, t] = to_go\n"
                "    return advantages, returns",
                hint="the lambda-return"),
    ],
    "3": [
        Mistake("the biased variance, divided by n instead of n - 1", "/ (n - 1)", "/ n"),
        Mistake("eps added to the standard deviation (CleanRL's std + 1e-8) instead of inside the "
                "square root",
                "torch.sqrt(var + eps)", "(torch.sqrt(var) + eps)"),
        Mistake("no eps at all", "torch.sqrt(var + eps)", "torch.sqrt(var)"),
        Mistake("eps written as the default 1e-8, ignoring the eps argument",
                "torch.sqrt(var + eps)", "torch.sqrt(var + 1e-8)"),
        Mistake("the padding's deviations left in the variance", "((x - mean) * mask) ** 2",
                "(x - mean) ** 2", hint="mask the deviations before squaring"),
        Mistake("the padding zeroed by multiplying by the mask: NaN there turns every sum NaN",
                "    x = torch.where(mask.bool(), x, 0.0)", "    x = x * mask",
                hint="NaN x 0 is NaN"),
        Mistake("the mean over every position, padding included", "(x * mask).sum() / n",
                "(x * mask).mean()"),
        Mistake("the padding left at (x - mean) / sigma instead of 0",
                "* mask  # (B, T): 0 at padding", " # (B, T)"),
    ],
}
