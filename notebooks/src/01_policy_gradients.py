# Source of notebooks/01_policy_gradients.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 01 · Policy gradients: from REINFORCE to the reason PPO clips
#
# {{colab_badge}}
#
# **Prerequisites:** none of the other notebooks; PyTorch tensors and autograd, expectation and variance, gradient ascent.
#
# **Time:** about 160 min for the core, in two sittings (the second from *7. Reusing a batch*); the deep dives add about 110 min.
#
# **You will learn** RLHF written as a token-level MDP, beside PPO on Atari and MuJoCo; the
# policy-gradient estimator and its unbiased weights $\Phi_t$; actor-critic; why
# reusing a batch calls for a trust region, and how PPO's clip stands in for one; and how the same
# log-probs come out of a language model's logits. The maths runs on a toy "language" whose true values
# are computed exactly.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %% [markdown]
# ## 1. Where RLHF sits
#
# Pretraining gives a model that continues text, supervised fine-tuning (SFT) one that answers; RLHF then
# maximises a reward model's score of its answers, kept close to the SFT model. It treats the language
# model as a **policy** $\pi_\theta(a_t \mid s_t)$: the state $s_t$ is the prompt plus the tokens so far,
# the action $a_t$ the next token.

# %%
import math

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from IPython.display import display
from plotly.subplots import make_subplots
from tqdm.auto import tqdm

import rlhf_helpers
from rlhf_helpers.core.tokens import mask_to_first_eos
from rlhf_helpers.course.claims import check_claims
from rlhf_helpers.ppo.model.sampling import sample
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.models import load_causal_lm, load_tokenizer
from rlhf_helpers.runtime.profiles import get_profile, gpu_profile, tiny_profile
from rlhf_helpers.widgets.style import fit_labels

torch.manual_seed(0)
torch.set_num_threads(1)  # tensors this tiny: extra threads cost more in synchronisation than they save

# %% [markdown]
# ## 2. From PPO on Atari/MuJoCo to RLHF
#
# If you know PPO from Atari or MuJoCo, RLHF is the same algorithm on an unusual MDP. For a prompt $x$
# and a response $y$ of $\lvert y \rvert$ tokens:
# - **Start:** $s_0 = x \sim \mathcal D$, a prompt drawn from the training prompts.
# - **States and actions:** $s_t = (x, y_{<t})$, the prompt and the tokens written so far; $a_t = y_t$,
#   the next token.
# - **Transitions** are deterministic: $s_{t+1} = (x, y_{\le t})$ appends the token. All randomness is
#   the prompt's and the policy's.
# - **Reward:** $r_t = -\beta\,\widehat{\mathrm{KL}}_t + [t = \lvert y \rvert - 1]\; r_\phi(x, y)$. The reward
#   model scores the whole response once, at its last token; every token pays a penalty for leaving the
#   reference model. Notebook 03 builds $r_t$ from the KL-regularised objective.
# - **Discount** $\gamma = 1$: an episode has at most `max_new_tokens` steps, so the return needs no
#   discount, and the score, paid at the end, reaches the first token undiminished.
# - **Termination:** the episode ends when the policy writes EOS, so its length is the response's,
#   $T = \lvert y \rvert$, varying from row to row. The trainer also cuts a response at `max_new_tokens`.
#   That is **truncation**, a time limit, not a terminal state: in the language's own MDP only EOS ends
#   an episode. The course treats a cut like an end, as CleanRL treats a time limit: the reward model
#   scores the text as cut, and $V = 0$ after its last token. On MuJoCo that is an approximation, since
#   the observation does not hold the time; here $s_t$ holds its own length, so it is exact
#   for the objective with the limit built in; it does not estimate what the uncut response would have
#   earned. Notebook 03 covers this, and `missing_eos_penalty`, which (set negative) lowers a cut response's score.
#
# **Two views of one response.**
# - **A bandit:** the context is $x$, the arm the whole response, paid once. Since
#   $\log \pi_\theta(y \mid x) = \sum_t \log \pi_\theta(y_t \mid x, y_{<t})$, its gradient weights every token
#   by the same advantage, $R(x, y) - b(x)$. REINFORCE with a baseline, RLOO and GRPO (a baseline from a
#   group of responses to the same prompt) and DPO (fixed preference pairs, no sampling) sit here.
# - **The token MDP:** a critic $V(s_t)$ and GAE give each token its own advantage; PPO with GAE sits
#   here. As transitions are deterministic, $r_t + V(s_{t+1}) = Q(s_t, a_t)$: with a perfect critic the TD
#   error $\delta_t$ *is* the advantage, so the per-token credit is exactly as good as the critic.
#
# Notebook 07 races methods of both views on one task. Below, the course's PPO beside CleanRL's, row by row:
#
# | | CleanRL's PPO (Atari / MuJoCo) | PPO for RLHF here (tiny profile) |
# |---|---|---|
# | a rollout | envs × steps: 8 × 128 / 1 × 2048; an episode still running at the end bootstraps from $V$ | $B$ prompts × up to `max_new_tokens`: 64 × 40 (gpu profile: 128 × 48); one whole episode per row, padded |
# | episode end | termination or time limit, both treated as terminal | EOS or the cut, $V = 0$ after both |
# | reward | from the environment, at every step | the score at the last token, $-\beta\,\widehat{\mathrm{KL}}_t$ at every token ($\beta = 0.2$) |
# | $\gamma$ | 0.99 | 1 |
# | GAE $\lambda$ | 0.95 | 0.95 |
# | advantage whitening | per minibatch | once per batch, over all its real tokens |
# | minibatches | shuffled time steps: 4 of 256 / 32 of 64; 4 / 10 epochs; clip 0.1 / 0.2 | shuffled whole sequences: 4 of 16; 4 epochs; clip 0.2 |
# | entropy bonus | 0.01 / 0 | none (`entropy_coef` = 0): the KL penalty already holds an entropy bonus of weight $\beta$, as $-\mathrm{KL}(\pi \Vert \pi_{\text{ref}}) = -\mathbb{E}_\pi[\log \pi] + \mathbb{E}_\pi[\log \pi_{\text{ref}}]$ |
# | normalisation | Atari: frames scaled by 1/255, each reward replaced by its sign; MuJoCo: observations normalised by a running mean and standard deviation, rewards divided by a running standard deviation of the discounted return, both clipped to ±10 | none: tokens are ids; scores as the reward model gives them (`score_clip` off) |
# | value function | a second head on the policy's network / a separate MLP | its own LoRA adapter and head on the same frozen base, its own optimiser (notebook 05) |
# | what costs time | environment steps | generation: one forward pass per token, one after another |
# | reference policy | none | the frozen SFT model, $\pi_{\text{ref}}$ |

# %% tags=["claim-check"]
shipped = {"tiny": tiny_profile().ppo, "gpu": gpu_profile().ppo}  # the defaults as shipped, before any override
check_claims({
    "a rollout is 64 prompts x up to 40 tokens (tiny), 128 x 48 (gpu)":
        (shipped["tiny"].rollout_batch_size, shipped["tiny"].max_new_tokens) == (64, 40)
        and (shipped["gpu"].rollout_batch_size, shipped["gpu"].max_new_tokens) == (128, 48),
    "gamma is 1 and GAE lambda 0.95, advantages whitened per batch, no entropy bonus, no score clip":
        all((c.gamma, c.lam, c.whiten_advantages, c.entropy_coef, c.score_clip) == (1.0, 0.95, True, 0.0, None)
            for c in shipped.values()),
    "the tiny profile: minibatches of 16 sequences, 4 epochs, clip 0.2, beta 0.2":
        (shipped["tiny"].mini_batch_size, shipped["tiny"].ppo_epochs, shipped["tiny"].clip_eps,
         shipped["tiny"].kl_coef) == (16, 4, 0.2, 0.2),
    "missing_eos_penalty is off by default": all(c.missing_eos_penalty is None for c in shipped.values()),
}, any_profile=True)

# %% [markdown]
# One rollout in these terms: the course's tiny SFT model (notebook 02 introduces it) answers 8 training
# prompts as PPO samples them, at temperature 1 and up to `max_new_tokens`. Below, the first states and
# actions of episode 0, then each episode's length and how it ended; the lengths vary from prompt to prompt, and a response that reaches the limit is cut.

# %%
tiny = get_profile("tiny")  # the toy below needs no model; this cell borrows the tiny profile's
lm_tokenizer, sft_lm = load_tokenizer(tiny), load_causal_lm(tiny)
prompt_texts = load_prompts("train")[:8]  # s_0 of 8 episodes
prompt_batch = lm_tokenizer(prompt_texts, return_tensors="pt", padding=True)  # (8, P), left-padded
with torch.random.fork_rng():  # its own seed: the draws of the cells below stay as they were
    torch.manual_seed(tiny.seed)
    rollout = sample(sft_lm, prompt_batch["input_ids"], prompt_batch["attention_mask"], tiny.ppo.max_new_tokens,
                     lm_tokenizer.eos_token_id, lm_tokenizer.pad_token_id)
responses = rollout.sequences[:, prompt_batch["input_ids"].shape[1]:]  # (8, R): pad after each row's EOS
lengths = mask_to_first_eos(responses, lm_tokenizer.eos_token_id).sum(1).long()  # (8,): |y|, the episode length
ended = (responses == lm_tokenizer.eos_token_id).any(1)  # (8,): wrote EOS; else cut at max_new_tokens
tokens = lm_tokenizer.convert_ids_to_tokens(responses[0, : lengths[0]].tolist())  # episode 0's actions
print("x =", repr(prompt_texts[0]))
for t in range(min(4, len(tokens))):  # its first steps
    print(f"s_{t} = (x, {tokens[:t]}),  a_{t} = {tokens[t]!r}")
display(pd.DataFrame({"episode length |y|": lengths.tolist(),
                      "ended by": ["EOS" if eos else "cut at max_new_tokens" for eos in ended.tolist()]},
                     index=pd.Index(prompt_texts, name="prompt x")))


# %% [markdown]
# ## 3. A toy language with a reward
#
# Nothing in this MDP's maths is specific to language, so we study it on four words. The policy writes
# $T = 6$ words from `good`, `fine`, `bad`, `!`; the state is the position $t$ and the previous word $p$
# (a start symbol at $t = 0$). Word $a$ earns
#
# $$
# r(t, p, a) = \begin{cases}
#   +1 & \text{if } t = T-1 \text{ and } a = \texttt{!} \quad\text{(the final score)}\\
#   w(a) & \text{otherwise, with } w = (0.3,\ 0.1,\ -0.3,\ -0.2) \text{ for good, fine, bad, !}
# \end{cases}
# \;-\; 0.5\,[a = p].
# $$
#
# The best sentence, `good fine good fine good !`, returns $2.1$. The policy is a table of logits
# $\theta[t, p, \cdot]$ (for a language model, a transformer's output), and $\pi_\theta(\cdot \mid t, p) = \operatorname{softmax}(\theta[t, p])$.

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

# %%
def sample(theta: torch.Tensor, n: int, generator: torch.Generator
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n sentences from the policy with logits theta: words, previous words and rewards, each (n, T)."""
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
# ## 4. The exact values, by dynamic programming
#
# The Bellman equations, run backwards from the end, give every value exactly:
#
# $$Q(t, p, a) = r(t, p, a) + V(t+1, a), \qquad V(t, p) = \sum_a \pi_\theta(a \mid t, p)\, Q(t, p, a), \qquad V(T, \cdot) = 0.$$
#
# $J(\theta) = V(0, \text{start})$ is differentiable: autograd gives the **exact** policy gradient.

# %%
def exact_values(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    """The exact policy gradient dJ/dtheta, by autograd through the dynamic programme: (T, N_WORDS+1, N_WORDS)."""
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
# Write the objective as a sum over whole episodes $\tau$ with return $R(\tau)$,
# $J(\theta) = \sum_\tau p_\theta(\tau)\, R(\tau)$, and use the **log-derivative trick** $\nabla p = p\, \nabla \log p$:
#
# $$\nabla_\theta J = \mathbb{E}_{\tau \sim \pi_\theta}\big[\nabla_\theta \log p_\theta(\tau)\, R(\tau)\big]
# = \mathbb{E}_{\tau \sim \pi_\theta}\Big[\sum_{t=0}^{T-1} \nabla_\theta \log \pi_\theta(a_t \mid s_t)\, \Phi_t\Big], \qquad \Phi_t = R(\tau).$$
#
# ($\log p_\theta(\tau)$ is the sum of the policy's $\log \pi_\theta(a_t \mid s_t)$ and the environment's
# log-probs, whose gradient is 0.) Other weights $\Phi_t$ have the same expectation:
#
# | name | $\Phi_t$ | why it is still unbiased |
# |---|---|---|
# | total return (REINFORCE) | $R(\tau) = \sum_{t'} r_{t'}$ | the derivation above |
# | reward-to-go | $G_t = \sum_{t' \ge t} r_{t'}$ | rewards before $t$ do not depend on $a_t$, and $\mathbb{E}_{a_t}[\nabla \log \pi(a_t \mid s_t)] = 0$ |
# | reward-to-go minus a baseline | $G_t - b(s_t)$ | $\mathbb{E}[\nabla \log\pi(a_t \mid s_t)\, b(s_t)] = 0$ for any $b$ of the state alone |
# | advantage | $A(s_t, a_t) = Q(s_t, a_t) - V(s_t)$ | the expectation of the previous row given $(s_t, a_t)$, with $b = V$ |
#
# For the tabular softmax, $\nabla_{\theta[s]} \log \pi(a \mid s) = e_a - \pi(\cdot \mid s)$; below, each episode's
# gradient built from it and checked against autograd, and $G_t$.

# %%
def per_episode_gradients(theta: torch.Tensor, words: torch.Tensor, prevs: torch.Tensor,
                          phi: torch.Tensor) -> torch.Tensor:
    """Each episode's sum_t grad log pi(a_t|s_t) * phi_t: (N, T) inputs -> (N, T, N_WORDS+1, N_WORDS)."""
    n = words.shape[0]
    pi = torch.softmax(theta[torch.arange(T), prevs], dim=-1)  # (N, T, N_WORDS)
    score = F.one_hot(words, N_WORDS).float() - pi  # (N, T, N_WORDS): e_a - pi(.|s)
    grads = torch.zeros(n, T, N_WORDS + 1, N_WORDS)
    grads[torch.arange(n)[:, None], torch.arange(T)[None, :], prevs] = score * phi[..., None]
    return grads


theta_random = torch.randn(T, N_WORDS + 1, N_WORDS)  # a random policy
words, prevs, rewards = sample(theta_random, 32, gen)
phi = rewards.sum(1, keepdim=True).expand(-1, T)  # (32, T): total return
theta_leaf = theta_random.clone().requires_grad_(True)
logp = rlhf_helpers.logprobs_from_logits(theta_leaf[torch.arange(T), prevs], words)  # (32, T): log pi(a_t|s_t)
(autograd_grad,) = torch.autograd.grad((logp * phi).sum(1).mean(), theta_leaf)
torch.testing.assert_close(per_episode_gradients(theta_random, words, prevs, phi).mean(0), autograd_grad)
print("closed-form score matches autograd")



def g_t(rewards: torch.Tensor) -> torch.Tensor:
    """Reward-to-go G_t = sum_{t' >= t} r_t': (N, T) -> (N, T)."""
    return rewards.flip(1).cumsum(1).flip(1)  # (N, T): a cumulative sum run from the end

# %% [markdown]
# ## Deep dive: measuring the variance of each estimator
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# An estimate of the gradient averages $N = 16$ episodes. We draw $K = 400$ such estimates, from
# independent episodes, and compute each choice of $\Phi_t$ on the same episodes (a paired comparison).
# For each we report
# - the **total variance** $\sum_i \operatorname{Var}_k[\hat g_{k,i}]$ over all parameters $i$;
# - the squared **bias** $\lVert \bar g - \nabla J \rVert^2$ of the mean $\bar g$ of the $K$ estimates
#   against the exact gradient. For an unbiased estimator its expectation is the variance $/K$ (the
#   noise level of the mean), so a bias² of that size is what no bias looks like.
#
# The baseline and the advantage use the exact $V$ and $Q$ here, to isolate the effect of the choice of
# $\Phi_t$ (section 6 learns them). First, the four choices as code.

# %%
def phis(theta: torch.Tensor, words: torch.Tensor, prevs: torch.Tensor,
         rewards: torch.Tensor) -> dict[str, torch.Tensor]:
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

# %%
def measure_variance(theta: torch.Tensor, n_per_estimate: int = 16, n_estimates: int = 400,
                     seed: int = 0) -> dict[str, dict[str, float]]:
    """Per choice of Phi_t: total variance of an n_per_estimate-episode estimate, bias^2, and variance / K."""
    generator = torch.Generator().manual_seed(seed)
    words, prevs, rewards = sample(theta, n_per_estimate * n_estimates, generator)
    truth = exact_gradient(theta).flatten()  # (P,)
    rows = {}
    for name, phi in phis(theta, words, prevs, rewards).items():
        grads = per_episode_gradients(theta, words, prevs, phi)  # (N*K, T, N_WORDS+1, N_WORDS)
        estimates = grads.reshape(n_estimates, n_per_estimate, -1).mean(1)  # (K, P)
        rows[name] = {
            "variance": estimates.var(0).sum().item(),
            "bias^2": ((estimates.mean(0) - truth) ** 2).sum().item(),
            "var/K": estimates.var(0).sum().item() / n_estimates,
        }
    return rows

# %%
# A partly trained policy: a few exact-gradient steps from uniform.
trained = uniform.clone()
for _ in range(20):
    trained = trained + 2.0 * exact_gradient(trained)
print(f"J(partly trained policy) = {expected_return(trained):.3f}")

variance_at = {"uniform policy": measure_variance(uniform), "partly trained policy": measure_variance(trained)}
variance_table = pd.DataFrame([{"policy": policy_name, "Phi_t": name, **row}
                               for policy_name, rows in variance_at.items() for name, row in rows.items()])
variance_table["bias^2 / (var/K)"] = variance_table["bias^2"] / variance_table["var/K"]
display(variance_table.set_index(["policy", "Phi_t"]).round(5))

# %%
fig = go.Figure()
for policy_name, rows in variance_at.items():
    fig.add_bar(name=policy_name, x=list(rows), y=[row["variance"] for row in rows.values()])
fig.update_layout(title="Total variance of a 16-episode policy-gradient estimate",
                  yaxis_title="sum of per-parameter variances", yaxis_type="log", barmode="group")
fig.show()

# %% [markdown]
# Reading the numbers: at both policies the **variance falls from each row to the next**, while every
# bias² stays **below 3 × var/K**, at the noise level of an unbiased estimator: only the variance changes.
# - **reward-to-go** drops the rewards collected before $t$: they cannot be caused by $a_t$ and only add
#   noise to its weight;
# - **subtracting $V(s_t)$** centres the weight: an action is pushed up only if it did better than usual
#   from that state, instead of every action being pushed up whenever returns are positive;
# - the **advantage** $Q - V$ also removes the randomness of the *later* actions. How much of the
#   remaining variance that is depends on the policy: at the uniform policy, whose later actions are
#   most random, the advantage cuts the variance of reward-to-go $- V$ by more than 3×; at the partly
#   trained policy by less than 3× (about 2×).

# %% tags=["claim-check"]
falls = {policy_name: all(later["variance"] < earlier["variance"] for earlier, later in zip(
    list(rows.values()), list(rows.values())[1:], strict=False)) for policy_name, rows in variance_at.items()}
cut = {policy_name: rows["reward-to-go - V(s)"]["variance"] / rows["advantage Q - V"]["variance"]
       for policy_name, rows in variance_at.items()}
check_claims({
    "the variance falls from each row to the next, at both policies": all(falls.values()),
    "every bias^2 is below 3 x var/K": bool((variance_table["bias^2 / (var/K)"] < 3).all()),
    "the advantage cuts the variance of reward-to-go - V by more than 3x at the uniform policy":
        cut["uniform policy"] > 3,
    "and by less than 3x at the partly trained policy": cut["partly trained policy"] < 3,
})

# %% [markdown]
# ## 6. Actor-critic: learning the baseline
#
# An **actor-critic** learns a critic $V_w(s)$ by regression on the reward-to-go,
# $\min_w \tfrac12 (V_w(s_t) - G_t)^2$, and **bootstraps**: the critic's value of the next state replaces the
# rest of the return in the TD error
#
# $$\hat A_t = \delta_t = r_t + V_w(s_{t+1}) - V_w(s_t), \qquad V_w(s_T) = 0.$$
#
# PPO is an actor-critic (its GAE advantage, notebook 03, interpolates between $\delta_t$ and $G_t - V_w(s_t)$).

# %% [markdown]
# ### How the exercise checks work
#
# A check prints **PASSED**, **FAILED** (what differs, and a hint) or **NOT DONE** (the stub still raises). It
# compares your function with an independent loop on inputs it chooses, hides the library function the
# exercise teaches, and fails in-place changes to inputs. PASSED is evidence, not a proof.

# %%
# Part of the exercise checks below: it compares an answer with their loop definition and says where it differs.
def check_matches(got: object, expected: torch.Tensor, name: str, known: dict[str, torch.Tensor],
                     labels: tuple[str, str] = ("episode", "t")) -> None:
    """Raise AssertionError unless `got` matches `expected` (a 2-D tensor): say at which columns it
    differs, and name the mistake when `got` matches one of `known` (description -> what it computes)."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise AssertionError(f"your {name} has shape {shape}, expected {tuple(expected.shape)}")
    close = torch.isclose(got.float(), expected, rtol=1.3e-6, atol=1e-5)  # (rows, columns)
    if close.all():
        return
    row, col = labels
    good = [j for j in range(expected.shape[1]) if close[:, j].all()]
    bad = [j for j in range(expected.shape[1]) if j not in good]
    i, j = (~close).nonzero()[0].tolist()
    where = f"matches for {col} in {good} and differs" if good else "differs"
    message = (f"your {name} {where} at {col} = {bad} ({row} {i}, {col} = {j}: got {got[i, j].item():.4f}, "
               f"expected {expected[i, j].item():.4f})")
    for description, wrong in known.items():
        if torch.allclose(got.float(), wrong, rtol=1.3e-6, atol=1e-5):
            message += f": it equals {description}"
            break
    raise AssertionError(message)

# %% [markdown]
# ### Exercise 1: the one-step TD advantage
#
# Write `td_advantage(rewards, values)`: rewards and critic values $V_w(s_t)$ are (N, T); return
# $\delta_t = r_t + V_w(s_{t+1}) - V_w(s_t)$ with $V_w(s_T) = 0$, shape (N, T).

# %%
# EXERCISE 1
def td_advantage(rewards: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """delta_t = r_t + V(s_{t+1}) - V(s_t), V after the last step = 0: (N, T), (N, T) -> (N, T)."""
    raise NotImplementedError

# %%
def check_td_advantage():
    generator = torch.Generator().manual_seed(2)
    r, v = torch.randn(4, T, generator=generator), torch.randn(4, T, generator=generator)  # (4, T) each
    expected = torch.empty(4, T)
    for t in range(T):  # loop definition
        v_next = v[:, t + 1] if t + 1 < T else torch.zeros(4)
        expected[:, t] = r[:, t] + v_next - v[:, t]
    check_matches(td_advantage(r.clone(), v.clone()), expected, "TD advantage", known={
        "r_t - V(s_t): the bootstrap term V(s_{t+1}) is missing": r - v,
        "r_t + V(s_{t-1}) - V(s_t): the previous state's value in place of the next state's":
            r + F.pad(v[:, :-1], (1, 0)) - v,
        "a wrap-around at the end (torch.roll?): after the last step V is 0, not V(s_0)": r + v.roll(-1, 1) - v,
        "r_t - V(s_{t+1}) + V(s_t): the two values' signs are swapped": r - F.pad(v[:, 1:], (0, 1)) + v,
    })


exercise_check("Exercise 1 (td_advantage)", check_td_advantage,
               hidden=[rlhf_helpers.td_errors, rlhf_helpers.compute_gae, rlhf_helpers.gae_reference])

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def td_advantage(rewards: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
#     """delta_t = r_t + V(s_{t+1}) - V(s_t), V after the last step = 0: (N, T), (N, T) -> (N, T)."""
#     next_values = F.pad(values[:, 1:], (0, 1))  # (N, T): V(s_{t+1}), 0 after the end
#     return rewards + next_values - values
# ```
# </details>

# %% [markdown]
# ### Deep dive: REINFORCE against actor-critic on the toy
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Now train the same policy three ways for 150 iterations of 8 episodes each, plain gradient ascent
# $\theta \leftarrow \theta + \eta \hat g$, and plot the exact $J(\theta)$ after every step
# (mean of 5 seeds): REINFORCE with reward-to-go, reward-to-go minus the learned critic, and the
# actor-critic with the TD advantage.

# %%
def td_reference(rewards: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Reference TD errors (independent of Exercise 1): (N, T), (N, T) -> (N, T)."""
    return rewards + F.pad(values[:, 1:], (0, 1)) - values  # (N, T)


def train(method: str, iterations: int = 150, n: int = 8, lr: float = 1.0, critic_lr: float = 1.0,
          seed: int = 0) -> list[float]:
    """Train from the uniform policy with one of the three methods; the exact J after every step."""
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

# %%
methods = ["REINFORCE, reward-to-go", "REINFORCE, reward-to-go - critic", "actor-critic, TD advantage"]
seeds = range(5)
curves = {}
for method in tqdm(methods, desc="training", leave=False):  # the bar goes away when done
    runs = torch.tensor([train(method, seed=s) for s in seeds])  # (seeds, iterations)
    curves[method] = runs.mean(0)
best_j = expected_return(best).item()

fig = go.Figure()
for method, curve in curves.items():
    fig.add_scatter(y=curve.tolist(), name=method, mode="lines")
fig.add_hline(y=best_j, line_dash="dot", annotation_text="best sentence")
fig.update_layout(title="Exact expected return while training (mean of 5 seeds, 8 episodes per step)",
                  xaxis_title="iteration", yaxis_title="J(theta)")
fig.show()
training_table = pd.DataFrame({"J after 25 steps": {m: c[24].item() for m, c in curves.items()},
                               "J after 150 steps": {m: c[-1].item() for m, c in curves.items()}})
training_table["below the best sentence's J = 2.1"] = best_j - training_table["J after 150 steps"]
display(training_table.round(3))

# %% [markdown]
# On this six-word problem all three methods end **within 0.1 of the best sentence's** $J = 2.1$: with 8
# episodes per step even the plain reward-to-go estimate is usable. After 25 steps the **actor-critic is
# the lowest**, by more than 0.05. Its critic starts at zero, so at first $\delta_t = r_t$: only the
# word's own reward, and the final score reaches the earlier words only as the critic learns their values.
# That bias costs nothing to the middle method, whose critic is only a baseline. A critic pays off when
# episodes are long and the return is one noisy number at the end, which is the LLM case (hundreds of
# tokens, one reward-model score). The paired measurement of the variance deep dive is the cleaner comparison of the
# estimators themselves.

# %% tags=["claim-check"]
after_25 = training_table["J after 25 steps"]
check_claims({
    "all three end within 0.1 of the best sentence's J": bool((training_table.iloc[:, 2] < 0.1).all()),
    "the actor-critic is the lowest after 25 steps, by more than 0.05":
        after_25.drop("actor-critic, TD advantage").min() - after_25["actor-critic, TD advantage"] > 0.05,
})

# %% [markdown]
# ## 7. Reusing a batch: the surrogate objective, the trust region and PPO's clip
#
# Sampling is the expensive part of RLHF, so PPO takes several gradient steps on each batch. After the
# first, the batch comes from the policy that collected it, $\pi_{\text{old}}$. Importance weighting by the
# ratio $\rho_t = \pi_\theta(a_t \mid s_t) / \pi_{\text{old}}(a_t \mid s_t)$ corrects the **actions**; the batch then
# estimates the **surrogate objective** (TRPO's $L$, PPO's $L^{\text{CPI}}$) $\hat{\mathbb{E}}_t[\rho_t \hat A_t]$,
# with $\hat{\mathbb{E}}_t$ the mean over the batch's steps and $\hat A_t$ an advantage estimated under
# $\pi_{\text{old}}$. At $\theta_{\text{old}}$, where every $\rho_t = 1$ and $\nabla_\theta \rho_t = \nabla_\theta \log \pi_\theta(a_t \mid s_t)$,
# its gradient is section 5's with $\Phi_t = \hat A_t$. But the **states** stay those the old policy
# visits, so the surrogate tracks $J$ only near $\theta_{\text{old}}$, and a step's size in parameter space
# says little about how far the policy moves. **TRPO** maximises the surrogate inside a KL ball,
#
# $$\max_\theta\ \hat{\mathbb{E}}_t\big[\rho_t\, \hat A_t\big]
# \quad\text{s.t.}\quad \hat{\mathbb{E}}_t\big[\mathrm{KL}(\pi_{\text{old}}(\cdot \mid s_t)\,\Vert\,\pi_\theta(\cdot \mid s_t))\big] \le \delta_{\text{KL}},$$
#
# with second-order machinery. **PPO** changes the objective instead:
#
# $$J^{\text{CLIP}}(\theta) = \hat{\mathbb{E}}_t\big[\min\big(\rho_t \hat A_t,\ \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\,\hat A_t\big)\big]
# \quad\text{(maximised)}.$$
#
# Once a ratio has left $[1-\epsilon, 1+\epsilon]$ in the helpful direction (above $1+\epsilon$ when
# $\hat A_t > 0$, below $1-\epsilon$ when $\hat A_t < 0$), its term is flat and its gradient zero. That removes
# the **incentive**, not the movement: shared parameters and a long step can still carry a ratio past the
# band. From notebook 04 on, the loss is $L^{\text{CLIP}} = -J^{\text{CLIP}}$ (the code's `policy_loss`). The
# deep dive at the end measures both effects on the toy: a large step, and many steps on one batch.

# %% [markdown]
# ### Exercise 2: the KL between two softmax policies
#
# Write `policy_kl(old_logits, new_logits)`, $\mathrm{KL}(\pi_{\text{old}} \Vert \pi_{\text{new}}) =
# \sum_a \pi_{\text{old}}(a)\,(\log \pi_{\text{old}}(a) - \log \pi_{\text{new}}(a))$ over the last dimension of
# logits (..., V). A KL is also a loss term, so the check compares its gradients with respect to both
# logits $z$ too:
#
# $$\frac{\partial\, \mathrm{KL}}{\partial z_{\text{new}}} = \pi_{\text{new}} - \pi_{\text{old}}, \qquad
# \frac{\partial\, \mathrm{KL}}{\partial z_{\text{old}}(v)} = \pi_{\text{old}}(v)\,\big(\log \pi_{\text{old}}(v) - \log \pi_{\text{new}}(v) - \mathrm{KL}\big).$$

# %%
# EXERCISE 2
def policy_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(old) || softmax(new)) over the last dimension: (..., V), (..., V) -> (...)."""
    raise NotImplementedError

# %%
def check_policy_kl():
    generator = torch.Generator().manual_seed(4)
    old, new = torch.randn(3, 5, N_WORDS, generator=generator), torch.randn(3, 5, N_WORDS, generator=generator)
    expected = torch.zeros(3, 5)  # a loop over the vocabulary: sum_v p_old(v) (log p_old(v) - log p_new(v))
    for i in range(3):
        for j in range(5):
            z_old = sum(math.exp(x) for x in old[i, j].tolist())
            z_new = sum(math.exp(x) for x in new[i, j].tolist())
            expected[i, j] = sum(math.exp(a) / z_old * ((a - math.log(z_old)) - (b - math.log(z_new)))
                                 for a, b in zip(old[i, j].tolist(), new[i, j].tolist(), strict=True))
    p_old, p_new = old.softmax(-1), new.softmax(-1)  # (3, 5, V)
    got = policy_kl(old.clone(), new.clone())
    if isinstance(got, torch.Tensor) and got.shape == old.shape:
        raise AssertionError(f"your KL has shape {tuple(got.shape)}, one value per action: the sum over the "
                             "actions (the last dimension) is missing")
    check_matches(got, expected, "KL", known={
        "KL(new || old): the direction is swapped, the expectation must be over the OLD policy":
            (p_new * (p_new.log() - p_old.log())).sum(-1),
        "sum_a p_old (p_old - p_new): probabilities where the formula has log-probabilities":
            (p_old * (p_old - p_new)).sum(-1),
        "the logits used as log-probabilities: log_softmax is missing": (p_old * (old - new)).sum(-1),
        "a mean over the actions where the formula has a sum": (p_old * (p_old.log() - p_new.log())).mean(-1),
    }, labels=("row", "column"))
    assert torch.all(policy_kl(old, old).abs() < 1e-6), "KL of a policy with itself must be 0"
    weights = torch.randn(3, 5, generator=generator)  # (3, 5): a loss's d/d KL
    old_leaf, new_leaf = old.clone().requires_grad_(True), new.clone().requires_grad_(True)  # (3, 5, V) each
    got_old, got_new = torch.autograd.grad((policy_kl(old_leaf, new_leaf) * weights).sum(), (old_leaf, new_leaf),
                                           allow_unused=True)
    log_ratio = p_old.log() - p_new.log()  # (3, 5, V)
    for name, grad, want in (("new", got_new, weights[..., None] * (p_new - p_old)),
                             ("old", got_old, weights[..., None] * p_old * (log_ratio - expected[..., None]))):
        assert grad is not None and grad.abs().max() > 0, (
            f"no gradient reaches the {name} logits: they are cut from the graph (.detach()?), so a KL penalty "
            "or constraint could not move that policy")
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5,
                                   msg=f"the gradient with respect to the {name} logits differs from its closed form")


exercise_check("Exercise 2 (policy_kl)", check_policy_kl,
               hidden=[torch.distributions.kl.kl_divergence])

# %% [markdown]
# <details><summary>Solution 2</summary>
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
# ## 8. From the toy to a language model: the log-probs of the response tokens
#
# With a language model, $\log \pi_\theta(a_t \mid s_t)$ is the same gather from the logits, and three
# details of a batch's layout decide which numbers are right:
# 1. **Shift by one.** The logits $z_t$ at position $t$ predict the **next** token:
#    $\log \pi_\theta(x_t \mid x_{<t}) = z_{t-1}[x_t] - \log \sum_v e^{z_{t-1}[v]}$.
# 2. **Left padding** makes every row end at the last column, as batched generation needs; pads are not text.
# 3. **Only the response is an action**; the prompt is the given initial state.
#
# So row $i$ (`pad ... pad | prompt | response`, attention mask $a_i$, $P_i$ prompt tokens) starts its
# response at column $c_i = (L - \sum_t a_{i,t}) + P_i$, and
#
# $$\ell_{i,t} = \begin{cases} z_{i,t-1}[x_{i,t}] - \log \sum_v e^{z_{i,t-1}[v]} & t \ge c_i \quad\text{(a response token)} \\ 0 & t < c_i \quad\text{(padding or prompt)}. \end{cases}$$

# %% [markdown]
# ### Exercise 3: the response log-probs of a left-padded batch
#
# Write `response_logprobs(logits, input_ids, attention_mask, prompt_lengths)`: logits (B, L, V), tokens and
# mask (B, L), prompt lengths (B,) give $\ell$ (B, L), without a Python loop (`logprobs_from_logits` is
# hidden). The check compares the gradient with respect to the logits too.

# %%
# EXERCISE 3
def response_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      prompt_lengths: torch.Tensor) -> torch.Tensor:
    """log pi(x_t | x_<t) on each response token, 0 elsewhere: (B, L, V), (B, L), (B, L), (B,) -> (B, L)."""
    raise NotImplementedError

# %%
# Part of the check below: the loop it compares your answer with, what some mistakes compute, and the gradient.
def logprob_loop(logits: torch.Tensor, input_ids: torch.Tensor, starts: list[int], source: int = -1,
                 strict: bool = False) -> torch.Tensor:
    """l[i, t] = log softmax(z[i, t + source])[x[i, t]] where t >= starts[i] (t > with strict), else 0: (B, L)."""
    table = torch.zeros(input_ids.shape, dtype=logits.dtype)  # (B, L)
    for i, start in enumerate(starts):
        for t in range(input_ids.shape[1]):
            if (t > start if strict else t >= start) and 0 <= t + source < input_ids.shape[1]:
                z = logits[i, t + source]  # (V,): the logits that score token t
                table[i, t] = z[input_ids[i, t]] - torch.logsumexp(z, dim=0)
    return table


def detached_normaliser_grad(weights: torch.Tensor, input_ids: torch.Tensor, starts: list[int], vocab: int
                             ) -> torch.Tensor:
    """d sum(w * l) / d z when log sum exp z is detached: w[i, t] on the chosen logit z[i, t-1, x_t] only."""
    grad = torch.zeros(*input_ids.shape, vocab, dtype=weights.dtype)  # (B, L, V)
    for i, start in enumerate(starts):
        for t in range(start, input_ids.shape[1]):
            grad[i, t - 1, input_ids[i, t]] = weights[i, t]
    return grad


def check_response_gradient(got: torch.Tensor, expected: torch.Tensor, logits: torch.Tensor,
                            weights: torch.Tensor, detached: torch.Tensor) -> None:
    """Raise AssertionError unless d sum(w * got) / d logits equals the loop's, naming a detached normaliser."""
    assert got.requires_grad, "no gradient reaches the logits: the log-probs were rebuilt outside the graph"
    grad, expected_grad = (torch.autograd.grad((x * weights).sum(), logits)[0] for x in (got, expected))  # (B, L, V)
    assert not torch.allclose(grad, detached), (
        "the values are right but the gradient is not: the normaliser log sum exp z was detached, so a step "
        "would push the chosen logit up without pushing the other tokens' logits down")
    torch.testing.assert_close(grad, expected_grad, msg="the values are right but the gradient with respect "
                               "to the logits is not")

# %%
def check_response_logprobs():
    generator = torch.Generator().manual_seed(5)
    layout = [(0, 3), (2, 4), (4, 1), (1, 5), (5, 3)]  # (pads, prompt tokens) per row; L = 9, responses 6, 3, 4, 3, 1
    B, L, V = len(layout), 9, 6
    mask = torch.tensor([[0] * pads + [1] * (L - pads) for pads, _ in layout])  # (B, L): left padding
    prompt_lengths = torch.tensor([p for _, p in layout])  # (B,)
    ids = torch.randint(1, V, (B, L), generator=generator).masked_fill(mask == 0, 0)  # (B, L): pad id 0
    logits = (2 * torch.randn(B, L, V, generator=generator)).requires_grad_(True)  # (B, L, V)
    weights = torch.randn(B, L, generator=generator)  # (B, L): a loss's d/d l
    starts = [pads + p for pads, p in layout]  # c_i
    expected = logprob_loop(logits, ids, starts)  # (B, L), differentiable
    got, z = response_logprobs(logits, ids.clone(), mask.clone(), prompt_lengths.clone()), logits.detach()
    check_matches(got.detach() if isinstance(got, torch.Tensor) else got, expected.detach(), "log-probs", known={
        "token t scored by the logits at position t, which predict token t+1: shift the logits by one":
            logprob_loop(z, ids, starts, source=0),
        "one column off: column t holds token t+1's log-prob (the padding added on the wrong side?)":
            F.pad(logprob_loop(z, ids, [s + 1 for s in starts])[:, 1:], (0, 1)),
        "log-probs before the response in padded rows: the response starts after the left padding, at "
        "(L - sum of the mask) + prompt length, not at the prompt length": logprob_loop(z, ids, [p for _, p in layout]),
        "log-probs on the prompt tokens: the prompt is given, not chosen by the policy; only the response "
        "is scored": logprob_loop(z, ids, [pads for pads, _ in layout]),
        "the first response token is 0: the response starts at column (pads + prompt length) itself":
            logprob_loop(z, ids, starts, strict=True),
    }, labels=("row", "column"))
    check_response_gradient(got, expected, logits, weights, detached_normaliser_grad(weights, ids, starts, V))
    extreme = z.clone()
    extreme[0, L - 2, ids[0, L - 1]] = -800.0  # the last token of row 0 at a probability of about e^-800
    assert torch.isfinite(response_logprobs(extreme, ids, mask, prompt_lengths)[0, L - 1]), (
        "a response token of probability about e^-800 got -inf: softmax rounds it to 0 before the log; "
        "use log_softmax, or z - logsumexp(z), which never form that probability")


exercise_check("Exercise 3 (response_logprobs)", check_response_logprobs,
               hidden=[rlhf_helpers.logprobs_from_logits])

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def response_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
#                       prompt_lengths: torch.Tensor) -> torch.Tensor:
#     """log pi(x_t | x_<t) on each response token, 0 elsewhere: (B, L, V), (B, L), (B, L), (B,) -> (B, L)."""
#     L = input_ids.shape[1]
#     z = logits[:, :-1]  # (B, L-1, V): position t-1's logits predict token t
#     token_logp = z.gather(-1, input_ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)  # (B, L-1)
#     start = (L - attention_mask.sum(dim=1)) + prompt_lengths  # (B,): after the pads and the prompt
#     is_response = torch.arange(L, device=input_ids.device)[None, :] >= start[:, None]  # (B, L)
#     return F.pad(token_logp, (1, 0)) * is_response  # (B, L): column t holds token t's log-prob, 0 off the response
# ```
# </details>

# %% [markdown]
# ## Deep dive: one large step, many steps on one batch, and the lemma behind the surrogate
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Three measurements on the toy behind section 7: what one over-large step does to the policy; what 30
# steps on one batch do with and without the clip; and the performance-difference lemma, which shows why
# the surrogate matches $J$ only near the old policy, with TRPO's bound.

# %% [markdown]
# ### One over-large step
#
# Take **one** step from the uniform policy with a 16-episode estimate (reward-to-go minus the exact $V$)
# and a growing step size $\eta$. Measure the KL between the old and the new policy, averaged over the
# states the old policy visits, and the new policy's entropy (0 = deterministic); then continue for 60
# ordinary steps ($\eta = 1$, fresh episodes every step) and see where each run ends.

# %%
def state_occupancy(theta: torch.Tensor) -> torch.Tensor:
    """d_t(p): probability that the policy visits state (t, p): (T, N_WORDS+1)."""
    pi = torch.softmax(theta, dim=-1)  # (T, N_WORDS+1, N_WORDS)
    d = F.one_hot(torch.tensor(START), N_WORDS + 1).float()  # (N_WORDS+1,)
    visits = []
    for t in range(T):
        visits.append(d)
        d = F.pad((d[:, None] * pi[t]).sum(0), (0, 1))  # (N_WORDS+1,): next previous word is a
    return torch.stack(visits)


def policy_kl_reference(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
    """KL(old || new) of softmax policies over the last dimension: (..., V), (..., V) -> (...)."""
    old_logp, new_logp = old_logits.log_softmax(-1), new_logits.log_softmax(-1)
    return (old_logp.exp() * (old_logp - new_logp)).sum(-1)


def mean_kl(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """(1/T) sum_t E_{s_t ~ d_t of the old policy} KL(old || new): the average KL over the old policy's states."""
    return (state_occupancy(old) * policy_kl_reference(old, new)).sum() / T


def mean_entropy(theta: torch.Tensor) -> torch.Tensor:
    """The policy's entropy averaged over the states it visits (max ln 4 for four words)."""
    logp = theta.log_softmax(-1)  # (T, N_WORDS+1, N_WORDS)
    return (state_occupancy(theta) * -(logp.exp() * logp).sum(-1)).sum() / T


# %%
def centred_return(theta: torch.Tensor, words: torch.Tensor, prevs: torch.Tensor,
                   rewards: torch.Tensor) -> torch.Tensor:
    """Reward-to-go minus the exact V(s_t) of the policy theta: (N, T) -> (N, T)."""
    return g_t(rewards) - exact_values(theta)[0][torch.arange(T), prevs]  # (N, T)


def ordinary_steps(theta: torch.Tensor, steps: int, generator: torch.Generator) -> list[float]:
    """`steps` plain steps (eta = 1, 16 fresh episodes, reward-to-go minus V); the exact J after each."""
    curve = []
    for _ in range(steps):
        words, prevs, rewards = sample(theta, 16, generator)
        phi = centred_return(theta, words, prevs, rewards)  # (16, T)
        theta = theta + 1.0 * per_episode_gradients(theta, words, prevs, phi).mean(0)
        curve.append(expected_return(theta).item())
    return curve

# %%
step_sizes = [0.3, 1, 3, 10, 30, 100, 300]
step_rows = []
for eta in tqdm(step_sizes, desc="step sizes", leave=False):
    first_js, kls, entropies, finals = [], [], [], []
    for seed in range(8):
        generator = torch.Generator().manual_seed(seed)
        words, prevs, rewards = sample(uniform, 16, generator)
        phi = centred_return(uniform, words, prevs, rewards)  # (16, T)
        theta = uniform + eta * per_episode_gradients(uniform, words, prevs, phi).mean(0)
        first_js.append(expected_return(theta).item())
        kls.append(mean_kl(uniform, theta).item())
        entropies.append(mean_entropy(theta).item())
        finals.append(ordinary_steps(theta, 60, generator)[-1])
    step_rows.append({"eta": eta, "J after step": sum(first_js) / 8, "KL(old || new)": sum(kls) / 8,
                      "entropy": sum(entropies) / 8, "final J": sum(finals) / 8,
                      "final J SE": torch.tensor(finals).std().item() / 8**0.5})
step_table = pd.DataFrame(step_rows).set_index("eta")  # means over the 8 seeds
display(step_table.round(3))

# %%
fig = make_subplots(rows=1, cols=4, subplot_titles=("J after the first step",
                                                    "KL(old || new) of the first step",
                                                    "entropy after the first step",
                                                    "J after 60 more ordinary steps"))
for col, key in enumerate(("J after step", "KL(old || new)", "entropy", "final J"), start=1):
    fig.add_scatter(x=step_sizes, y=step_table[key].tolist(), mode="lines+markers", showlegend=False,
                    row=1, col=col)
    fig.update_xaxes(type="log", title_text="first step size eta", row=1, col=col)
fig.update_layout(title=f"One large step from the uniform policy "
                        f"(mean of 8 seeds; max entropy = {math.log(N_WORDS):.2f})")
fit_labels(fig).show()  # long subplot and axis titles wrapped to their panels

# %% [markdown]
# A large first step looks like progress: the policy jumps straight to the actions that did well in
# those 16 episodes, so **$J$ right after the step rises with every larger $\eta$**. But **the entropy
# falls with every larger $\eta$**, and at $\eta = 300$ the policy is nearly deterministic at once (mean
# entropy **below 0.2 nats**, of a maximum $\ln 4 \approx 1.39$). Its exact gradient with respect to the
# logits of state $s$, $d_t(s)\,\pi(a \mid s)\,(Q(s, a) - V(s))$ (with $d_t(s)$ the probability of being in
# $s$), is then nearly zero for every action, because $\pi(a \mid s) \approx 0$ for all but the chosen
# action and $Q - V \approx 0$ for that one; it rarely samples the
# alternatives, and ordinary steps afterwards undo an unlucky commitment only slowly. The final $J$ says
# what that costs: the three smallest step sizes end at about 1.85 to 1.9, less than two standard
# errors apart; **from $\eta = 10$ on, the final $J$ falls with every larger first step**, and
# $\eta = 300$ ends **more than 5 standard errors** below the best step size. With a neural policy the
# damage can be worse, because one step also changes the behaviour in states the batch never visited.
#
# Against a typical trust region of radius $\delta_{\text{KL}} = 0.01$: at $\eta = 100$ the first step's
# mean KL is **about 4.4 nats**, over 400 times the radius; **only the two smallest step sizes
# ($\eta \le 1$) stay inside**.

# %% tags=["claim-check"]
def steadily(column: pd.Series, rising: bool) -> bool:
    """Every value above (rising) or below (falling) the one before it."""
    steps = column.diff().dropna()
    return bool((steps > 0).all()) if rising else bool((steps < 0).all())


peak = step_table["final J"].idxmax()
drop_in_se = ((step_table.loc[peak, "final J"] - step_table.loc[300, "final J"])
              / math.hypot(step_table.loc[peak, "final J SE"], step_table.loc[300, "final J SE"]))
check_claims({
    "J right after the step rises with every larger eta": steadily(step_table["J after step"], rising=True),
    "the entropy falls with every larger eta": steadily(step_table["entropy"], rising=False),
    "the mean entropy at eta = 300 is below 0.2 nats": step_table.loc[300, "entropy"] < 0.2,
    "the three smallest step sizes end between 1.8 and 1.95": bool(step_table["final J"].iloc[:3].between(1.8, 1.95).all()),
    "less than two standard errors apart": step_table["final J"].iloc[:3].max() - step_table["final J"].iloc[:3].min()
                                           < 2 * step_table["final J SE"].iloc[:3].max(),
    "the final J falls with every larger first step from eta = 10 on": steadily(step_table.loc[10:, "final J"], rising=False),
    "eta = 300 ends more than 5 SE below the best step size": drop_in_se > 5,
    "the mean KL of the first step at eta = 100 is about 4.4 nats": 4.3 < step_table.loc[100, "KL(old || new)"] < 4.5,
    "only eta <= 1 stays inside a trust region of 0.01": bool(
        (step_table.loc[:1, "KL(old || new)"] <= 0.01).all() and (step_table.loc[3:, "KL(old || new)"] > 0.01).all()),
})

# %% [markdown]
# ### Several epochs on one batch, with and without the clip
#
# The clip exists so that one batch can be used for several steps. Here is what it changes, on the
# toy: from the uniform policy, sample one batch of 16 episodes, store its log-probs
# $\log \pi_{\text{old}}$ and advantages $\hat A_t$ (reward-to-go minus the exact $V(s_t)$, as
# above), then take 30 plain gradient steps of size $\eta = 5$ on that **same** batch, maximising either
# the batch estimate of the CPI surrogate's gain,
#
# $$\hat J^{\text{CPI}}(\theta) = \frac1N \sum_{i=1}^{N} \sum_{t} \rho_{i,t}\, \hat A_{i,t}
# \quad\text{(the CPI surrogate, unclipped)},$$
#
# or $J^{\text{CLIP}}$ above, summed over $t$ the same way, with $\epsilon = 0.2$. Its loss is
# `rlhf_helpers.policy_loss`, which returns $-J^{\text{CLIP}}$ averaged over all $N T$ tokens, so
# $J^{\text{CLIP}} = -T \cdot$ `policy_loss`. At the first step $\rho = 1$ and both gradients equal
# the policy-gradient estimate of section 5; they part once ratios leave the band. Then, as above,
# each result trains on for 60 ordinary steps ($\eta = 1$, fresh episodes every step), and we compare
# the final $J$ over 16 seeds (same seed, same batch for both: a paired comparison).

# %%
def reuse_one_batch(clip: bool, seed: int, epochs: int = 30, lr: float = 5.0, n: int = 16, eps: float = 0.2,
                    later_steps: int = 60) -> dict:
    """`epochs` gradient steps on one batch from the uniform policy, then `later_steps` ordinary ones."""
    generator = torch.Generator().manual_seed(seed)
    words, prevs, rewards = sample(uniform, n, generator)  # (n, T) each
    adv = centred_return(uniform, words, prevs, rewards)  # (n, T): A_t, fixed for all epochs
    old_logp = rlhf_helpers.logprobs_from_logits(uniform[torch.arange(T), prevs], words)  # (n, T): log pi_old, stored
    mask = torch.ones_like(adv)  # (n, T): every position is a real action
    theta = uniform.clone().requires_grad_(True)  # (T, N_WORDS+1, N_WORDS)
    history = {"J": [], "entropy": [], "outside band": []}
    for _ in range(epochs):
        logp = rlhf_helpers.logprobs_from_logits(theta[torch.arange(T), prevs], words)  # (n, T): log pi_theta
        if clip:
            loss, _ = rlhf_helpers.policy_loss(logp, old_logp, adv, mask, clip_eps=eps)  # mean over n*T
            objective = -T * loss  # J^CLIP: sum over t, mean over episodes
        else:
            objective = (torch.exp(logp - old_logp) * adv).sum(1).mean()  # the CPI surrogate's estimate
        (grad,) = torch.autograd.grad(objective, theta)  # (T, N_WORDS+1, N_WORDS)
        theta = (theta + lr * grad).detach().requires_grad_(True)
        history["J"].append(expected_return(theta).item())
        history["entropy"].append(mean_entropy(theta).item())
        ratio = torch.exp(rlhf_helpers.logprobs_from_logits(theta[torch.arange(T), prevs], words) - old_logp).detach()  # (n, T)
        history["outside band"].append(((ratio - 1).abs() > eps).float().mean().item())
    theta = theta.detach()
    history |= {"kl": mean_kl(uniform, theta).item(), "ratio max": ratio.max().item()}
    history["later J"] = ordinary_steps(theta, later_steps, generator)
    return history


reuse_seeds = range(16)
reuse = {name: [reuse_one_batch(clip, seed) for seed in reuse_seeds]
         for name, clip in (("CPI surrogate, unclipped", False), ("PPO clip", True))}


def seed_mean(runs: list[dict], key: str) -> torch.Tensor:
    """Mean over the seeds of one entry of the runs' histories: (steps,) or a scalar."""
    return torch.tensor([run[key] for run in runs]).mean(0)

# %%
fig = make_subplots(rows=1, cols=3, subplot_titles=("J while reusing one batch", "entropy while reusing one batch",
                                                    "J during 60 ordinary steps afterwards"))
for name, runs in reuse.items():
    color = "crimson" if name.startswith("CPI") else "royalblue"
    for col, key in enumerate(("J", "entropy", "later J"), start=1):
        fig.add_scatter(y=seed_mean(runs, key).tolist(), name=name, legendgroup=name, showlegend=col == 1,
                        mode="lines", line_color=color, row=1, col=col)
fig.update_xaxes(title_text="step on the same batch", row=1, col=1)
fig.update_xaxes(title_text="step on the same batch", row=1, col=2)
fig.update_xaxes(title_text="ordinary step", row=1, col=3)
fig.update_layout(title=f"30 steps on one batch (eta 5, eps 0.2), then ordinary training "
                        f"(mean of {len(reuse_seeds)} seeds)")
fit_labels(fig).show()  # long subplot and axis titles wrapped to their panels

# %%
reuse_table = pd.DataFrame({name: {
    "J after 30 steps on the batch": seed_mean(runs, "J")[-1].item(),
    "KL(old || new)": seed_mean(runs, "kl").item(),
    "entropy": seed_mean(runs, "entropy")[-1].item(),
    "largest ratio on the batch": seed_mean(runs, "ratio max").item(),
    "share of ratios outside [0.8, 1.2] after step 1": seed_mean(runs, "outside band")[0].item(),
    "share of ratios outside [0.8, 1.2] after step 30": seed_mean(runs, "outside band")[-1].item(),
    "J after 60 more ordinary steps": seed_mean(runs, "later J")[-1].item(),
} for name, runs in reuse.items()})  # means over the seeds
display(reuse_table.round(3))
unclipped, clipped = reuse["CPI surrogate, unclipped"], reuse["PPO clip"]
final_gap = torch.tensor([c["later J"][-1] - u["later J"][-1]
                          for c, u in zip(clipped, unclipped, strict=True)])  # (seeds,): paired
gap_se = final_gap.std().item() / len(final_gap) ** 0.5
print(f"final J, clip minus unclipped: {final_gap.mean():+.3f} +- {gap_se:.3f} (paired SE), clip ahead in "
      f"{(final_gap > 0).sum().item()} of {len(final_gap)} seeds")

# %% [markdown]
# Without the clip, $\hat J^{\text{CPI}}$ is, at each state of the batch, linear in that state's
# probabilities: it sums $\pi_\theta(a \mid s)\,\hat A / \pi_{\text{old}}(a \mid s)$ over the batch's
# actions there. Its supremum is therefore a deterministic choice at every visited state, of the action
# with the largest summed weighted advantage in these 16 episodes: a softmax with finite logits never
# attains it, only approaches it, and nothing in the objective says stop on the way. The 30 steps head there: the mean KL from the old policy ends **more than 10 times**
# the clipped run's, and the entropy **under a third** of it, the collapse above. Right after the
# reuse, **$J$ is higher without the clip**, since the policy commits to what did well in 16 episodes;
# the 60 ordinary steps afterwards show the price: **the clipped run ends ahead, by more than 3 paired
# standard errors**, in at least 14 of the 16 seeds.
#
# With the clip, a token stops contributing once its ratio leaves the band in the helpful direction,
# so the policy drifts far less over the 30 steps. The clip does **not keep the ratios inside the band**,
# though. A step of $\eta = 5$ is long: the first one, where both objectives still have the same
# gradient, already carries **about half** of the batch's ratios outside $[0.8, 1.2]$. The clip cannot
# undo that; it only stops pushing those tokens further. After 30 steps **most ratios are outside the
# band**, and the largest is **above 1.5** on average over the seeds. The tokens outside on the
# unhelpful side still have a gradient, which pulls their ratios back towards the band, and tokens that
# share a state move each other's probabilities (raising one word lowers the others). So the clip limits
# how far repeated steps on one batch drift (the KL), not where each ratio lands, which is why PPO
# implementations also keep the learning rate small and the epochs few. Notebook 04 measures the same for
# a policy with shared parameters, and notebook 05 in the full loop on a language model. PPO alternates
# the two: a few epochs on a batch, then a fresh batch from the new policy.

# %% tags=["claim-check"]
check_claims({
    "the unclipped mean KL is more than 10x the clipped run's":
        reuse_table.loc["KL(old || new)"].iloc[0] > 10 * reuse_table.loc["KL(old || new)"].iloc[1],
    "the unclipped entropy is under a third of the clipped run's":
        reuse_table.loc["entropy"].iloc[0] < reuse_table.loc["entropy"].iloc[1] / 3,
    "right after the reuse J is higher without the clip": bool(
        reuse_table.loc["J after 30 steps on the batch"].iloc[0] > reuse_table.loc["J after 30 steps on the batch"].iloc[1]),
    "the clipped run ends ahead by more than 3 paired SE": final_gap.mean().item() > 3 * gap_se,
    "in at least 14 of the 16 seeds": (final_gap > 0).sum().item() >= 14,
    "after the first clipped step about half of the ratios are outside the band":
        0.4 < reuse_table.loc["share of ratios outside [0.8, 1.2] after step 1", "PPO clip"] < 0.65,
    "after 30 clipped steps most ratios are outside the band":
        reuse_table.loc["share of ratios outside [0.8, 1.2] after step 30", "PPO clip"] > 0.5,
    "the clipped run's largest ratio is above 1.5 on average": reuse_table.loc["largest ratio on the batch", "PPO clip"] > 1.5,
})

# %% [markdown]
# ### The performance-difference lemma, the CPI surrogate and TRPO's bound
#
# Section 7 stated that the surrogate objective, which a step on old data improves, matches $J$ only
# near the old policy. Here is the proof, and the gap measured on the toy. Write
# $A^{\text{old}} = Q^{\pi_{\text{old}}} - V^{\pi_{\text{old}}}$ for the advantage of the policy that
# collected the data, and $d^{\pi}_t(s)$ for the probability that policy $\pi$ is in state $s$ at step
# $t$ (`state_occupancy` above).
#
# **Performance-difference lemma** (Kakade and Langford, 2002). For any two policies,
#
# $$J(\theta) - J(\theta_{\text{old}}) = \mathbb{E}_{\tau \sim \pi_\theta}\Big[\sum_{t=0}^{T-1} A^{\text{old}}(s_t, a_t)\Big]
# = \sum_{t=0}^{T-1} \mathbb{E}_{s_t \sim d^{\pi_\theta}_t,\ a_t \sim \pi_\theta}\big[A^{\text{old}}(s_t, a_t)\big].$$
#
# Proof: $A^{\text{old}}(s_t, a_t) = \mathbb{E}\big[r_t + V^{\text{old}}(s_{t+1}) \mid s_t, a_t\big] - V^{\text{old}}(s_t)$,
# so along an episode of $\pi_\theta$ the sum telescopes to $\sum_t r_t - V^{\text{old}}(s_0)$ (since
# $V^{\text{old}}(s_T) = 0$), whose expectation is $J(\theta) - J(\theta_{\text{old}})$ because $s_0$ does
# not depend on the policy. (With a discount $\gamma$ and no fixed end, the same steps give
# $\frac{1}{1-\gamma}\,\mathbb{E}_{s \sim d^{\pi_\theta}_\gamma,\, a \sim \pi_\theta}[A^{\text{old}}(s, a)]$,
# with $d^{\pi}_\gamma$ the normalised discounted state distribution.)
#
# The actions can be drawn from the old policy instead, exactly, by importance weighting:
# $\mathbb{E}_{a \sim \pi_\theta}[A^{\text{old}}] = \mathbb{E}_{a \sim \pi_{\text{old}}}[\rho\, A^{\text{old}}]$
# with $\rho = \pi_\theta(a \mid s) / \pi_{\text{old}}(a \mid s)$. The states cannot: $d^{\pi_\theta}$ is where
# the *new* policy goes, and the only episodes we have come from the old one. Replacing $d^{\pi_\theta}_t$
# by $d^{\pi_{\text{old}}}_t$ gives the **surrogate objective** of conservative policy iteration (CPI),
#
# $$J^{\text{CPI}}_{\theta_{\text{old}}}(\theta) = J(\theta_{\text{old}}) + \sum_{t=0}^{T-1} \mathbb{E}_{s_t \sim d^{\pi_{\text{old}}}_t,\ a_t \sim \pi_{\text{old}}}\big[\rho_t\, A^{\text{old}}(s_t, a_t)\big],$$
#
# which a batch from $\pi_{\text{old}}$ can estimate. It is TRPO's surrogate (Schulman et al., 2015, who
# define it as $L$ in eq. 3 and estimate it from samples in eq. 14; it is maximised, so this course
# writes $J$) and, without the constant,
# PPO's $L^{\text{CPI}}$ (Schulman et al., 2017, eq. 6). It agrees with $J$ to **first order** at $\theta_{\text{old}}$:
# - same value: at $\theta = \theta_{\text{old}}$ every $\rho_t = 1$, and $\mathbb{E}_{a \sim \pi_{\text{old}}}[A^{\text{old}}(s, a)] = 0$;
# - same gradient: $\nabla_\theta \rho_t = \rho_t \nabla_\theta \log \pi_\theta(a_t \mid s_t)$, so at $\theta_{\text{old}}$
#   the surrogate's gradient is $\mathbb{E}\big[\sum_t \nabla_\theta \log \pi_\theta(a_t \mid s_t)\, A^{\text{old}}(s_t, a_t)\big]$,
#   the policy gradient of section 5 with $\Phi_t = A$.
#
# Away from $\theta_{\text{old}}$ the two differ only through the state distribution, which drifts further
# the more the policy changes. TRPO's Theorem 1 bounds the gap with the total-variation distance; since
# $D_{\text{TV}}^2 \le \mathrm{KL}$ it gives this bound (their eq. 9), in the discounted setting (where $J$ and
# $J^{\text{CPI}}$ are the discounted returns, and $J^{\text{CPI}}$ uses the old policy's discounted state distribution):
#
# $$J(\theta) \ge J^{\text{CPI}}_{\theta_{\text{old}}}(\theta) - \frac{4 \gamma \max_{s,a} \lvert A^{\text{old}}(s,a) \rvert}{(1-\gamma)^2}\, \max_s \mathrm{KL}\big(\pi_{\text{old}}(\cdot \mid s) \,\Vert\, \pi_\theta(\cdot \mid s)\big).$$
#
# So a gain of the surrogate is guaranteed to be a gain of $J$ only where it exceeds a penalty that grows
# with the KL from the old policy: maximise the surrogate, but only within a small KL of $\theta_{\text{old}}$.
# That is what a trust region enforces, and what PPO's clip approximates (section 7). The toy has
# every quantity exactly, so the next cell computes both sides. On a random pair of policies, **the lemma
# holds exactly**, **$J^{\text{CPI}}$ has $J$'s value and gradient at $\theta_{\text{old}}$**, and away from
# it, for this pair far apart, **the surrogate predicts more than twice the true gain**.

# %%
def advantage_table(theta: torch.Tensor) -> torch.Tensor:
    """A(t, p, a) = Q(t, p, a) - V(t, p) of the policy with logits theta: (T, N_WORDS+1, N_WORDS)."""
    values, qs = exact_values(theta)
    return qs - values[..., None]


def gain_exact(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """sum_t E_{s ~ d_t of NEW, a ~ NEW}[A_old(s, a)]: J(new) - J(old) by the lemma."""
    return (state_occupancy(new)[..., None] * torch.softmax(new, -1) * advantage_table(old)).sum()


def gain_surrogate(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """sum_t E_{s ~ d_t of OLD, a ~ NEW}[A_old(s, a)] = J^CPI_old(new) - J(old): the states of the old policy."""
    return (state_occupancy(old)[..., None] * torch.softmax(new, -1) * advantage_table(old)).sum()


pair = torch.Generator().manual_seed(3)
theta_a = torch.randn(T, N_WORDS + 1, N_WORDS, generator=pair)  # an old policy
theta_b = theta_a + 0.5 * torch.randn(T, N_WORDS + 1, N_WORDS, generator=pair)  # a new one
theta_new = theta_a.clone().requires_grad_(True)
(surrogate_grad,) = torch.autograd.grad(gain_surrogate(theta_a, theta_new), theta_new)  # at theta = theta_old
print(f"J(new) - J(old) = {(expected_return(theta_b) - expected_return(theta_a)).item():+.5f}   "
      f"lemma: {gain_exact(theta_a, theta_b).item():+.5f}   surrogate: {gain_surrogate(theta_a, theta_b).item():+.5f}")

# %% tags=["claim-check"]
check_claims({
    "the lemma holds exactly": abs(gain_exact(theta_a, theta_b).item()
                                   - (expected_return(theta_b) - expected_return(theta_a)).item()) < 1e-5,
    "J^CPI has J's value at theta_old": abs(gain_surrogate(theta_a, theta_a).item()) < 1e-6,
    "J^CPI has J's gradient at theta_old": torch.allclose(surrogate_grad, exact_gradient(theta_a), atol=1e-6),
    "for this pair the surrogate predicts more than twice the true gain":
        gain_surrogate(theta_a, theta_b).item() > 2 * gain_exact(theta_a, theta_b).item() > 0,
}, any_profile=True)

# %% [markdown]
# How fast do they part? Step from the uniform policy $\theta_u$ along the exact gradient,
# $\theta = \theta_u + \eta\, \nabla J(\theta_u)$, and compare the true gain with the one the surrogate predicts:

# %%
surrogate_rows = []
for eta in (0.1, 1, 10, 30, 100):
    theta = uniform + eta * exact_gradient(uniform)  # (T, N_WORDS+1, N_WORDS)
    true_gain, predicted = gain_exact(uniform, theta).item(), gain_surrogate(uniform, theta).item()
    surrogate_rows.append({"eta": eta, "KL(old || new)": mean_kl(uniform, theta).item(), "J gain": true_gain,
                           "surrogate gain": predicted, "gap": predicted - true_gain,
                           "gap / J gain": (predicted - true_gain) / true_gain})
surrogate_table = pd.DataFrame(surrogate_rows).set_index("eta")
display(surrogate_table.style.format("{:.3g}"))

# %% [markdown]
# The gap is of **second order**, like the KL: from $\eta = 0.1$ to $\eta = 1$ the gain grows about 10×
# and the gap about 100×. The surrogate **overestimates the gain at every step size** here, by **under
# 1%** up to $\eta = 1$ and by **over 5%** from $\eta = 10$ on (mean KL of about 0.05 and more). On this toy, with exact
# advantages, the error stays moderate. A real optimiser maximises a *batch estimate* of $J^{\text{CPI}}$,
# with estimated advantages, and the part above showed what many steps on such an estimate do.

# %% tags=["claim-check"]
grows = surrogate_table.loc[1] / surrogate_table.loc[0.1]  # how much each column grows from eta 0.1 to 1
check_claims({
    "from eta 0.1 to 1 the gain grows about 10x": 9 < grows["J gain"] < 11,
    "and the gap about 100x": 80 < grows["gap"] < 120,
    "the surrogate overestimates the gain at every step size": bool((surrogate_table["gap"] > 0).all()),
    "by under 1% up to eta = 1": bool((surrogate_table.loc[:1, "gap / J gain"] < 0.01).all()),
    "by over 5% from eta = 10 on": bool((surrogate_table.loc[10:, "gap / J gain"] > 0.05).all()),
    "where the mean KL is about 0.05 and more": bool((surrogate_table.loc[10:, "KL(old || new)"] > 0.04).all()),
}, any_profile=True)

# %% [markdown]
# ## Summary
# - The policy gradient weights $\nabla \log \pi(a_t \mid s_t)$ by $\Phi_t$: the return, the reward-to-go,
#   either minus a state baseline, or the advantage; an actor-critic bootstraps from a learned $V$.
# - A batch reused for several steps estimates the surrogate $\hat{\mathbb{E}}_t[\rho_t \hat A_t]$, faithful only
#   near $\theta_{\text{old}}$: TRPO bounds the KL; PPO's clip removes the incentive to push a ratio past the band.
# - With a language model, token $t$'s log-prob comes from the logits at $t-1$; only response tokens are actions.
# - RLHF is PPO on a token MDP: a prompt as $s_0$, deterministic transitions, the score at the last token,
#   $\gamma = 1$, an end at EOS or a cut at `max_new_tokens`. RLOO, GRPO and DPO see the response as one bandit arm.
#
# Next: notebook 02 trains the reward model that supplies the final score.

# %% [markdown]
# ## Check your understanding
#
# 1. Why may the policy gradient weight $\nabla \log \pi(a_t \mid s_t)$ by the reward-to-go instead of the
#    whole return, without bias?
#
# <details><summary>Answer</summary>
#
# The rewards before $t$ do not depend on $a_t$, and $\mathbb{E}_{a_t \sim \pi}[\nabla \log \pi(a_t \mid s_t)] =
# \nabla \sum_a \pi(a \mid s_t) = 0$, so their terms have expectation zero.
# </details>
#
# 2. With $\epsilon = 0.2$ and $\hat A_t > 0$, a token's ratio is 1.35. What does it add to the gradient of
#    $J^{\text{CLIP}}$, and can its ratio still grow?
#
# <details><summary>Answer</summary>
#
# Nothing: its term is $1.2\, \hat A_t$, flat in $\theta$. Yes: other tokens' gradients move shared
# parameters, and a long step overshoots.
# </details>
#
# 3. In the left-padded row `pad pad p1 p2 r1 r2 r3` (prompt of 2), which position's logits score $r_1$,
#    and which columns of `response_logprobs` are 0?
#
# <details><summary>Answer</summary>
#
# Column 3's (`p2`); columns 0 to 3 are 0.
# </details>
