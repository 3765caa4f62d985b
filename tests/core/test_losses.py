"""PPO clip loss (the six gradient cases, dual clip), KL-penalty form, value clip, LM loss and the
Bradley-Terry reward-model loss, each against autograd rules or closed forms."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rlhf_helpers import (
    clipped_surrogate,
    kl_penalty_policy_loss,
    lm_loss,
    pairwise_accuracy,
    policy_loss,
    reward_model_loss,
    value_loss,
)

EPS = 0.2
# the six cases: A > 0 / A < 0  x  ratio below / inside / above the clip range
RATIOS = [0.5, 1.0, 1.5, 0.5, 1.0, 1.5]
ADVS = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
ZERO_GRAD = [False, False, True, True, False, False]  # A>0 & ratio>1+eps, A<0 & ratio<1-eps


def policy_grad(ratios, advs, dual_clip=None):
    """d loss / d logprob for one row of tokens whose old log-prob is 0 (so ratio =
    exp(logprob))."""
    logp = torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_(True)  # (1, N)
    old = torch.zeros_like(logp)
    adv = torch.tensor([advs], dtype=torch.float64)
    loss, stats = policy_loss(logp, old, adv, torch.ones_like(adv), clip_eps=EPS,
                              dual_clip=dual_clip)
    (grad,) = torch.autograd.grad(loss, logp)
    return grad[0], loss, stats


def test_six_cases_gradient_zero_exactly_where_clipped():
    grad, _, stats = policy_grad(RATIOS, ADVS)
    n = len(RATIOS)
    for r, a, zero, g in zip(RATIOS, ADVS, ZERO_GRAD, grad.tolist(), strict=True):
        if zero:
            assert g == 0.0, (r, a)
        else:
            # unclipped term: d(-rho A / n)/d log pi = -rho A / n, never zero here
            assert g == pytest.approx(-r * a / n), (r, a)
    # clipfrac is the share of tokens whose gradient is cut
    assert stats["clipfrac"].item() == pytest.approx(sum(ZERO_GRAD) / n)


def test_loss_value_is_minus_masked_mean_of_min():
    _, loss, _ = policy_grad(RATIOS, ADVS)
    by_hand = [min(r * a, min(max(r, 1 - EPS), 1 + EPS) * a) for r,
               a in zip(RATIOS, ADVS, strict=True)]
    assert loss.item() == pytest.approx(-sum(by_hand) / len(by_hand))


def test_dual_clip_bounds_negative_advantage_from_below():
    c = 3.0
    ratios = [5.0, 2.0, 5.0, 0.5, 1.0]
    advs = [-1.0, -1.0, 1.0, -1.0, 1.0]
    # ratio 5, A<0: rho A = -5 < c A = -3 -> objective c A, no gradient
    # ratio 2, A<0: rho A = -2 > -3 -> unclipped, gradient; ratio 5, A>0: ordinary clip, no gradient
    # ratio 0.5, A<0: ordinary clip, no gradient; ratio 1, A>0: gradient
    grad, _, stats = policy_grad(ratios, advs, dual_clip=c)
    n = len(ratios)
    expected_zero = [True, False, True, True, False]
    for r, a, zero, g in zip(ratios, advs, expected_zero, grad.tolist(), strict=True):
        assert (g == 0.0) == zero, (r, a, g)
        if not zero:
            assert g == pytest.approx(-r * a / n)
    objective = clipped_surrogate(torch.tensor(ratios), torch.tensor(advs), EPS, dual_clip=c)
    torch.testing.assert_close(objective, torch.tensor([c * -1.0, -2.0, 1.2, -0.8, 1.0]))
    assert stats["dual_clipfrac"].item() == pytest.approx(1 / n)
    # without dual clip the bad, now-likely action keeps its unbounded weight
    grad_plain, _, _ = policy_grad(ratios, advs)
    assert grad_plain[0].item() == pytest.approx(5.0 / n)


def test_dual_clip_is_a_no_op_for_positive_advantages():
    ratio = torch.linspace(0.1, 4.0, 40)
    adv = torch.full_like(ratio, 0.7)
    torch.testing.assert_close(clipped_surrogate(ratio, adv, EPS, dual_clip=2.0),
                               clipped_surrogate(ratio, adv, EPS))


def test_policy_loss_masked_mean_ignores_padding(make_batch):
    batch = make_batch(B=5, T=12, seed=1, pad_value=500.0)  # exp(500) would overflow in float32
    mask = batch["mask"].float()
    logp, old, adv = (0.3 * batch["x"]).float(), (0.3 * batch["y"]).float(), batch["z"].float()
    logp.requires_grad_(True)
    loss, stats = policy_loss(logp, old, adv, mask)
    real = mask.bool()
    ratio = torch.exp(logp[real] - old[real])
    by_hand = torch.minimum(ratio * adv[real], ratio.clamp(1 - EPS, 1 + EPS) * adv[real]).mean()
    torch.testing.assert_close(loss, -by_hand)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and (logp.grad[~real] == 0).all()
    assert all(v.requires_grad is False and v.dim() == 0 for v in stats.values())


def test_approx_kl_estimates_kl_old_to_new_on_samples():
    """Tokens sampled from pi_old; approx_kl should match the exact KL(pi_old || pi_new)."""
    gen = torch.Generator().manual_seed(2)
    old_logits = torch.randn(30, generator=gen, dtype=torch.float64)
    new_logits = old_logits + 0.3 * torch.randn(30, generator=gen, dtype=torch.float64)
    old_lp, new_lp = old_logits.log_softmax(-1), new_logits.log_softmax(-1)
    exact = (old_lp.exp() * (old_lp - new_lp)).sum().item()
    tokens = torch.multinomial(old_lp.exp(), 200_000, replacement=True, generator=gen)
    logp, old = new_lp[tokens][None], old_lp[tokens][None]  # (1, N)
    _, stats = policy_loss(logp, old, torch.zeros_like(logp), torch.ones_like(logp))
    assert stats["approx_kl"].item() == pytest.approx(exact, rel=0.05)
    _, same = policy_loss(old, old, torch.ones_like(old), torch.ones_like(old))
    assert same["approx_kl"].item() == 0.0 and same["clipfrac"].item() == 0.0


def test_kl_penalty_form_closed_form_and_gradient():
    beta, a = 0.5, 2.0
    for r in [0.5, 1.0, 1.7]:
        logp = torch.tensor([[math.log(r)]], dtype=torch.float64, requires_grad=True)
        old = torch.zeros_like(logp)
        loss, stats = kl_penalty_policy_loss(logp, old, torch.full_like(old, a),
                                             torch.ones_like(old), beta)
        kl = (r - 1) - math.log(r)
        assert loss.item() == pytest.approx(-(r * a - beta * kl))
        assert stats["kl"].item() == pytest.approx(kl)
        (g,) = torch.autograd.grad(loss, logp)
        # d/d log r of -(r A - beta (r - 1 - log r)) = -(r A - beta (r - 1))
        assert g.item() == pytest.approx(-(r * a - beta * (r - 1)))


def test_kl_penalty_with_zero_beta_is_the_unclipped_surrogate(make_batch):
    batch = make_batch(B=4, T=8, seed=3)
    mask, logp, old, adv = batch["mask"], 0.5 * batch["x"], 0.5 * batch["y"], batch["z"]
    loss, _ = kl_penalty_policy_loss(logp, old, adv, mask, beta=0.0)
    real = mask.bool()
    torch.testing.assert_close(loss, -(torch.exp(logp[real] - old[real]) * adv[real]).mean())


def test_value_loss_unclipped_has_half_factor(make_batch):
    batch = make_batch(B=6, T=10, seed=4, pad_value=99.0)
    mask, v, r = batch["mask"], batch["x"], batch["y"]
    loss, stats = value_loss(v, batch["z"], r, mask)
    real = mask.bool()
    torch.testing.assert_close(loss, 0.5 * ((v[real] - r[real]) ** 2).mean())
    assert stats["vf_clipfrac"].item() == 0.0


@pytest.mark.parametrize(
    "v, v_old, ret, loss_expected, clipped_larger",
    [
        (1.0, 0.0, 1.0, 0.5 * 0.8**2, True),  # moved too far towards R: clipped error 0.64 wins
        (1.0, 0.0, 0.0, 0.5 * 1.0, False),  # moved away from R: unclipped error 1 wins
        (0.1, 0.0, 1.0, 0.5 * 0.9**2, False),  # inside the range: both equal
        # towards R (below), too far: clipped error 7.84 wins
        (-1.0, 0.0, -3.0, 0.5 * 2.8**2, True),
        (-1.0, 0.0, 1.0, 0.5 * 2.0**2, False),  # far away from R: the larger unclipped error wins
    ],
)
def test_value_clip_closed_form(v, v_old, ret, loss_expected, clipped_larger):
    values = torch.tensor([[v]], dtype=torch.float64, requires_grad=True)
    loss, stats = value_loss(values, torch.tensor([[v_old]], dtype=torch.float64),
                             torch.tensor([[ret]], dtype=torch.float64),
                             torch.ones(1, 1), value_clip=0.2)
    assert loss.item() == pytest.approx(loss_expected)
    assert stats["vf_clipfrac"].item() == float(clipped_larger)
    (g,) = torch.autograd.grad(loss, values)
    # the clipped branch is flat in V; otherwise d 0.5 (V - R)^2 / dV = V - R
    assert g.item() == pytest.approx(0.0 if clipped_larger else v - ret)


def test_lm_loss_against_shifted_hand_sum():
    torch.manual_seed(5)
    B, T, V = 2, 6, 9
    logits = torch.randn(B, T, V, dtype=torch.float64)
    labels = torch.randint(V, (B, T))
    labels[0, :3] = -100
    labels[1, 4:] = -100
    terms = []
    for b in range(B):
        for t in range(T - 1):
            y = labels[b, t + 1].item()
            if y != -100:
                terms.append(-torch.log_softmax(logits[b, t], -1)[y].item())
    assert lm_loss(logits, labels).item() == pytest.approx(sum(terms) / len(terms))
    custom = torch.where(labels == -100, torch.full_like(labels, -1), labels)
    assert lm_loss(logits, custom, ignore_index=-1).item() == pytest.approx(sum(terms) / len(terms))


def test_reward_model_loss_closed_form_and_stability():
    chosen = torch.tensor([2.0, 0.0, -1.0, 30.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([1.0, 0.0, 1.0, -30.0], dtype=torch.float64)
    diffs = [1.0, 0.0, -2.0, 60.0]
    loss = reward_model_loss(chosen, rejected)
    assert loss.item() == pytest.approx(sum(math.log1p(math.exp(-d)) for d in diffs) / 4)
    (g,) = torch.autograd.grad(loss, chosen)
    sigmoid = [1 / (1 + math.exp(-d)) for d in diffs]
    torch.testing.assert_close(g,
                               torch.tensor([-(1 - s) / 4 for s in sigmoid], dtype=torch.float64))
    # a huge wrong-way gap: log sigmoid(-1000) = -1000, not -inf
    far = reward_model_loss(torch.tensor([-500.0]), torch.tensor([500.0]))
    assert far.item() == pytest.approx(1000.0)
    assert reward_model_loss(torch.tensor([1.0]), torch.tensor([0.0]),
                             margin=1.0).item() == pytest.approx(math.log(2))


def test_reward_model_loss_matches_bce_on_the_difference():
    torch.manual_seed(6)
    c, r = torch.randn(50), torch.randn(50)
    bce = F.binary_cross_entropy(torch.sigmoid(c - r), torch.ones(50))
    torch.testing.assert_close(reward_model_loss(c, r), bce)


def test_pairwise_accuracy():
    chosen = torch.tensor([1.0, 2.0, 0.0, 5.0])
    rejected = torch.tensor([0.0, 3.0, 0.0, 4.0])
    assert pairwise_accuracy(chosen, rejected) == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert isinstance(pairwise_accuracy(chosen, rejected), float)
    assert pairwise_accuracy(torch.zeros(7), torch.zeros(7)) == 0.5


# ---- the log-ratio bound before exp -------------------------------------------------------------

def textbook_policy_loss(logp, old, adv, mask, eps, dual_clip=None):
    """The PPO clip loss without any bound on log rho: an independent reference."""
    ratio = torch.exp((logp - old) * mask)  # (B, T)
    obj = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    if dual_clip is not None:
        obj = torch.where(adv < 0, torch.maximum(obj, dual_clip * adv), obj)
    return -(obj * mask).sum() / mask.sum()


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_log_ratio_bound_changes_nothing_within_it(make_batch, dual_clip):
    """|log rho| <= 20: the same loss and gradient as the unbounded formula (float64, so the only
    difference could be the bound; 1e-12 is float64 rounding of a few dozen terms)."""
    batch = make_batch(B=5, T=12, seed=9)
    # log rho up to ~ +-15: far outside the clip range
    logp = (4.0 * batch["x"]).requires_grad_(True)
    logp_ref = logp.detach().clone().requires_grad_(True)
    old, adv, mask = batch["y"], batch["z"], batch["mask"]
    with torch.no_grad():
        logp[0, 0], logp_ref[0, 0] = 19.9 + old[0, 0], 19.9 + old[0, 0]  # just inside the bound
        adv[0, 0] = -1.0  # A < 0 and rho = e^19.9: the unclipped term, a huge but finite gradient
    loss, _ = policy_loss(logp, old, adv, mask, clip_eps=EPS, dual_clip=dual_clip)
    expected = textbook_policy_loss(logp_ref, old, adv, mask, EPS, dual_clip)
    (grad,) = torch.autograd.grad(loss, logp)
    (grad_ref,) = torch.autograd.grad(expected, logp_ref)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=0.0)
    if dual_clip is None:
        assert grad[0, 0] == pytest.approx(math.exp(19.9) / mask.sum().item(), rel=1e-9)


# (log rho, A, objective with the bound, whether the unbounded gradient is 0 there as well)
FAR_CASES = [
    (100.0, 1.0, 1.0 + EPS, True),  # clipped side: (1 + eps) A, no gradient either way
    (100.0, -1.0, -math.exp(20.0), False),  # unclipped rho A: the token is dropped from the step
    (-100.0, 1.0, math.exp(-20.0), False),  # rho A with rho ~ 0: gradient e^-100 before, 0 now
    (-100.0, -1.0, -(1.0 - EPS), True),  # clipped side: (1 - eps) A
]


@pytest.mark.parametrize("dtype, far", [(torch.float32, 100.0), (torch.float64, 1000.0),
                                        (torch.float16, 12.0), (torch.bfloat16, 100.0)])
def test_huge_log_ratios_give_a_finite_loss_and_a_zero_gradient(dtype, far):
    """exp overflows past log rho ~ 88 in float32 (~ 11 in float16): loss and gradient were
    inf/NaN."""
    cases = [(math.copysign(far, lr), a, obj, same) for lr, a, obj, same in FAR_CASES]
    logp = torch.tensor([[lr for lr, *_ in cases]], dtype=dtype, requires_grad=True)  # (1, 4)
    old = torch.zeros_like(logp)
    adv = torch.tensor([[a for _, a, *_ in cases]], dtype=dtype)
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 4), clip_eps=EPS)
    (grad,) = torch.autograd.grad(loss, logp)
    # half: float32
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    if dtype != torch.float16:  # float16's 12 is inside the bound: there the plain formula holds
        expected = -sum(obj for _, _, obj, _ in cases) / 4
        assert loss.item() == pytest.approx(expected, rel=1e-6)
        assert grad.tolist() == [[0.0] * 4]
        assert stats["ratio_max"].item() == pytest.approx(math.exp(20.0), rel=1e-6)
    else:  # rho = e^12 = 1.6e5 > float16's max: finite only because the loss works in float32
        expected = -((1 + EPS) - math.exp(12.0) + math.exp(-12.0) - (1 - EPS)) / 4
        assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert bool(torch.isfinite(grad).all()) and all(bool(torch.isfinite(v)) for v in stats.values())


def test_bound_and_dual_clip_agree_on_the_negative_advantage_side():
    """With a dual clip c, a token with A < 0 and rho > c already has gradient 0 and objective c A:
    the bound changes nothing there, whatever the size of log rho."""
    logp = torch.tensor([[2.0, 50.0, 500.0]], requires_grad=True)
    adv = -torch.ones(1, 3)
    loss, _ = policy_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3),
                          clip_eps=EPS, dual_clip=3.0)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(3.0) and grad.tolist() == [[0.0, 0.0, 0.0]]


def test_kl_penalty_form_is_finite_for_huge_log_ratios():
    logp = torch.tensor([[100.0, -100.0, 0.5]], requires_grad=True)
    loss, stats = kl_penalty_policy_loss(logp, torch.zeros(1, 3), torch.ones(1, 3),
                                         torch.ones(1, 3), beta=0.1)
    (grad,) = torch.autograd.grad(loss, logp)
    assert bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())
    assert grad[0, 0] == 0.0 and grad[0, 1] == 0.0  # saturated tokens carry no gradient
    # the normal token keeps d/dlogp of -(rho A - beta ((rho - 1) - log rho)) / 3
    rho = math.exp(0.5)
    assert grad[0, 2].item() == pytest.approx(-(rho - 0.1 * (rho - 1)) / 3, rel=1e-6)
    assert stats["kl"].item() == pytest.approx((math.expm1(20) - 20 + math.expm1(-20) + 20
                                                + math.expm1(0.5) - 0.5) / 3, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_losses_are_computed_in_float32(make_batch, dtype):
    batch = make_batch(B=4, T=9, seed=3, dtype=torch.float32)
    x, y, z = (batch[k].to(dtype) for k in ("x", "y", "z"))
    mask = batch["mask"]
    for fn in (lambda *t: policy_loss(*t, mask), lambda *t: value_loss(*t, mask, value_clip=0.2),
               lambda *t: kl_penalty_policy_loss(*t, mask, beta=0.1)):
        got, _ = fn(x, y, z)
        expected, _ = fn(x.float(), y.float(), z.float())  # the same values, upcast by hand
        assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_lm_loss_accepts_int32_labels_like_int64():
    torch.manual_seed(2)
    logits, labels = torch.randn(2, 5, 7), torch.randint(7, (2, 5))
    labels[0, 2] = -100
    assert torch.equal(lm_loss(logits, labels.int()), lm_loss(logits, labels))


def test_reward_model_loss_accepts_one_margin_per_pair():
    chosen, rejected = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])
    margins = torch.tensor([1.0, 0.0])
    expected = (math.log(2) + math.log1p(math.exp(-2.0))) / 2  # -log sigmoid(0), -log sigmoid(2)
    assert reward_model_loss(chosen, rejected, margins).item() == pytest.approx(expected, rel=1e-6)
