"""What one method's run gives back, and when during the budget it is judged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class MethodRun:
    """One method trained for one budget: its evaluation curve and what it cost."""

    method: str  #: "ppo", "grpo", "rloo" or "dpo"
    label: str  #: name in tables and legends
    #: "cpu" (process CPU seconds) or "wall" (GPU wall seconds): the unit of train_seconds
    clock: str
    #: one row per evaluation: step, train_seconds, wall_seconds, samples (responses trained on so
    #: far), eval_hidden_score, eval_score (learned reward), eval_kl (nats per response),
    #: eval_response_length, eval_win_rate (against the SFT model's responses, `win_rate`)
    curve: list[dict[str, float]] = field(default_factory=list)
    peak_memory_mb: float = 0.0  #: peak memory the run added (see memory_how)
    memory_how: str = ""  #: how peak_memory_mb was measured
    #: parameters the run's optimisers update (policy, and the critic for PPO)
    trainable_parameters: int = 0
    #: GRPO/RLOO: (N * G,) learned rewards of each generation batch
    rewards: list[torch.Tensor] = field(default_factory=list)
    #: GRPO/RLOO: (N * G,) the trainer's advantages of each batch
    advantages: list[torch.Tensor] = field(default_factory=list)
    #: the method's own settings (for the record)
    settings: dict[str, Any] = field(default_factory=dict)
    #: PPO: the critic's explained variance of each iteration's returns (how much per-token credit
    #: its advantages can carry); empty for the others
    explained_variance: list[float] = field(default_factory=list)
    #: GRPO/RLOO/DPO: the trained policy adapter's LoRA weights at the end (peft's state dict;
    #: `trl_methods.copy_policy_adapter` puts them into a judge)
    policy_state: dict[str, torch.Tensor] = field(default_factory=dict)
    #: one list per evaluation (as curve): the hidden score of the response to each judged prompt
    eval_hidden_scores: list[list[float]] = field(default_factory=list)

    def add_evaluation(self, row: dict[str, Any]) -> None:
        """Append a judge's row to the curve. Its per-prompt "hidden_scores" go to
        eval_hidden_scores, and the row gains eval_win_rate: the win rate of this evaluation's
        responses against the first evaluation's (the SFT model's: every policy starts as it)."""
        scores = [float(s) for s in row.pop("hidden_scores")]
        self.eval_hidden_scores.append(scores)
        row["eval_win_rate"] = win_rate(scores, self.eval_hidden_scores[0])
        self.curve.append(row)

    @property
    def final(self) -> dict[str, float]:
        """The last evaluation (at the end of the budget)."""
        return self.curve[-1]

    def first_time_above(self, level: float, key: str = "train_seconds") -> float | None:
        """`key` (train_seconds, samples, step) of the first evaluation whose hidden score exceeds
        `level` (None: never)."""
        for row in self.curve:
            if row["eval_hidden_score"] > level:
                return row[key]
        return None


def win_rate(scores: Sequence[float], baseline: Sequence[float]) -> float:
    """The share of prompts whose response scores above the baseline's response to the same prompt,
    a tie counting one half (as AlpacaEval and MT-Bench's pairwise judges count them)."""
    if len(scores) != len(baseline) or not scores:
        raise ValueError(f"scores ({len(scores)}) and baseline ({len(baseline)}) must hold one "
                         "score per prompt, at least one")
    wins = sum(1.0 if s > b else 0.5 if s == b else 0.0
               for s, b in zip(scores, baseline, strict=True))
    return wins / len(scores)


class EvalSchedule:
    """When a run of `budget` (seconds or batches, `unit`) is judged and when it ends.

    Evaluation marks at budget * k / points for k = 1..points, and `early` more at 1/2, 1/4, ... of
    the first. `due(seconds, batches)` is True once per mark passed (a step that crosses several
    marks gives one evaluation); `done(seconds, batches)` once the budget is spent. With unit
    "batches" the marks are counts of sampled batches whose updates have all run, so the schedule
    does not depend on the machine's speed.
    """

    def __init__(self, budget: float, points: int, early: int = 0, unit: str = "seconds") -> None:
        if unit not in ("seconds", "batches"):
            raise ValueError(f"unit must be 'seconds' or 'batches', got {unit!r}")
        first = budget / points
        self.marks = [first / 2**j for j in range(early, 0, -1)] + [first * k
                                                                    for k in range(1, points + 1)]
        self.budget = budget
        self.unit = unit

    @classmethod
    def for_config(cls, config: Any) -> EvalSchedule:
        """The schedule of a CompareConfig: its train_batches, or its train_seconds when that is
        None."""
        if config.train_batches is not None:
            return cls(config.train_batches, config.eval_points, config.early_evals, unit="batches")
        return cls(config.train_seconds, config.eval_points, config.early_evals, unit="seconds")

    def spent(self, seconds: float, batches: int) -> float:
        """The part of the budget used so far, in the schedule's unit."""
        return float(batches) if self.unit == "batches" else seconds

    def due(self, seconds: float, batches: int = 0) -> bool:
        spent = self.spent(seconds, batches)
        if not any(spent >= m for m in self.marks):
            return False
        self.marks = [m for m in self.marks if spent < m]
        return True

    def done(self, seconds: float, batches: int = 0) -> bool:
        return self.spent(seconds, batches) >= self.budget
