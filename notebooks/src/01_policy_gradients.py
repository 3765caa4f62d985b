# Source of notebooks/01_policy_gradients.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 01 · Policy gradients: from REINFORCE to the reason PPO clips
#
# {{colab_badge}}
#
# **You will learn**
# - how a language model is a policy, and where RLHF sits among pretraining, SFT and RLHF;
# - the policy-gradient estimator $\nabla_\theta J = \mathbb{E}\left[\sum_t \nabla_\theta \log \pi_\theta(a_t \mid s_t)\,\Phi_t\right]$
#   and four choices of $\Phi_t$, with the **measured** variance of each;
# - actor-critic: replacing Monte-Carlo returns by a learned value function (PPO is an actor-critic);
# - what an over-large step does to a policy, and why that leads to TRPO and then to PPO's clip;
# - **measured**: many steps on one batch, with and without the clip.
#
# Everything here runs on a toy "language" small enough that the true values are computed exactly,
# so every estimate can be compared with the truth.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %% [markdown]
# ## 1. Where RLHF sits
#
# | stage | data | objective | result |
# |---|---|---|---|
# | pretraining | raw text | next-token likelihood | a model that continues text |
# | SFT (supervised fine-tuning) | (prompt, good answer) pairs | next-token likelihood on the answers | a model that answers |
# | RLHF | prompts + a reward model trained on human preferences | expected reward, kept close to the SFT model | a model that answers the way people prefer |
#
# RLHF treats the language model as a **policy** $\pi_\theta(a_t \mid s_t)$: the state $s_t$ is the
# prompt plus the tokens generated so far, the action $a_t$ is the next token, and the episode ends at
# EOS. The reward arrives mostly at the end (the reward model's score of the whole answer), with a small
# per-token term that keeps the policy near the SFT model (notebook 03). Nothing about this is specific to
# language, so this notebook studies the method on a vocabulary of four words.

# %%
import math

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots
from tqdm.auto import tqdm

import rlhf_helpers

torch.manual_seed(0)
# The tensors here are tiny: extra threads cost more in synchronisation than they save.
torch.set_num_threads(1)

# %% [markdown]
# ## 2. A toy language with a reward
#
# The policy writes a sentence of exactly $T = 6$ words from the vocabulary `good`, `fine`, `bad`, `!`.
# The state is the position $t$ and the previous word $p$ (a start symbol at $t = 0$).
# Each word earns a per-token reward, and the last position carries the "reward model" score:
#
# $$
# r(t, p, a) = \begin{cases}
#   +1 & \text{if } t = T-1 \text{ and } a = \texttt{!} \quad\text{(the final score: the sentence ends with "!")}\\
#   w(a) & \text{otherwise, with } w = (0.3,\ 0.1,\ -0.3,\ -0.2) \text{ for good, fine, bad, !}
# \end{cases}
# \;-\; 0.5\,[a = p]
# $$
#
# The last term punishes repeating the previous word. The best sentence is therefore
# `good fine good fine good !` with return $0.3+0.1+0.3+0.1+0.3+1 = 2.1$.

# %%
VOCAB = ["good", "fine", "bad", "!"]
N_WORDS = len(VOCAB)  # number of actions (words); V is the value function in this course
T = 6  # sentence length
START = N_WORDS  # index of the "previous word" at t = 0
EXCLAIM = VOCAB.index("!")
WORD_REWARD = torch.tensor([0.3, 0.1, -0.3, -0.2])  # w(a)
FINAL_SCORE = 1.0
REPEAT_COST = 0.5


def reward_table() -> torch.Tensor:
    """r[t, p, a]: reward of writing word a at position t after word p."""
    r = WORD_REWARD.repeat(T, N_WORDS + 1, 1)  # (T, N_WORDS+1, N_WORDS)
    r[T - 1, :, EXCLAIM] = FINAL_SCORE
    r[:, torch.arange(N_WORDS), torch.arange(N_WORDS)] -= REPEAT_COST  # a == p
    return r


REWARD = reward_table()  # (T, N_WORDS+1, N_WORDS)


def sample(theta: torch.Tensor, n: int, generator: torch.Generator):
    """Sample n sentences from the policy with logits theta (T, N_WORDS+1, N_WORDS).

    Returns words (n, T), previous words (n, T) and per-token rewards (n, T).
    """
    prev = torch.full((n,), START)  # (n,)
    words, prevs, rewards = [], [], []
    for t in range(T):
        probs = torch.softmax(theta[t, prev], dim=-1)  # (n, N_WORDS)
        word = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (n,)
        words.append(word)
        prevs.append(prev)
        rewards.append(REWARD[t, prev, word])
        prev = word
    return torch.stack(words, 1), torch.stack(prevs, 1), torch.stack(rewards, 1)


gen = torch.Generator().manual_seed(0)
uniform = torch.zeros(T, N_WORDS + 1, N_WORDS)  # logits of the uniform policy
words, prevs, rewards = sample(uniform, 3, gen)
for row, r in zip(words, rewards, strict=True):
    print(" ".join(VOCAB[i] for i in row), "  rewards:", [round(x, 1) for x in r.tolist()])

# %% [markdown]
# ## 3. A softmax policy and its log-probabilities
#
# The policy is a table of logits $\theta[t, p, \cdot]$ and
# $\pi_\theta(a \mid t, p) = \operatorname{softmax}(\theta[t, p])_a$, so
#
# $$\log \pi_\theta(a \mid s) = \theta[s, a] - \log \sum_{a'} e^{\theta[s, a']}.$$
#
# A language model is the same thing with the table replaced by a transformer. Gathering the
# log-probability of the chosen token from a (B, T, vocab) logits tensor is the first helper of the course;
# here it is from scratch, checked against `rlhf_helpers.logprobs_from_logits`.

# %%
def logprobs_scratch(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] at every position: (B, T, vocab), (B, T) -> (B, T)."""
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, T)
    chosen = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return chosen - log_norm


theta_random = torch.randn(T, N_WORDS + 1, N_WORDS)
words, prevs, _ = sample(theta_random, 8, gen)
logits = theta_random[torch.arange(T), prevs]  # (8, T, N_WORDS): the logits the policy used at each step
torch.testing.assert_close(logprobs_scratch(logits, words), rlhf_helpers.logprobs_from_logits(logits, words))
print("logprobs_scratch matches rlhf_helpers.logprobs_from_logits")

# %% [markdown]
# ## 4. The exact values, by dynamic programming
#
# Because the state space is tiny, the value of every state under any policy follows from the
# Bellman equations, computed backwards from the end of the sentence:
#
# $$Q(t, p, a) = r(t, p, a) + V(t+1, a), \qquad V(t, p) = \sum_a \pi_\theta(a \mid t, p)\, Q(t, p, a), \qquad V(T, \cdot) = 0.$$
#
# The objective is $J(\theta) = V(0, \text{start})$, the expected return. It is differentiable, so
# autograd gives the **exact** policy gradient: the target every estimator below tries to hit.

# %%
def exact_values(theta: torch.Tensor):
    """V (T, N_WORDS+1) and Q (T, N_WORDS+1, N_WORDS) of the policy with logits theta."""
    pi = torch.softmax(theta, dim=-1)  # (T, N_WORDS+1, N_WORDS)
    v_next = torch.zeros(N_WORDS + 1)  # V(T, .) = 0
    values, qs = [], []
    for t in reversed(range(T)):
        q = REWARD[t] + v_next[:N_WORDS]  # (N_WORDS+1, N_WORDS): the next state's previous word is a
        v = (pi[t] * q).sum(-1)  # (N_WORDS+1,)
        values.append(v)
        qs.append(q)
        v_next = v
    return torch.stack(values[::-1]), torch.stack(qs[::-1])


def expected_return(theta: torch.Tensor) -> torch.Tensor:
    """J(theta) = V(0, start)."""
    return exact_values(theta)[0][0, START]


def exact_gradient(theta: torch.Tensor) -> torch.Tensor:
    theta = theta.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(expected_return(theta), theta)
    return grad  # (T, N_WORDS+1, N_WORDS)


best = torch.full((T, N_WORDS + 1, N_WORDS), -50.0)
best_sentence = [0, 1, 0, 1, 0, EXCLAIM]
for t, word in enumerate(best_sentence):
    best[t, :, word] = 50.0
print(f"J(uniform policy) = {expected_return(uniform):.3f}")
print(f"J(best sentence)  = {expected_return(best):.3f}")

# %% [markdown]
# ## 5. The policy-gradient estimator and four choices of $\Phi_t$
#
# Why sampled episodes can estimate a gradient at all: the **log-derivative trick**. Write the objective
# as a sum over whole episodes $\tau = (s_0, a_0, \dots, s_{T-1}, a_{T-1})$ with return $R(\tau)$:
#
# $$J(\theta) = \sum_\tau p_\theta(\tau)\, R(\tau), \qquad p_\theta(\tau) = p(s_0) \prod_{t=0}^{T-1} \pi_\theta(a_t \mid s_t)\, p(s_{t+1} \mid s_t, a_t).$$
#
# Differentiate, and use $\nabla p = p\, \nabla \log p$ to turn the sum back into an expectation:
#
# $$\nabla_\theta J = \sum_\tau \nabla_\theta p_\theta(\tau)\, R(\tau) = \sum_\tau p_\theta(\tau)\, \nabla_\theta \log p_\theta(\tau)\, R(\tau) = \mathbb{E}_{\tau \sim \pi_\theta}\big[\nabla_\theta \log p_\theta(\tau)\, R(\tau)\big].$$
#
# The log of the product is a sum, and the environment's terms $p(s_0)$, $p(s_{t+1} \mid s_t, a_t)$ do not
# depend on $\theta$, so their gradients vanish: $\nabla_\theta \log p_\theta(\tau) = \sum_t \nabla_\theta \log \pi_\theta(a_t \mid s_t)$.
# No model of the environment (for a language model: of which text follows) is needed. This is the
# **policy-gradient theorem**, in its general form:
#
# $$\nabla_\theta J(\theta) = \mathbb{E}_{\tau \sim \pi_\theta}\Big[\sum_{t=0}^{T-1} \nabla_\theta \log \pi_\theta(a_t \mid s_t)\, \Phi_t\Big]$$
#
# with $\Phi_t = R(\tau)$, and several other $\Phi_t$ give the same expectation:
#
# | name | $\Phi_t$ | why it is still unbiased |
# |---|---|---|
# | total return (REINFORCE) | $R(\tau) = \sum_{t'=0}^{T-1} r_{t'}$ | the theorem itself |
# | reward-to-go | $\sum_{t' \ge t} r_{t'}$ | rewards before $t$ do not depend on $a_t$, and $\mathbb{E}[\nabla \log \pi] = 0$ |
# | reward-to-go minus a baseline | $\sum_{t' \ge t} r_{t'} - b(s_t)$ | any $b$ that depends only on the state has $\mathbb{E}[\nabla \log\pi \cdot b(s_t)] = 0$ |
# | advantage | $A(s_t, a_t) = Q(s_t, a_t) - V(s_t)$ | the expectation of the previous row given $(s_t, a_t)$, with $b = V$ |
#
# For the tabular softmax, the score has a closed form: $\nabla_{\theta[s]} \log \pi(a \mid s) = e_a - \pi(\cdot \mid s)$,
# and zero for every other state. The function below builds each episode's gradient from it; the cell
# checks it against autograd on the surrogate $\frac1N \sum_i \sum_t \log \pi(a_t \mid s_t)\,\Phi_t$.

# %%
def per_episode_gradients(theta, words, prevs, phi):
    """Each episode's sum_t grad log pi(a_t|s_t) * phi_t: (N, T) inputs -> (N, T, N_WORDS+1, N_WORDS)."""
    n = words.shape[0]
    pi = torch.softmax(theta[torch.arange(T), prevs], dim=-1)  # (N, T, N_WORDS)
    score = F.one_hot(words, N_WORDS).float() - pi  # (N, T, N_WORDS): e_a - pi(.|s)
    grads = torch.zeros(n, T, N_WORDS + 1, N_WORDS)
    grads[torch.arange(n)[:, None], torch.arange(T)[None, :], prevs] = score * phi[..., None]
    return grads


words, prevs, rewards = sample(theta_random, 32, gen)
phi = rewards.sum(1, keepdim=True).expand(-1, T)  # (32, T): total return
theta_leaf = theta_random.clone().requires_grad_(True)
logp = logprobs_scratch(theta_leaf[torch.arange(T), prevs], words)  # (32, T)
(autograd_grad,) = torch.autograd.grad((logp * phi).sum(1).mean(), theta_leaf)
torch.testing.assert_close(per_episode_gradients(theta_random, words, prevs, phi).mean(0), autograd_grad)
print("closed-form score matches autograd")

# %% [markdown]
# ### Exercise 1: reward-to-go
#
# Write `reward_to_go(rewards)`: for per-token rewards of shape (N, T) return
# $G_t = \sum_{t' \ge t} r_{t'}$, also (N, T). No Python loop over $t$ is needed.

# %%
# EXERCISE 1
def reward_to_go(rewards: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{t' >= t} r_t' for rewards (N, T) -> (N, T)."""
    raise NotImplementedError


# %%
def check_reward_to_go():
    r = torch.randn(5, T)
    expected = torch.stack([r[:, t:].sum(1) for t in range(T)], dim=1)  # loop definition
    torch.testing.assert_close(reward_to_go(r), expected)


exercise_check("Exercise 1 (reward_to_go)", check_reward_to_go,
               hidden=[rlhf_helpers.compute_gae, rlhf_helpers.gae_reference, rlhf_helpers.td_errors])

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def reward_to_go(rewards: torch.Tensor) -> torch.Tensor:
#     """G_t = sum_{t' >= t} r_t' for rewards (N, T) -> (N, T)."""
#     return rewards.flip(1).cumsum(1).flip(1)  # (N, T): cumulative sum from the end
# ```
# </details>

# %% [markdown]
# ## 6. Measuring the variance of each estimator
#
# An estimate of the gradient averages $N = 16$ episodes. We draw $K = 400$ such estimates for each
# choice of $\Phi_t$ (from the same episodes, so the comparison is paired) and report
# - the **total variance** $\sum_i \operatorname{Var}_k[\hat g_{k,i}]$ over all parameters $i$;
# - the squared **bias** $\lVert \bar g - \nabla J \rVert^2$ against the exact gradient; it should be at the
#   noise level $\approx$ variance $/K$, since every choice is unbiased.
#
# The baseline and the advantage use the exact $V$ and $Q$ here, to isolate the effect of the choice of
# $\Phi_t$; the next section learns them.

# %%
def g_t(rewards):  # reference reward-to-go for the rest of the notebook (independent of Exercise 1)
    return rewards.flip(1).cumsum(1).flip(1)  # (N, T)


def phis(theta, words, prevs, rewards):
    """The four choices of Phi_t, each (N, T)."""
    values, qs = exact_values(theta)
    v_s = values[torch.arange(T), prevs]  # (N, T): V(s_t)
    q_sa = qs[torch.arange(T), prevs, words]  # (N, T): Q(s_t, a_t)
    return {
        "total return": rewards.sum(1, keepdim=True).expand(-1, T),
        "reward-to-go": g_t(rewards),
        "reward-to-go - V(s)": g_t(rewards) - v_s,
        "advantage Q - V": q_sa - v_s,
    }


def measure_variance(theta, n_per_estimate=16, n_estimates=400, seed=0):
    generator = torch.Generator().manual_seed(seed)
    words, prevs, rewards = sample(theta, n_per_estimate * n_estimates, generator)
    truth = exact_gradient(theta).flatten()  # (P,)
    rows = {}
    for name, phi in phis(theta, words, prevs, rewards).items():
        grads = per_episode_gradients(theta, words, prevs, phi)  # (N*K, T, N_WORDS+1, N_WORDS)
        estimates = grads.reshape(n_estimates, n_per_estimate, -1).mean(1)  # (K, P)
        rows[name] = {
            "variance": estimates.var(0).sum().item(),
            "bias2": ((estimates.mean(0) - truth) ** 2).sum().item(),
            "noise level": estimates.var(0).sum().item() / n_estimates,
        }
    return rows


# A partly trained policy: a few exact-gradient steps from uniform.
trained = uniform.clone()
for _ in range(20):
    trained = trained + 2.0 * exact_gradient(trained)
print(f"J(partly trained policy) = {expected_return(trained):.3f}")

variance_at = {"uniform policy": measure_variance(uniform), "partly trained policy": measure_variance(trained)}
for policy_name, rows in variance_at.items():
    print(f"\n{policy_name}")
    print(f"{'Phi_t':<22}{'variance':>10}{'bias^2':>10}{'var/K':>10}")
    for name, row in rows.items():
        print(f"{name:<22}{row['variance']:10.4f}{row['bias2']:10.5f}{row['noise level']:10.5f}")
    variances = [row["variance"] for row in rows.values()]
    falling = all(later < earlier for earlier, later in zip(variances, variances[1:], strict=False))
    at_noise = all(row["bias2"] < 3 * row["noise level"] for row in rows.values())
    print(f"-> the variance {'falls' if falling else 'does NOT fall'} from each row to the next; bias^2 is "
          f"{'below' if at_noise else 'NOT below'} 3 x var/K (noise level) in every row")
    # the text below and the summary state both: make the notebook fail if a change breaks them
    assert falling, f"{policy_name}: the variance no longer falls in table order: {variances}"
    assert at_noise, f"{policy_name}: a bias^2 is above 3x its noise level: {rows}"

fig = go.Figure()
for policy_name, rows in variance_at.items():
    fig.add_bar(name=policy_name, x=list(rows), y=[row["variance"] for row in rows.values()])
fig.update_layout(title="Total variance of a 16-episode policy-gradient estimate",
                  yaxis_title="sum of per-parameter variances", yaxis_type="log", barmode="group")
fig.show()

# %% [markdown]
# Reading the numbers:
# - **reward-to-go** drops the rewards collected before $t$: they cannot be caused by $a_t$ and only add
#   noise to its weight;
# - **subtracting $V(s_t)$** centres the weight: an action is pushed up only if it did better than usual
#   from that state, instead of every action being pushed up whenever returns are positive;
# - the **advantage** $Q - V$ also removes the randomness of the *later* actions (how much of the
#   remaining noise that is depends on the policy: compare the two tables).
#
# The lines under each table check this on the measurement: the variance falls row by row, and the
# bias stays at the noise level (the cell asserts both), so only the variance changes.

# %% [markdown]
# ## 7. Actor-critic: learning the baseline
#
# In practice $V$ is unknown. An **actor-critic** learns it: a critic $V_w(s)$ fitted by regression to
# the observed reward-to-go, $\min_w \tfrac12 (V_w(s_t) - G_t)^2$, and an advantage from its one-step
# TD error, which needs no full return:
#
# $$\hat A_t = \delta_t = r_t + V_w(s_{t+1}) - V_w(s_t), \qquad V_w(s_T) = 0.$$
#
# REINFORCE uses Monte-Carlo returns; an actor-critic uses a learned critic. PPO is an actor-critic
# (with the GAE advantage of notebook 03, which interpolates between these two).

# %% [markdown]
# ### Exercise 2: the one-step TD advantage
#
# Write `td_advantage(rewards, values)`: rewards and critic values $V_w(s_t)$ are (N, T); return
# $\delta_t = r_t + V_w(s_{t+1}) - V_w(s_t)$ with $V_w(s_T) = 0$, shape (N, T).

# %%
# EXERCISE 2
def td_advantage(rewards: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """delta_t = r_t + V(s_{t+1}) - V(s_t), V after the last step = 0: (N, T), (N, T) -> (N, T)."""
    raise NotImplementedError


# %%
def check_td_advantage():
    r, v = torch.randn(4, T), torch.randn(4, T)
    expected = torch.empty(4, T)
    for t in range(T):  # loop definition
        v_next = v[:, t + 1] if t + 1 < T else torch.zeros(4)
        expected[:, t] = r[:, t] + v_next - v[:, t]
    torch.testing.assert_close(td_advantage(r, v), expected)


exercise_check("Exercise 2 (td_advantage)", check_td_advantage,
               hidden=[rlhf_helpers.td_errors, rlhf_helpers.compute_gae, rlhf_helpers.gae_reference])

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def td_advantage(rewards: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
#     """delta_t = r_t + V(s_{t+1}) - V(s_t), V after the last step = 0: (N, T), (N, T) -> (N, T)."""
#     next_values = F.pad(values[:, 1:], (0, 1))  # (N, T): V(s_{t+1}), 0 after the end
#     return rewards + next_values - values
# ```
# </details>

# %% [markdown]
# Now train the same policy three ways for 150 iterations of 8 episodes each, plain gradient ascent
# $\theta \leftarrow \theta + \eta \hat g$, and plot the exact $J(\theta)$ after every step
# (mean of 5 seeds): REINFORCE with reward-to-go, reward-to-go minus the learned critic, and the
# actor-critic with the TD advantage.

# %%
def td_reference(rewards, values):
    return rewards + F.pad(values[:, 1:], (0, 1)) - values  # (N, T)


def train(method, iterations=150, n=8, lr=1.0, critic_lr=1.0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    theta = torch.zeros(T, N_WORDS + 1, N_WORDS)
    critic = torch.zeros(T, N_WORDS + 1, requires_grad=True)  # V_w(t, p)
    critic_opt = torch.optim.SGD([critic], lr=critic_lr)
    curve = []
    for _ in range(iterations):
        words, prevs, rewards = sample(theta, n, generator)
        returns = g_t(rewards)  # (n, T)
        values = critic[torch.arange(T), prevs]  # (n, T)
        if method == "REINFORCE, reward-to-go":
            phi = returns
        elif method == "REINFORCE, reward-to-go - critic":
            phi = returns - values.detach()
        else:  # actor-critic, TD advantage
            phi = td_reference(rewards, values.detach())
        theta = theta + lr * per_episode_gradients(theta, words, prevs, phi).mean(0)
        critic_opt.zero_grad()
        (0.5 * ((values - returns) ** 2).sum() / n).backward()
        critic_opt.step()
        curve.append(expected_return(theta).item())
    return curve


methods = ["REINFORCE, reward-to-go", "REINFORCE, reward-to-go - critic", "actor-critic, TD advantage"]
seeds = range(5)
curves = {}
for method in tqdm(methods, desc="training", leave=False):  # the bar goes away when done
    runs = torch.tensor([train(method, seed=s) for s in seeds])  # (seeds, iterations)
    curves[method] = runs.mean(0)

fig = go.Figure()
for method, curve in curves.items():
    fig.add_scatter(y=curve.tolist(), name=method, mode="lines")
fig.add_hline(y=expected_return(best).item(), line_dash="dot", annotation_text="best sentence")
fig.update_layout(title="Exact expected return while training (mean of 5 seeds, 8 episodes per step)",
                  xaxis_title="iteration", yaxis_title="J(theta)")
fig.show()
for method, curve in curves.items():
    print(f"{method:<36} J after 25 steps {curve[24]:.3f}   after 150 steps {curve[-1]:.3f}")
best_j = expected_return(best).item()
largest_gap = max(best_j - curve[-1].item() for curve in curves.values())
slowest = min(curves, key=lambda method: curves[method][24].item())
print(f"after 150 steps every method is within {largest_gap:.3f} of the best sentence's J = {best_j:.1f}; "
      f"lowest after 25 steps: {slowest}")
assert largest_gap < 0.1, f"a method ends {largest_gap:.3f} below the best sentence: the text below says all get close"
assert slowest == "actor-critic, TD advantage", \
    f"the text below explains why the actor-critic starts slowest; {slowest} does"

# %% [markdown]
# On this six-word problem all three end close to the best sentence (the last printed line gives how
# close): with 8 episodes per step even the plain reward-to-go estimate is usable. The actor-critic is
# the slowest after 25 steps because its critic starts at
# zero, so its early TD errors are biased; a critic pays off when episodes are long and the return is
# one noisy number at the end, which is the LLM case (hundreds of tokens, one reward-model score).
# The paired measurement of section 6 is the cleaner comparison of the estimators themselves.

# %% [markdown]
# ## 8. An over-large step collapses the policy
#
# Gradient ascent has no notion of "how far" the policy moved: the step is measured in parameter space,
# but what matters is the change in the distribution. Take **one** step from the uniform policy with a
# 16-episode estimate and a growing step size $\eta$, measure
# - the KL divergence between the old and new policy, averaged over the states the old policy visits,
# - the entropy of the new policy (0 = deterministic),
#
# then continue for 60 ordinary steps ($\eta = 1$) and see where each run ends.

# %%
def state_occupancy(theta):
    """Probability of visiting each state (t, p) under the policy: (T, N_WORDS+1)."""
    pi = torch.softmax(theta, dim=-1)  # (T, N_WORDS+1, N_WORDS)
    d = F.one_hot(torch.tensor(START), N_WORDS + 1).float()  # (N_WORDS+1,)
    visits = []
    for t in range(T):
        visits.append(d)
        d = F.pad((d[:, None] * pi[t]).sum(0), (0, 1))  # (N_WORDS+1,): next previous word is a
    return torch.stack(visits)


def policy_kl_reference(old_logits, new_logits):
    """KL(old || new) of softmax policies over the last dimension."""
    old_logp, new_logp = old_logits.log_softmax(-1), new_logits.log_softmax(-1)
    return (old_logp.exp() * (old_logp - new_logp)).sum(-1)


def mean_kl(old, new):
    return (state_occupancy(old) * policy_kl_reference(old, new)).sum() / T


def mean_entropy(theta):
    logp = theta.log_softmax(-1)
    return (state_occupancy(theta) * -(logp.exp() * logp).sum(-1)).sum() / T


step_sizes = [0.3, 1, 3, 10, 30, 100, 300]
results = {"J after step": [], "kl": [], "entropy": [], "final J": []}
final_se = []  # standard error of the final J over the seeds
for eta in tqdm(step_sizes, desc="step sizes", leave=False):
    first_js, kls, entropies, finals = [], [], [], []
    for seed in range(8):
        generator = torch.Generator().manual_seed(seed)
        words, prevs, rewards = sample(uniform, 16, generator)
        phi = phis(uniform, words, prevs, rewards)["reward-to-go - V(s)"]
        theta = uniform + eta * per_episode_gradients(uniform, words, prevs, phi).mean(0)
        first_js.append(expected_return(theta).item())
        kls.append(mean_kl(uniform, theta).item())
        entropies.append(mean_entropy(theta).item())
        for _ in range(60):
            words, prevs, rewards = sample(theta, 16, generator)
            phi = phis(theta, words, prevs, rewards)["reward-to-go - V(s)"]
            theta = theta + 1.0 * per_episode_gradients(theta, words, prevs, phi).mean(0)
        finals.append(expected_return(theta).item())
    for key, values in zip(results, (first_js, kls, entropies, finals), strict=True):
        results[key].append(sum(values) / len(values))
    final_se.append(torch.tensor(finals).std().item() / len(finals) ** 0.5)

fig = make_subplots(rows=1, cols=4, subplot_titles=("J after the first step",
                                                    "KL(old || new) of the first step",
                                                    "entropy after the first step",
                                                    "J after 60 more ordinary steps"))
for col, key in enumerate(results, start=1):
    fig.add_scatter(x=step_sizes, y=results[key], mode="lines+markers", showlegend=False, row=1, col=col)
    fig.update_xaxes(type="log", title_text="first step size eta", row=1, col=col)
fig.update_layout(title=f"One large step from the uniform policy "
                        f"(mean of 8 seeds; max entropy = {math.log(N_WORDS):.2f})")
fig.show()
for eta, first, kl, ent, final, se in zip(step_sizes, *results.values(), final_se, strict=True):
    print(f"eta {eta:6}: J after step {first:6.3f}   KL {kl:7.3f}   entropy {ent:5.3f}   "
          f"final J {final:6.3f} +- {se:.3f}")


def trend(values):
    """'rises' or 'falls' when every step goes that way, else 'goes up and down'."""
    steps = [later - earlier for earlier, later in zip(values, values[1:], strict=False)]
    return "rises" if all(d > 0 for d in steps) else "falls" if all(d < 0 for d in steps) else "goes up and down"


finals = results["final J"]
peak = max(range(len(step_sizes)), key=lambda i: finals[i])
drop_in_se = (finals[peak] - finals[-1]) / math.hypot(final_se[peak], final_se[-1])
print(f"\nJ right after the step {trend(results['J after step'])} with eta; the entropy after it "
      f"{trend(results['entropy'])}, down to {results['entropy'][-1]:.2f} of a maximum {math.log(N_WORDS):.2f}.")
print(f"The final J is highest at eta = {step_sizes[peak]} and {trend(finals[peak:])} with every larger first "
      f"step, to {finals[-1]:.3f} at eta = {step_sizes[-1]}: {drop_in_se:.1f} standard errors below its peak.")
assert results["entropy"][-1] < 0.2 * math.log(N_WORDS), \
    "the text says a large step makes the policy nearly deterministic"
assert drop_in_se > 2, "the text says the largest first step ends with a lower return than the best one"

# %% [markdown]
# A large first step looks like progress: the policy jumps straight to the actions that did well in
# those 16 episodes, so $J$ right after it is higher (the first printed verdict). But the largest steps
# leave the policy nearly deterministic at once (the entropy column), its score function
# $e_a - \pi(\cdot \mid s)$ is then nearly zero, it stops exploring, and ordinary steps afterwards cannot
# undo an unlucky commitment. The second verdict says from which step size on that costs return, and
# how many standard errors the largest step loses (compare the smaller steps' final returns with their
# standard errors in the table). With a neural policy the damage is worse, because one step changes
# the behaviour in states the batch never visited.
#
# ## 9. From the trust region to PPO's clip
#
# **TRPO** fixes the step size in the space that matters: maximise the importance-weighted advantage
# while the new policy stays within a KL ball of the old one,
#
# $$\max_\theta\ \mathbb{E}_t\Big[\tfrac{\pi_\theta(a_t \mid s_t)}{\pi_{\text{old}}(a_t \mid s_t)}\, \hat A_t\Big]
# \quad\text{s.t.}\quad \mathbb{E}_t\big[\mathrm{KL}(\pi_{\text{old}}(\cdot \mid s_t)\,\Vert\,\pi_\theta(\cdot \mid s_t))\big] \le \delta_{\text{KL}},$$
#
# which needs second-order machinery (conjugate gradient, line search). **PPO** folds the constraint
# into the objective: with the ratio $\rho_t = \pi_\theta(a_t \mid s_t) / \pi_{\text{old}}(a_t \mid s_t)$,
#
# $$J^{\text{CLIP}}(\theta) = \mathbb{E}_t\big[\min\big(\rho_t \hat A_t,\ \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\,\hat A_t\big)\big]
# \quad\text{(maximised)},$$
#
# so once an action's **ratio** $\rho_t$ has left $[1-\epsilon, 1+\epsilon]$ in the helpful direction
# (above $1+\epsilon$ when $\hat A_t > 0$, below $1-\epsilon$ when $\hat A_t < 0$) its gradient is zero.
# The limit is relative: with $\epsilon = 0.2$ an action of probability 0.5 stops being pushed up at 0.6,
# one of probability 0.01 at 0.012. Plain first-order steps can then reuse one batch for several epochs.
# **Sign convention:** the paper calls this objective $L^{\text{CLIP}}$ and maximises it; optimisers
# minimise, so from notebook 04 on, $L^{\text{CLIP}} = -J^{\text{CLIP}}$ is the **loss** (the code's `policy_loss`), and every other
# $L$ in the course is a loss too. Notebook 04 takes it apart; notebook 03 builds the advantage
# $\hat A_t$ it needs.

# %% [markdown]
# ### Several epochs on one batch, with and without the clip
#
# The clip exists so that one batch can be used for several steps. Here is what it prevents, on the
# toy: from the uniform policy, sample one batch of 16 episodes, store its log-probs
# $\log \pi_{\text{old}}$ and advantages $\hat A_t$ (reward-to-go minus the exact $V(s_t)$, as in
# section 8), then take 30 plain gradient steps of size $\eta = 5$ on that **same** batch, maximising either
#
# $$J^{\text{IS}}(\theta) = \frac1N \sum_{i=1}^{N} \sum_{t} \rho_{i,t}\, \hat A_{i,t}
# \quad\text{(vanilla policy gradient, importance-weighted, no clip)}$$
#
# or $J^{\text{CLIP}}$ above, summed over $t$ the same way, with $\epsilon = 0.2$. Its loss is
# `rlhf_helpers.policy_loss`, which returns $-J^{\text{CLIP}}$ averaged over all $N T$ tokens, so
# $J^{\text{CLIP}} = -T \cdot$ `policy_loss`. At the first step $\rho = 1$ and both gradients equal
# the policy gradient of section 5; they part from the second step on. Then, as in section 8, each
# result trains on for 60 ordinary steps ($\eta = 1$, fresh episodes every step), and we compare
# the final $J$ over 16 seeds (same seed, same batch for both: a paired comparison).

# %%
def reuse_one_batch(clip, seed, epochs=30, lr=5.0, n=16, eps=0.2, later_steps=60):
    """`epochs` gradient steps on one batch from the uniform policy, then `later_steps` ordinary ones."""
    generator = torch.Generator().manual_seed(seed)
    words, prevs, rewards = sample(uniform, n, generator)  # (n, T) each
    adv = phis(uniform, words, prevs, rewards)["reward-to-go - V(s)"]  # (n, T): A_t, fixed for all epochs
    old_logp = logprobs_scratch(uniform[torch.arange(T), prevs], words)  # (n, T): log pi_old, stored
    mask = torch.ones_like(adv)  # (n, T): every position is a real action
    theta = uniform.clone().requires_grad_(True)  # (T, N_WORDS+1, N_WORDS)
    history = {"J": [], "entropy": []}
    for _ in range(epochs):
        logp = logprobs_scratch(theta[torch.arange(T), prevs], words)  # (n, T): log pi_theta
        if clip:
            loss, _ = rlhf_helpers.policy_loss(logp, old_logp, adv, mask, clip_eps=eps)  # mean over n*T
            objective = -T * loss  # J^CLIP: sum over t, mean over episodes
        else:
            objective = (torch.exp(logp - old_logp) * adv).sum(1).mean()  # J^IS
        (grad,) = torch.autograd.grad(objective, theta)  # (T, N_WORDS+1, N_WORDS)
        theta = (theta + lr * grad).detach().requires_grad_(True)
        history["J"].append(expected_return(theta).item())
        history["entropy"].append(mean_entropy(theta).item())
    theta = theta.detach()
    history["kl"] = mean_kl(uniform, theta).item()
    history["later J"] = []
    for _ in range(later_steps):
        words, prevs, rewards = sample(theta, 16, generator)
        phi = phis(theta, words, prevs, rewards)["reward-to-go - V(s)"]  # (16, T)
        theta = theta + 1.0 * per_episode_gradients(theta, words, prevs, phi).mean(0)
        history["later J"].append(expected_return(theta).item())
    return history


reuse_seeds = range(16)
reuse = {name: [reuse_one_batch(clip, seed) for seed in reuse_seeds]
         for name, clip in (("vanilla (no clip)", False), ("PPO clip", True))}


def seed_mean(runs, key):
    return torch.tensor([run[key] for run in runs]).mean(0)  # mean over seeds: (steps,) or scalar


fig = make_subplots(rows=1, cols=3, subplot_titles=("J while reusing one batch", "entropy while reusing one batch",
                                                    "J during 60 ordinary steps afterwards"))
for name, runs in reuse.items():
    color = "crimson" if name.startswith("vanilla") else "royalblue"
    for col, key in enumerate(("J", "entropy", "later J"), start=1):
        fig.add_scatter(y=seed_mean(runs, key).tolist(), name=name, legendgroup=name, showlegend=col == 1,
                        mode="lines", line_color=color, row=1, col=col)
fig.update_xaxes(title_text="step on the same batch", row=1, col=1)
fig.update_xaxes(title_text="step on the same batch", row=1, col=2)
fig.update_xaxes(title_text="ordinary step", row=1, col=3)
fig.update_layout(title=f"30 steps on one batch (eta 5, eps 0.2), then ordinary training "
                        f"(mean of {len(reuse_seeds)} seeds)")
fig.show()

vanilla, clipped = reuse["vanilla (no clip)"], reuse["PPO clip"]
for name, runs in reuse.items():
    print(f"{name:<18} after 30 steps on the batch: J {seed_mean(runs, 'J')[-1]:6.3f}   "
          f"KL(old || new) {seed_mean(runs, 'kl'):6.3f}   entropy {seed_mean(runs, 'entropy')[-1]:5.3f}   "
          f"| after 60 more ordinary steps: J {seed_mean(runs, 'later J')[-1]:6.3f}")
final_gap = torch.tensor([c["later J"][-1] - v["later J"][-1]
                          for c, v in zip(clipped, vanilla, strict=True)])  # (seeds,): paired
gap_se = final_gap.std().item() / len(final_gap) ** 0.5
entropy_ratio = seed_mean(vanilla, "entropy")[-1] / seed_mean(clipped, "entropy")[-1]
vanilla_ahead = seed_mean(vanilla, "J")[-1] > seed_mean(clipped, "J")[-1]
print(f"\nright after the reuse, J is {'higher' if vanilla_ahead else 'lower'} without the clip; "
      f"its entropy is {entropy_ratio:.0%} of the clipped policy's")
print(f"final J, clip minus vanilla: {final_gap.mean():+.3f} +- {gap_se:.3f} (paired SE), clip ahead in "
      f"{(final_gap > 0).sum().item()} of {len(final_gap)} seeds: the clip "
      f"{'keeps' if final_gap.mean() > 2 * gap_se else 'does NOT keep'} the return that the vanilla reuse loses")
assert final_gap.mean() > 2 * gap_se, "the clip should end with a higher return than vanilla reuse (> 2 SE)"
assert entropy_ratio < 0.5, "vanilla reuse should collapse the entropy to under half of the clipped policy's"

# %% [markdown]
# Without the clip, each step on the old batch multiplies the ratio of every action with
# $\hat A > 0$ and so its weight $\rho \hat A$: the steps compound into one very large step, with the
# collapse of section 8 (the entropy panel). Right after, $J$ can even look better, since the policy
# commits to what did well in 16 episodes; the ordinary steps afterwards show the price. With the clip,
# an action stops being pushed once its ratio leaves the band in the helpful direction, so the 30 steps
# compound far less (compare the two KL values printed above). The clip removes the incentive to go
# further; it does not bound the ratio, which can still leave the band (notebook 04 measures by how
# much). The exploration is still there for the next batches. PPO alternates the two: a few epochs on a batch, then a fresh batch from the new policy.

# %% [markdown]
# ### Exercise 3: the KL between two softmax policies
#
# Write `policy_kl(old_logits, new_logits)`: $\mathrm{KL}(\pi_{\text{old}} \Vert \pi_{\text{new}}) =
# \sum_a \pi_{\text{old}}(a)\,(\log \pi_{\text{old}}(a) - \log \pi_{\text{new}}(a))$ over the last
# dimension, for logits of any shape (..., V). Then check: what is the KL of the first step with
# $\eta = 100$ printed above, and is it inside a typical trust region of $\delta_{\text{KL}} = 0.01$ (the radius; $\delta_t$ stays the TD error)?

# %%
# EXERCISE 3
def policy_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(old) || softmax(new)) over the last dimension: (..., V), (..., V) -> (...)."""
    raise NotImplementedError


# %%
def check_policy_kl():
    old, new = torch.randn(3, 5, N_WORDS), torch.randn(3, 5, N_WORDS)
    expected = torch.zeros(3, 5)  # a loop over the vocabulary: sum_v p_old(v) (log p_old(v) - log p_new(v))
    for i in range(3):
        for j in range(5):
            z_old = sum(math.exp(x) for x in old[i, j].tolist())
            z_new = sum(math.exp(x) for x in new[i, j].tolist())
            expected[i, j] = sum(math.exp(a) / z_old * ((a - math.log(z_old)) - (b - math.log(z_new)))
                                 for a, b in zip(old[i, j].tolist(), new[i, j].tolist(), strict=True))
    torch.testing.assert_close(policy_kl(old, new), expected)
    assert torch.all(policy_kl(old, old).abs() < 1e-6), "KL of a policy with itself must be 0"


exercise_check("Exercise 3 (policy_kl)", check_policy_kl,
               hidden=[policy_kl_reference, torch.distributions.kl.kl_divergence])

# %%
# The exercise's question, answered from the step-size table above (mean over its 8 seeds)
kl_at_100 = results["kl"][step_sizes.index(100)]
print(f"KL(old || new) of the first step at eta = 100: {kl_at_100:.2f} nats, {kl_at_100 / 0.01:.0f} times a "
      f"trust region of 0.01 ({'inside' if kl_at_100 <= 0.01 else 'outside'} it)")

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def policy_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
#     """KL(softmax(old) || softmax(new)) over the last dimension: (..., V), (..., V) -> (...)."""
#     old_logp = old_logits.log_softmax(-1)  # (..., V)
#     new_logp = new_logits.log_softmax(-1)  # (..., V)
#     return (old_logp.exp() * (old_logp - new_logp)).sum(-1)
# ```
# </details>

# %% [markdown]
# ## Summary
# - The policy gradient weights $\nabla \log \pi(a_t \mid s_t)$ by $\Phi_t$; total return, reward-to-go,
#   reward-to-go minus a baseline and the advantage are all unbiased, with measured variance falling in
#   that order.
# - REINFORCE uses Monte-Carlo returns; an actor-critic learns $V$ and uses TD errors. PPO is an actor-critic.
# - Step size in parameter space says nothing about how far the policy moves; a large step collapses it,
#   and so do many steps on one batch. TRPO constrains the KL; PPO clips the probability ratio
#   $\pi_\theta / \pi_{\text{old}}$ to $[1-\epsilon, 1+\epsilon]$ instead, which stops the steps on one batch from
#   compounding (measured in section 9).
#
# Next: notebook 02 trains the reward model that supplies the final score.
