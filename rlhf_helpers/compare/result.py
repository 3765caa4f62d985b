"""What one method's run gives back, and when during the budget it is judged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class MethodRun:
    """One method trained for one budget: its evaluation curve and what it cost."""

    method: str  #: "ppo", "grpo" or "rloo"
    label: str  #: name in tables and legends
    clock: str  #: "cpu" (process CPU seconds) or "wall" (GPU wall seconds): the unit of train_seconds
    #: one row per evaluation: step, train_seconds, wall_seconds, samples (responses trained on so far),
    #: eval_hidden_score, eval_score (learned reward), eval_kl (nats per response), eval_response_length
    curve: list[dict[str, float]] = field(default_factory=list)
    peak_memory_mb: float = 0.0  #: peak memory the run added (see memory_how)
    memory_how: str = ""  #: how peak_memory_mb was measured
    trainable_parameters: int = 0  #: parameters the run's optimisers update (policy, and the critic for PPO)
    #: GRPO/RLOO: (N * G,) learned rewards of each generation batch
    rewards: list[torch.Tensor] = field(default_factory=list)
    #: GRPO/RLOO: (N * G,) the trainer's advantages of each batch
    advantages: list[torch.Tensor] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  #: the method's own settings (for the record)

    @property
    def final(self) -> dict[str, float]:
        """The last evaluation (at the end of the budget)."""
        return self.curve[-1]

    def first_time_above(self, level: float) -> float | None:
        """Training seconds of the first evaluation whose hidden score exceeds `level` (None: never)."""
        for row in self.curve:
            if row["eval_hidden_score"] > level:
                return row["train_seconds"]
        return None


class EvalSchedule:
    """Evaluation marks at budget * k / points for k = 1..points, and `early` more at 1/2, 1/4, ... of
    the first: `due(seconds)` is True once per mark passed (a step that crosses several marks gives one
    evaluation). `done` once the budget is spent or, with `max_batches`, once that many batches are
    trained on."""

    def __init__(self, budget: float, points: int, max_batches: int | None = None, early: int = 0) -> None:
        first = budget / points
        self.marks = [first / 2**j for j in range(early, 0, -1)] + [first * k for k in range(1, points + 1)]
        self.budget = budget
        self.max_batches = max_batches

    def due(self, seconds: float) -> bool:
        passed = [m for m in self.marks if seconds >= m]
        if not passed:
            return False
        self.marks = [m for m in self.marks if seconds < m]
        return True

    def done(self, seconds: float, batches: int = 0) -> bool:
        return seconds >= self.budget or (self.max_batches is not None and batches >= self.max_batches)
