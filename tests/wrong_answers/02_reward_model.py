"""Plausible wrong answers to notebook 02's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("averaged p itself (how often 'chosen' wins) instead of the better guess's accuracy max(p, 1 - p)",
                "torch.maximum(p, 1 - p).mean()", "p.mean()"),
        Mistake("took the worse guess, min(p, 1 - p), instead of the better one", "torch.maximum", "torch.minimum"),
        Mistake("multiplied the score difference by the temperature instead of dividing by it",
                "/ temperature", "* temperature"),
        Mistake("returned the 0-d tensor instead of a Python float (no .item())", ".mean().item()", ".mean()"),
    ],
    "2": [
        Mistake("the margin the wrong way round: sigmoid(r_rejected - r_chosen)",
                "chosen_scores - rejected_scores", "rejected_scores - chosen_scores"),
        Mistake("log-sigmoid without its minus sign (a log-likelihood, not a loss)", "return -F.logsigmoid",
                "return F.logsigmoid"),
        Mistake("summed over the pairs instead of averaging", ".mean()", ".sum()"),
        Mistake("log of the sigmoid, which underflows to log(0) = -inf at a margin of -100",
                "-F.logsigmoid(chosen_scores - rejected_scores)",
                "-torch.log(torch.sigmoid(chosen_scores - rejected_scores))"),
        Mistake("softplus of the margin instead of softplus of minus the margin",
                "-F.logsigmoid(chosen_scores - rejected_scores)", "F.softplus(chosen_scores - rejected_scores)"),
    ],
    "3": [
        Mistake("count of real tokens minus one, right only when the padding is on the right",
                "(positions * attention_mask.long()).max(dim=1).values", "attention_mask.sum(dim=1) - 1"),
        Mistake("multiplied by a float mask, so the index comes back as float32",
                "attention_mask.long()", "attention_mask.float()"),
        Mistake("the index of the first padding token instead of the last real one",
                "(positions * attention_mask.long()).max(dim=1).values", "(attention_mask == 0).long().argmax(dim=1)"),
        Mistake("argmax of the mask, which returns the first real token, not the last",
                "(positions * attention_mask.long()).max(dim=1).values", "attention_mask.argmax(dim=1)"),
        Mistake("positions counted from 1, one past the last real token",
                "torch.arange(L, device", "torch.arange(1, L + 1, device"),
    ],
}
