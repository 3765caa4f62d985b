"""Test-only entries for the option registries (`rlhf_helpers.core.registry`), registered for the
length of one test: a new value must reach every reader without another file changing.

    test_estimator(drawn=True)                  # a KL estimator that no framework has a name for
    registered(monkeypatch, KL_ESTIMATORS, entry)   # gone again when the test ends
"""

from __future__ import annotations

from typing import Any

from rlhf_helpers.core.kl_estimators import KLEstimator


def test_estimator(name: str = "k_test", drawn: bool = False, verl: str | None = None,
                   openrlhf: str | None = None) -> KLEstimator:
    """|log r| (verl's "abs"): >= 0, biased; by default unknown to both frameworks."""
    return KLEstimator(name, lambda log_r: log_r.abs(), "|log r|", verl, openrlhf, drawn,
                       unbiased=False, nonnegative=True, note="a test's own estimator")


test_estimator.__test__ = False  # a factory, not a test for pytest to collect


def registered(monkeypatch: Any, registry: Any, entry: Any) -> Any:
    """`entry` in `registry` until the test ends: monkeypatch takes it out again (a registry has no
    public way to forget a name, by design)."""
    monkeypatch.setitem(registry._entries, entry.name, entry)
    return entry
