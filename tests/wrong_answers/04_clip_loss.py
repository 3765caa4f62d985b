"""Plausible wrong answers to notebook 04's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("took the max of the two terms instead of the min", "torch.min(", "torch.max("),
        Mistake("returned the clipped term alone, without the min",
                "torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)",
                "torch.clamp(ratio, 1 - eps, 1 + eps) * adv"),
        Mistake("clipped the product ratio * A instead of the ratio",
                "torch.clamp(ratio, 1 - eps, 1 + eps) * adv",
                "torch.clamp(ratio * adv, 1 - eps, 1 + eps)"),
        Mistake(
            "clamped the caller's ratios in place (the values returned are right; the ratios are "
            "not)",
            "torch.clamp(ratio, 1 - eps, 1 + eps) * adv", "ratio.clamp_(1 - eps, 1 + eps) * adv"),
        Mistake("clipped at the usual 0.8 and 1.2 instead of at 1 -/+ eps",
                "torch.clamp(ratio, 1 - eps, 1 + eps)", "torch.clamp(ratio, 0.8, 1.2)"),
        Mistake("detached the clipped term: the values are right, the in-band gradient is halved",
                "torch.clamp(ratio, 1 - eps, 1 + eps) * adv",
                "torch.clamp(ratio, 1 - eps, 1 + eps).detach() * adv"),
        Mistake("detached the unclipped term: the values are right, the gradient is halved or lost",
                "torch.min(ratio * adv,", "torch.min(ratio.detach() * adv,"),
    ],
    "2": [
        Mistake("flagged every ratio outside the band, whatever the advantage's sign",
                "((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))",
                "(ratio > 1 + eps) | (ratio < 1 - eps)"),
        Mistake(
            "swapped the sides: the side the advantage wants undone instead of the side it favours",
            "((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))",
            "((adv > 0) & (ratio < 1 - eps)) | ((adv < 0) & (ratio > 1 + eps))"),
        Mistake("forgot the negative advantages", " | ((adv < 0) & (ratio < 1 - eps))", ""),
        Mistake("the band written as the usual 0.8 and 1.2 instead of 1 -/+ eps",
                "((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))",
                "((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))"),
    ],
    "3": [
        Mistake("took the min of the two errors instead of the max", "torch.max(", "torch.min("),
        Mistake("detached the clipped branch: the values are right, the in-band gradient is halved",
                "(v_clipped - returns) ** 2", "(v_clipped.detach() - returns) ** 2"),
        Mistake("clipped around the return G instead of the old value",
                "old_values + torch.clamp(values - old_values",
                "returns + torch.clamp(values - returns"),
        Mistake("clipped the value itself instead of its change from the old value",
                "old_values + torch.clamp(values - old_values, -eps_v, eps_v)",
                "torch.clamp(values, -eps_v, eps_v)"),
        Mistake("clipped with the policy's 0.2 instead of eps_v", "-eps_v, eps_v)", "-0.2, 0.2)"),
        Mistake("left out the 1/2", "0.5 * (", "("),
        Mistake("averaged over every position, padding included",
                "* mask).sum() / mask.sum()", "* mask).mean()"),
        Mistake("left the mask out, so the padding's errors enter",
                "(torch.max(err, err_clipped) * mask).sum()", "torch.max(err, err_clipped).sum()"),
    ],
}
