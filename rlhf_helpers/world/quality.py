"""Sample-quality metrics: hidden-score distribution, EOS rate and distinct-n.

Used by the data build (tiny model against its corpus), the benchmark, and the notebooks
(policy samples before and after PPO).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlhf_helpers.world.scorer import hidden_scores, tokenize_words


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct-n: unique n-grams / total n-grams over all texts (word tokens, lower case).

    1.0 means no n-gram repeats; a collapsed model that says the same thing scores near 0.
    Texts shorter than n contribute no n-grams; with no n-grams at all the result is 0.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams: list[tuple[str, ...]] = []
    for text in texts:
        tokens = tokenize_words(text)
        grams += [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, standard deviation (population), min, quartiles and max of a list of numbers."""
    if not values:
        raise ValueError("values must not be empty")
    ordered = sorted(values)
    count = len(ordered)
    mean = sum(ordered) / count
    std = math.sqrt(sum((v - mean) ** 2 for v in ordered) / count)

    def quantile(q: float) -> float:
        # linear interpolation between closest ranks
        position = q * (count - 1)
        low = int(math.floor(position))
        high = min(low + 1, count - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return {"mean": mean, "std": std, "min": ordered[0], "q25": quantile(0.25),
            "median": quantile(0.5), "q75": quantile(0.75), "max": ordered[-1]}


def sample_quality(
    prompts: Sequence[str], responses: Sequence[str], ended_with_eos: Sequence[bool] | None = None
) -> dict[str, float]:
    """Hidden-score summary (keys "score_*"), EOS fraction, distinct-1/2 and mean word count."""
    scores = hidden_scores(prompts, responses)
    report = {f"score_{k}": v for k, v in summarize(scores).items()}
    if ended_with_eos is not None:
        if len(ended_with_eos) != len(responses):
            raise ValueError(
                f"ended_with_eos must have one flag per response, got {len(ended_with_eos)} "
                f"for {len(responses)} responses"
            )
        report["eos_fraction"] = sum(map(bool, ended_with_eos)) / len(ended_with_eos)
    report["distinct_1"] = distinct_n(responses, 1)
    report["distinct_2"] = distinct_n(responses, 2)
    report["mean_words"] = sum(
        sum(t.isalpha() for t in tokenize_words(r)) for r in responses
    ) / len(responses)
    return report
