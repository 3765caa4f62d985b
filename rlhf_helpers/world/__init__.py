"""The offline world of the course: synthetic movie reviews, a hidden scorer, a noisy annotator
and a tiny GPT-2 trained on the reviews.

Import the parts you need from their modules (`rlhf_helpers.world.scorer`, `.reviews`,
`.annotator`, `.tokenizer`, `.tiny_model`, `.quality`, `.build`). The light ones are re-exported
here; nothing in this package imports torch or transformers at import time except
`tokenizer`, `tiny_model` and `build`. It knows nothing of PPO: the engine (`rlhf_helpers.ppo`)
never imports it, and the pipeline (`rlhf_helpers.stages`) passes its hidden scorer in.
"""

from rlhf_helpers.world.annotator import Annotator, accuracy_ceiling
from rlhf_helpers.world.reviews import generate_prompt, generate_review, record_rng
from rlhf_helpers.world.scorer import ScoreBreakdown, hidden_score, hidden_scores, score_breakdown

__all__ = [
    "Annotator",
    "ScoreBreakdown",
    "accuracy_ceiling",
    "generate_prompt",
    "generate_review",
    "hidden_score",
    "hidden_scores",
    "record_rng",
    "score_breakdown",
]
