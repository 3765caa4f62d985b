"""Plausible wrong answers to notebook 03's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("left the count as a float (no .long()), so the indices cannot index a tensor",
                "mask.sum(dim=1).long() - 1", "mask.sum(dim=1) - 1"),
        Mistake("returned the number of real tokens: the first padding position, one past the last real token",
                "mask.sum(dim=1).long() - 1", "mask.sum(dim=1).long()"),
        Mistake("used argmax, which finds the first 1 of each row, not the last",
                "mask.sum(dim=1).long() - 1", "mask.argmax(dim=1)"),
    ],
    "2": [
        Mistake("looped forwards over t instead of backwards", "reversed(range(T))", "range(T)"),
        Mistake("left the mask out of the running advantage, so padding feeds the last real token",
                "running = (delta + gamma * lam * running) * real", "running = delta + gamma * lam * running"),
        Mistake("bootstrapped the last real token from the value stored at the padding after it",
                "next_value = values[:, t] * real", "next_value = values[:, t]"),
        Mistake("discounted the next value in the TD error by lambda instead of gamma",
                "rewards[:, t] + gamma * next_value", "rewards[:, t] + lam * next_value"),
        Mistake("no bootstrap: the TD error without gamma V(s_t+1)",
                "delta = rewards[:, t] + gamma * next_value - values[:, t]", "delta = rewards[:, t] - values[:, t]"),
    ],
    "3": [
        Mistake("divided by every position, padding included", "(x * mask).sum() / mask.sum()", "(x * mask).mean()"),
        Mistake("averaged the per-row means, so short rows weigh as much as long ones",
                "(x * mask).sum() / mask.sum()", "((x * mask).sum(dim=1) / mask.sum(dim=1)).mean()"),
        Mistake("summed x without the mask, so the padding's values enter", "(x * mask).sum()", "x.sum()"),
        Mistake("masked the caller's x in place (x.mul_), so the padding values it held are gone",
                "(x * mask).sum()", "x.mul_(mask).sum()"),
    ],
}
