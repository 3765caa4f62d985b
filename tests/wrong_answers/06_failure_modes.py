"""Plausible wrong answers to notebook 06's exercises (see tests/mistakes.py)."""

from mistakes import Mistake

MISTAKES = {
    "1": [
        Mistake("counts the EOS at t itself, so the EOS token is left out of the mask",
                "eos_before = torch.cumsum(is_eos, dim=1) - is_eos",
                "eos_before = torch.cumsum(is_eos, dim=1)"),
        Mistake(
            "masks the EOS tokens (the pad == EOS mask) instead of everything after the first EOS",
            "return (eos_before == 0).float()", "return (is_eos == 0).float()"),
        Mistake("keeps the tokens after the first EOS, up to the second one",
                "return (eos_before == 0).float()", "return (eos_before <= 1).float()"),
        Mistake("returns the mask as integers, not floats", "return (eos_before == 0).float()",
                "return (eos_before == 0).long()"),
    ],
    "2": [
        Mistake("no clip: uses the relative error unclipped",
                "min(max((kl - target) / target, -0.2), 0.2)", "(kl - target) / target"),
        Mistake("clips the absolute error KL - target, then divides by the target",
                "min(max((kl - target) / target, -0.2), 0.2)",
                "min(max(kl - target, -0.2), 0.2) / target"),
        Mistake("takes the error relative to the measured KL instead of the target",
                "(kl - target) / target,", "(kl - target) / kl,"),
        Mistake("flips the sign: a KL above the target lowers beta", "(1.0 + gain * error)",
                "(1.0 - gain * error)"),
        Mistake("counts the horizon in steps: K_beta = 1 / horizon",
                "min(batch_size / horizon, 1.0)", "min(1 / horizon, 1.0)"),
        Mistake("turns K_beta upside down: horizon / batch_size", "batch_size / horizon",
                "horizon / batch_size"),
        Mistake("leaves K_beta uncapped (TRL's old controller), so beta can turn negative",
                "min(batch_size / horizon, 1.0)", "batch_size / horizon"),
        Mistake("updates beta additively instead of multiplying it",
                "betas[-1] * (1.0 + gain * error)", "betas[-1] + gain * error"),
        Mistake("returns the beta before each update instead of after", "return betas[1:]",
                "return betas[:-1]"),
    ],
    "3": [
        Mistake("fits on the KL itself instead of d = sqrt(KL)",
                ".clamp(min=0).sqrt()", ".clamp(min=0)"),
        Mistake("adds the d log d column with a plus sign, so beta_G comes out negated",
                "torch.stack([torch.ones_like(d), d, -d_log_d], dim=1)",
                "torch.stack([torch.ones_like(d), d, d_log_d], dim=1)"),
        Mistake("uses log d instead of d log d", "d * torch.log(d.clamp(min=1e-300))",
                "torch.log(d.clamp(min=1e-300))"),
        Mistake("takes the square root before clamping negative KL values at 0",
                ".clamp(min=0).sqrt()", ".sqrt().clamp(min=0)"),
    ],
}
