"""One record of each shipped data file, as a pure function of (seed, split, index).

`build.py` writes files made of these records; the tests regenerate a slice and compare it
with the shipped files. Responses are stored with a leading space so that `prompt + response`
(the way TRL joins an explicit prompt to its completion) reads as plain text.
"""

from __future__ import annotations

from rlhf_helpers.world.annotator import DEFAULT_TEMPERATURE, Annotator
from rlhf_helpers.world.reviews import generate_prompt, generate_review, record_rng

#: Records per file in the shipped data.
DEFAULT_SIZES: dict[str, int] = {
    "prompts_train": 2000,
    "prompts_test": 200,
    "sft": 8000,
    "preferences_train": 4000,
    "preferences_test": 500,
}

#: Text between a prompt and its response.
RESPONSE_PREFIX = " "


def prompt_record(seed: int, split: str, index: int) -> dict[str, str]:
    """Record `index` of prompts_<split>.jsonl; "test" prompts use the held-out titles only."""
    rng = record_rng(seed, f"prompts_{split}", index)
    return generate_prompt(rng, held_out=split == "test")


def sft_record(seed: int, index: int) -> dict[str, str]:
    """Record `index` of sft.jsonl: a train-title prompt and one review of it."""
    rng = record_rng(seed, "sft", index)
    prompt = generate_prompt(rng, held_out=False)
    return {"prompt": prompt["prompt"],
            "completion": RESPONSE_PREFIX + generate_review(rng, prompt["genre"])}


def preference_record(
    seed: int, split: str, index: int, temperature: float = DEFAULT_TEMPERATURE
) -> tuple[dict[str, str], float]:
    """Record `index` of preferences_<split>.jsonl and P(chosen preferred) under the annotator.

    Two different reviews of one prompt are labelled by a Bradley-Terry annotator whose coin is
    drawn from the record's own RNG.
    """
    rng = record_rng(seed, f"preferences_{split}", index)
    prompt = generate_prompt(rng, held_out=split == "test")
    a = RESPONSE_PREFIX + generate_review(rng, prompt["genre"])
    b = a
    while b == a:
        b = RESPONSE_PREFIX + generate_review(rng, prompt["genre"])
    annotator = Annotator(temperature)
    p_a = annotator.probability(prompt["prompt"], a, b)
    first = annotator.label(prompt["prompt"], a, b, rng=rng)
    chosen, rejected, p_chosen = (a, b, p_a) if first == 0 else (b, a, 1.0 - p_a)
    return {"prompt": prompt["prompt"], "chosen": chosen, "rejected": rejected}, p_chosen
