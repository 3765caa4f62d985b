# Copy to notebooks/src/NN_topic.py, fill in, then run `python tools/build_notebooks.py`.
# (Files starting with "_" are not built.) See notebooks/CONVENTIONS.md.

# %% [markdown]
# # NN · Title
#
# {{colab_badge}}
#
# **You will learn**
# - ...

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import plotly.graph_objects as go
import torch
from tqdm.auto import tqdm

import rlhf_helpers
from rlhf_helpers.runtime.profiles import get_profile

profile = get_profile()
torch.manual_seed(profile.seed)

# %% [markdown]
# ## 1. The idea
#
# $$\text{the equation, right above the code that implements it}$$

# %%
def thing_scratch(x: torch.Tensor) -> torch.Tensor:
    """What it computes: (B, T) -> (B, T)."""
    return x  # (B, T)


# Check the from-scratch version against the library, so the two cannot drift.
# torch.testing.assert_close(thing_scratch(x), rlhf_helpers.thing(x))

# %% [markdown]
# ### Exercise 1: ...

# %%
# EXERCISE 1
def exercise_fn(x: torch.Tensor) -> torch.Tensor:
    """..."""
    raise NotImplementedError


# %%
def check_exercise_fn():
    x = torch.randn(3, 4)
    torch.testing.assert_close(exercise_fn(x), x)  # against an independent formula or loop


exercise_check("Exercise 1 (exercise_fn)", check_exercise_fn)

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def exercise_fn(x: torch.Tensor) -> torch.Tensor:
#     """..."""
#     return x
# ```
# </details>
