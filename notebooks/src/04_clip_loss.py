# Source of notebooks/04_clip_loss.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 04 · PPO's losses: the clipped surrogate, value clipping and the LM loss
#
# {{colab_badge}}
#
# **You will learn**
# - the probability ratio and the clipped surrogate objective, term by term;
# - the six cases ($\hat A$ positive or negative, ratio below, inside or above the band) and exactly where
#   the gradient is zero, checked with autograd;
# - the clip fraction and approx-KL diagnostics;
# - the value loss with clipping around the old values, which you write, and the optional LM (ptx) loss.
#
# **Prerequisites:** notebooks 01 (policy gradients, the importance ratio, why PPO clips) and 03
# (advantages, and the KL estimators $k_1$, $k_2$, $k_3$).
# **Time:** about 125 min for the core, in two sittings (the second from *3. The value loss, with clipping*); the deep dives add about 80 min.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import pandas as pd
import torch
import torch.nn.functional as F
from IPython.display import display
from plotly.subplots import make_subplots

import rlhf_helpers
from rlhf_helpers import widgets
from rlhf_helpers.course.claims import check_claims

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny tensors: extra threads only add overhead

# %% [markdown]
# ## 1. Ratio and clipped surrogate
#
# The batch was sampled by the policy as it was before this update, $\pi_{\text{old}}$, whose per-token
# log-probs were stored at sampling time. After some gradient steps the current policy $\pi_\theta$ gives
# new log-probs for the same tokens, and (Schulman et al. 2017, eqs. 6-7)
#
# $$\rho_t = \frac{\pi_\theta(a_t \mid s_t)}{\pi_{\text{old}}(a_t \mid s_t)} = \exp\big(\log\pi_\theta - \log\pi_{\text{old}}\big),$$
#
# $$\text{surr1}_t = \rho_t \hat A_t, \qquad \text{surr2}_t = \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\,\hat A_t,$$
#
# $$L^{\text{CLIP}} = -\frac{\sum_t m_t \min(\text{surr1}_t, \text{surr2}_t)}{\sum_t m_t}.$$
#
# This is a **loss**, minimised: the minus sign turns the paper's objective (maximised; $J^{\text{CLIP}}$
# in notebook 01, $L^{\text{CLIP}}$ without the minus in Schulman et al.) into what an optimiser descends.
#
# Two diagnostics are logged with it. The **clip fraction** is the share of real tokens where `min`
# selects the clipped term ($\text{surr2}_t < \text{surr1}_t$), which is exactly where the gradient is
# zero: $\hat A_t > 0$ with $\rho_t > 1+\epsilon$, or $\hat A_t < 0$ with $\rho_t < 1-\epsilon$. The
# **approx-KL** says how far the policy has moved on this batch: an estimate of
# $\mathrm{KL}(\pi_{\text{old}} \Vert \pi_\theta)$ from the sampled tokens, notebook 03's $k_3$ with $w = \rho_t$,
# as a masked mean $\overline{(\rho_t - 1) - \log\rho_t}$. Frameworks log other conventions of both
# (the deep dive below compares them): check which one a log shows before comparing numbers.
#
# The old log-probs must come from the policy that *sampled* the batch, not from the reference (SFT)
# model. With the reference's log-probs the ratio is $\pi_\theta / \pi_{\text{ref}}$, so the band stays
# centred on the reference for the whole training instead of on the policy of each update. The clip then
# no longer limits the step of an update: it zeroes the gradient of tokens that have moved past the band,
# away from the reference, in the direction their advantage favours, and leaves the full gradient to
# those outside it on the other side, which pulls them back. It holds the policy near the reference
# instead of bounding each step. Notebook 06(a) trains with this bug.

# %%
def policy_loss_scratch(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip_eps: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """-masked mean of min(ratio * A, clip(ratio) * A), plus clip fraction: (B, T) inputs -> 2 scalars."""
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    surr1 = ratio * advantages  # (B, T)
    surr2 = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages  # (B, T)
    objective = torch.min(surr1, surr2)  # (B, T)
    loss = -(objective * mask).sum() / mask.sum()
    clipped = (surr2 < surr1).float()  # (B, T): the clipped term is selected
    clipfrac = (clipped * mask).sum() / mask.sum()
    return loss, clipfrac


gen = torch.Generator().manual_seed(0)
B, T = 4, 10
mask = (torch.arange(T)[None, :] < torch.tensor([10, 7, 4, 9])[:, None]).float()  # (B, T)
old_logprobs = -torch.rand(B, T, generator=gen) * 4  # (B, T)
logprobs = old_logprobs + 0.3 * torch.randn(B, T, generator=gen)  # (B, T): after some updates
advantages = torch.randn(B, T, generator=gen) * mask  # (B, T)

loss, clipfrac = policy_loss_scratch(logprobs, old_logprobs, advantages, mask)
lib_loss, stats = rlhf_helpers.policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps=0.2)
torch.testing.assert_close(loss, lib_loss)
torch.testing.assert_close(clipfrac, stats["clipfrac"])
print(f"loss {loss:.4f}   clipfrac {clipfrac:.3f}   approx_kl {stats['approx_kl']:.4f}")

# %% [markdown]
# ### Deep dive: the clip fraction and approx-KL, framework by framework
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# **Clip fraction.** Two different shares go by this name:
#
# - *where the clip is active*: the share of real tokens where `min` selects the clipped term
#   ($\text{surr2}_t < \text{surr1}_t$). That is exactly where the gradient is zero: $\hat A_t > 0$ with
#   $\rho_t > 1+\epsilon$, or $\hat A_t < 0$ with $\rho_t < 1-\epsilon$. TRL (the PPO trainer of TRL 1.10,
#   `trl.experimental.ppo`), trlx and OpenRLHF (0.11.2) log this one; TRL and trlx compare the loss terms
#   $-\hat A_t\rho_t$ and $-\hat A_t\operatorname{clip}(\rho_t)$, the same test with the sign flipped:
#
#   ```python
#   pg_clipfrac = masked_mean((pg_losses2 > pg_losses).float(), ~padding_mask[micro_batch_inds])  # TRL
#   pg_clipfrac = torch.sum((pg_loss2 > pg_loss1).float() * mask) / n  # trlx
#   clip_ratio = masked_mean(torch.lt(surr2, surr1).float(), action_mask, dim=None)  # OpenRLHF
#   ```
# - *where the ratio left the band*: the share of ratios outside $[1-\epsilon, 1+\epsilon]$, whatever the
#   advantage's sign. CleanRL, Stable-Baselines3 and OpenAI baselines log this one:
#
#   ```python
#   clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]  # CleanRL
#   clip_fraction = th.mean((th.abs(ratio - 1) > clip_range).float()).item()  # Stable-Baselines3
#   clipfrac = tf.reduce_mean(tf.to_float(tf.greater(tf.abs(ratio - 1.0), CLIPRANGE)))  # OpenAI baselines
#   ```
#
# The second also counts the ratios outside the band on the side the advantage wants undone
# ($\hat A_t > 0$ with $\rho_t < 1-\epsilon$, $\hat A_t < 0$ with $\rho_t > 1+\epsilon$), which keep the
# unclipped term and their gradient. So on the same batch the band share is never below the active share
# and can be well above it. **This course logs the first**: `stats["clipfrac"]` of
# `rlhf_helpers.policy_loss` (`policy/clipfrac_avg` in a tracker, TRL's name) is the share of tokens that
# got no gradient. Before comparing clip fractions across frameworks, check which of the two each logs.
#
# **Approx-KL** says how far the policy has moved on this batch: an estimate of
# $\mathrm{KL}(\pi_{\text{old}} \Vert \pi_\theta)$ from the sampled tokens, which $\pi_{\text{old}}$ drew.
# Notebook 03's estimators with $w = \rho_t$ give, as masked means over the real tokens,
#
# $$k_1 = \overline{\log\pi_{\text{old}}(a_t \mid s_t) - \log\pi_\theta(a_t \mid s_t)} = \overline{-\log\rho_t}, \qquad
# k_3 = \overline{(\rho_t - 1) - \log\rho_t}.$$
#
# Both are unbiased. A $k_1$ term has either sign, so a batch's $k_1$ can come out negative; every $k_3$
# term is $\ge 0$, and near $\rho = 1$ (where an update stays) $k_3$ is much less noisy. CleanRL logs both:
#
# ```python
# old_approx_kl = (-logratio).mean()  # k1
# approx_kl = ((ratio - 1) - logratio).mean()  # k3
# ```
#
# Stable-Baselines3 (`th.mean((th.exp(log_ratio) - 1) - log_ratio)`) and trlx log $k_3$; OpenRLHF's
# `ppo_kl` is $k_1$ (`masked_mean(-raw_policy_log_ratio.detach(), action_mask, dim=None)`). TRL 1.10 and
# OpenAI baselines log a third, the biased $k_2 = \tfrac12\overline{(\log\rho_t)^2}$: TRL's
# `approxkl = 0.5 * (logprobs_diff**2).mean()`, a plain mean that also counts the padding, where the
# difference is 0. **This course logs $k_3$** as `approx_kl` (`stats["approx_kl"]`).
#
# The cell measures every convention on the batch above.

# %%
# Both clip-fraction conventions, and three approx-KL estimators, on this batch's real tokens
eps = 0.2
log_ratio = logprobs - old_logprobs  # (B, T)
ratio = torch.exp(log_ratio)  # (B, T)
real = mask.bool()  # (B, T)
outside = ((ratio - 1).abs() > eps) & real  # (B, T): ratio outside [1 - eps, 1 + eps] (CleanRL, SB3)
cut = ((advantages > 0) & (ratio > 1 + eps)) | ((advantages < 0) & (ratio < 1 - eps))  # (B, T): gradient 0
cut = cut & real
torch.testing.assert_close(stats["clipfrac"], cut.float().sum() / mask.sum())  # the course's definition
n_real = int(mask.sum())
display(pd.DataFrame({
    "tokens": [int(outside.sum()), int(cut.sum()), int((outside & ~cut).sum())],
    "share of real tokens": [float(outside.sum()) / n_real, float(cut.sum()) / n_real,
                             float((outside & ~cut).sum()) / n_real],
}, index=["ratio outside the band (CleanRL, SB3, baselines)", "clipped term selected (TRL, trlx, OpenRLHF; here)",
          "outside the band on the side to undo (gradient kept)"]).style.format(precision=3))
approx_kl = {"k1 = mean(-log ratio)": float(-log_ratio[real].mean()),
             "k2 = mean((log ratio)^2) / 2": float(0.5 * (log_ratio[real] ** 2).mean()),
             "k3 = mean((ratio - 1) - log ratio)": float(((ratio - 1) - log_ratio)[real].mean())}
torch.testing.assert_close(torch.tensor(approx_kl["k3 = mean((ratio - 1) - log ratio)"]), stats["approx_kl"])
display(pd.DataFrame({"approx-KL": approx_kl}).style.format(precision=4))

# %% [markdown]
# On this batch, 11 of the 30 real tokens have a ratio outside the band, but only 5 of them have their
# clipped term selected: the band convention reports about 0.37, the course's about 0.17. The other 6
# lie outside the band on the side the advantage wants undone and keep their gradient. Every clipped
# token lies outside the band, as the definitions require. The approx-KL is about 0.04 by $k_3$ (and by
# $k_2$), while $k_1$ comes out **negative**, about $-0.02$: on 30 tokens the noise of $k_1$ exceeds the
# KL it estimates. A negative $k_1$ in a log is noise, not a bug.

# %% tags=["claim-check"]
check_claims({
    "11 of 30 real tokens outside the band": int(outside.sum()) == 11 and n_real == 30,
    "5 clipped, all of them outside the band": int(cut.sum()) == 5 and not (cut & ~outside).any(),
    "k3 and k2 about 0.04": all(0.035 < approx_kl[k] < 0.045 for k in list(approx_kl)[1:]),
    "k1 negative, about -0.02": -0.025 < approx_kl["k1 = mean(-log ratio)"] < -0.01,
}, any_profile=True)


# %% [markdown]
# ## 2. The six cases, and where the gradient is zero
#
# | | $\rho < 1-\epsilon$ | $1-\epsilon \le \rho \le 1+\epsilon$ | $\rho > 1+\epsilon$ |
# |---|---|---|---|
# | $\hat A > 0$ | $\rho \hat A$: gradient $\rho\hat A$ (raise the good action back) | $\rho \hat A$: gradient $\rho\hat A$ | clipped: **zero** (already raised enough) |
# | $\hat A < 0$ | clipped: **zero** (already lowered enough) | $\rho \hat A$: gradient $\rho\hat A$ | $\rho \hat A$: gradient $\rho\hat A$, **growing** with $\rho$ (no bound) |
#
# The gradient with respect to the new log-prob is $\partial(\rho\hat A)/\partial\log\pi_\theta = \rho\hat A$
# where the unclipped term is selected and 0 where the clipped one is. So the clip only stops a policy
# from gaining too much on a token, never from repairing a loss. The bottom-right cell, a bad action that
# became much *more* likely, is not clipped at all: its gradient grows with $\rho$ (the dual clip, in a
# deep dive below, bounds it). Nor is the clip a hard limit on the ratio: steps on other tokens, through
# shared parameters, still move a clipped token's ratio (a deep dive below measures it over ten epochs).
# The cell checks every case with autograd.

# %%
eps = 0.2
ratios = torch.tensor([0.5, 1.0, 1.5, 0.5, 1.0, 1.5])
advs = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
new_logp = torch.log(ratios).requires_grad_(True)  # old log-prob = 0, so ratio = exp(new_logp)
objective = rlhf_helpers.clipped_surrogate(torch.exp(new_logp), advs, eps)  # (6,): to maximise
(grad,) = torch.autograd.grad(objective.sum(), new_logp)

zero_expected = ((advs > 0) & (ratios > 1 + eps)) | ((advs < 0) & (ratios < 1 - eps))
expected_grad = torch.where(zero_expected, torch.zeros(6), ratios * advs)
torch.testing.assert_close(grad, expected_grad)
for r, a, g in zip(ratios.tolist(), advs.tolist(), grad.tolist(), strict=True):
    print(f"A {a:+.0f}  ratio {r:.1f}  ->  d objective / d log pi = {g:+.2f}")

# %% [markdown]
# ### Exercise 1: the clipped surrogate, elementwise
# Write `clipped_objective(ratio, adv, eps)`: the per-token $\min(\rho\hat A, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon)\hat A)$.
# The check compares its values with the table above, and its gradient with respect to the ratio with
# the rule: $\hat A$ where the unclipped term is selected, 0 where the clipped one is. It uses
# $\epsilon = 0.3$.

# %%
# EXERCISE 1
def clipped_objective(ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
    """min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A), elementwise."""
    raise NotImplementedError


# %%
def check_clipped_objective():
    g = torch.Generator().manual_seed(11)
    eps = 0.3  # not the usual 0.2, so a band written as (0.8, 1.2) shows
    r = torch.rand(60, generator=g, dtype=torch.float64) * 2  # (60,): ratios in [0, 2]
    a = torch.randn(60, generator=g, dtype=torch.float64)  # (60,)
    upper, lower = (a > 0) & (r > 1 + eps), (a < 0) & (r < 1 - eps)  # (60,): the clipped term is the min
    expected = torch.where(upper, (1 + eps) * a, torch.where(lower, (1 - eps) * a, r * a))  # (60,): the table
    expected_grad = torch.where(upper | lower, torch.zeros_like(a), a)  # (60,): d objective / d ratio
    got = clipped_objective(r, a, eps)
    assert isinstance(got, torch.Tensor) and got.shape == r.shape, "return one value per token, shaped like ratio"
    wrong = ~torch.isclose(got, expected, rtol=1e-9, atol=1e-12)  # (60,)
    slips = {  # what the usual slips compute, and what to say about each
        "you took the max of the two terms; PPO takes the pessimistic min": torch.max(r * a, r.clamp(1 - eps, 1 + eps) * a),
        "you return the clipped term alone; take the min with the unclipped ratio * A, so a token on the "
        "side the advantage wants undone keeps ratio * A": r.clamp(1 - eps, 1 + eps) * a,
        "you clipped the product ratio * A; clip the ratio, then multiply by A":
            torch.min(r * a, (r * a).clamp(1 - eps, 1 + eps)),
        "you clipped at 0.8 and 1.2; clip at 1 - eps and 1 + eps": torch.min(r * a, r.clamp(0.8, 1.2) * a),
    }
    hint = next((text for text, value in slips.items() if torch.allclose(got, value)), "")
    i = int(wrong.nonzero()[0]) if wrong.any() else 0
    assert not wrong.any(), (f"{int(wrong.sum())} of 60 tokens differ (eps = {eps}), e.g. A = {float(a[i]):+.2f} "
                             f"with ratio {float(r[i]):.2f}: got {float(got[i]):.4f}, expected {float(expected[i]):.4f}. {hint}")
    r_grad = r.clone().requires_grad_(True)
    out = clipped_objective(r_grad, a, eps)
    assert out.requires_grad, "your objective carries no gradient w.r.t. the ratio: no .detach(), .item() or no_grad"
    (grad,) = torch.autograd.grad(out.sum(), r_grad)  # (60,)
    wrong = ~torch.isclose(grad, expected_grad, rtol=1e-9, atol=1e-12)  # (60,)
    inside = (r >= 1 - eps) & (r <= 1 + eps)  # (60,): the band, where the two terms are equal
    hint = ("inside the band the two terms are equal and torch.min splits the gradient between them, so a "
            ".detach() on one term halves it there" if bool(torch.isclose(grad[inside], a[inside] / 2).all()) else "")
    i = int(wrong.nonzero()[0]) if wrong.any() else 0
    assert not wrong.any(), (f"your values are right, but d objective / d ratio differs at {int(wrong.sum())} of 60 "
                             f"tokens, e.g. A = {float(a[i]):+.2f} with ratio {float(r[i]):.2f}: got {float(grad[i]):.4f}, "
                             f"expected {float(expected_grad[i]):.4f} (A where the unclipped term is selected, 0 where "
                             f"the clipped one is). {hint}")


exercise_check("Exercise 1 (clipped_objective)", check_clipped_objective,
               hidden=[rlhf_helpers.clipped_surrogate, rlhf_helpers.policy_loss])

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def clipped_objective(ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
#     """min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A), elementwise."""
#     return torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
# ```
# </details>

# %% [markdown]
# ### Exercise 2: which tokens get no gradient?
# Write `zero_gradient(ratio, adv, eps)` returning a boolean tensor: True where the clipped objective's
# gradient with respect to the ratio is zero. The check compares it with autograd, with $\epsilon = 0.3$.

# %%
# EXERCISE 2
def zero_gradient(ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
    """True where d min(ratio A, clip(ratio) A) / d ratio == 0 (adv != 0, ratio not on a band edge)."""
    raise NotImplementedError


# %%
def check_zero_gradient():
    g = torch.Generator().manual_seed(12)
    eps = 0.3  # not the usual 0.2, so a band written as (0.8, 1.2) shows
    r = (torch.rand(200, generator=g) * 2).requires_grad_(True)  # (200,): ratios in [0, 2]
    a = torch.randn(200, generator=g)  # (200,)
    (grad,) = torch.autograd.grad(torch.min(r * a, r.clamp(1 - eps, 1 + eps) * a).sum(), r)  # the objective, written out
    got = zero_gradient(r.detach(), a, eps)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bool, "return a boolean tensor"
    assert got.shape == r.shape, f"return one flag per token, shape {tuple(r.shape)}; got {tuple(got.shape)}"
    zero, ratio = grad == 0, r.detach()  # (200,), (200,)
    cases = []
    for sign_name, sign in (("A > 0", a > 0), ("A < 0", a < 0)):
        for side_name, side in (("ratio < 0.7", ratio < 1 - eps), ("ratio in [0.7, 1.3]", (ratio >= 1 - eps) & (ratio <= 1 + eps)),
                                ("ratio > 1.3", ratio > 1 + eps)):
            wrong = sign & side & (got != zero)  # (200,)
            if wrong.any():
                truth = "zero" if bool(zero[wrong].all()) else "not zero"
                said = "zero" if bool(got[wrong].all()) else "not zero"
                cases.append(f"{int(wrong.sum())} tokens with {sign_name} and {side_name}: you say {said}, "
                             f"autograd's gradient is {truth}")
    assert not cases, f"eps = {eps}: {int((got != zero).sum())} of 200 tokens classified wrongly: " + "; ".join(cases)


exercise_check("Exercise 2 (zero_gradient)", check_zero_gradient,
               hidden=[rlhf_helpers.clipped_surrogate, rlhf_helpers.policy_loss])

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def zero_gradient(ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
#     """True where d min(ratio A, clip(ratio) A) / d ratio == 0 (adv != 0, ratio not on a band edge)."""
#     return ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
# ```
# </details>


# %% [markdown]
# ### Deep dive: drag the clip, and the dual clip
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Move the advantage and $\epsilon$ (and, in a running notebook, the ratio and the dual clip); the
# explorer shows both surrogate terms, the one `min` selects, and whether the gradient flows.
#
# *If an explorer is gone when you come back:* closing a notebook's tab in JupyterLab closes its widgets'
# connection to the kernel, so a notebook reopened while its kernel still runs shows "Error displaying
# widget: model not found" where each explorer was. Run the explorer's cell again. Reloading the browser
# page instead keeps them.

# %%
clip_explorer = widgets.ClipExplorer()
clip_explorer

# %% [markdown]
# #### Predict, then drag
#
# **1.** With $\hat A > 0$, for which ratios is the gradient zero? Why is $\rho < 1 - \epsilon$ **not** clipped?
#
# <details><summary>Answer</summary>
#
# Only for $\rho > 1 + \epsilon$. Below the band the `min` still picks the unclipped $\rho \hat A$ (the
# smaller of the two), so a good action whose probability fell keeps being pushed back up: the clip
# only stops the policy from gaining too much, never from repairing a loss.
# </details>
#
# **2.** Make $\hat A < 0$ and follow the curves far to the right of $1 + \epsilon$. Is the objective
# bounded? What does the dual clip change (in a running notebook, tick it)?
#
# <details><summary>Answer</summary>
#
# Unbounded: the `min` selects the unclipped $\rho \hat A$, which falls without limit. Its slope in
# $\rho$ is the constant $\hat A$ (what the explorer shows), but the parameters move $\log\pi_\theta$, and
# $\partial(\rho\hat A)/\partial\log\pi_\theta = \rho\hat A$ **grows** with $\rho$: the more likely a bad
# action has become, the harder that one token pulls, and a few such tokens can dominate the step. The
# dual clip (Ye et al. 2020) takes $\max(\cdot,\ c_{\text{dual}}\hat A)$ for $\hat A < 0$, with
# $c_{\text{dual}} > 1$ (e.g. 3; the explorer starts at 2, so the flat part fits on its axis): it bounds
# the objective and zeroes the gradient beyond $\rho = c_{\text{dual}}$.
# </details>
#
# **3.** Drag $\epsilon$ down to its smallest value, 0.01 (on the website: 0.05). Where does any gradient flow?
#
# <details><summary>Answer</summary>
#
# On the side that undoes a move, plus a sliver of band: for $\hat A > 0$ where $\rho < 1 + \epsilon$, for
# $\hat A < 0$ where $\rho > 1 - \epsilon$. A move in the helpful direction is clipped after only $\epsilon$:
# the batch can undo mistakes but teaches almost nothing new after its first step (at $\epsilon = 0$,
# which the library refuses, nothing at all), which is why $\epsilon$ is 0.1-0.3, not close to 0.
# </details>

# %% [markdown]
# The **dual clip** (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
# Learning") bounds the bottom-right cell of the table: for $\hat A < 0$ the objective becomes
# $\max\big(\min(\rho\hat A, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon)\hat A),\ c_{\text{dual}}\hat A\big)$
# with $c_{\text{dual}} > 1$ (e.g. 3), a constant with zero gradient beyond $\rho = c_{\text{dual}}$.
# The cell checks that cell with and without the dual clip.

# %%
# the bottom-right cell, far above the band: gradient rho * A without the dual clip, 0 beyond c with it
c_dual = 3.0
far = torch.tensor([1.5, 2.0, 5.0, 10.0])  # ratios above 1 + eps, on both sides of c_dual
far_logp = torch.log(far).requires_grad_(True)  # old log-prob = 0
bad = -torch.ones(len(far))  # A = -1
(grad_plain,) = torch.autograd.grad(rlhf_helpers.clipped_surrogate(torch.exp(far_logp), bad, eps).sum(), far_logp)
(grad_dual,) = torch.autograd.grad(
    rlhf_helpers.clipped_surrogate(torch.exp(far_logp), bad, eps, dual_clip=c_dual).sum(), far_logp)
torch.testing.assert_close(grad_plain, far * bad)  # rho * A: grows with rho
torch.testing.assert_close(grad_dual, torch.where(far > c_dual, torch.zeros(len(far)), far * bad))
for r, g, gd in zip(far.tolist(), grad_plain.tolist(), grad_dual.tolist(), strict=True):
    print(f"A -1  ratio {r:4.1f}  ->  d objective / d log pi = {g:+6.2f}   with dual clip c = {c_dual:g}: {gd:+6.2f}")


# %% [markdown]
# ## Deep dive: the KL-penalty form beside the clip form
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# The PPO paper's alternative (eq. 8) keeps the plain importance-weighted objective and subtracts a
# KL penalty towards the old policy, with $\beta$ adapted to hit a target KL. The paper penalises the
# exact $\mathrm{KL}[\pi_{\text{old}}(\cdot \mid s_t), \pi_\theta(\cdot \mid s_t)]$ over the whole distribution;
# here the single-sample $k_3$ estimate on the sampled token stands in for it, as most LLM code does:
#
# $$L^{\text{KLPEN}} = -\,\overline{\rho_t \hat A_t - \beta\, \widehat{\mathrm{KL}}_t}, \qquad
# \widehat{\mathrm{KL}}_t = (\rho_t - 1) - \log\rho_t \quad (k_3 \text{ estimate of } \mathrm{KL}(\pi_{\text{old}} \Vert \pi_\theta)).$$
#
# Both forms as a function of the ratio for one token, computed by the library:

# %%
ratio_grid = torch.linspace(0.3, 2.0, 171)  # (G,)
old = torch.zeros(len(ratio_grid), 1)  # (G, 1): one token per row
one = torch.ones(len(ratio_grid), 1)
fig = make_subplots(rows=1, cols=2, subplot_titles=("A = +1", "A = -1"))
for col, a in enumerate((1.0, -1.0), start=1):
    clip_obj = rlhf_helpers.clipped_surrogate(ratio_grid, torch.full_like(ratio_grid, a), 0.2)  # (G,)
    kl_obj = torch.tensor([
        -rlhf_helpers.kl_penalty_policy_loss(old[i:i + 1] + torch.log(ratio_grid[i]), old[i:i + 1],
                                              one[i:i + 1] * a, one[i:i + 1], beta=1.0)[0].item()
        for i in range(len(ratio_grid))
    ])
    fig.add_scatter(x=ratio_grid.tolist(), y=(ratio_grid * a).tolist(), name="ratio * A", row=1, col=col,
                    line_dash="dot", showlegend=col == 1, line_color="gray")
    fig.add_scatter(x=ratio_grid.tolist(), y=clip_obj.tolist(), name="clip (eps 0.2)", row=1, col=col,
                    showlegend=col == 1, line_color="royalblue")
    fig.add_scatter(x=ratio_grid.tolist(), y=kl_obj.tolist(), name="KL penalty (beta 1)", row=1, col=col,
                    showlegend=col == 1, line_color="darkorange")
    for edge in (0.8, 1.2):
        fig.add_vline(x=edge, line_dash="dash", line_color="lightgray", row=1, col=col)
fig.update_xaxes(title_text="ratio")
fig.update_layout(title="Per-token objective (to maximise) against the ratio")
fig.show()

# %% [markdown]
# The clip form is flat where it stops pushing; the KL form bends back smoothly, with a strength set by
# $\beta$ that must be tuned or adapted. Most PPO code for language models uses the clip form on the
# policy and a separate KL penalty towards the *reference* model inside the reward (notebook 03).

# %% [markdown]
# ## Deep dive: several epochs on one batch, and how far the ratio drifts
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# PPO reuses each batch for several epochs of minibatch steps. Here a small softmax policy over 8
# "tokens" in 32 "contexts", with logits $W x_s$ from shared context features (so a step on one
# context moves the others, as in a network), collects one batch of 512 samples. Each sample's reward is
# the context-token reward plus unit Gaussian noise (a noisy reward model), and its advantage is that
# reward minus the old policy's expected reward in the context, whitened. Then 10 epochs of 8 minibatches each with Adam, once
# with the clipped loss and once with the unclipped surrogate $-\overline{\rho \hat A}$, measuring after
# each epoch the share of samples whose ratio left $[1-\epsilon, 1+\epsilon]$, the clip fraction of
# section 1 on the whole batch (the share whose gradient the clip would cut), the largest ratio, the
# exact KL between old and new policy averaged over contexts, and the gain in true expected reward.

# %%
n_ctx, n_tok, n_feat = 32, 8, 6
world = torch.Generator().manual_seed(3)
features = torch.randn(n_ctx, n_feat, generator=world)  # (S, d)
true_reward = torch.randn(n_ctx, n_tok, generator=world)  # (S, A)
W0 = 0.3 * torch.randn(n_feat, n_tok, generator=world)  # (d, A)


def logits_of(W: torch.Tensor) -> torch.Tensor:
    return features @ W  # (S, A)


old_logits = logits_of(W0)
old_pi = old_logits.softmax(-1)  # (S, A)
ctx = torch.randint(n_ctx, (512,), generator=world)  # (N,)
tok = torch.multinomial(old_pi[ctx], 1, generator=world).squeeze(1)  # (N,)
batch_old_logp = old_logits.log_softmax(-1)[ctx, tok].unsqueeze(1)  # (N, 1): stored at sampling time
baseline = (old_pi * true_reward).sum(-1)  # (S,): V(s) under the old policy
sampled_reward = true_reward[ctx, tok] + torch.randn(len(ctx), generator=world)  # (N,)
batch_adv = (sampled_reward - baseline[ctx]).unsqueeze(1)  # (N, 1)
batch_mask = torch.ones_like(batch_adv)
batch_adv = rlhf_helpers.masked_whiten(batch_adv, batch_mask)


# %%
def run_epochs(clip: bool, epochs: int = 10, minibatches: int = 8, lr: float = 0.05, eps: float = 0.2,
               seed: int = 0) -> tuple[list[dict[str, float]], torch.Tensor]:
    """Several epochs of Adam on the batch above; after each, the diagnostics of the whole batch."""
    W = W0.clone().requires_grad_(True)
    opt = torch.optim.Adam([W], lr=lr)
    order_gen = torch.Generator().manual_seed(seed)
    history = []
    for _ in range(epochs):
        for idx in torch.randperm(len(ctx), generator=order_gen).chunk(minibatches):
            logp = logits_of(W).log_softmax(-1)[ctx[idx], tok[idx]].unsqueeze(1)  # (n, 1)
            if clip:
                loss, _ = rlhf_helpers.policy_loss(logp, batch_old_logp[idx], batch_adv[idx],
                                                   batch_mask[idx], clip_eps=eps)
            else:
                loss = -(torch.exp(logp - batch_old_logp[idx]) * batch_adv[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            new_logits = logits_of(W)  # (S, A)
            ratio = torch.exp(new_logits.log_softmax(-1)[ctx, tok].unsqueeze(1) - batch_old_logp)  # (N, 1)
            kl = (old_pi * (old_logits.log_softmax(-1) - new_logits.log_softmax(-1))).sum(-1).mean()
            gain = ((new_logits.softmax(-1) - old_pi) * true_reward).sum(-1).mean()
            _, batch_stats = rlhf_helpers.policy_loss(torch.log(ratio) + batch_old_logp, batch_old_logp,
                                                      batch_adv, batch_mask, clip_eps=eps)
            history.append({"outside band": ((ratio - 1).abs() > eps).float().mean().item(),
                            "clip fraction": batch_stats["clipfrac"].item(),
                            "max ratio": ratio.max().item(), "KL(old || new)": kl.item(),
                            "reward gain": gain.item()})
    return history, ratio.flatten()


# %%
drift, final_ratios = {}, {}
for name, clip in [("clipped", True), ("unclipped", False)]:  # under a second each: no progress bar
    drift[name], final_ratios[name] = run_epochs(clip)
keys = list(drift["clipped"][0])
fig = make_subplots(rows=1, cols=len(keys), subplot_titles=keys)
for name, history in drift.items():
    for col, key in enumerate(keys, start=1):
        fig.add_scatter(x=list(range(1, len(history) + 1)), y=[h[key] for h in history], name=name,
                        legendgroup=name, showlegend=col == 1, mode="lines+markers", row=1, col=col,
                        line_color="royalblue" if name == "clipped" else "crimson")
fig.update_xaxes(title_text="epoch")
fig.update_layout(title="Ten epochs on one batch (eps = 0.2)")
fig.show()

# %%
after = pd.DataFrame({name: history[-1] for name, history in drift.items()}).T  # after the 10th epoch
after["KL, lowest epoch"] = [min(h["KL(old || new)"] for h in drift[name]) for name in after.index]
after["KL, highest epoch"] = [max(h["KL(old || new)"] for h in drift[name]) for name in after.index]
display(after.style.format(precision=3).set_caption("After ten epochs (KL: over the ten epochs)"))

# %% [markdown]
# Without the clip, every epoch keeps pushing the same samples and the policy walks far from the one
# that collected the data: after ten epochs over 90% of the ratios lie outside the band (about half in
# the clipped run), and the KL from the sampling policy is more than ten times the clipped run's (above
# 2 nats against below 0.1). On this toy the big move also gains more true reward (about +0.6 against
# +0.1), because the policy has only 48 parameters and the advantages, though noisy, point the right
# way on average. With a network policy and critic-estimated advantages the same move is a bet on a
# batch that no longer describes the policy (the importance weights become huge), and notebook 01
# showed what an over-large step, and many steps on one batch without the clip, do.
#
# With the clip, a sample stops contributing once its ratio leaves the band in the helpful direction.
# It is not a hard limit on the ratio: the minibatch steps within an epoch, and the shared parameters,
# still carry samples past the band. The clipped run's largest ratio ends near 2, far past the band's
# edge at 1.2, while its KL stays below 0.1 after every epoch. That is why PPO also caps the number of
# epochs, keeps the learning rate small, and can stop early on approx-KL. The two clip-fraction
# conventions of section 1 part here too: after the clipped run about 0.56 of the ratios lie outside
# the band, but the clipped term is selected for only about 0.42.

# %% tags=["claim-check"]
clipped_last, free_last = drift["clipped"][-1], drift["unclipped"][-1]
check_claims({
    "unclipped: over 90% of the ratios outside the band": free_last["outside band"] > 0.9,
    "clipped: about half outside the band, about 0.56": 0.5 < clipped_last["outside band"] < 0.62,
    "unclipped KL more than 10 times the clipped run's, above 2 nats":
        free_last["KL(old || new)"] > 10 * clipped_last["KL(old || new)"] and free_last["KL(old || new)"] > 2,
    "clipped KL below 0.1 after every epoch": max(h["KL(old || new)"] for h in drift["clipped"]) < 0.1,
    "reward gain about +0.6 unclipped, +0.1 clipped":
        0.5 < free_last["reward gain"] < 0.7 and 0.05 < clipped_last["reward gain"] < 0.15,
    "clipped run's largest ratio near 2": 1.8 < clipped_last["max ratio"] < 2.2,
    "clipped run: clip fraction about 0.42": 0.37 < clipped_last["clip fraction"] < 0.47,
}, any_profile=True)

# %% [markdown]
# The clip explorer again, with the batch's ratios after the ten clipped epochs as a histogram: set
# the advantage's sign and see which of these samples still get a gradient.

# %%
batch_clip_explorer = widgets.ClipExplorer(ratios=final_ratios["clipped"])
batch_clip_explorer


# %% [markdown]
# ## 3. The value loss, with clipping
#
# The critic regresses the GAE returns $G^\lambda_t$ of notebook 03. Value clipping (as in the OpenAI baselines
# and trlx) limits how far the new value may move from the value at sampling time $V_{\text{old}}$,
# and takes the worse of the two errors:
#
# $$V^{\text{clip}}_t = V_{\text{old},t} + \operatorname{clip}(V_t - V_{\text{old},t}, -\epsilon_V, \epsilon_V), \qquad
# L^V = \tfrac12\, \overline{\max\big((V_t - G^\lambda_t)^2,\ (V^{\text{clip}}_t - G^\lambda_t)^2\big)}.$$
#
# The overline is the masked mean over the real tokens, as in $L^{\text{CLIP}}$. `vf_clipfrac` is the share
# of real tokens where the clipped error is the larger one.

# %%
value_explorer = widgets.ValueClipExplorer()
value_explorer

# %% [markdown]
# #### Predict, then drag
#
# **1.** Look at the curves where the new value $V$ is within $\epsilon_V$ of $V_{\text{old}}$. Which of the two
# losses is used?
#
# <details><summary>Answer</summary>
#
# Both terms are equal there ($V^{\text{clip}} = V$), so value clipping changes nothing inside the band.
# </details>
#
# **2.** Put the return far from $V_{\text{old}}$ and follow $V$ from $V_{\text{old}}$ towards it, past the
# band's edge on the return's side. What happens to the gradient?
#
# <details><summary>Answer</summary>
#
# It vanishes: the clipped value stays at the band's edge ($V_{\text{old}} \pm \epsilon_V$), farther from $G^\lambda$ than $V$, so the
# `max` picks the clipped error, whose gradient with respect to $V$ is zero. Value clipping slows a
# critic that has a long way to go, one reason some implementations drop it.
# </details>


# %% [markdown]
# ### Exercise 3: the clipped value loss
# Write `clipped_value_loss(values, old_values, returns, mask, eps_v)`: $L^V$ above, one number for a
# (B, T) batch whose rows have different lengths. The check compares it with a loop over the real tokens,
# and its gradient with respect to `values` (the critic's parameters reach the loss only through them)
# with the rule: $(V_t - G^\lambda_t)/n$ where the unclipped error is the larger or the two are equal, 0
# where the clipped one is larger, for $n$ real tokens. It uses $\epsilon_V = 0.45$. `value_loss` and
# `masked_mean` are hidden while it runs.

# %%
# EXERCISE 3
def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       eps_v: float) -> torch.Tensor:
    """0.5 * masked mean of max((V - G)^2, (V_clip - G)^2) over real tokens: (B, T) inputs -> scalar."""
    raise NotImplementedError


# %%
def check_clipped_value_loss():
    g, eps_v, lengths = torch.Generator().manual_seed(13), 0.45, [8, 5, 3, 6]  # eps_v: not the policy's 0.2
    mask_c = (torch.arange(8)[None, :] < torch.tensor(lengths)[:, None]).double()  # (4, 8), right-padded
    old_v = torch.randint(-16, 17, (4, 8), generator=g).double() / 8 + 40 * (1 - mask_c)  # (4, 8): 40 at padding
    v = old_v + torch.randint(-8, 9, (4, 8), generator=g).double() / 8  # (4, 8): grid of 1/8, in and out of the band
    ret = torch.randint(-24, 25, (4, 8), generator=g).double() / 8 + 1 / 32  # (4, 8): off the grid, no tie outside
    cells = [(i, t) for i, n_i in enumerate(lengths) for t in range(n_i)]  # the real tokens
    def by_loop(centres, clip=eps_v, pick=max):  # the loss and its gradient w.r.t. V, token by token
        loss, grad = 0.0, torch.zeros(4, 8, dtype=torch.float64)
        for c in cells:
            v_clip = float(centres[c]) + min(max(float(v[c] - centres[c]), -clip), clip)
            err, err_clip = float(v[c] - ret[c]) ** 2, (v_clip - float(ret[c])) ** 2
            loss += 0.5 * pick(err, err_clip)
            grad[c] = float(v[c] - ret[c]) if err >= err_clip else 0.0  # in the band V_clip = V exactly (grid)
        return loss / len(cells), grad / len(cells)
    want, want_grad = by_loop(old_v)
    got = clipped_value_loss(v, old_v, ret, mask_c, eps_v)
    assert isinstance(got, torch.Tensor) and got.dim() == 0, f"return a 0-d tensor; got {getattr(got, 'shape', got)}"
    slips = {"you take the min of the two errors; the clipped loss takes the max": by_loop(old_v, pick=min)[0],
             "you clip around the return G; clip the change from the old value, V_old + clip(V - V_old)": by_loop(ret)[0],
             "you clip V itself; clip its change from the old value, V_old + clip(V - V_old)": by_loop(0 * v)[0],
             "you clip with 0.2, not with eps_v": by_loop(old_v, clip=0.2)[0],
             "you left out the 1/2 (it makes the gradient V - G)": 2 * want,
             "you divided by every position, padding included: divide by mask.sum()": want * len(cells) / 32}
    hint = next((text for text, value in slips.items() if abs(float(got) - value) < 1e-9 * max(1.0, abs(value))), "")
    assert abs(float(got) - want) < 1e-9 * max(1.0, want), \
        f"you return {float(got):.6f}, expected {want:.6f} (a loop over the real tokens, eps_v = {eps_v}). {hint}"
    out = clipped_value_loss(v_grad := v.clone().requires_grad_(True), old_v, ret, mask_c, eps_v)
    assert out.requires_grad, "your loss carries no gradient w.r.t. the values: no .detach(), .item() or no_grad"
    (grad,) = torch.autograd.grad(out, v_grad)  # (4, 8)
    wrong = ~torch.isclose(grad, want_grad, rtol=1e-9, atol=1e-12)  # (4, 8)
    band = ((v - old_v).abs() <= eps_v) & (mask_c > 0)  # (4, 8): real tokens inside the band, where V_clip = V
    hint = ("the two errors are equal there and torch.max splits the gradient between them: a .detach() on one "
            "branch halves it" if torch.allclose(grad[band], want_grad[band] / 2) else "")
    assert not wrong.any(), (f"your loss is right, but its gradient w.r.t. V differs at {int(wrong.sum())} of "
                             f"{len(cells)} real tokens, {int((wrong & band).sum())} of them inside the band. {hint}")


exercise_check("Exercise 3 (clipped_value_loss)", check_clipped_value_loss,
               hidden=[rlhf_helpers.value_loss, rlhf_helpers.masked_mean])

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
#                        eps_v: float) -> torch.Tensor:
#     """0.5 * masked mean of max((V - G)^2, (V_clip - G)^2) over real tokens: (B, T) inputs -> scalar."""
#     v_clipped = old_values + torch.clamp(values - old_values, -eps_v, eps_v)  # (B, T): within eps_v of V_old
#     err = (values - returns) ** 2  # (B, T)
#     err_clipped = (v_clipped - returns) ** 2  # (B, T)
#     return 0.5 * (torch.max(err, err_clipped) * mask).sum() / mask.sum()
# ```
# The `max` keeps the larger error, so clipping only ever removes gradient: where $V$ has left the band
# on the return's side, the clipped error is the larger and $V$ gets no gradient. Inside the band the two
# errors are equal up to rounding: where they tie exactly `torch.max` sends half the gradient through each
# branch, elsewhere rounding picks one. Either way both must stay differentiable.
# </details>

# %% [markdown]
# ## 4. The LM (ptx) loss
#
# InstructGPT's "PPO-ptx" adds a next-token loss on ordinary text to the policy's loss, so RL does not
# erode what the model already does well. InstructGPT takes that text from its pretraining data; this
# course, which has no pretraining corpus, uses its SFT texts (`ptx_texts`):
#
# $$L^{\text{ptx}} = -\frac{1}{|\{t: y_{t+1} \ne \text{ignore}\}|} \sum_{t:\ y_{t+1} \ne \text{ignore}} \log \pi_\theta(y_{t+1} \mid y_{\le t}).$$
#
# The logits at position $t$ predict the label at $t+1$, so logits drop their last position and labels
# their first; positions labelled $-100$ (prompt or padding) are ignored. The policy's total loss is
# $L^{\text{CLIP}} + c_{\text{ptx}} L^{\text{ptx}}$; the critic's is $L^V$.

# %%
def lm_loss_scratch(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean next-token cross-entropy over the labels that are not ignore_index: (B, T, V), (B, T) -> scalar."""
    shift_logits = logits[:, :-1]  # (B, T-1, vocab): position t predicts token t+1
    shift_labels = labels[:, 1:]  # (B, T-1)
    return F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                           ignore_index=ignore_index)


lm_logits = torch.randn(2, 7, 11, generator=gen)  # (B, T, vocab)
labels = torch.randint(11, (2, 7), generator=gen)  # (B, T)
labels[0, :3] = -100  # a prompt we do not train on
labels[1, 5:] = -100  # padding
torch.testing.assert_close(lm_loss_scratch(lm_logits, labels), rlhf_helpers.lm_loss(lm_logits, labels))
# random logits lose more than uniform guessing on average (E[logsumexp] >= logsumexp of the mean, Jensen)
print(f"ptx loss of random logits {lm_loss_scratch(lm_logits, labels):.4f} "
      f"(uniform guessing would give log 11 = {torch.log(torch.tensor(11.0)):.4f})")


# %% [markdown]
# ## Summary
# - $\rho = \exp(\log\pi_\theta - \log\pi_{\text{old}})$ with old log-probs from the sampling policy;
#   $L^{\text{CLIP}} = -\overline{\min(\rho\hat A, \operatorname{clip}(\rho)\hat A)}$ over real tokens.
# - The gradient is zero exactly when the clipped term is selected: $\hat A > 0, \rho > 1+\epsilon$ or
#   $\hat A < 0, \rho < 1-\epsilon$. This course's clip fraction counts those tokens; its approx-KL is $k_3$.
# - Value clipping takes the worse of the clipped and unclipped errors; its gradient, like the policy
#   loss's, needs both branches differentiable.
# - The ptx loss is a shifted next-token loss with ignored positions.
#
# Next: notebook 05 puts these pieces into the full PPO loop on a language model.

# %% [markdown]
# ## Check your understanding
#
# **1.** With $\hat A > 0$, $\epsilon = 0.2$ and $\rho = 0.5$, does the clip zero this token's gradient?
#
# <details><summary>Answer</summary>
#
# No. Below the band the `min` selects the unclipped $\rho\hat A$, so the token keeps its gradient: the
# clip never stops the policy from repairing a drop in a good action's probability.
# </details>
#
# **2.** Why must the old log-probs come from the policy that sampled the batch, not from the reference?
#
# <details><summary>Answer</summary>
#
# With the reference's the ratio is $\pi_\theta/\pi_{\text{ref}}$ and the band stays centred on the
# reference for the whole training. The clip then no longer bounds each update's step; it holds the policy
# near the reference instead.
# </details>
#
# **3.** Your clipped value loss gives the library's value on every batch, yet your critic learns more
# slowly. What could be wrong?
#
# <details><summary>Answer</summary>
#
# A detached branch. Inside the band the two errors are equal up to rounding: where they tie exactly
# `torch.max` splits the gradient between them, elsewhere rounding picks one branch. So `.detach()` on one
# branch takes half or all of an in-band token's gradient; the values do not change. Compare gradients,
# not only values.
# </details>
#
# **4.** After ten epochs on one batch with $\epsilon = 0.2$, can a token's ratio be 2?
#
# <details><summary>Answer</summary>
#
# Yes. Past the band the clip zeroes only that token's own gradient; steps on other tokens still move the
# shared parameters, and its ratio with them. Hence PPO also caps the epochs, keeps the learning rate small,
# and can stop early on approx-KL.
# </details>
