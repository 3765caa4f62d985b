"""Names and one-line meanings of the metrics `PPOTrainer.step` logs, and a plotly figure of their curves.

    from rlhf_helpers.ppo.metrics import GLOSSARY, plot_curves
    fig = plot_curves(trainer.history, keys=("score", "hidden_score", "kl"))

docs/metrics.md is the long form: what healthy and unhealthy curves look like.
Imports only plotly (lazily), so notebooks can use it without loading a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: metric name -> one line: what it is (see docs/metrics.md for what healthy looks like).
GLOSSARY: dict[str, str] = {
    # rollouts: what the policy does
    "score": "mean reward-model score of the batch's responses (the proxy PPO maximises)",
    "hidden_score": "mean hidden ground-truth score of the same responses (what we really want)",
    "kl": "mean sequence KL to the reference, sum_t (log pi - log ref) over response tokens (k1)",
    "kl_coef": "beta, the weight of the per-token KL penalty this step (changes if adaptive)",
    "entropy": "mean per-token entropy of the policy on its own responses (nats)",
    "response_length": "mean response length in tokens, EOS included",
    "eos_fraction": "fraction of responses that ended with EOS before max_new_tokens",
    "explained_variance": "1 - Var[returns - values] / Var[returns] over real tokens (critic quality)",
    "return_mean": "mean GAE return over real tokens (the critic's regression target)",
    "value_mean": "mean old value V(s_t) over real tokens",
    # updates: what the optimiser does (means over epochs and minibatches)
    "policy_loss": "clipped surrogate loss -min(r A, clip(r) A), masked mean",
    "clipfrac": "fraction of response tokens whose ratio left [1 - eps, 1 + eps] with the clip active",
    "approx_kl": "mean (r - 1) - log r between the updated and the sampling policy (k3 estimate)",
    "value_loss": "clipped value loss 0.5 * max((V - R)^2, (clip(V) - R)^2), masked mean",
    "vf_clipfrac": "fraction of tokens where value clipping was active",
    "policy_grad_norm": "policy gradient norm before clipping to max_grad_norm",
    "value_grad_norm": "value gradient norm before clipping to max_grad_norm",
    "entropy_update": "mean policy entropy seen during the update epochs",
    "ratio_mean": "mean probability ratio pi_new / pi_old over real tokens",
    "ratio_max": "largest probability ratio pi_new / pi_old in the minibatch",
    "ptx_loss": "next-token loss of the policy on SFT text (only when ptx_coef > 0)",
    # evaluation on held-out prompts (every eval_every steps)
    "eval_score": "mean reward-model score on held-out prompts (fixed sampling seed)",
    "eval_hidden_score": "mean hidden ground-truth score on held-out prompts",
    "eval_kl": "mean sequence KL to the reference on held-out prompts",
    "eval_response_length": "mean response length on held-out prompts",
    # timing (seconds)
    "time_rollout": "seconds of the rollout phase: generate, score, reference and value passes, GAE",
    "time_update": "seconds of the update epochs",
    "time_step": "seconds of the whole PPO iteration (rollout + update)",
    "step": "PPO iterations done so far (the x axis)",
}

#: The curves worth watching first, in the order `plot_curves` draws them by default.
DEFAULT_CURVES = ("score", "hidden_score", "kl", "entropy", "clipfrac", "approx_kl", "value_loss",
                  "explained_variance", "response_length")


def describe(name: str) -> str:
    """The glossary line of a metric; ValueError for a name the glossary does not know."""
    if name not in GLOSSARY:
        raise ValueError(f"name must be a metric of the glossary ({sorted(GLOSSARY)}), got {name!r}")
    return GLOSSARY[name]


def curve(history: Sequence[Mapping[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric over a history; rows without the key (or with NaN) are skipped."""
    xs, ys = [], []
    for index, row in enumerate(history):
        value = row.get(key)
        if value is None or not math.isfinite(float(value)):
            continue
        xs.append(float(row.get("step", index + 1)))
        ys.append(float(value))
    return xs, ys


def plot_curves(history: Sequence[Mapping[str, float]], keys: Sequence[str] | None = None,
                columns: int = 3, title: str = "PPO training curves") -> Any:
    """A plotly figure with one small panel per metric against the PPO step.

    `history` is `PPOTrainer.history` (a list of per-step metric dicts) or the rows of a
    metrics.jsonl; `keys` defaults to the DEFAULT_CURVES present in it. Panel titles are metric names;
    hovering a point shows the glossary line.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if not history:
        raise ValueError("history must hold at least one step of metrics")
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    present = {k for row in history for k in row}
    if keys is None:
        keys = [k for k in DEFAULT_CURVES if k in present]
    else:
        missing = [k for k in keys if k not in present]
        if missing:
            raise ValueError(f"keys {missing} are not in the history (it has {sorted(present)})")
    if not keys:
        raise ValueError("keys must name at least one metric")
    rows = math.ceil(len(keys) / columns)
    fig = make_subplots(rows=rows, cols=min(columns, len(keys)), subplot_titles=list(keys))
    for index, key in enumerate(keys):
        xs, ys = curve(history, key)
        meaning = GLOSSARY.get(key, key)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=key, showlegend=False,
                                 hovertemplate=f"step %{{x}}<br>{key} = %{{y:.4g}}<br>{meaning}"
                                               "<extra></extra>"),
                      row=index // columns + 1, col=index % columns + 1)
    fig.update_xaxes(title_text="PPO step")
    fig.update_layout(title=title, height=260 * rows, margin=dict(t=80, l=40, r=20, b=40))
    return fig
