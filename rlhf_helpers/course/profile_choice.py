"""The profile a Colab learner picks in the set-up cell's form, and what the choice means.

The set-up cell (`rlhf_helpers.course.notebook.colab_setup_source`) shows a drop-down, `auto`
by default: `auto` is `gpu` where CUDA is present, else `tiny`. `choose_profile` sets $RLHF_PROFILE
for this kernel (unless the learner set it already) and says, in fixed words, what the choice means
for the numbers the text states.
"""

from __future__ import annotations

import os

from rlhf_helpers.runtime.profiles import PROFILE_ENV, resolve_profile_name

#: The choices of the set-up cell's drop-down, in its order
CHOICES = ("auto", "tiny", "gpu")
#: What each profile means for the text's numbers (fixed prose, one paragraph each)
MEANING = {
    "tiny": ("Profile tiny: the course's tiny model on the CPU (an attached GPU stays idle), the "
             "whole course in minutes. The numbers the text states are this profile's; your run "
             "checks each claim and prints a note where your machine's rounding took another "
             "path."),
    "gpu": ("Profile gpu: SmolLM2-135M on the GPU, fine-tuned on the course's corpus first (a few "
            "minutes), in bf16, or fp16 on a T4. The numbers the text states are the tiny "
            "profile's: yours differ, the claim cells say they checked nothing, and the figures "
            "are your run's own. Pick tiny to see the text's numbers."),
}


def choose_profile(choice: str) -> str:
    """Set $RLHF_PROFILE to `choice` ("auto", "tiny" or "gpu"; "auto" resolves here) unless it is
    already set, print what the profile in use means, and return its name. ValueError for any other
    choice."""
    if choice not in CHOICES:
        raise ValueError(f"choice must be one of {CHOICES}, got {choice!r}")
    if os.environ.get(PROFILE_ENV):
        name = resolve_profile_name(None)
        print(f"${PROFILE_ENV} was already set; the form's choice is not used.")
    else:
        name = resolve_profile_name(choice)
        os.environ[PROFILE_ENV] = name
    print(MEANING[name])
    return name
