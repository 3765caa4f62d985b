"""KL estimators on samples from known distributions, reward shaping, and the KL controllers."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_helpers import (
    AdaptiveKLController,
    FixedKLController,
    kl_estimate,
    last_token_index,
    shape_rewards,
)

N_SAMPLES = 200_000


def categorical_samples(seed=0, vocab=40, spread=0.5):
    """log pi(y), log ref(y) for y ~ pi, and the exact KL(pi || ref)."""
    gen = torch.Generator().manual_seed(seed)
    pi_logits = torch.randn(vocab, generator=gen, dtype=torch.float64)
    ref_logits = pi_logits + spread * torch.randn(vocab, generator=gen, dtype=torch.float64)
    log_pi, log_ref = pi_logits.log_softmax(-1), ref_logits.log_softmax(-1)
    exact = (log_pi.exp() * (log_pi - log_ref)).sum().item()
    y = torch.multinomial(log_pi.exp(), N_SAMPLES, replacement=True, generator=gen)
    return log_pi[y][None], log_ref[y][None], exact  # (1, N), (1, N), float


def gaussian_samples(seed=1, mu_ref=0.4, sigma_ref=1.2):
    """pi = N(0, 1), ref = N(mu_ref, sigma_ref^2); exact KL(pi || ref) in closed form."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, N_SAMPLES, generator=gen, dtype=torch.float64)
    pi = torch.distributions.Normal(0.0, 1.0)
    ref = torch.distributions.Normal(mu_ref, sigma_ref)
    exact = math.log(sigma_ref) + (1 + mu_ref**2) / (2 * sigma_ref**2) - 0.5
    return pi.log_prob(x), ref.log_prob(x), exact


@pytest.mark.parametrize("samples", [categorical_samples, gaussian_samples])
def test_k1_and_k3_unbiased_k3_nonnegative_k1_sometimes_negative(samples):
    log_pi, log_ref, exact = samples()
    for kind in ("k1", "k3"):
        est = kl_estimate(log_pi, log_ref, kind)  # (1, N)
        standard_error = est.std().item() / math.sqrt(N_SAMPLES)
        assert abs(est.mean().item() - exact) < 4 * standard_error, kind
    k1 = kl_estimate(log_pi, log_ref, "k1")
    k3 = kl_estimate(log_pi, log_ref, "k3")
    assert (k3 >= 0).all()
    assert (k1 < 0).any() and (k1 > 0).any()


def test_k3_has_lower_variance_than_k1_for_nearby_distributions():
    log_pi, log_ref, _ = gaussian_samples(mu_ref=0.1, sigma_ref=1.0)
    k1, k3 = kl_estimate(log_pi, log_ref, "k1"), kl_estimate(log_pi, log_ref, "k3")
    assert k3.std() < 0.2 * k1.std()


@pytest.mark.parametrize("samples", [categorical_samples, gaussian_samples])
def test_k2_nonnegative_and_close_for_nearby_distributions(samples):
    log_pi, log_ref, exact = samples()
    k2 = kl_estimate(log_pi, log_ref, "k2")
    assert (k2 >= 0).all()
    assert k2.mean().item() == pytest.approx(exact, rel=0.25)


def test_estimators_per_token_formulas_on_one_token():
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])  # log r' = ref - pi = -0.5
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    same = torch.randn(3, 4)
    for kind in ("k1", "k2", "k3"):
        assert (kl_estimate(same, same, kind) == 0).all()


def test_k3_accurate_for_tiny_differences():
    logp = torch.zeros(1, 1, dtype=torch.float32)
    ref = torch.full((1, 1), -1e-4, dtype=torch.float32)
    # (r - 1) - log r = x^2 / 2 + O(x^3) for log r = x; naive exp(x) - 1 in float32 loses it
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5e-8, rel=1e-3)


def test_shape_rewards_against_loop(make_batch):
    batch = make_batch(B=5, T=9, seed=2, pad_value=3.0)
    mask, logp, ref = batch["mask"], -batch["x"].abs(), -batch["y"].abs()
    scores = torch.randn(5, dtype=torch.float64)
    coef = 0.05
    for kind in ("k1", "k3"):
        rewards, kl = shape_rewards(scores, logp, ref, mask, coef, kl_kind=kind)
        expected_r = torch.zeros_like(rewards)
        expected_kl = torch.zeros_like(kl)
        for b, length in enumerate(batch["lengths"].tolist()):
            for t in range(length):
                d = ref[b, t].item() - logp[b, t].item()  # log r'
                k = -d if kind == "k1" else math.exp(d) - 1 - d
                expected_kl[b, t] = k
                expected_r[b, t] = -coef * k + (scores[b].item() if t == length - 1 else 0.0)
        torch.testing.assert_close(rewards, expected_r)
        torch.testing.assert_close(kl, expected_kl)


def test_shape_rewards_score_lands_after_prompt_block_and_can_be_clipped():
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    zeros = torch.zeros(2, 5)
    rewards, kl = shape_rewards(torch.tensor([2.0, -7.0]), zeros, zeros, mask,
                                kl_coef=0.1, score_clip=5.0)
    expected = torch.zeros(2, 5)
    expected[0, 3], expected[1, 4] = 2.0, -5.0
    torch.testing.assert_close(rewards, expected)
    assert (kl == 0).all()


def test_last_token_index():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [1, 2, 3, -1]


def test_fixed_controller_never_moves():
    ctl = FixedKLController(0.1)
    for kl in (0.0, 5.0, 100.0):
        assert ctl.update(kl, n_steps=64) == 0.1
    assert ctl.value == 0.1


def test_adaptive_controller_moves_beta_the_right_way():
    up = AdaptiveKLController(0.1, target=6.0, horizon=1000)
    up.update(9.0, n_steps=100)  # KL above target -> raise beta; e = 0.5 clipped to 0.2
    assert up.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))
    down = AdaptiveKLController(0.1, target=6.0, horizon=1000)
    down.update(5.4, n_steps=100)  # e = -0.1
    assert down.value == pytest.approx(0.1 * (1 - 0.1 * 100 / 1000))
    steady = AdaptiveKLController(0.1, target=6.0, horizon=1000)
    steady.update(torch.tensor(6.0), n_steps=100)
    assert steady.value == pytest.approx(0.1)


def test_adaptive_controller_closes_the_loop():
    """A toy plant where KL falls as beta rises: the controller settles near the target."""
    ctl = AdaptiveKLController(0.01, target=2.0, horizon=100)
    for _ in range(400):
        kl = 0.1 / ctl.value  # higher beta -> lower KL
        ctl.update(kl, n_steps=10)
    assert 0.1 / ctl.value == pytest.approx(2.0, rel=0.05)


def test_adaptive_controller_clips_the_error_below_target_too():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=1000)
    ctl.update(0.0, n_steps=100)  # e = -1, clipped to -0.2 (Ziegler et al.)
    assert ctl.value == pytest.approx(0.1 * (1 - 0.2 * 100 / 1000), rel=1e-12)


def test_adaptive_controller_never_makes_beta_negative():
    """n_steps > 5 * horizon with KL below target used to give 0.1 * (1 - 0.2 * 6.4) = -0.028."""
    ctl = AdaptiveKLController(0.1, 1.0, 10)
    assert ctl.update(0.0, 64) == pytest.approx(0.1 * 0.8, rel=1e-12)  # at most one horizon's 20%
    for _ in range(50):
        ctl.update(0.0, 64)
    assert ctl.value == pytest.approx(0.1 * 0.8**51, rel=1e-9) and ctl.value > 0
    up = AdaptiveKLController(0.1, 1.0, 10)
    assert up.update(100.0, 64) == pytest.approx(0.1 * 1.2, rel=1e-12)  # and at most +20% up


def test_adaptive_controller_accepts_numpy_integers_and_one_element_tensors():
    np = pytest.importorskip("numpy")
    plain, numpy_steps = AdaptiveKLController(0.1, 6.0, 1000), AdaptiveKLController(0.1, 6.0, 1000)
    plain.update(9.0, 100)
    numpy_steps.update(np.float32(9.0), np.int64(100))
    assert numpy_steps.value == plain.value
    tensor_kl = AdaptiveKLController(0.1, 6.0, 1000)
    tensor_kl.update(torch.tensor([9.0]), 100)
    assert tensor_kl.value == plain.value


@pytest.mark.parametrize("bad_kl", ["0.5", b"0.5", None, True, [0.5], torch.tensor([1.0, 2.0]),
                                    torch.tensor(1), math.nan])
@pytest.mark.parametrize("make",
                         [lambda: AdaptiveKLController(0.1, 6.0, 100),
                          lambda: FixedKLController(0.1)], ids=["adaptive", "fixed"])
def test_controllers_refuse_a_kl_that_is_not_a_finite_number(make, bad_kl):
    ctl = make()
    with pytest.raises(ValueError, match="current_kl must be a finite number"):
        ctl.update(bad_kl, 8)
    assert ctl.value == 0.1  # unchanged


@pytest.mark.parametrize("bad_steps", [0, -3, 2.5, "8", True, None])
def test_controllers_refuse_bad_n_steps(bad_steps):
    for ctl in (AdaptiveKLController(0.1, 6.0, 100), FixedKLController(0.1)):
        with pytest.raises(ValueError, match="n_steps must be a positive int"):
            ctl.update(1.0, bad_steps)


@pytest.mark.parametrize("horizon", [0, -10, math.nan, math.inf, "100", True, None])
def test_adaptive_controller_refuses_a_bad_horizon(horizon):
    with pytest.raises(ValueError, match="horizon must be a finite number > 0"):
        AdaptiveKLController(0.1, 6.0, horizon)
