"""Interactive explorers (ipywidgets + plotly) for the course notebooks.

    from rlhf_helpers import widgets
    widgets.ClipExplorer()          # PPO clip: both terms, the min, the gradient, the six cases
    widgets.GAEExplorer()           # per-token rewards, TD errors, GAE advantages, returns
    widgets.KLExplorer()            # k1 / k2 / k3 estimators against the exact KL
    widgets.ValueClipExplorer()     # clipped against unclipped value loss

Each takes `backend="auto" | "figurewidget" | "html" | "output"` (see `backends`), works on
ipywidgets 7.7 (Colab) and 8, plotly 5 to 7, and computes every number with the `rlhf_helpers` maths
core.
"""

from rlhf_helpers.widgets.backends import BACKENDS, ENV_VAR, FigureView, resolve_backend
from rlhf_helpers.widgets.clip_explorer import ClipExplorer
from rlhf_helpers.widgets.gae_explorer import GAEExplorer, TokenResponse
from rlhf_helpers.widgets.kl_explorer import KLExplorer
from rlhf_helpers.widgets.value_clip_explorer import ValueClipExplorer

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "ClipExplorer",
    "FigureView",
    "GAEExplorer",
    "KLExplorer",
    "TokenResponse",
    "ValueClipExplorer",
    "resolve_backend",
]
