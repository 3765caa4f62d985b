"""Plausible wrong answers to notebook 07's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("leaves r_i in its own baseline: returns the centred rewards with no constant",
                "return G / (G - 1) * centred", "return centred"),
        Mistake("inverts the constant: (G - 1) / G instead of G / (G - 1)",
                "return G / (G - 1) * centred", "return (G - 1) / G * centred"),
        Mistake("divides the sum of the other rewards by G instead of G - 1",
                "return G / (G - 1) * centred",
                "return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / G"),
        Mistake("takes the mean over the prompts (dim 0) instead of over each group",
                "rewards.mean(dim=1, keepdim=True)", "rewards.mean(dim=0, keepdim=True)"),
    ],
    "2": [
        Mistake("GRPO: divides by the batch's token count (DAPO's normaliser) instead of each "
                "response's length",
                "(B * mask.sum(dim=1, keepdim=True).clamp(min=1.0))", "mask.sum().clamp(min=1.0)"),
        Mistake("GRPO: forgets the 1/B of the mean over responses",
                "(B * mask.sum(dim=1, keepdim=True).clamp(min=1.0))",
                "mask.sum(dim=1, keepdim=True).clamp(min=1.0)"),
        Mistake(
            "Dr. GRPO: divides by each response's own length instead of the constant max_length",
            "(B * max_length)", "(B * mask.sum(dim=1, keepdim=True))"),
        Mistake("Dr. GRPO: divides by the batch's padded width instead of the max_length setting",
                "(B * max_length)", "(B * mask.shape[1])"),
        Mistake("Dr. GRPO: divides by the longest response in the batch instead of the max_length "
                "setting",
                "(B * max_length)", "(B * mask.sum(dim=1).max())"),
        Mistake("Dr. GRPO: leaves the mask out, so padding gets a weight",
                "advantages[:, None] * mask / (B * max_length)",
                "advantages[:, None] / (B * max_length)"),
    ],
}
