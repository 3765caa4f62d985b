"""What each replaceable piece of PPO's maths is: its contract, and the registry of the pieces.

    PIECES["advantage_fn"].parameters     # ("rewards", "values", "mask", "gamma", "lam")
    PIECES["advantage_fn"].library        # core.gae.compute_gae, what runs when none is given
    PIECES.names()                        # PPOTrainer's piece arguments, in order

A piece is a keyword argument of PPOTrainer (`pieces` has the whole story). Each has a `Protocol`
here, its exact positional signature, and is registered by the `@piece(...)` on the trainer's
checked call of it (`pieces.call_advantages`, ...), as verl registers its policy losses
(`register_policy_loss`): the trainer's arguments, the names an error message gives each argument
(`piece_checks`) and the docs read this one list. Adding a piece: CONTRIBUTING.md, "Add a piece".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from rlhf_helpers.core.registry import Registry

#: two (B, T) tensors: (rewards, kl) or (advantages, returns)
Tensors = tuple[torch.Tensor, torch.Tensor]
#: a loss (0-dim, with a gradient) and its stats (clipfrac, approx_kl...: numbers or 0-dim tensors)
LossAndStats = tuple[torch.Tensor, Mapping[str, Any]]

class ShapeRewardsFn(Protocol):
    """A reward-shaping piece: r_t = -beta * kl_t, plus each row's score at its last real token."""

    def __call__(self, scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                 mask: torch.Tensor, kl_coef: float, /) -> Tensors | torch.Tensor:
        """(B,), (B, T) x 3, beta -> (rewards, kl) (B, T) each, or the rewards alone."""


class AdvantageFn(Protocol):
    """An advantage piece: A_t from the shaped rewards and the old values (GAE by default)."""

    def __call__(self, rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                 gamma: float, lam: float, /) -> Tensors:
        """(B, T) x 3, gamma, lambda -> (advantages, returns) (B, T) each."""


class PolicyLossFn(Protocol):
    """A policy-loss piece: the clipped surrogate by default."""

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, clip_eps: float, /) -> LossAndStats | torch.Tensor:
        """(b, r) x 4, epsilon -> (loss, stats), or the loss alone (0-dim, with a gradient)."""


class ValueLossFn(Protocol):
    """A value-loss piece: the (optionally clipped) squared error by default."""

    def __call__(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                 mask: torch.Tensor, value_clip: float | None, /) -> LossAndStats | torch.Tensor:
        """(b, r) x 4, the value clip (None: none) -> (loss, stats), or the loss alone."""


class UpdateFn(Protocol):
    """A whole update loop of one iteration, in place of the library's (`iteration.update_epochs`).
    It runs on one process, with plain torch optimisers and no fp16 loss scaling, and without
    entropy bonus, ptx loss or value warm-up: a trainer given one refuses those settings by name
    (`check_update_fn_settings`), and a `value_loss_fn` beside it, which would never run."""

    def __call__(self, model: Any, batch: Any, policy_opt: torch.optim.Optimizer,
                 value_opt: torch.optim.Optimizer, config: Any, generator: torch.Generator,
                 policy_loss_fn: Callable[..., torch.Tensor], /) -> Sequence[tuple[float, float]]:
        """-> the (policy loss, value loss) of every minibatch, in order."""


@dataclass(frozen=True)
class Piece:
    """One replaceable piece: the trainer's argument, its contract, the library's own, the check."""

    name: str  #: PPOTrainer's keyword argument ("advantage_fn")
    contract: type  #: the Protocol whose `__call__` is its exact positional signature
    #: the library's function, what runs when the argument is None (None: the trainer's own loop)
    library: Callable[..., Any] | None
    call: Callable[..., Any]  #: the trainer's call of a caller's piece, its result checked

    @property
    def parameters(self) -> tuple[str, ...]:
        """The piece's positional parameters, in the order the trainer passes them."""
        return tuple(inspect.signature(self.contract.__call__).parameters)[1:]  # after self


#: every replaceable piece, by PPOTrainer's argument name, in the order of its arguments
PIECES: Registry[Piece] = Registry("piece", "piece", "rlhf_helpers/ppo/pieces.py")

C = TypeVar("C", bound=Callable[..., Any])


def piece(name: str, contract: type,
          library: Callable[..., Any] | None) -> Callable[[C], C]:
    """Register the decorated function, the trainer's checked call of a caller's piece `name`, with
    the piece's contract and the library's own; the function is returned as it is."""
    def register(call: C) -> C:
        PIECES.add(Piece(name, contract, library, call))
        return call
    return register
