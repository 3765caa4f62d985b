"""The KL estimators' registry: each entry's function keeps what its metadata says (unbiased, never
negative), and the registry refuses a name twice and names what it takes when refusing one.

What an entry claims is measured here on exact expectations over a categorical pair (no sampling),
so a new estimator registered with a wrong `unbiased` or `nonnegative` fails these tests.
"""

from __future__ import annotations

import pytest
import torch
from registry_entries import registered, test_estimator

from rlhf_helpers.core.kl_estimators import KL_ESTIMATORS, drawn_kl_kinds, kl_estimator
from rlhf_helpers.core.registry import Registry, UnknownName

#: log r = log ref - log pi over a wide range, where "never negative" must hold on every value
LOG_R = torch.linspace(-20.0, 20.0, 4001, dtype=torch.float64)  # (N,)


def _pair(shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi, log ref over 8 tokens, pi moved from ref by `shift`."""
    gen = torch.Generator().manual_seed(0)
    ref_logits, direction = torch.randn(2, 8, generator=gen, dtype=torch.float64)  # (8,) each
    return (torch.log_softmax(ref_logits + shift * direction, dim=0),
            torch.log_softmax(ref_logits, dim=0))


def _mean_and_kl(name: str, shift: float) -> tuple[float, float]:
    """E_pi[estimate] exactly (a sum over the 8 tokens) and the exact KL(pi || ref)."""
    log_pi, log_ref = _pair(shift)
    pi = log_pi.exp()  # (8,)
    estimate = KL_ESTIMATORS[name].function(log_ref - log_pi)  # (8,)
    return float((pi * estimate).sum()), float((pi * (log_pi - log_ref)).sum())


@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_every_estimator_keeps_what_its_entry_says(name):
    entry = KL_ESTIMATORS[name]
    assert entry.name == name and entry.formula and entry.note
    values = entry.function(LOG_R)  # (N,)
    assert values.shape == LOG_R.shape and values.dtype == LOG_R.dtype
    assert bool((values >= 0).all()) == entry.nonnegative, f"{name}: nonnegative is wrong"
    mean, kl = _mean_and_kl(name, shift=1.5)
    assert (mean == pytest.approx(kl, rel=1e-12)) == entry.unbiased, f"{name}: unbiased is wrong"
    assert entry.function(torch.zeros(3, dtype=torch.float64)).abs().max() == 0  # 0 at pi = ref


def test_a_wrong_claim_is_caught():
    """The checks above are not vacuous: k2 claimed unbiased, or k1 never negative, would fail."""
    for name, claim in (("k2", "unbiased"), ("k1", "nonnegative")):
        entry = KL_ESTIMATORS[name]
        values = entry.function(LOG_R)
        mean, kl = _mean_and_kl(name, shift=1.5)
        measured = {"unbiased": mean == pytest.approx(kl, rel=1e-12),
                    "nonnegative": bool((values >= 0).all())}
        assert measured[claim] is False and getattr(entry, claim) is False


def test_the_three_teaching_estimators_are_drawn_in_order():
    assert KL_ESTIMATORS.names()[:3] == ("k1", "k2", "k3")
    assert drawn_kl_kinds() == ("k1", "k2", "k3")
    assert [KL_ESTIMATORS[k].verl for k in ("k1", "k2", "k3")] == ["kl", "mse", "low_var_kl"]


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match=r"KL estimator 'k1' is registered twice \(rlhf_helpers/"):
        kl_estimator("k1", formula="x", verl=None, openrlhf=None, drawn=False, unbiased=False,
                     nonnegative=False, note="x")(lambda log_r: log_r)
    assert KL_ESTIMATORS["k1"].formula.startswith("-log r")  # the first one stays


def test_an_unknown_name_is_a_value_error_and_a_missing_key():
    with pytest.raises(UnknownName) as refused:
        KL_ESTIMATORS["k9"]
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, KeyError)
    assert str(refused.value).startswith("kl_kind must be one of 'k1', 'k2', 'k3'")
    assert KL_ESTIMATORS.get("k9") is None and "k9" not in KL_ESTIMATORS and 3 not in KL_ESTIMATORS
    assert KL_ESTIMATORS.check("kind", "k2") == "k2"


def test_a_registry_refuses_an_empty_name():
    registry: Registry = Registry("thing", "thing", "here.py")
    with pytest.raises(ValueError, match="a thing's name must be a non-empty string, got ' '"):
        registry.add(test_estimator(" "))
    assert len(registry) == 0


def test_a_registered_estimator_is_a_value_of_kl_kind_while_it_is_there(monkeypatch):
    registered(monkeypatch, KL_ESTIMATORS, test_estimator())
    assert KL_ESTIMATORS.names()[-1] == "k_test" and "k_test" not in drawn_kl_kinds()
