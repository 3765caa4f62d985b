"""The frame of the metrics glossary: what an entry holds (`MetricDoc`), the glossary's sections
(`GROUPS`) and the notation its formulas use (`NOTATION`, printed at the top of docs/metrics.md).

`ppo.metric_docs.METRICS` holds the entries (each made by `metric_doc`); the names here are imported
from there too, with the ranges an entry's `possible` names (SHARE, NON_NEGATIVE, ENTROPY, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlhf_helpers.runtime.config_limits import MAX_COUNT


@dataclass(frozen=True)
class MetricDoc:
    """Everything the docs say about one metric."""

    meaning: str  #: one line: what the number is (GLOSSARY's text, the plots' hover text)
    formula: str  #: how it is computed, in plain text maths over the batch's real response tokens
    healthy: str  #: what it looks like in a healthy tiny-profile run ("" for bookkeeping fields)
    bad: str  #: what an unhealthy value means: which failure mode, and what to try ("" if nothing)
    #: its name in an experiment tracker (--report-to); "" for what is not sent: the step (the x
    #: axis) and the per-minibatch rows
    tracker: str = ""
    #: (low, high): the values it can take at all, in any run (a share [0, 1], a length >= 0); a
    #: logged value outside is an edited or damaged file. None: any real number
    possible: tuple[float, float] | None = None


def metric_doc(tracker: str, meaning: str, formula: str, healthy: str, bad: str,
               possible: tuple[float, float] | None = None) -> MetricDoc:
    """A glossary entry, its fields in the order ppo/metric_docs.py writes them."""
    return MetricDoc(meaning=meaning, formula=formula, healthy=healthy, bad=bad, tracker=tracker,
                     possible=possible)


# What a metric can be at all (MetricDoc.possible), whatever the run: a share is a mean of 0/1
# indicators, a length a count of tokens, a norm, a squared error, a ratio exp(.) or a duration
# cannot be negative, and 1 - Var/Var cannot exceed 1. Values outside are no run's: the run doctor
# refuses the file (`doctor.reading.value_problem`). Metrics whose float32 rounding can cross a
# bound by an amount no one can bound (a k3 KL of about 0 may come out at -1e-8) have none.
SHARE = (0.0, 1.0)
NON_NEGATIVE = (0.0, math.inf)
AT_MOST_ONE = (-math.inf, 1.0)
#: How far below 0 float32 rounding can put a logged entropy. H = logsumexp(z) - sum_v p_v z_v
#: (core.logprobs.entropy_from_logits) is the difference of two float32 numbers, each about the
#: largest logit |z| when H is about 0: the log-sum-exp rounds about twice, the sum of V products
#: log2(V) times in a tree reduction (V < 2**17 for every vocabulary here), each by at most 2**-24
#: of |z|. With z = logits / temperature, temperature >= 0.01 (config_limits) and logits below 100,
#: |z| <= 1e4, so H >= -(2 + 17) * 2**-24 * 1e4, about -0.011; a mean over tokens no lower. An
#: entropy below it (-3) is an edited file, not rounding.
ENTROPY_ROUNDING = (2 + 17) * 2.0**-24 * 1e4
ENTROPY = (-ENTROPY_ROUNDING, math.inf)
#: steps are counted from 0 or 1, and a billion iterations is beyond any run (config_limits)
STEPS = (0.0, float(MAX_COUNT))

#: Sections of the glossary, in order: (title, what logs them).
GROUPS: dict[str, str] = {
    "rollout": "Rollouts: what the policy does (one number per PPO step, from the "
               "experience batch)",
    "update": "Updates: what the optimiser does (means over all epochs and minibatches of a step)",
    "minibatch": "Per minibatch (`PPOTrainer.last_update_stats`, one row per optimiser step; not "
                 "in metrics.jsonl)",
    "eval": "Evaluation on held-out prompts (every `eval_every` steps; one fresh sample per "
            "prompt, fixed seed)",
    "timing": "Timing and bookkeeping",
}

#: Notation used in the formulas, printed at the top of docs/metrics.md (a backslash at the end of a
#: line joins the next line to it: two lines of the page are longer than this file's).
NOTATION = """\
- `B` responses per batch, `t` a response token, `m_t` = 1 on real response tokens (up to and
  including the first EOS), 0 on padding; "masked mean" = sum_t m_t x_t / sum_t m_t over the batch.
- `pi` the policy, `pi_old` the policy that sampled the batch, `ref` the reference (base model with
  every adapter disabled), `rho_t = pi(y_t) / pi_old(y_t)` the probability ratio, `eps` = clip_eps.
- `s` the reward-model score of a whole response, `V_t` the critic's value before token t,
  `A_t` the GAE advantage, `G_t = A_t + V_t` the return (GAE's lambda-return, the critic's target),
  `beta` = kl_coef.
- Healthy ranges come from one 60-step tiny-profile run (`python -m rlhf_helpers.stages.train_ppo \
--profile
  tiny --steps 60 --eval-every 10`, seed 0), "late" = steps 30-60; the failure examples from the \
same
  command with `--kl-coef 0 --steps 40` (no KL penalty) and `--kl-coef 0.05` (a weak one). Other
  models and batch sizes move them.
"""
