"""The per-token KL estimators, each registered with its metadata: the one list of `kl_kind` values.

    KL_ESTIMATORS["k3"].function(log_r)     # (r - 1) - log r, elementwise
    KL_ESTIMATORS["k3"].verl                # "low_var_kl": verl's algorithm.kl_penalty
    KL_ESTIMATORS.names()                   # ("k1", "k2", "k3"): what PPOConfig.kl_kind accepts
    drawn_kl_kinds()                        # the ones the explorers draw

Each estimates KL(pi || ref) = E_{y ~ pi}[log pi(y) - log ref(y)] from one token y sampled by the
policy pi, through r = ref(y) / pi(y) (Schulman, "Approximating KL divergence", 2020); a function
gets log r = log ref(y) - log pi(y), any shape, and returns the estimate of every element.

Adding one is this file and its tests (CONTRIBUTING.md, "Add an option value"): `core.kl`'s
`kl_estimate` and `shape_rewards`, `PPOConfig.kl_kind` and its flag, the cluster export (or its "not
carried over" line) and the explorers (when `drawn`) all read this registry. The functions use only
tensor methods, so this module imports no torch: the torch-free config and export import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlhf_helpers.core.registry import Registry

if TYPE_CHECKING:  # annotations only: the module stays free of torch
    from torch import Tensor


@dataclass(frozen=True)
class KLEstimator:
    """One value of `kl_kind`: the function and what the rest of the package says about it."""

    name: str  #: the value of PPOConfig.kl_kind and of `kl_estimate`'s kind
    function: Callable[[Tensor], Tensor]  #: log r (any shape) -> the estimate, elementwise
    formula: str  #: the estimate in terms of r = ref(y) / pi(y), y sampled from pi
    verl: str | None  #: verl's algorithm.kl_penalty name (None: verl has none)
    openrlhf: str | None  #: OpenRLHF's --algo.kl.estimator choice (None: OpenRLHF has none)
    drawn: bool  #: the KL and GAE explorers draw it (and offer it)
    unbiased: bool  #: its mean over tokens sampled from pi is KL(pi || ref)
    nonnegative: bool  #: no single token's estimate is below 0
    note: str  #: its bias and sign, in a few words


#: every KL estimator by name, in the order the explorers and the docs list them
KL_ESTIMATORS: Registry[KLEstimator] = Registry(
    "kl_kind", "KL estimator", "rlhf_helpers/core/kl_estimators.py")


def kl_estimator(name: str, *, formula: str, verl: str | None, openrlhf: str | None, drawn: bool,
                 unbiased: bool, nonnegative: bool,
                 note: str) -> Callable[[Callable[[Tensor], Tensor]], Callable[[Tensor], Tensor]]:
    """Register the decorated function log r -> estimate as the KL estimator `name` (ValueError if
    the name is taken); the function is returned as it is."""
    def register(function: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        KL_ESTIMATORS.add(KLEstimator(name, function, formula, verl, openrlhf, drawn, unbiased,
                                      nonnegative, note))
        return function
    return register


def drawn_kl_kinds() -> tuple[str, ...]:
    """The estimators the explorers draw, in registry order: a new estimator is drawn only when it
    says so, so registering one cannot break an explorer's layout."""
    return tuple(name for name, estimator in KL_ESTIMATORS.items() if estimator.drawn)


@kl_estimator("k1", formula="-log r = log pi(y) - log ref(y)", verl="kl", openrlhf="k1",
              drawn=True, unbiased=True, nonnegative=False,
              note="unbiased; negative whenever ref likes the token more")
def k1(log_r: Tensor) -> Tensor:
    """-log r: the log-ratio itself, KL's integrand."""
    return -log_r


@kl_estimator("k2", formula="0.5 (log r)^2", verl="mse", openrlhf="k2", drawn=True,
              unbiased=False, nonnegative=True,
              note=">= 0; biased, but close for nearby distributions")
def k2(log_r: Tensor) -> Tensor:
    """(log r)^2 / 2: its gradient is the KL's in expectation, its value only near ref."""
    return 0.5 * log_r**2


@kl_estimator("k3", formula="(r - 1) - log r", verl="low_var_kl", openrlhf="k3", drawn=True,
              unbiased=True, nonnegative=True,
              note="unbiased (E[r] = 1) and >= 0 for every sample")
def k3(log_r: Tensor) -> Tensor:
    """(r - 1) - log r: k1 plus r - 1, whose mean is 0; expm1 is exact near r = 1."""
    return log_r.expm1() - log_r
