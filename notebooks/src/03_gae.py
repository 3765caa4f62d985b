# Source of notebooks/03_gae.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 03 · Rewards and advantages: KL shaping and GAE
#
# {{colab_badge}}
#
# **You will learn**
# - how one reward-model score per answer becomes a reward per token, with a KL penalty towards the
#   reference model (estimators $k_1$, $k_2$, $k_3$);
# - the KL-regularised objective those rewards maximise, and its optimum $\pi^* \propto \pi_{\text{ref}}\, e^{r/\beta}$;
# - TD errors, $\lambda$-returns and GAE, which you write as trlx's reverse loop over a padded batch;
# - what $\lambda$ trades: the critic's bias against the rewards' variance;
# - whitening advantages over the real tokens only.
#
# **Prerequisites:** notebooks 01 (policy gradients, reward-to-go, TD errors, the critic) and 02 (the
# reward model's one score per response); padded (B, T) batches with a mask.
# **Time:** about 155 min for the core, in two sittings (the second from *3. The reverse loop*); the deep dives add about 90 min.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import itertools
import math
import time

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from IPython.display import display

import rlhf_helpers
from rlhf_helpers import widgets
from rlhf_helpers.core.printed import cell_formatter
from rlhf_helpers.course.claims import check_claims

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny tensors: extra threads only add overhead


# %% [markdown]
# ## 1. From one score to a reward per token
#
# A batch holds $B$ responses padded to $T$ tokens; `mask` is 1 on real response tokens and 0 on
# padding. For response token $t$ the policy and the frozen reference model give
# $\log \pi(a_t \mid s_t)$ and $\log \pi_{\text{ref}}(a_t \mid s_t)$. The per-token reward is
#
# $$r_t = -\beta\, \widehat{\mathrm{KL}}_t + [t = t_{\text{last}}]\; \text{score},$$
#
# a penalty for drifting from the reference at every token plus the reward model's score on the last
# real token. The penalty keeps the policy close to a model that still writes fluent text. It **bounds**
# the exploitation of the reward model's blind spots, it does not stop it: the policy moves towards a flaw
# the reward model over-rates as far as the gain in learned score pays for $\beta$ per nat of KL.
#
# ### KL estimators
# With $w = \pi_{\text{ref}}(a_t \mid s_t) / \pi(a_t \mid s_t)$ for a token sampled from $\pi$, three
# single-sample estimators of $\mathrm{KL}(\pi \Vert \pi_{\text{ref}})$ are in use (Schulman, "Approximating KL divergence"):
#
# $$k_1 = -\log w, \qquad k_2 = \tfrac12 (\log w)^2, \qquad k_3 = (w - 1) - \log w .$$
#
# $k_1$ is unbiased but negative whenever the sampled token is *more* likely under the reference, so a
# batch mean can be negative. $k_3$ is unbiased and never negative; $k_2$ is never negative and biased
# (right only to second order in $\log w$). The course shapes rewards with $k_1$.

# %%
def kl_scratch(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from log-probs of tokens sampled from pi: (B, T) -> (B, T)."""
    log_w = ref_logprobs - logprobs  # (B, T): log(pi_ref / pi)
    if kind == "k1":
        return -log_w
    if kind == "k2":
        return 0.5 * log_w**2
    if kind == "k3":
        return torch.expm1(log_w) - log_w  # (w - 1) - log w, accurate for small log_w
    raise ValueError(f"kind must be k1, k2 or k3, got {kind!r}")

# %% [markdown]
# ### Deep dive: the three estimators, measured
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# **What to report.** These estimators exist for when only the sampled token's log-probs are at hand.
# A PPO step has the full logits of the policy and the reference at every position anyway, so the
# exact per-token KL, $\sum_v \pi(v \mid s_t)\,(\log\pi(v \mid s_t) - \log\pi_{\text{ref}}(v \mid s_t))$, costs
# one more reduction; report it, or the $k_1$ sum (unbiased). $k_3$'s low variance holds only near the
# reference: $w = \pi_{\text{ref}}/\pi$ is heavy-tailed once the policy has moved, and a rare token with
# a large $w$ then dominates a batch's $k_3$ mean. The predict questions below measure both regimes;
# notebook 06 shows it on a trained policy. (On the penalty itself: at scale, Gao et al. (2022) found
# that a larger $\beta$ moves the policy along much the same true-score-against-KL curve, as stopping
# earlier would, rather than onto a better one.)
#
# First two nearby distributions over a vocabulary of 50 tokens, with 20 000 tokens sampled from $\pi$:
# one histogram per estimator.

# %%
sample_gen = torch.Generator().manual_seed(0)
vocab = 50
policy_logits = torch.randn(vocab, generator=sample_gen)
ref_logits = policy_logits + 0.3 * torch.randn(vocab, generator=sample_gen)
true_kl = F.kl_div(ref_logits.log_softmax(-1), policy_logits.log_softmax(-1), log_target=True,
                   reduction="sum")  # KL(pi || ref)
tokens = torch.multinomial(policy_logits.softmax(-1), 20_000, replacement=True, generator=sample_gen)  # (N,)
logp = policy_logits.log_softmax(-1)[tokens].unsqueeze(0)  # (1, N)
ref_logp = ref_logits.log_softmax(-1)[tokens].unsqueeze(0)  # (1, N)
print(f"exact KL(pi || ref) = {true_kl:.4f}")
fig = go.Figure()
for kind in ("k1", "k2", "k3"):
    est = kl_scratch(logp, ref_logp, kind)  # (1, N)
    torch.testing.assert_close(est, rlhf_helpers.kl_estimate(logp, ref_logp, kind=kind))
    print(f"{kind}: mean {est.mean():.4f}   std {est.std():.4f}   share of negative tokens {(est < 0).float().mean():.2f}")
    # 4 decimals are plenty for a histogram and keep the saved notebook small (float32 -> 20 digits)
    fig.add_histogram(x=[round(v, 4) for v in est[0].tolist()], name=kind, opacity=0.6, nbinsx=80)
fig.update_layout(barmode="overlay", title="Per-token KL estimates (k1 goes negative; k2, k3 never do)",
                  xaxis_title="estimate", yaxis_title="tokens")
fig.show()
print("kl_scratch matches rlhf_helpers.kl_estimate for k1, k2, k3")

# %% [markdown]
# Move the reference away from the policy and compare the three estimators with the exact KL: their
# means, their spread, and how often $k_1$ comes out negative.
#
# *If an explorer is gone when you come back:* closing a notebook's tab in JupyterLab closes its widgets'
# connection to the kernel, so a notebook reopened while its kernel still runs shows "Error displaying
# widget: model not found" where each explorer was. Run the explorer's cell again. Reloading the browser
# page instead keeps them.

# %%
kl_explorer = widgets.KLExplorer()
kl_explorer

# %% [markdown]
# #### Predict, then drag
#
# **1.** Set *π far from ref* to 0. What does each estimator give, token by token?
#
# <details><summary>Answer</summary>
#
# Exactly 0 for every token and every batch: with $\pi = \pi_{\text{ref}}$ the ratio $w = 1$, and
# $k_1 = -\log 1$, $k_2 = \tfrac12 (\log 1)^2$ and $k_3 = (1 - 1) - \log 1$ all vanish.
# </details>
#
# **2.** Now set it to 0.5 (a policy close to its reference, where a KL penalty keeps PPO). Which estimator's
# batch means spread the most, and which ones can come out negative?
#
# <details><summary>Answer</summary>
#
# $k_1$ spreads the most and is negative for a sizeable share of 16-token batches, although its mean is
# exact. $k_2$ and $k_3$ are never negative, and here, close to the reference, $k_3$ has the tightest
# spread while staying unbiased. GRPO puts it in its loss, but an unbiased *value* is not a correct
# *gradient*: with the samples held fixed, the expected gradient of $k_3$ is that of the forward
# $\mathrm{KL}(\pi_{\text{ref}} \Vert \pi)$, while $k_2$'s is that of $\mathrm{KL}(\pi \Vert \pi_{\text{ref}})$
# (notebook 07 works this out).
# The cell after these questions prints the numbers.
# </details>
#
# **3.** Drag it to 3 (a policy far from its reference). Does $k_2$ stay centred on the exact KL? Is $k_3$
# still the tightest?
#
# <details><summary>Answer</summary>
#
# No and no. $k_2$ agrees with the KL only to second order in $\log w$, so far from the reference it
# overshoots. $k_3$ stays unbiased, but its spread now exceeds $k_1$'s: its low variance is a property
# of nearby policies, and far from the reference a rare token with a large $w$ dominates a batch's
# $k_3$ mean. This is why the KL to the reference that the course reports is the $k_1$ sum over each
# response. (The trainer's `approx_kl` is another quantity: the KL between the policy before and after
# one update, which stays near 0, where $k_3$ is accurate.)
# </details>

# %%
# The answers above, computed with the explorer's own numbers (300 batches of 16 tokens each)
answers, exact = {}, {}
for shift in (0.5, 3.0):
    result = kl_explorer.compute(shift=shift, n_samples=16, seed=0)
    exact[shift] = result["exact"]
    for k, v in result["batch_means"].items():  # estimator -> (300,) batch means
        answers[shift, k] = {"mean of batch means": float(v.mean()), "spread (std)": float(v.std()),
                             "negative batches": float((v < 0).float().mean())}
near = {k: answers[0.5, k] for k in ("k1", "k2", "k3")}
far = {k: answers[3.0, k] for k in ("k1", "k2", "k3")}
table = pd.DataFrame(answers.values(), index=pd.MultiIndex.from_tuples(answers, names=["shift", "estimator"]))
table.insert(0, "exact KL", [exact[shift] for shift, _ in answers])
display(table.style.format({"negative batches": "{:.0%}"}, precision=3).format_index("{:g}", level=0))

# %% tags=["claim-check"]
check_claims({
    "answer 2: near the reference k1 is negative in many batches, k2 and k3 in none":
        near["k1"]["negative batches"] > 0.1 and near["k2"]["negative batches"] == near["k3"]["negative batches"] == 0,
    "answer 2: near the reference k1 spreads the most, k3 the least":
        near["k3"]["spread (std)"] < near["k2"]["spread (std)"] < near["k1"]["spread (std)"],
    "answer 3: far from the reference k2 overshoots the exact KL":
        far["k2"]["mean of batch means"] > 1.2 * exact[3.0],
    "answer 3: far from the reference k3 spreads more than k1": far["k3"]["spread (std)"] > far["k1"]["spread (std)"],
}, any_profile=True)


# %% [markdown]
# ### Shaping the rewards of a padded batch
# Below, three responses of lengths 5, 3 and 6 (right-padded to 6). The score lands on the last real
# token of each row; padding gets no reward.

# %%
def shape_rewards_scratch(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
                          kl_coef: float, kl_kind: str = "k1") -> tuple[torch.Tensor, torch.Tensor]:
    """r_t = -beta * KL_t on real tokens, plus the score on the last real token: (B,), (B, T) -> (B, T)."""
    kl = kl_scratch(logprobs, ref_logprobs, kl_kind) * mask  # (B, T)
    rewards = -kl_coef * kl  # (B, T)
    last = rlhf_helpers.last_token_index(mask)  # (B,): index of the last real token (Exercise 1 writes it)
    rewards[torch.arange(len(scores)), last] += scores
    return rewards, kl


lengths = torch.tensor([5, 3, 6])
B, T = 3, 6
mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # (B, T)
logprobs = -torch.rand(B, T) * 3 * mask  # (B, T)
ref_logprobs = (logprobs - 0.2 * torch.randn(B, T)) * mask  # (B, T)
scores = torch.tensor([1.0, -0.5, 2.0])  # (B,)

rewards, kl = shape_rewards_scratch(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
lib_rewards, lib_kl = rlhf_helpers.shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
torch.testing.assert_close(rewards * mask, lib_rewards * mask)
torch.testing.assert_close(kl * mask, lib_kl * mask)
print("rewards (B, T):\n", rewards)

# %% [markdown]
# ### Exercise 1: where does the score go?
# Write `last_token_index(mask)` returning, for each row of a right-padded (B, T) mask, the index of
# its last real token, shape (B,). Rows of a batch have different lengths.

# %%
# EXERCISE 1
def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of a right-padded (B, T) mask -> (B,) long."""
    raise NotImplementedError


# %%
def check_last_token_index():
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float)  # (3, 4)
    lengths = torch.randint(1, 9, (16,), generator=torch.Generator().manual_seed(4))  # (16,)
    random_mask = (torch.arange(8)[None, :] < lengths[:, None]).float()  # (16, 8), right-padded
    for mask_c in (m, random_mask):
        got = last_token_index(mask_c)
        assert isinstance(got, torch.Tensor) and got.shape == (len(mask_c),), \
            f"return one index per row, shape ({len(mask_c)},); got {getattr(got, 'shape', type(got))}"
        assert got.dtype == torch.long, (
            f"your indices have dtype {got.dtype}; an index must be an integer tensor, torch.long: "
            "rewards[rows, last] with float indices raises IndexError (convert with .long())")
        for row, index in zip(mask_c.tolist(), got.tolist(), strict=True):
            expected = max(t for t in range(len(row)) if row[t] == 1)  # a loop over the row
            assert index == expected, (
                f"for the mask row {[int(x) for x in row]} you return {index}, expected {expected}"
                + ("; that is the first padding position, one past the last real token" if index == expected + 1
                   else "; that is the FIRST real token: the last one is what you need" if index == 0 else ""))


exercise_check("Exercise 1 (last_token_index)", check_last_token_index, hidden=[rlhf_helpers.last_token_index])

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def last_token_index(mask: torch.Tensor) -> torch.Tensor:
#     """Index of the last 1 in each row of a right-padded (B, T) mask -> (B,) long."""
#     return mask.sum(dim=1).long() - 1  # right padding: the count of real tokens, minus one
# ```
# </details>


# %% [markdown]
# ### The objective these rewards maximise
#
# An autoregressive model multiplies its token probabilities, $\log\pi(y \mid x) = \sum_t \log\pi(y_t \mid s_t)$,
# so a response's $k_1$ terms add up to its log-ratio, and their expectation is the KL between the two
# models' distributions over whole responses:
#
# $$\sum_t k_{1,t} = \log\frac{\pi(y \mid x)}{\pi_{\text{ref}}(y \mid x)}, \qquad
# \mathbb E_{y \sim \pi}\Big[\sum_t k_{1,t}\Big] = \mathrm{KL}\big(\pi(\cdot \mid x) \,\Vert\, \pi_{\text{ref}}(\cdot \mid x)\big).$$
#
# With $\gamma = 1$ a response's shaped rewards therefore sum to $r(x, y) - \beta \log\frac{\pi(y \mid x)}{\pi_{\text{ref}}(y \mid x)}$
# ($r$ the score), and PPO on them maximises the **KL-regularised objective**
#
# $$J(\theta) = \mathbb E_{x,\; y \sim \pi_\theta}\big[r(x, y)\big] - \beta\, \mathrm{KL}\big(\pi_\theta(\cdot \mid x) \,\Vert\, \pi_{\text{ref}}(\cdot \mid x)\big).$$
#
# **A reward that depends on $\theta$.** PPO treats $-\beta k_1$ as a fixed reward: no gradient flows through
# it. For $k_1$ that is exact in expectation. With $\ell(y) = \log\pi_\theta(y) - \log\pi_{\text{ref}}(y)$,
#
# $$\nabla_\theta\, \mathbb E_{y \sim \pi_\theta}[\ell] = \sum_y \nabla\pi_\theta(y)\, \ell(y) + \sum_y \pi_\theta(y)\, \nabla\ell(y)
# = \mathbb E\big[\ell\, \nabla\log\pi_\theta\big] + \mathbb E\big[\nabla\log\pi_\theta\big],$$
#
# as $\nabla\ell = \nabla\log\pi_\theta$. The last term is zero, the key step: $\mathbb E[\nabla\log\pi_\theta] = \sum_y \nabla\pi_\theta(y) = \nabla \sum_y \pi_\theta(y) = \nabla 1 = 0$
# (the score-function identity; per token, given $s_t$, likewise). So $\nabla J = \mathbb E[(r - \beta\ell)\, \nabla\log\pi_\theta]$:
# the policy gradient of notebook 01 with the shaped reward held fixed.
#
# **Its optimum.** With $\pi^*(y \mid x) = \pi_{\text{ref}}(y \mid x)\, e^{r(x, y)/\beta} / Z(x)$ and
# $Z(x) = \sum_y \pi_{\text{ref}}(y \mid x)\, e^{r(x, y)/\beta}$, for each prompt
#
# $$J = \sum_y \pi(y)\Big(r(y) - \beta \log\frac{\pi(y)}{\pi_{\text{ref}}(y)}\Big) = \beta \log Z - \beta\, \mathrm{KL}(\pi \,\Vert\, \pi^*),$$
#
# largest, $\beta\log Z$, exactly at $\pi = \pi^*$ (Gibbs' variational principle): the reference tilted towards
# high reward, at a finite KL that a smaller $\beta$ makes larger. With a uniform $\pi_{\text{ref}}$ the penalty
# is the negative entropy up to a constant and $\pi^* = \operatorname{softmax}(r/\beta)$: the soft-optimal
# policy of maximum-entropy RL. Solved for the reward, $r = \beta\log(\pi^*/\pi_{\text{ref}}) + \beta\log Z$:
# notebook 07 derives DPO from that line.
#
# The cells check all three on toys: a model of two words and EOS that writes at most 3 tokens (15 possible
# responses, cut ones included), and 6 responses with rewards, where gradient ascent on $J$ meets $\pi^*$.

# %%
toy_gen = torch.Generator().manual_seed(3)
EOS_TOY, MAX_TOY = 2, 3  # tokens 0, 1 and EOS; responses of at most 3 tokens
toy_logits = torch.randn(2, MAX_TOY, 4, 3, generator=toy_gen, dtype=torch.float64)  # (pi / ref, t, y_{t-1} or start, y_t)
toy_logits[1] += toy_logits[0]  # the reference: the policy's logits plus noise
toy_responses = [y for n in range(1, MAX_TOY + 1) for y in itertools.product(range(3), repeat=n)
                 if EOS_TOY not in y[:-1] and (y[-1] == EOS_TOY or n == MAX_TOY)]  # EOS, or cut at 3 tokens
seq_logp, k1_sums, exact_sums = [], [], []  # per response
for y in toy_responses:
    logp_all = toy_logits[:, range(len(y)), (3,) + y[:-1]].log_softmax(-1)  # (2, n, 3): each state's next token
    logp_y = logp_all[:, range(len(y)), y]  # (2, n): log pi(y_t | s_t) and log pi_ref(y_t | s_t)
    seq_logp.append(logp_y.sum(1))  # (2,): log pi(y), log pi_ref(y)
    k1_sums.append((logp_y[0] - logp_y[1]).sum())
    exact_sums.append((logp_all[0].exp() * (logp_all[0] - logp_all[1])).sum())  # exact per-token KLs, summed
p_seq, p_ref_seq = torch.stack(seq_logp).exp().T  # (15,) each: two distributions over the responses
torch.testing.assert_close(p_seq.sum(), torch.tensor(1.0, dtype=torch.float64))  # nothing missing
seq_kl = float((p_seq * (p_seq / p_ref_seq).log()).sum())  # KL of the two distributions over responses
torch.testing.assert_close(float((p_seq * torch.stack(k1_sums)).sum()), seq_kl)  # E[sum of k1]
torch.testing.assert_close(float((p_seq * torch.stack(exact_sums)).sum()), seq_kl)  # E[sum of exact KL_t]
print(f"{len(toy_responses)} responses: sequence KL {seq_kl:.6f} = E[sum of k1] = E[sum of exact per-token KL]")

# %%
cat_gen = torch.Generator().manual_seed(4)
beta_toy, rewards_toy = 1.0, 2 * torch.rand(6, generator=cat_gen, dtype=torch.float64)  # (6,)
log_ref = (0.5 * torch.randn(6, generator=cat_gen, dtype=torch.float64)).log_softmax(-1)  # (6,)


def objective(theta: torch.Tensor) -> torch.Tensor:
    """J = sum_y pi(y) (r(y) - beta log(pi(y) / pi_ref(y))) with pi = softmax(theta): exact, no sampling."""
    logp = theta.log_softmax(-1)  # (6,)
    return (logp.exp() * (rewards_toy - beta_toy * (logp - log_ref))).sum()


theta = torch.randn(6, dtype=torch.float64, generator=cat_gen, requires_grad=True)  # (6,)
(grad_exact,) = torch.autograd.grad(objective(theta), theta)
probs, jacobian = theta.softmax(-1).detach(), torch.autograd.functional.jacobian(lambda th: th.log_softmax(-1), theta)
held_fixed = (rewards_toy - beta_toy * (probs.log() - log_ref)) * probs  # (6,): shaped reward x pi, no gradient
torch.testing.assert_close(held_fixed @ jacobian, grad_exact)  # E[(r - beta l) grad log pi] = grad J
print(f"|E[grad log pi]| = {float((probs @ jacobian).norm()):.1e}: the term the fixed reward drops")
ascent = torch.optim.SGD([theta], lr=4.0)
for _ in range(1000):  # gradient ascent on J
    ascent.zero_grad()
    (-objective(theta)).backward()
    ascent.step()
pi_star = (log_ref + rewards_toy / beta_toy).softmax(-1)  # (6,): pi_ref exp(r / beta) / Z
gap = float(beta_toy * torch.logsumexp(log_ref + rewards_toy / beta_toy, -1) - objective(theta.detach()))  # beta log Z - J
largest_error = float((theta.detach().softmax(-1) - pi_star).abs().max())  # max over y of |pi(y) - pi*(y)|
print(f"beta log Z - J = {gap:.1e};  max |pi - pi*| = {largest_error:.1e}")

# %% [markdown]
# In the first cell three numbers agree: the KL between the distributions over responses, the expected $k_1$
# sum, and the expected sum of the *exact* per-token KLs (the chain rule of KL), which the estimators' deep
# dive recommends reporting. In the second, gradient ascent ends within $10^{-10}$ of the bound $\beta\log Z$.
# Since $\beta\log Z - J = \beta\,\mathrm{KL}(\pi \Vert \pi^*)$ and Pinsker's inequality gives
# $|\pi(y) - \pi^*(y)| \le \sqrt{\mathrm{KL}/2}$, every probability must then lie within
# $\sqrt{10^{-10}/(2\beta)} \approx 7 \times 10^{-6}$ of $\pi^*$; it does.

# %% tags=["claim-check"]
check_claims({
    "gradient ascent ends within 1e-10 of beta log Z": abs(gap) < 1e-10,
    "every probability lies within sqrt(1e-10 / (2 beta)) of pi* (Pinsker's bound for that gap)":
        largest_error < math.sqrt(1e-10 / (2 * beta_toy)),
}, any_profile=True)


# %% [markdown]
# ## 2. TD errors, n-step returns, $\lambda$-returns
#
# With a critic $V(s_t)$ (the value head, notebook 05) and $V = 0$ after the last real token:
#
# $$\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t) \qquad \text{(TD error)}$$
#
# $$G_t^{(n)} = \sum_{l=0}^{n-1} \gamma^l r_{t+l} + \gamma^n V(s_{t+n}) \qquad \text{(n-step return)}$$
#
# $$G_t^{\lambda} = (1-\lambda) \sum_{n \ge 1} \lambda^{n-1} G_t^{(n)} \qquad \text{($\lambda$-return; past the end every } G_t^{(n)} \text{ equals the full return)}$$
#
# GAE (Schulman et al. 2016, eq. 16) is the same thing written with TD errors:
#
# $$\hat A_t = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{t+l} = G_t^\lambda - V(s_t), \qquad \text{returns}_t = \hat A_t + V(s_t).$$
#
# $\lambda = 0$ gives $\hat A_t = \delta_t$ (one-step TD: low variance, biased by the critic);
# $\lambda = 1$ gives the (discounted) Monte-Carlo return minus $V$ (unbiased, high variance).
#
# **Where a response ends.** A response ends at EOS or is cut at `max_new_tokens`, and in both cases $V = 0$
# after its last real token: the return stops there and GAE does not bootstrap. After an EOS that is simply
# true. After a cut it treats the length limit as termination, part of the task rather than an interruption:
# the reward model scores the cut text as it stands (its head reads the last real token, EOS or not), no
# reward ever follows, and the policy's state $s_t = (x, y_{<t})$ holds how many tokens it has written. The
# alternative, bootstrapping with $V(s_T)$ (adding $\gamma V$ of the state after the cut to the last TD
# error), suits an episode that would go on earning reward, such as a simulator's time limit; here it would
# add reward that no response receives. A cut answer is usually an unfinished one, which the reward model
# may still like. `missing_eos_penalty` (a `PPOConfig` field, off in the course's profiles) adds a fixed
# amount to the score of every response cut without EOS; a negative one makes finishing pay. (TRL has a
# field of the same name with the opposite sign: it subtracts a positive value.) Use
# it when responses run to the limit (`eos_fraction` falls; the run doctor reports `length_runaway`) and
# the reward model does not mark unfinished answers down itself.

# %%
def td_scratch(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """delta_t = r_t + gamma V(s_t+1) - V(s_t) on real tokens, V = 0 past the end: (B, T) -> (B, T)."""
    next_values = F.pad(values[:, 1:] * mask[:, 1:], (0, 1))  # (B, T): V(s_{t+1}), 0 past the end
    return (rewards + gamma * next_values - values) * mask  # (B, T)


values = torch.randn(B, T) * mask  # (B, T): critic values on real tokens
gamma, lam = 0.99, 0.9
torch.testing.assert_close(td_scratch(rewards, values, mask, gamma),
                           rlhf_helpers.td_errors(rewards, values, mask, gamma))
print("td_scratch matches rlhf_helpers.td_errors")

# %% [markdown]
# ## 3. The reverse loop
#
# The recursion $\hat A_t = \delta_t + \gamma\lambda \hat A_{t+1}$ (with $\hat A = 0$ past the end) is how
# trlx and most PPO code compute GAE: one backwards loop over $t$, for the whole batch at once.
#
# ### Exercise 2: GAE on a padded batch
# Write `gae_loop(rewards, values, mask, gamma, lam)`, that loop, for a right-padded (B, T) batch whose
# rows have different lengths. Return `(advantages, returns)`, both (B, T), with
# $\text{returns} = \hat A + V$ and both 0 at padding. After a row's last real token $V = 0$: never
# bootstrap from the padding, which may hold anything (the check puts large values there). The library's
# GAE functions are hidden while the check runs.

# %%
# EXERCISE 2
def gae_loop(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
             lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A_t = delta_t + gamma lam A_{t+1} over the real tokens of each row: (B, T) x3 -> (B, T), (B, T)."""
    raise NotImplementedError


# %%
def check_gae_loop():
    g = torch.Generator().manual_seed(7)
    lengths = [5, 1, 8, 3]
    mask_c = (torch.arange(8)[None, :] < torch.tensor(lengths)[:, None]).double()  # (4, 8), right-padded
    r, v = torch.randn(2, 4, 8, generator=g, dtype=torch.float64) + 50 * (1 - mask_c)  # (4, 8) each: garbage at padding
    for gamma_c, lam_c in [(0.99, 0.95), (1.0, 0.0), (1.0, 1.0), (0.9, 0.5)]:
        expected = torch.zeros(4, 8, dtype=torch.float64)  # one row at a time, its real tokens only
        for i, n in enumerate(lengths):
            delta = [r[i, t] + gamma_c * (v[i, t + 1] if t + 1 < n else 0.0) - v[i, t] for t in range(n)]
            for t in range(n):
                expected[i, t] = sum((gamma_c * lam_c) ** k * delta[t + k] for k in range(n - t))
        advantages_c, returns_c = gae_loop(r, v, mask_c, gamma_c, lam_c)
        assert advantages_c.shape == returns_c.shape == (4, 8), "both outputs are (B, T)"
        for name, got, want in (("advantages", advantages_c, expected), ("returns", returns_c, (expected + v) * mask_c)):
            wrong = ~torch.isclose(got.double(), want, rtol=1e-6, atol=1e-8)  # (4, 8)
            if not wrong.any():
                continue
            i = int(wrong.any(1).nonzero()[0])  # the first row that differs
            t = int(wrong[i].nonzero()[-1])  # its last differing position: the reverse loop goes wrong there first
            n, diff = lengths[i], float(got[i, t] - want[i, t])
            where = f"match for t > {t} and differ at t = {t}"
            if t >= n:
                where = f"are not 0 at the padding position t = {t}"
                hint = "padding must hold 0 and must not feed the row's last real token: multiply by the mask"
            elif t == n - 1 < 7 and abs(diff - gamma_c * float(v[i, t + 1])) < 1e-6:
                hint = "the last real token must bootstrap from V = 0, not from the value stored at the padding"
            elif name == "returns" and all(abs(got[i, u] - sum(gamma_c**k * r[i, u + k] for k in range(n - u))) < 1e-6
                                           for u in range(n)):  # the row's Monte-Carlo reward-to-go
                hint = ("your returns are the Monte-Carlo reward-to-go; GAE's are A_t + V(s_t), the lambda-return (the "
                        "critic's target), which equals the reward-to-go only at lambda = 1")
            else:
                hint = ("check delta_t = r_t + gamma V(s_t+1) - V(s_t) and A_t = delta_t + gamma lambda A_t+1, "
                        "computed from t = T-1 down to 0")
            raise AssertionError(
                f"gamma={gamma_c}, lambda={lam_c}, row {i} ({n} real tokens of 8): your {name} {where}: "
                f"got {float(got[i, t]):.4f}, expected {float(want[i, t]):.4f}. Hint: {hint}")


exercise_check("Exercise 2 (gae_loop)", check_gae_loop,
               hidden=[rlhf_helpers.compute_gae, rlhf_helpers.gae_reference, rlhf_helpers.td_errors, td_scratch])


# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def gae_loop(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
#              lam: float) -> tuple[torch.Tensor, torch.Tensor]:
#     """A_t = delta_t + gamma lam A_{t+1} over the real tokens of each row: (B, T) x3 -> (B, T), (B, T)."""
#     advantages = torch.zeros_like(rewards)  # (B, T)
#     running = torch.zeros_like(rewards[:, 0])  # (B,): A_{t+1}, 0 past the end
#     next_value = torch.zeros_like(rewards[:, 0])  # (B,): V(s_{t+1}), 0 past the end
#     for t in reversed(range(rewards.shape[1])):
#         delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
#         running = (delta + gamma * lam * running) * mask[:, t]  # 0 on padding: the last real token starts fresh
#         advantages[:, t] = running
#         next_value = values[:, t] * mask[:, t]  # padding's value never reaches a real token
#     return advantages, (advantages + values) * mask
# ```
# Multiplying by the mask inside the loop is what handles the ends: on padding both `running` and
# `next_value` are 0, so a row's last real token sees $\hat A_{t+1} = 0$ and $V(s_{t+1}) = 0$.
# </details>

# %% [markdown]
# ### Deep dive: the $\lambda$-return from n-step returns, and GAE as a matrix product
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Two other ways to the same advantages. First the $\lambda$-return of section 2, built literally as a
# weighted sum of n-step returns, against `compute_gae`'s returns on the shaped rewards of section 1.

# %%
def n_step_return(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                  n: int) -> torch.Tensor:
    """G_t^(n) on every real token: (B, T) -> (B, T)."""
    B, T = rewards.shape
    out = torch.zeros(B, T)
    for t in range(T):
        for k in range(n):
            if t + k < T:
                out[:, t] += gamma**k * rewards[:, t + k] * mask[:, t + k]
        if t + n < T:
            out[:, t] += gamma**n * values[:, t + n] * mask[:, t + n]
    return out * mask


def lambda_return(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                  lam: float) -> torch.Tensor:
    """(1 - lam) sum_n lam^(n-1) G^(n); from n = T on, every G^(n) is the full return."""
    T = rewards.shape[1]
    total = sum((1 - lam) * lam ** (n - 1) * n_step_return(rewards, values, mask, gamma, n)
                for n in range(1, T))
    return total + lam ** (T - 1) * n_step_return(rewards, values, mask, gamma, T)  # tail weight


_, returns = rlhf_helpers.compute_gae(rewards, values, mask, gamma, lam)
torch.testing.assert_close(returns * mask, lambda_return(rewards, values, mask, gamma, lam))
print("returns == the lambda-return built from n-step returns")

# %% [markdown]
# `rlhf_helpers.gae_reference` is your loop one sample at a time (the library's reference). A third way,
# from scratch here: the sum $\sum_l (\gamma\lambda)^l \delta_{t+l}$ is a matrix product with an upper
# triangular discount matrix $D_{t,u} = (\gamma\lambda)^{u-t}$ for $u \ge t$. The three agree on a batch
# of 16 responses of 1 to 24 tokens.

# %%
def gae_matrix_scratch(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                       lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A = delta @ D^T with D[t, u] = (gamma * lam)^(u - t) for u >= t."""
    T = rewards.shape[1]
    steps = torch.arange(T)
    offsets = (steps[None, :] - steps[:, None]).clamp(min=0)  # (T, T): u - t
    discount = torch.triu((gamma * lam) ** offsets.double()).to(rewards.dtype)  # (T, T)
    deltas = td_scratch(rewards, values, mask, gamma)  # (B, T)
    advantages = (deltas @ discount.T) * mask  # (B, T)
    return advantages, (advantages + values) * mask


gen = torch.Generator().manual_seed(1)
B_big, T_big = 16, 24
lengths_big = torch.randint(1, T_big + 1, (B_big,), generator=gen)
mask_big = (torch.arange(T_big)[None, :] < lengths_big[:, None]).float()  # (B, T)
rewards_big = torch.randn(B_big, T_big, generator=gen) * mask_big
values_big = torch.randn(B_big, T_big, generator=gen) * mask_big
for g, lam_g in [(1.0, 0.95), (0.99, 0.0), (0.9, 1.0)]:
    ref_a, ref_r = rlhf_helpers.gae_reference(rewards_big, values_big, mask_big, g, lam_g)
    for fn in (rlhf_helpers.compute_gae, gae_matrix_scratch):
        a, r = fn(rewards_big, values_big, mask_big, g, lam_g)
        torch.testing.assert_close(a * mask_big, ref_a * mask_big)
        torch.testing.assert_close(r * mask_big, ref_r * mask_big)
print("gae_reference == compute_gae == matrix from scratch (3 settings of gamma, lambda)")

# %%
# How much the vectorised forms save on a PPO-sized batch (one run; timings on a shared CPU are noisy).
rewards_t, values_t = torch.randn(64, 256), torch.randn(64, 256)
mask_t = torch.ones(64, 256)
for name, fn in [("gae_reference (per-sample loop)", rlhf_helpers.gae_reference),
                 ("compute_gae", rlhf_helpers.compute_gae),
                 ("matrix from scratch", gae_matrix_scratch)]:
    repeats = 1 if fn is rlhf_helpers.gae_reference else 5  # the per-sample loop is slow
    start = time.perf_counter()
    for _ in range(repeats):
        fn(rewards_t, values_t, mask_t, 1.0, 0.95)
    print(f"{name:<34} {(time.perf_counter() - start) / repeats * 1e3:8.2f} ms per call")


# %% [markdown]
# ## 4. Choosing $\lambda$
#
# At $\lambda = 0$ the target trusts the critic entirely: its errors enter as bias, and one noisy reward
# enters the variance. At $\lambda = 1$ the critic's later guesses cancel out (the Monte-Carlo return,
# unbiased), but the noise of every later reward adds up. In between, the final score reaches a token
# $l$ steps before the end with weight $(\gamma\lambda)^{l}$, the rest only through the critic's guesses.
#
# PPO for language models usually takes $\gamma = 1$ and $\lambda = 0.95$ (or 1): early in training the
# value head guesses badly, and a large $\lambda$ lets the real score reach every token; large batches
# keep the variance in check. The deep dives below let you drag $\lambda$ and $\gamma$, and measure bias and
# variance on a chain whose true values are known.

# %% [markdown]
# ### Deep dive: drag $\lambda$ and $\gamma$
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Drag $\lambda$ and $\gamma$ (on the course website: $\lambda$ and $\beta$, with $\gamma = 1$ as the title says) and
# watch where the final score's credit flows along the sequence.

# %%
advantage_explorer = widgets.GAEExplorer()
advantage_explorer

# %% [markdown]
# #### Predict, then drag
#
# **1.** Set $\lambda = 0$. Which tokens' advantages contain the final score directly?
#
# <details><summary>Answer</summary>
#
# Only the last token's. With $\lambda = 0$ the advantage is the TD error $\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)$:
# earlier tokens see the score only through the critic's guess $V(s_{t+1})$.
# </details>
#
# **2.** Set $\lambda = 1$ and $\gamma = 1$. What is the advantage of token $t$ now?
#
# <details><summary>Answer</summary>
#
# The Monte-Carlo advantage: every reward from $t$ to the end (KL penalties and the score) minus
# $V(s_t)$. The critic's other guesses cancel out of the telescoping sum.
# </details>
#
# **3.** Set the KL coefficient $\beta$ to 0. What do the per-token rewards before the last token become?
#
# <details><summary>Answer</summary>
#
# All zero: without the penalty the only reward is the score on the last real token. With
# $\lambda = \gamma = 1$ every earlier token's advantage is then score $- V(s_t)$, so they differ only by the
# critic's values; with $\gamma\lambda < 1$ the score also reaches token $t$ with the weight
# $(\gamma\lambda)^{T-1-t}$.
# </details>

# %% [markdown]
# ### Deep dive: bias against variance, measured on a chain
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# A chain of $T = 20$ steps with a noisy reward $r_t = \mu_t + \varepsilon_t$,
# $\varepsilon_t \sim \mathcal N(0, 1)$, has the true value $V(s_t) = \sum_{u \ge t} \mu_u$ ($\gamma = 1$).
# The critic is imperfect: $\hat V(s_t) = V(s_t) + e_t$ with a fixed error $e_t \sim \mathcal N(0, 1)$.
# `returns` $= \hat A_t + \hat V(s_t)$ is GAE's estimate of $Q(s_t, a_t)$ (here $= V(s_t)$, a chain has
# one action) and is the critic's training target. Over 4 000 episodes, for each $\lambda$:
# - bias$^2$: mean over $t$ of $(\mathbb E[\text{returns}_t] - V(s_t))^2$, caused by the critic's error;
# - variance: mean over $t$ of $\operatorname{Var}[\text{returns}_t]$, caused by the reward noise.

# %%
T_chain, n_episodes = 20, 4000
chain_gen = torch.Generator().manual_seed(2)
mu = torch.rand(T_chain, generator=chain_gen) - 0.5  # (T,)
true_v = mu.flip(0).cumsum(0).flip(0)  # (T,): V(s_t) = sum_{u >= t} mu_u
critic = true_v + torch.randn(T_chain, generator=chain_gen)  # (T,): imperfect critic
chain_rewards = mu + torch.randn(n_episodes, T_chain, generator=chain_gen)  # (N, T)
chain_values = critic.expand(n_episodes, -1)  # (N, T)
chain_mask = torch.ones(n_episodes, T_chain)

lams = [0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0]
bias2, variance = [], []
for lam_i in lams:  # 8 settings, well under a second: no progress bar
    _, ret = rlhf_helpers.compute_gae(chain_rewards, chain_values, chain_mask, 1.0, lam_i)  # (N, T)
    bias2.append(((ret.mean(0) - true_v) ** 2).mean().item())
    variance.append(ret.var(0).mean().item())
mse = [b + v for b, v in zip(bias2, variance, strict=True)]
best_lam = lams[min(range(len(lams)), key=mse.__getitem__)]

# %%
fig = go.Figure()
for name, ys in [("bias²", bias2), ("variance", variance), ("bias² + variance", mse)]:
    fig.add_scatter(x=lams, y=ys, name=name, mode="lines+markers")
fig.update_layout(title="GAE returns as estimates of the true value, against lambda",
                  xaxis_title="lambda", yaxis_title="mean over t")
fig.show()
display(pd.DataFrame({"lambda": lams, "bias²": bias2, "variance": variance, "bias² + variance": mse})
        .style.hide(axis="index").format(precision=3).format({"lambda": "{:.2f}"}))
print(f"lowest total error on this chain at lambda = {best_lam}")

# %% [markdown]
# At $\lambda = 0$ the target leans entirely on the critic, so the critic's error enters it entirely
# as bias; the variance there, about 1, is that of the one noisy reward that enters. At $\lambda = 1$
# the critic cancels out of the target (it is the Monte-Carlo return, unbiased: bias$^2$ below 0.01)
# but the noise of every later reward adds up, to a variance of about 10.5 (the mean over $t$ of the
# $20 - t$ rewards left). Along the table bias$^2$ falls and the variance rises at every step of
# $\lambda$. The best total error lies in between, at a small $\lambda$ (0.2 to 0.4 on this chain): more
# than 0.1 below $\lambda = 0$'s, and about a sixth of $\lambda = 1$'s.

# %% tags=["claim-check"]
check_claims({
    "at lambda 0 the variance is about 1 (one noisy reward)": abs(variance[0] - 1.0) < 0.1,
    "at lambda 1 bias² is below 0.01 and the variance about 10.5": bias2[-1] < 0.01 and abs(variance[-1] - 10.5) < 0.5,
    "bias² falls and the variance rises at every step of lambda":
        all(bias2[i] > bias2[i + 1] and variance[i] < variance[i + 1] for i in range(len(lams) - 1)),
    "the lowest total error is at lambda 0.2 to 0.4": best_lam in (0.2, 0.4),
    "more than 0.1 below lambda 0's total error": mse[0] - min(mse) > 0.1,
    "about a sixth of lambda 1's total error": 5 < mse[-1] / min(mse) < 8,
}, any_profile=True)

# %% [markdown]
# This chain is not a model of an LLM's noise: there, the variance of an early token's return comes from
# sampling all the later tokens, which decide the final score, not from independent noise added at
# each step. What the chain does show is the price of a small $\lambda$, as section 4 says: the target
# then trusts the critic, whose error here has a standard deviation of 1 at every step.

# %% [markdown]
# ## 5. Whitening advantages, with masks
#
# PPO normalises advantages per batch so the step size does not depend on the reward scale:
#
# $$\tilde A_t = m_t\,\frac{\hat A_t - \mu}{\sqrt{\sigma^2 + \epsilon}}, \qquad
# \mu = \frac{\sum_t m_t \hat A_t}{\sum_t m_t}, \qquad \sigma^2 = \frac{\sum_t m_t (\hat A_t - \mu)^2}{\sum_t m_t - 1},
# \qquad \epsilon = 10^{-8},$$
#
# where $m_t$ is the mask and the sums run over the whole batch: one mean and one variance over all
# its real tokens.
#
# ### Exercise 3: whiten over the real tokens
# Write `masked_whiten_scratch(x, mask, eps=1e-8)`, the equation above, for a (B, T) batch whose rows
# have different lengths and whose padding may hold anything, even NaN or inf. Match it exactly, as the
# library and TRL's `masked_whiten` do: variance divided by $n - 1$, $\epsilon$ inside the square root. The
# check loops over the real tokens, also on advantages that barely differ (where $\epsilon$ matters), with
# another `eps`, and with NaN and inf in the padding; the library's masked reductions are hidden while it runs.

# %%
# EXERCISE 3
def masked_whiten_scratch(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with the mean and unbiased var over the real tokens; 0 at padding: (B, T)."""
    raise NotImplementedError


# %%
def check_whiten_hint(dev: list[float], mine: list[float], var: float, eps_used: float, padded: list[float]) -> str:
    """The check's guess at the cause, from the divisor a learner's output implies if it is centred right
    (`padded`: the variance with the padding's deviations left in)."""
    n = len(dev)
    if abs(sum(mine) / n) > 1e-6:
        return "your output's mean over the real tokens is not 0: subtract their mean, (sum over them) / mask.sum()"
    divisor = sum(d * d for d in dev) / sum(d * o for d, o in zip(dev, mine, strict=True))
    slips = [("your variance divides by n; the equation's (unbiased, as torch.var) divides by n - 1",
              math.sqrt(var * (n - 1) / n + eps_used)),
             ("you add eps to the standard deviation, sqrt(var) + eps (as CleanRL does); the equation puts it "
              "inside the square root, sqrt(var + eps)", math.sqrt(var) + eps_used),
             (f"the eps passed ({eps_used:g}) is not in your divisor, sqrt(var) (give or take 1e-8)", math.sqrt(var))]
    slips += [("the padding's values entered your variance: mask the deviations before squaring", math.sqrt(v + eps_used))
              for v in padded]
    return next((text for text, d in slips if abs(divisor - d) <= 1e-6 * d), "")


# %%
def check_masked_whiten():
    g = torch.Generator().manual_seed(5)
    lengths = [6, 2, 4, 1]  # 13 real tokens of 24; the last row holds one
    m = (torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]).double()  # (4, 6), right-padded
    noise = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)  # (3, 4, 6)
    nan_inf = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64).repeat(8).view(4, 6)  # (4, 6)
    cases = [("advantages of spread about 2", 1 + 2 * noise[0], None, 50.0),  # (what, real values, eps, padding)
             ("advantages that barely differ (spread 1e-4, so var is near the default eps)", 3 + 1e-4 * noise[1], None,
              50.0), ("eps=0.5", noise[2], 0.5, 50.0), ("NaN and inf at the padding", 1 + 2 * noise[0], None, nan_inf)]
    for what, x_real, eps_c, padding in cases:  # eps None: the default
        x = torch.where(m.bool(), x_real, padding)  # (4, 6); x_real * m + padding * (1 - m) would be NaN everywhere
        got = masked_whiten_scratch(x, m) if eps_c is None else masked_whiten_scratch(x, m, eps=eps_c)
        assert isinstance(got, torch.Tensor) and got.shape == x.shape, f"return a tensor of x's shape, {tuple(x.shape)}"
        assert bool(torch.isfinite(got).all()) or bool(torch.isfinite(x).all()), (
            f"{what}: your output holds NaN or inf, from the padding's: NaN x 0 is NaN (and inf x 0 too), so "
            "multiplying by the mask does not remove them. Select instead: torch.where(mask.bool(), x, 0.0) (or "
            "x.masked_fill(mask == 0, 0.0)) before any sum")
        assert bool((got[m == 0] == 0).all()), f"{what}: the padding must hold 0 (multiply the result by the mask)"
        cells = [(i, t) for i, n_i in enumerate(lengths) for t in range(n_i)]  # a loop over the real tokens
        real, mine = [float(x[c]) for c in cells], [float(got[c]) for c in cells]
        n, eps_used, mean = len(real), 1e-8 if eps_c is None else eps_c, sum(real) / len(real)
        dev = [a - mean for a in real]  # deviations from the mean over the real tokens
        var = sum(d * d for d in dev) / (n - 1)
        expected = [d / math.sqrt(var + eps_used) for d in dev]
        wrong = [k for k in range(n) if abs(mine[k] - expected[k]) > 1e-6 * max(map(abs, expected))]
        if not wrong:
            continue
        padded = [var + (24 - n) * (pad - mean) ** 2 / (n - 1) for pad in (50.0, 0.0)]  # padding as given, or 0
        hint = check_whiten_hint(dev, mine, var, eps_used, padded)
        raise AssertionError(f"{what}: at (row, t) = {cells[wrong[0]]} you return {mine[wrong[0]]:.6g}, expected "
                             f"{expected[wrong[0]]:.6g} (a loop over the real tokens). {hint}")


exercise_check("Exercise 3 (masked_whiten_scratch)", check_masked_whiten,
               hidden=[rlhf_helpers.masked_whiten, rlhf_helpers.masked_mean, rlhf_helpers.masked_var,
                       rlhf_helpers.masked_sum])

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def masked_whiten_scratch(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
#     """(x - mean) / sqrt(var + eps) with the mean and unbiased var over the real tokens; 0 at padding: (B, T)."""
#     x = torch.where(mask.bool(), x, 0.0)  # (B, T): the padding may hold NaN, and NaN * 0 is NaN: select, not multiply
#     n = mask.sum()  # real tokens in the whole batch
#     mean = (x * mask).sum() / n
#     var = (((x - mean) * mask) ** 2).sum() / (n - 1)  # unbiased; the padding's deviations masked out
#     return (x - mean) / torch.sqrt(var + eps) * mask  # (B, T): 0 at padding
# ```
# Every sum runs over the whole batch, so a token weighs the same whatever the length of its row; the
# final `* mask` puts the padding back to 0, since `x - mean` is not 0 there. The first line is what keeps a
# NaN or inf in the padding out: multiplied by the mask it would stay NaN and spread through every sum.
# `x[mask.bool()]` with `.mean()` and `.var()` gives the same statistics (`torch.var` divides by $n - 1$
# by default).
# </details>

# %% [markdown]
# ### Deep dive: what the padding does to $\sigma$
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Including the padding positions pulls $\mu$ towards 0, and the padded zeros become non-zero
# "advantages" after the shift. What they do to $\sigma$ depends on the batch: each zero adds a squared
# deviation $(0 - \mu_{\text{all}})^2$, so when the real advantages sit far from 0 compared with their
# spread, the zeros **inflate** $\sigma$; when they are centred near 0, the zeros add almost nothing but
# still count in $n$, and **shrink** it. The cells compare the library's masked whitening with an
# unmasked one on GAE advantages ($\gamma = 1$, $\lambda = 0.95$) of 16 random responses of 1 to 24
# tokens, and measure both cases.

# %%
gen = torch.Generator().manual_seed(1)
B_big, T_big = 16, 24
lengths_big = torch.randint(1, T_big + 1, (B_big,), generator=gen)
mask_big = (torch.arange(T_big)[None, :] < lengths_big[:, None]).float()  # (B, T)
rewards_big = torch.randn(B_big, T_big, generator=gen) * mask_big
values_big = torch.randn(B_big, T_big, generator=gen) * mask_big
adv_big, _ = rlhf_helpers.compute_gae(rewards_big, values_big, mask_big, 1.0, 0.95)  # (B, T)
white = rlhf_helpers.masked_whiten(adv_big, mask_big)  # (B, T): what Exercise 3 computes
naive = (adv_big - adv_big.mean()) / adv_big.std()  # ignores the mask: wrong
real = mask_big.bool()  # (B, T)
display(pd.DataFrame(
    [{"whitening": name, "mean over real tokens": float(w[real].mean()), "std over real tokens": float(w[real].std()),
      "max |value at padding|": float(w[~real].abs().max())} for name, w in (("masked", white), ("unmasked", naive))]
).style.hide(axis="index").format(cell_formatter(".3f")))

# %%
# sigma over the real tokens against sigma over every position (padding zeros included): for this batch,
# and for the same advantages moved 3 of their own sigmas away from 0
sigma_of_real = adv_big[real].std().item()
sigmas = {}
for label, moved in (("this batch", adv_big * mask_big), ("moved by +3 sigma", (adv_big + 3 * sigma_of_real) * mask_big)):
    sigmas[label] = {"mean over real tokens": moved[real].mean().item(), "sigma over real tokens": moved[real].std().item(),
                     "sigma with the padding zeros": moved.std().item()}
display(pd.DataFrame(sigmas).T.style.format(cell_formatter(".3f")))

# %% [markdown]
# For this batch, whose real advantages are centred near 0 compared with their spread, the zeros
# **shrink** $\sigma$ (from about 2.8 to about 1.9); moved 3 of their own $\sigma$ away from 0, the same
# advantages have their $\sigma$ **inflated** by the zeros (to about 4.8). Either way the unmasked
# statistics are wrong, and the unmasked whitening above leaves its real tokens with a standard deviation
# far from 1 and puts non-zero values on the padding.

# %% tags=["claim-check"]
check_claims({
    "this batch: the zeros shrink sigma from about 2.8 to about 1.9":
        abs(sigmas["this batch"]["sigma over real tokens"] - 2.8) < 0.1
        and abs(sigmas["this batch"]["sigma with the padding zeros"] - 1.9) < 0.1,
    "moved by 3 sigma: the zeros inflate sigma to about 4.8":
        abs(sigmas["moved by +3 sigma"]["sigma with the padding zeros"] - 4.8) < 0.1,
    "unmasked whitening: std over real tokens far from 1, padding non-zero":
        abs(float(naive[real].std()) - 1) > 0.3 and float(naive[~real].abs().max()) > 0.01,
}, any_profile=True)


# %% [markdown]
# ## Summary
# - Per-token reward: $-\beta \widehat{\mathrm{KL}}_t$ everywhere plus the score on the last real token;
#   $k_1$ can go negative, $k_3$ cannot, both are unbiased.
# - The $k_1$ sum is the sequence log-ratio: PPO on these rewards maximises $\mathbb E[r] - \beta\,\mathrm{KL}(\pi \Vert \pi_{\text{ref}})$,
#   exactly in expectation, and its optimum is $\pi^* \propto \pi_{\text{ref}}\, e^{r/\beta}$.
# - GAE: $\hat A_t = \sum_l (\gamma\lambda)^l \delta_{t+l}$, returns $= \hat A + V$; on a padded batch the
#   reverse loop masks the running advantage and the next value.
# - $\lambda$ trades the critic's bias against the rewards' variance.
# - Whitening: one mean and one unbiased variance over the batch's real tokens, 0 at padding.
#
# Next: notebook 04 feeds these advantages to PPO's clipped loss.

# %% [markdown]
# ## Check your understanding
#
# **1.** A batch's mean $k_1$ KL to the reference is $-0.01$. Is the code broken?
#
# <details><summary>Answer</summary>
#
# Not necessarily: $k_1 = \log\pi - \log\pi_{\text{ref}}$ of a sampled token is negative wherever the
# reference likes that token more. It is unbiased, so it equals the KL only on average, and near the
# reference a batch's noise can exceed the KL.
# </details>
#
# **2.** With $\gamma = 1$ and $\lambda = 0$, what is the advantage of a response's last real token, with
# score $s$, KL estimate $k$ and value $V_{\text{last}}$? What does the token before it see of $s$?
#
# <details><summary>Answer</summary>
#
# $\hat A = s - \beta k - V_{\text{last}}$, since $V = 0$ after the last token. The token before sees $s$
# only through the critic's guess $V_{\text{last}}$ in its TD error.
# </details>
#
# **3.** With $\lambda = 1$, is the advantage free of the critic?
#
# <details><summary>Answer</summary>
#
# No: $\hat A_t = G_t - V(s_t)$. The later guesses cancel out, but $V(s_t)$ stays as a baseline. A baseline
# that depends only on the state does not bias the policy gradient; a poor one adds variance.
# </details>
#
# **4.** What does whitening the advantages fix, and what not?
#
# <details><summary>Answer</summary>
#
# Their offset and their scale. Subtracting the batch mean centres them, a batch-level baseline on top
# of the critic's: a shared offset the critic missed no longer pushes every token the same way (a token
# below the batch mean is now pushed down). Dividing by the standard deviation fixes their scale, and
# with it the size of the policy step, whatever the rewards' scale. Not their noise: signal and noise
# are scaled alike.
# </details>
