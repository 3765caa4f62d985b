"""A simulated annotator: picks the better of two responses with Bradley-Terry noise.

    P(a preferred over b) = sigmoid((score(a) - score(b)) / temperature)

where score is the hidden score of `scorer.py`. At temperature -> 0 the annotator always picks
the higher score; at large temperature it flips a fair coin. Because the label probabilities
are known, so is the best pairwise accuracy any reward model can reach on its labels:

    ceiling = E[max(p, 1 - p)]  over the pairs

(a perfect model predicts the more likely label and is right with probability max(p, 1 - p)).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

from rlhf_helpers.world.scorer import hidden_score

#: Temperature used to label the shipped preference pairs.
DEFAULT_TEMPERATURE = 0.5


def preference_probability(score_a: float, score_b: float, temperature: float) -> float:
    """Bradley-Terry probability that a is preferred: sigmoid((score_a - score_b) / temperature)."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    z = (score_a - score_b) / temperature
    # numerically stable sigmoid
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def accuracy_ceiling(probabilities: Iterable[float]) -> float:
    """Best achievable pairwise accuracy on labels drawn with these probabilities: mean max(p,
    1-p)."""
    values = list(probabilities)
    if not values:
        raise ValueError("probabilities must not be empty")
    for p in values:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probabilities must lie in [0, 1], got {p}")
    return sum(max(p, 1.0 - p) for p in values) / len(values)


class Annotator:
    """A noisy labeller with a fixed temperature and its own seeded RNG.

    `label(prompt, a, b)` returns 0 if it prefers `a` and 1 if it prefers `b`. Pass `rng` to
    draw the coin from a per-record RNG instead (the data build does, so each record is
    reproducible on its own).
    """

    def __init__(self, temperature: float = DEFAULT_TEMPERATURE, seed: int = 0) -> None:
        if not (temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        self.temperature = temperature
        self._rng = random.Random(seed)

    def probability(self, prompt: str, a: str, b: str) -> float:
        """P(a preferred over b) under the Bradley-Terry model of the hidden score."""
        return preference_probability(
            hidden_score(prompt, a), hidden_score(prompt, b), self.temperature
        )

    def label(self, prompt: str, a: str, b: str, rng: random.Random | None = None) -> int:
        """0 if the annotator prefers `a`, 1 if it prefers `b` (a Bernoulli draw)."""
        coin = (rng or self._rng).random()
        return 0 if coin < self.probability(prompt, a, b) else 1
