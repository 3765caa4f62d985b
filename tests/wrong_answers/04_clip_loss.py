"""Plausible wrong answers to notebook 04's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("took the max of the two terms instead of the min", "torch.min(", "torch.max("),
        Mistake("returned the clipped term alone, without the min",
                "torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)",
                "torch.clamp(ratio, 1 - eps, 1 + eps) * adv"),
        Mistake("clipped the product ratio * A instead of the ratio",
                "torch.clamp(ratio, 1 - eps, 1 + eps) * adv", "torch.clamp(ratio * adv, 1 - eps, 1 + eps)"),
        Mistake("clamped the caller's ratios in place (the values returned are right; the ratios are not)",
                "torch.clamp(ratio, 1 - eps, 1 + eps) * adv", "ratio.clamp_(1 - eps, 1 + eps) * adv"),
    ],
    "2": [
        Mistake("flagged every ratio outside the band, whatever the advantage's sign",
                "((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))",
                "(ratio > 1 + eps) | (ratio < 1 - eps)"),
        Mistake("swapped the sides: the side the advantage wants undone instead of the side it favours",
                "((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))",
                "((adv > 0) & (ratio < 1 - eps)) | ((adv < 0) & (ratio > 1 + eps))"),
        Mistake("forgot the negative advantages", " | ((adv < 0) & (ratio < 1 - eps))", ""),
    ],
    "3": [
        Mistake("left out the 1/2", "0.5 * (", "("),
        Mistake("averaged over every position, padding included",
                "((values - returns) ** 2) * mask).sum() / mask.sum()", "((values - returns) ** 2) * mask).mean()"),
        Mistake("left the mask out of the squared errors, so the padding's errors enter",
                "(((values - returns) ** 2) * mask).sum()", "((values - returns) ** 2).sum()"),
    ],
}
