"""Every bad input raises ValueError naming the argument, never a silent wrong answer."""

from __future__ import annotations

import math

import pytest
import torch

import rlhf_helpers as rh

B, T, V = 2, 4, 5
ONES = torch.ones(B, T)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
EMPTY = torch.zeros(B, T)


def x():
    return torch.randn(B, T)


def with_value(value, where=(0, 1)):
    t = torch.randn(B, T)
    t[where] = value
    return t


def gae_fns():
    return [
        lambda r, v, m, g=1.0, lam=0.95: rh.compute_gae(r, v, m, g, lam),
        lambda r, v, m, g=1.0, lam=0.95: rh.gae_reference(r, v, m, g, lam),
        lambda r, v, m, g=1.0, lam=0.95: rh.td_errors(r, v, m, g),
    ]


GAE_IDS = ["compute_gae", "gae_reference", "td_errors"]


# ---- shapes -------------------------------------------------------------------------------------

SHAPE_CASES = [
    ("values", lambda: rh.compute_gae(x(), torch.randn(B, T + 1), MASK, 1.0, 0.9)),
    ("values", lambda: rh.gae_reference(x(), torch.randn(B + 1, T), MASK, 1.0, 0.9)),
    ("values", lambda: rh.td_errors(x(), torch.randn(B, T - 1), MASK, 1.0)),
    ("rewards", lambda: rh.compute_gae(torch.randn(T), torch.randn(T), torch.ones(T), 1.0, 0.9)),
    ("mask", lambda: rh.compute_gae(x(), x(), torch.ones(B, T + 1), 1.0, 0.9)),
    ("mask", lambda: rh.masked_mean(x(), torch.ones(B, T - 1))),
    ("mask", lambda: rh.masked_whiten(x(), torch.ones(T))),
    ("old_logprobs", lambda: rh.policy_loss(x(), torch.randn(B, T + 1), x(), MASK)),
    ("advantages", lambda: rh.policy_loss(x(), x(), torch.randn(B), MASK)),
    ("mask", lambda: rh.policy_loss(x(), x(), x(), torch.ones(B, 1))),
    ("advantages", lambda: rh.clipped_surrogate(torch.ones(3), torch.ones(4), 0.2)),
    ("old_logprobs", lambda: rh.kl_penalty_policy_loss(x(), torch.randn(1, T), x(), MASK, 0.1)),
    ("returns", lambda: rh.value_loss(x(), x(), torch.randn(B, T, 1), MASK)),
    ("old_values", lambda: rh.value_loss(x(), torch.randn(T, B), x(), MASK)),
    ("logits", lambda: rh.logprobs_from_logits(torch.randn(B, V),
                                               torch.zeros(B, dtype=torch.long))),
    ("labels", lambda: rh.logprobs_from_logits(torch.randn(B, T, V),
                                               torch.zeros(B, T + 1, dtype=torch.long))),
    ("logits", lambda: rh.entropy_from_logits(torch.randn(B, T))),
    ("labels", lambda: rh.lm_loss(torch.randn(B, T, V), torch.zeros(B, T - 1, dtype=torch.long))),
    ("rejected_scores", lambda: rh.reward_model_loss(torch.randn(4), torch.randn(3))),
    ("rejected_scores", lambda: rh.pairwise_accuracy(torch.randn(4), torch.randn(4, 1))),
    ("ref_logprobs", lambda: rh.kl_estimate(x(), torch.randn(B, T + 2))),
    ("scores", lambda: rh.shape_rewards(torch.randn(B + 1), x(), x(), MASK, 0.1)),
    ("scores", lambda: rh.shape_rewards(torch.randn(B, 1), x(), x(), MASK, 0.1)),
    ("ref_logprobs", lambda: rh.shape_rewards(
        torch.randn(B), x(), torch.randn(B, T + 1), MASK, 0.1)),
    ("mask", lambda: rh.shape_rewards(torch.randn(B), x(), x(), torch.ones(B, T + 1), 0.1)),
    ("rewards", lambda: rh.compute_gae([[1.0]], [[1.0]], [[1.0]], 1.0, 0.9)),
]


@pytest.mark.parametrize("name, call", SHAPE_CASES,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(SHAPE_CASES)])
def test_wrong_shapes(name, call):
    with pytest.raises(ValueError, match=name):
        call()


# ---- empty masks where a mean (or a last token) is needed --------------------------------------

EMPTY_CASES = [
    lambda: rh.masked_mean(x(), EMPTY),
    lambda: rh.masked_mean(x(), torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0]]), dim=1),
    lambda: rh.masked_var(x(), EMPTY),
    # 1 token: no unbiased var
    lambda: rh.masked_var(x(), torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0]])),
    lambda: rh.masked_whiten(x(), EMPTY),
    lambda: rh.masked_whiten(x(), torch.tensor([[0.0, 0, 0, 0], [0, 1, 0, 0]])),
    lambda: rh.policy_loss(x(), x(), x(), EMPTY),
    lambda: rh.kl_penalty_policy_loss(x(), x(), x(), EMPTY, 0.1),
    lambda: rh.value_loss(x(), x(), x(), EMPTY, value_clip=0.2),
    lambda: rh.shape_rewards(torch.randn(B), x(), x(),
                             torch.tensor([[1.0, 1, 0, 0], [0, 0, 0, 0]]), 0.1),
]


@pytest.mark.parametrize("call", EMPTY_CASES)
def test_empty_mask(call):
    with pytest.raises(ValueError, match="mask"):
        call()


def test_lm_loss_with_every_label_ignored():
    labels = torch.full((B, T), -100)
    labels[:, 0] = 1  # the first label is never predicted (shift)
    with pytest.raises(ValueError, match="labels"):
        rh.lm_loss(torch.randn(B, T, V), labels)


def test_empty_preference_batch():
    with pytest.raises(ValueError, match="chosen_scores"):
        rh.reward_model_loss(torch.zeros(0), torch.zeros(0))


# ---- NaN / inf ----------------------------------------------------------------------------------

BAD_VALUES = [math.nan, math.inf, -math.inf]

FINITE_CASES = [
    ("rewards", lambda bad: rh.compute_gae(with_value(bad), x(), MASK, 1.0, 0.9)),
    ("values", lambda bad: rh.compute_gae(x(), with_value(bad), MASK, 1.0, 0.9)),
    ("rewards", lambda bad: rh.gae_reference(with_value(bad), x(), MASK, 1.0, 0.9)),
    ("values", lambda bad: rh.td_errors(x(), with_value(bad), MASK, 1.0)),
    ("logprobs", lambda bad: rh.policy_loss(with_value(bad), x(), x(), MASK)),
    ("old_logprobs", lambda bad: rh.policy_loss(x(), with_value(bad), x(), MASK)),
    ("advantages", lambda bad: rh.policy_loss(x(), x(), with_value(bad), MASK)),
    ("logprobs", lambda bad: rh.kl_penalty_policy_loss(with_value(bad), x(), x(), MASK, 0.1)),
    ("values", lambda bad: rh.value_loss(with_value(bad), x(), x(), MASK)),
    ("returns", lambda bad: rh.value_loss(x(), x(), with_value(bad), MASK)),
    ("x", lambda bad: rh.masked_mean(with_value(bad), MASK)),
    ("x", lambda bad: rh.masked_whiten(with_value(bad), MASK)),
    ("logprobs", lambda bad: rh.kl_estimate(with_value(bad), x())),
    ("ref_logprobs", lambda bad: rh.kl_estimate(x(), with_value(bad), "k3")),
    ("ref_logprobs", lambda bad: rh.shape_rewards(torch.randn(B), x(), with_value(bad), MASK, 0.1)),
    ("scores", lambda bad: rh.shape_rewards(torch.tensor([1.0, bad]), x(), x(), MASK, 0.1)),
    ("chosen_scores", lambda bad: rh.reward_model_loss(torch.tensor([1.0, bad]), torch.zeros(2))),
    ("logits", lambda bad: rh.logprobs_from_logits(torch.full((B, T, V), bad),
                                                   torch.zeros(B, T, dtype=torch.long))),
    ("logits", lambda bad: rh.lm_loss(torch.full((B, T, V), bad),
                                      torch.zeros(B, T, dtype=torch.long))),
    ("current_kl", lambda bad: rh.AdaptiveKLController(0.1, 6.0, 100).update(bad, 1)),
]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name, call", FINITE_CASES,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(FINITE_CASES)])
def test_non_finite_values(name, call, bad):
    with pytest.raises(ValueError, match=f"{name} must be (a )?finite"):
        call(bad)


def test_non_finite_in_padding_is_also_refused():
    """A NaN hidden in the padding still signals a broken pipeline: refuse it too."""
    rewards = torch.randn(B, T)
    rewards[1, 3] = math.nan  # MASK[1, 3] == 0
    with pytest.raises(ValueError, match="rewards"):
        rh.compute_gae(rewards, x(), MASK, 1.0, 0.9)


# ---- scalar hyper-parameters --------------------------------------------------------------------

@pytest.mark.parametrize("fn", gae_fns(), ids=GAE_IDS)
@pytest.mark.parametrize("gamma", [-0.1, 1.01, math.nan, "0.9"])
def test_gamma_outside_unit_interval(fn, gamma):
    with pytest.raises(ValueError, match="gamma"):
        fn(x(), x(), MASK, g=gamma)


@pytest.mark.parametrize("fn", gae_fns()[:2], ids=GAE_IDS[:2])
@pytest.mark.parametrize("lam", [-0.5, 2.0, math.nan])
def test_lam_outside_unit_interval(fn, lam):
    with pytest.raises(ValueError, match="lam"):
        fn(x(), x(), MASK, lam=lam)


EPS_CASES = [
    ("clip_eps", lambda e: rh.policy_loss(x(), x(), x(), MASK, clip_eps=e)),
    ("clip_eps", lambda e: rh.clipped_surrogate(torch.ones(3), torch.ones(3), e)),
    ("value_clip", lambda e: rh.value_loss(x(), x(), x(), MASK, value_clip=e)),
    ("eps", lambda e: rh.masked_whiten(x(), MASK, eps=e)),
    ("init_kl_coef", lambda e: rh.AdaptiveKLController(e, 6.0, 100)),
    ("target", lambda e: rh.AdaptiveKLController(0.1, e, 100)),
    ("horizon", lambda e: rh.AdaptiveKLController(0.1, 6.0, e)),
    ("score_clip", lambda e: rh.shape_rewards(torch.randn(B), x(), x(), MASK, 0.1, score_clip=e)),
]


@pytest.mark.parametrize("value", [0.0, -0.2, math.inf, math.nan])
@pytest.mark.parametrize("name, call", EPS_CASES, ids=[c[0] for c in EPS_CASES])
def test_non_positive_epsilons(name, call, value):
    with pytest.raises(ValueError, match=name):
        call(value)


@pytest.mark.parametrize("dual_clip", [1.0, 0.5, -3.0])
def test_dual_clip_must_exceed_one(dual_clip):
    with pytest.raises(ValueError, match="dual_clip"):
        rh.policy_loss(x(), x(), x(), MASK, dual_clip=dual_clip)
    with pytest.raises(ValueError, match="dual_clip"):
        rh.clipped_surrogate(torch.ones(2), torch.ones(2), 0.2, dual_clip=dual_clip)


@pytest.mark.parametrize(
    "name, call",
    [
        ("kl_coef", lambda: rh.FixedKLController(-0.1)),
        ("kl_coef", lambda: rh.shape_rewards(torch.randn(B), x(), x(), MASK, -0.1)),
        ("beta", lambda: rh.kl_penalty_policy_loss(x(), x(), x(), MASK, beta=-1.0)),
        ("n_steps", lambda: rh.AdaptiveKLController(0.1, 6.0, 100).update(1.0, 0)),
        ("n_steps", lambda: rh.FixedKLController(0.1).update(1.0, 2.5)),
        ("kind", lambda: rh.kl_estimate(x(), x(), kind="k4")),
        ("kind", lambda: rh.shape_rewards(torch.randn(B), x(), x(), MASK, 0.1, kl_kind="exact")),
        ("labels", lambda: rh.logprobs_from_logits(torch.randn(B, T, V), torch.full((B, T), V))),
        ("labels", lambda: rh.logprobs_from_logits(torch.randn(B, T, V), torch.full((B, T), -100))),
        ("labels", lambda: rh.logprobs_from_logits(torch.randn(B, T, V), torch.zeros(B, T))),
    ],
)
def test_other_bad_arguments(name, call):
    with pytest.raises(ValueError, match=name):
        call()


# ---- malformed masks ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0])
@pytest.mark.parametrize(
    "call",
    [
        lambda m: rh.masked_mean(x(), m),
        lambda m: rh.masked_sum(x(), m),
        lambda m: rh.compute_gae(x(), x(), m, 1.0, 0.9),
        lambda m: rh.policy_loss(x(), x(), x(), m),
        lambda m: rh.value_loss(x(), x(), x(), m),
        lambda m: rh.shape_rewards(torch.randn(B), x(), x(), m, 0.1),
    ],
)
def test_mask_values_other_than_zero_one(call, bad):
    mask = MASK.clone()
    mask[0, 0] = bad
    with pytest.raises(ValueError, match="mask must contain only 0 and 1"):
        call(mask)


HOLES = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "call",
    [*[lambda m, fn=fn: fn(x(), x(), m) for fn in gae_fns()],
     lambda m: rh.shape_rewards(torch.randn(B), x(), x(), m, 0.1)],
    ids=[*GAE_IDS, "shape_rewards"],
)
def test_mask_with_holes_is_refused_where_order_matters(call):
    with pytest.raises(ValueError, match="contiguous"):
        call(HOLES)


def test_mask_with_holes_is_fine_for_plain_means():
    """Means do not care about order: a mask with holes is just a selection."""
    values = torch.arange(8.0).reshape(B, T)
    assert rh.masked_mean(values, HOLES).item() == pytest.approx((0 + 2 + 4 + 5) / 4)


# ---- the validation switch ----------------------------------------------------------------------

def test_validation_off_skips_value_checks_but_not_shape_checks():
    rewards = with_value(math.nan, where=(0, 0))
    with rh.validation(False):
        adv, _ = rh.compute_gae(rewards, x(), MASK, 1.0, 0.9)  # no ValueError, NaN propagates
        assert torch.isnan(adv[0, 0])
        with pytest.raises(ValueError, match="values"):
            rh.compute_gae(x(), torch.randn(B, T + 1), MASK, 1.0, 0.9)
    with pytest.raises(ValueError, match="rewards"):  # back on after the block
        rh.compute_gae(rewards, x(), MASK, 1.0, 0.9)


# ---- zero-length sequences (T = 0) and empty batches: the same ValueError everywhere -----------

Z = torch.zeros(B, 0)  # (B, 0): a batch of zero-length sequences
ZL = torch.zeros(B, 0, dtype=torch.long)

ZERO_LENGTH_CASES = [
    ("rewards", lambda: rh.compute_gae(Z, Z, Z, 1.0, 0.9)),
    ("rewards", lambda: rh.gae_reference(Z, Z, Z, 1.0, 0.9)),
    ("rewards", lambda: rh.td_errors(Z, Z, Z, 1.0)),
    ("rewards", lambda: rh.compute_gae(
        torch.zeros(0, T), torch.zeros(0, T), torch.zeros(0, T), 1.0, 0.9)),
    ("logprobs", lambda: rh.shape_rewards(torch.zeros(B), Z, Z, Z, 0.1)),
    ("logprobs", lambda: rh.kl_estimate(Z, Z)),
    ("mask", lambda: rh.last_token_index(Z)),
    ("logprobs", lambda: rh.policy_loss(Z, Z, Z, Z)),
    ("logprobs", lambda: rh.kl_penalty_policy_loss(Z, Z, Z, Z, 0.1)),
    ("values", lambda: rh.value_loss(Z, Z, Z, Z)),
    ("ratio", lambda: rh.clipped_surrogate(Z, Z, 0.2)),
    ("x", lambda: rh.masked_sum(Z, Z)),
    ("x", lambda: rh.masked_mean(Z, Z)),
    ("x", lambda: rh.masked_var(Z, Z)),
    ("x", lambda: rh.masked_whiten(Z, Z)),
    ("logits", lambda: rh.logprobs_from_logits(torch.zeros(B, 0, V), ZL)),
    ("logits", lambda: rh.entropy_from_logits(torch.zeros(B, 0, V))),
    ("logits", lambda: rh.lm_loss(torch.zeros(B, 0, V), ZL)),
    ("logits", lambda: rh.logprobs_from_logits(torch.zeros(B, T, 0),
                                               torch.zeros(B, T, dtype=torch.long))),
    ("logits", lambda: rh.entropy_from_logits(torch.zeros(B, T, 0))),  # V = 0: every entry was -inf
]


@pytest.mark.parametrize("name, call", ZERO_LENGTH_CASES,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(ZERO_LENGTH_CASES)])
def test_zero_length_inputs_raise_the_same_value_error(name, call):
    with pytest.raises(ValueError,
                       match=f"{name} is empty .*need at least one sequence and one time step"):
        call()


# ---- integer tensors where real numbers are expected: refused, never truncated -----------------

INTS = torch.tensor([[1, 1, 1, 1]])  # (1, 4) int64
F1 = torch.ones(1, 4)
ONE_ROW = torch.ones(1, 4)

INTEGER_CASES = [
    ("rewards", lambda: rh.compute_gae(INTS, INTS, ONE_ROW, 0.99, 0.95)),
    # was [[3, 2, 1, 1]], truncated
    ("rewards", lambda: rh.gae_reference(INTS, INTS, ONE_ROW, 0.99, 0.95)),
    ("rewards", lambda: rh.td_errors(INTS, INTS, ONE_ROW, 0.99)),
    ("values", lambda: rh.compute_gae(F1, INTS, ONE_ROW, 0.99, 0.95)),
    ("values", lambda: rh.gae_reference(F1, INTS, ONE_ROW, 0.99, 0.95)),
    ("values", lambda: rh.td_errors(F1, INTS.bool(), ONE_ROW, 0.99)),
    ("scores", lambda: rh.shape_rewards(torch.tensor([1]), F1, F1, ONE_ROW, 0.1)),
    ("logprobs", lambda: rh.shape_rewards(torch.tensor([1.0]), INTS, INTS, ONE_ROW, 0.1)),
    ("ref_logprobs", lambda: rh.kl_estimate(F1, INTS, "k3")),
    ("advantages", lambda: rh.policy_loss(F1, F1, INTS, ONE_ROW)),
    ("old_logprobs", lambda: rh.kl_penalty_policy_loss(F1, INTS, F1, ONE_ROW, 0.1)),
    ("returns", lambda: rh.value_loss(F1, F1, INTS, ONE_ROW)),
    ("ratio", lambda: rh.clipped_surrogate(INTS, F1, 0.2)),
    ("x", lambda: rh.masked_mean(INTS, ONE_ROW)),
    ("x", lambda: rh.masked_whiten(INTS, ONE_ROW)),
    ("chosen_scores", lambda: rh.reward_model_loss(torch.tensor([1]), torch.tensor([0]))),
    ("logits", lambda: rh.logprobs_from_logits(torch.zeros(B, T, V, dtype=torch.long),
                                               torch.zeros(B, T, dtype=torch.long))),
    ("logits", lambda: rh.lm_loss(torch.zeros(B, T, V, dtype=torch.long),
                                  torch.zeros(B, T, dtype=torch.long))),
]


@pytest.mark.parametrize("name, call", INTEGER_CASES,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(INTEGER_CASES)])
def test_integer_tensors_are_refused_where_real_numbers_are_expected(name, call):
    with pytest.raises(ValueError,
                       match=f"{name} must be a floating-point tensor, got dtype torch"):
        call()


# ---- token ids, ratios, margins, masks of the wrong kind ---------------------------------------

LABEL_CASES = [
    lambda labels: rh.lm_loss(torch.randn(B, T, V), labels),
    lambda labels: rh.logprobs_from_logits(torch.randn(B, T, V), labels),
]


@pytest.mark.parametrize("call", LABEL_CASES, ids=["lm_loss", "logprobs_from_logits"])
@pytest.mark.parametrize(
    "labels, message",
    [
        (torch.full((B, T), V), "token ids in \\[0, 5\\)"),  # one past the vocabulary
        (torch.full((B, T), -5), "token ids in \\[0, 5\\)"),  # negative, and not ignore_index
        (torch.zeros(B, T), "integer token ids, got dtype torch.float32"),
        (torch.zeros(B, T, dtype=torch.bool), "integer token ids, got dtype torch.bool"),
    ],
    ids=["past-vocab", "negative", "float", "bool"],
)
def test_bad_token_ids_are_named(call, labels, message):
    with pytest.raises(ValueError, match=f"labels must be {message}"):
        call(labels)


@pytest.mark.parametrize("margin", [math.nan, math.inf, -math.inf, "1.0", None, True])
def test_reward_model_loss_margin_must_be_a_finite_number(margin):
    with pytest.raises(ValueError, match="margin must be a finite number"):
        rh.reward_model_loss(torch.zeros(2), torch.zeros(2), margin)


def test_reward_model_loss_tensor_margin_is_checked_too():
    with pytest.raises(ValueError, match="margin must be finite"):
        rh.reward_model_loss(torch.zeros(2), torch.zeros(2), torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match="margin must have the same shape"):
        rh.reward_model_loss(torch.zeros(2), torch.zeros(2), torch.zeros(3))


@pytest.mark.parametrize(
    "ratio, message",
    [(math.nan, "ratio must be finite"), (math.inf, "ratio must be finite"),
     (-1.0, "ratio must be >= 0")],
    ids=["nan", "inf", "negative"],
)
def test_clipped_surrogate_refuses_impossible_ratios(ratio, message):
    with pytest.raises(ValueError, match=message):
        rh.clipped_surrogate(torch.tensor([1.0, ratio]), torch.ones(2), 0.2)


def test_clipped_surrogate_refuses_non_finite_advantages():
    with pytest.raises(ValueError, match="advantages must be finite"):
        rh.clipped_surrogate(torch.ones(2), torch.tensor([1.0, math.nan]), 0.2)


@pytest.mark.parametrize(
    "mask, message",
    [
        (torch.ones(T), "mask must have shape \\(B, T\\)"),  # 1-D: was a raw IndexError
        (torch.ones(B, T, 1), "mask must have shape \\(B, T\\)"),
        (torch.tensor([[1.0, 0.5, 0.0, 0.0]]), "mask must contain only 0 and 1"),
        (HOLES, "contiguous"),
    ],
    ids=["1-D", "3-D", "half", "holes"],
)
def test_last_token_index_validates_its_mask(mask, message):
    with pytest.raises(ValueError, match=message):
        rh.last_token_index(mask)
