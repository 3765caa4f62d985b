"""Plausible wrong answers to notebook 06's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("counts the EOS at t itself, so the EOS token is left out of the mask",
                "eos_before = torch.cumsum(is_eos, dim=1) - is_eos", "eos_before = torch.cumsum(is_eos, dim=1)"),
        Mistake("masks the EOS tokens (the pad == EOS mask) instead of everything after the first EOS",
                "return (eos_before == 0).float()", "return (is_eos == 0).float()"),
        Mistake("keeps the tokens after the first EOS, up to the second one",
                "return (eos_before == 0).float()", "return (eos_before <= 1).float()"),
        Mistake("returns the mask as integers, not floats", "return (eos_before == 0).float()",
                "return (eos_before == 0).long()"),
    ],
    "2": [
        Mistake("fits on the KL itself instead of d = sqrt(KL)", ".clamp(min=0).sqrt()", ".clamp(min=0)"),
        Mistake("adds the d log d column with a plus sign, so beta_G comes out negated",
                "torch.stack([torch.ones_like(d), d, -d_log_d], dim=1)",
                "torch.stack([torch.ones_like(d), d, d_log_d], dim=1)"),
        Mistake("uses log d instead of d log d", "d * torch.log(d.clamp(min=1e-300))",
                "torch.log(d.clamp(min=1e-300))"),
        Mistake("takes the square root before clamping negative KL values at 0", ".clamp(min=0).sqrt()",
                ".sqrt().clamp(min=0)"),
    ],
    "3": [
        Mistake("sums k1 (minus the log ratio) instead of k3", "((torch.expm1(log_w) - log_w) * mask)",
                "((-log_w) * mask)"),
        Mistake("flips the log ratio: log w = log pi - log ref", "log_w = ref_logprobs - logprobs",
                "log_w = logprobs - ref_logprobs"),
        Mistake("averages over the positions instead of summing", ".sum(dim=1)", ".mean(dim=1)"),
        Mistake("leaves the mask out, so padding adds to the sum", "((torch.expm1(log_w) - log_w) * mask)",
                "(torch.expm1(log_w) - log_w)"),
    ],
}
