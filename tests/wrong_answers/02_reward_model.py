"""Plausible wrong answers to notebook 02's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("averaged p itself (how often 'chosen' wins) instead of the better guess's "
                "accuracy max(p, 1 - p)",
                "torch.maximum(p, 1 - p).mean()", "p.mean()"),
        Mistake("took the worse guess, min(p, 1 - p), instead of the better one",
                "torch.maximum", "torch.minimum"),
        Mistake("multiplied the score difference by the temperature instead of dividing by it",
                "/ temperature", "* temperature"),
        Mistake("returned the 0-d tensor instead of a Python float (no .item())",
                ".mean().item()", ".mean()"),
    ],
    "2": [
        Mistake("the margin the wrong way round: sigmoid(r_rejected - r_chosen)",
                "chosen_scores - rejected_scores", "rejected_scores - chosen_scores"),
        Mistake("log-sigmoid without its minus sign (a log-likelihood, not a loss)",
                "return -F.logsigmoid", "return F.logsigmoid"),
        Mistake("summed over the pairs instead of averaging", ".mean()", ".sum()"),
        Mistake("log of the sigmoid, which underflows to log(0) = -inf at a margin of -100",
                "-F.logsigmoid(chosen_scores - rejected_scores)",
                "-torch.log(torch.sigmoid(chosen_scores - rejected_scores))"),
        Mistake("softplus of the margin instead of softplus of minus the margin",
                "-F.logsigmoid(chosen_scores - rejected_scores)",
                "F.softplus(chosen_scores - rejected_scores)"),
        Mistake("the rejected scores detached: the value is right, but training would never push "
                "them down",
                "chosen_scores - rejected_scores", "chosen_scores - rejected_scores.detach()"),
        Mistake(
            "the chosen scores detached: the value is right, but training would never push them up",
            "(chosen_scores - rejected", "(chosen_scores.detach() - rejected"),
        Mistake("a sign slip in the rejected branch only: r_c + r_r",
                "chosen_scores - rejected_scores", "chosen_scores + rejected_scores"),
    ],
    "3": [
        Mistake("count of real tokens minus one, the last real token only when the padding is on "
                "the right",
                "(positions * attention_mask.long()).max(dim=1).values",
                "attention_mask.sum(dim=1) - 1"),
        Mistake("the last column, the last real token only when the padding is on the left",
                "head_outputs[rows, last]", "head_outputs[:, -1]"),
        Mistake("argmax of the mask, which returns the first real token, not the last",
                "(positions * attention_mask.long()).max(dim=1).values",
                "attention_mask.argmax(dim=1)"),
        Mistake("head_outputs[:, last]: every row's index taken from every row, a (B, B) tensor",
                "head_outputs[rows, last]", "head_outputs[:, last]"),
        Mistake(
            "the scores rebuilt as a new tensor: the right values, but cut from the autograd graph",
            "return head_outputs[rows, last]",
            "return torch.tensor(head_outputs[rows, last].tolist())"),
    ],
}
