# Source of notebooks/07_beyond_ppo.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 07 · Beyond PPO: do you need a critic? PPO against RLOO and GRPO
#
# {{colab_badge}}
#
# TRL no longer ships a `PPOTrainer`. Most people who run RL on language models today reach for
# **GRPO** or **RLOO**, which TRL ships and describes as PPO without a value function. This notebook
# measures what the critic buys, against a ground truth no real data set has: the hidden score.
#
# **You will learn**
# - what the critic does in PPO (a learned baseline $V(s_t)$ and per-token credit through GAE), and
#   what replaces it in RLOO (the **leave-one-out** mean of the other answers to the same prompt) and in
#   GRPO (the **group-normalised** reward);
# - the two biases Dr. GRPO points out: dividing by a group's std, and dividing each response's loss
#   by its own length;
# - **KL in the reward** (PPO, RLOO) against **KL in the loss** (GRPO): which KL each one's gradient
#   actually minimises, computed exactly on a toy policy;
# - how PPO (ours), TRL's `GRPOTrainer` and `RLOOTrainer`, and best-of-n compare in one setting. They
#   share the learned reward, the prompts, the LoRA policy, the CPU budget and the judge. They are
#   compared on the frontier of hidden score against KL, on CPU seconds, on samples and on memory;
# - where PPO, GRPO, RLOO and DPO each fit.

# %% [setup]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import math

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import rlhf_helpers
from rlhf_helpers.compare import CompareConfig, run_best_of_n, run_method
from rlhf_helpers.compare.figures import comparison_figure
from rlhf_helpers.core.group_advantages import group_rewards
from rlhf_helpers.ppo.build import build_shared_model
from rlhf_helpers.ppo.config import PPOConfig
from rlhf_helpers.ppo.experience import sample_responses, score_samples
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.reward import ensure_reward_model
from rlhf_helpers.stages.sft import ensure_sft_model

profile = get_profile()
ensure_sft_model(profile)  # gpu profile: fine-tuned once per runtime, then reused; tiny: ships in data/
torch.manual_seed(profile.seed)
if profile.device == "cpu":
    torch.set_num_threads(1)  # the tiny model's matrices are too small to gain from a second thread
reward_dir = ensure_reward_model(profile)  # notebook 02's reward adapter (trained now if not cached)
config = CompareConfig.from_profile(profile)
eval_prompts = load_prompts("test")
print(f"budget {config.train_seconds:.0f} {'CPU ' if profile.device == 'cpu' else ''}s per method; "
      f"{config.samples_per_batch} responses per batch (GRPO/RLOO: {config.prompts_per_batch} prompts x "
      f"G = {config.group_size}); beta {config.kl_coef}; lr {config.learning_rate}; judged on "
      f"{min(config.n_eval_prompts, len(eval_prompts))} held-out prompts")

# %% [markdown]
# ## 1. What the critic does, and what replaces it
#
# All three methods push up the log-probability of a sampled response in proportion to an
# **advantage**: how much better that response was than expected. They differ in what "expected"
# means.
#
# **PPO (notebooks 03-05).** A critic $V_\psi(s_t)$, trained alongside the policy, predicts the return
# from every prefix. GAE turns the one score at the end (plus the per-token KL penalty) into a
# per-token advantage:
# $\hat A_t = \sum_l (\gamma\lambda)^l\,\delta_{t+l}$ with $\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)$.
# Tokens after which the critic's prediction rose get credit; the others do not. The cost is a second
# adapter and head, its optimiser, a value pass per batch and a value loss. A critic that has not yet
# learned gives noisy advantages (notebook 06, experiment e).
#
# **RLOO** (REINFORCE leave-one-out, Ahmadian et al. 2024) samples $G$ responses to each prompt. The
# baseline of response $i$ is the mean reward of the *other* $G-1$. It does not depend on response $i$
# itself, so the gradient stays unbiased:
#
# $$A_i = r_i - \frac{1}{G-1}\sum_{j\neq i} r_j \qquad \text{(Ahmadian et al. 2024, eq. 5)}$$
#
# **GRPO** (Shao et al. 2024, DeepSeekMath section 4.1.2) centres on the group mean and divides by the
# group's standard deviation:
#
# $$A_i = \frac{r_i - \operatorname{mean}(r_1..r_G)}{\operatorname{std}(r_1..r_G) + \epsilon}$$
#
# In both, every token of response $i$ gets the same $A_i$: there is no per-token credit. The group
# *is* the baseline, paid for with $G$ samples per prompt instead of a learned $V$.
#
# From scratch, one number at a time, then checked against `rlhf_helpers`:

# %%
def rloo_advantages_scratch(rewards: torch.Tensor) -> torch.Tensor:
    """(N, G) -> (N, G): each reward minus the mean of the others in its group, with loops."""
    N, G = rewards.shape
    out = torch.empty_like(rewards)
    for n in range(N):
        for i in range(G):
            others = [rewards[n, j] for j in range(G) if j != i]
            out[n, i] = rewards[n, i] - sum(others) / (G - 1)
    return out


def grpo_advantages_scratch(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(N, G) -> (N, G): (r - group mean) / (group sample std + eps), with loops."""
    N, G = rewards.shape
    out = torch.empty_like(rewards)
    for n in range(N):
        mean = sum(rewards[n]) / G
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards[n]) / (G - 1))  # sample std, as torch.std
        for i in range(G):
            out[n, i] = (rewards[n, i] - mean) / (std + eps)
    return out


toy = torch.tensor([[1.0, 2.0, 3.0, 6.0],     # a spread-out group
                    [0.50, 0.51, 0.49, 0.50],  # a nearly tied group
                    [2.0, 2.0, 2.0, 2.0]])     # a tied group: nothing to learn from
torch.testing.assert_close(rloo_advantages_scratch(toy), rlhf_helpers.rloo_advantages(toy))
torch.testing.assert_close(grpo_advantages_scratch(toy), rlhf_helpers.grpo_advantages(toy))
print("RLOO advantages:\n", rlhf_helpers.rloo_advantages(toy))
print("GRPO advantages:\n", rlhf_helpers.grpo_advantages(toy))

# %% [markdown]
# Look at the second row. Its rewards differ by 0.01 (noise, for a learned reward), yet GRPO's
# advantages there are as large as in the first row, where the rewards really differ. Dividing by the
# group's std turns any group into advantages of about $\pm 1$. A tied group (third row) gives
# $A = 0$ everywhere: that prompt teaches nothing in this batch (TRL logs the share of such groups as
# `frac_reward_zero_std`).
#
# ### Exercise 1: RLOO is a rescaled, centred reward
#
# The leave-one-out baseline looks different from "subtract the group mean", but
# $\frac{1}{G-1}\sum_{j\ne i} r_j = \frac{G\,\bar r - r_i}{G-1}$. Write RLOO's advantages using only
# the centred rewards $r_i - \bar r$ (what GRPO computes with `scale="none"`, i.e. Dr. GRPO) and a
# constant.

# %%
# EXERCISE 1
def rloo_from_centred(rewards: torch.Tensor) -> torch.Tensor:
    """(N, G) rewards -> (N, G) RLOO advantages, computed from r - group mean and one constant."""
    raise NotImplementedError


# %%
def check_rloo_from_centred():
    rewards = torch.randn(6, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(rloo_from_centred(rewards), rlhf_helpers.rloo_advantages(rewards))
    two = torch.tensor([[4.0, 1.0]], dtype=torch.float64)  # G = 2: each answer against the other
    torch.testing.assert_close(rloo_from_centred(two), torch.tensor([[3.0, -3.0]], dtype=torch.float64))


exercise_check("Exercise 1 (rloo_from_centred)", check_rloo_from_centred)

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def rloo_from_centred(rewards: torch.Tensor) -> torch.Tensor:
#     """(N, G) rewards -> (N, G) RLOO advantages, computed from r - group mean and one constant."""
#     G = rewards.shape[1]
#     centred = rlhf_helpers.grpo_advantages(rewards, scale="none")  # r_i - mean
#     return G / (G - 1) * centred  # r_i - (G mean - r_i)/(G-1) = G/(G-1) (r_i - mean)
# ```
# So RLOO's advantage is Dr. GRPO's times $G/(G-1)$: the same direction, the scale of a learning
# rate. As TRL implements them, what still separates the two trainers is how each loss is averaged and
# where the KL goes (sections 2 and 3).
# </details>

# %% [markdown]
# ## 2. Two biases of GRPO (Dr. GRPO, Liu et al. 2025)
#
# Real groups from the SFT model: $G$ responses to each of 16 prompts, scored by the learned reward
# (notebook 02).

# %%
torch.manual_seed(profile.seed)
sft, tokenizer = build_shared_model(profile, PPOConfig.from_profile(profile), reward_dir)
group_prompts = [p for p in load_prompts("train")[:16] for _ in range(config.group_size)]  # G in a row
samples = sample_responses(sft, tokenizer, group_prompts, config.max_prompt_length, config.max_new_tokens)
rewards = group_rewards(score_samples(sft, samples), config.group_size)  # (16, G)
lengths = group_rewards(samples.mask.sum(dim=1).float(), config.group_size)  # (16, G) tokens incl. EOS
group_std = rewards.std(dim=1)  # (16,)
scaled = rlhf_helpers.grpo_advantages(rewards, scale="group").abs().mean(dim=1)  # (16,)
centred = rlhf_helpers.grpo_advantages(rewards, scale="none").abs().mean(dim=1)  # (16,)

fig = make_subplots(rows=1, cols=2, subplot_titles=("mean |A| of a group against its reward std",
                                                    "per-token weight against response length"))
fig.add_scatter(x=group_std.tolist(), y=scaled.tolist(), mode="markers", name="GRPO: / group std",
                marker={"size": 9, "color": "#2ca02c"}, row=1, col=1)
fig.add_scatter(x=group_std.tolist(), y=centred.tolist(), mode="markers", name="Dr. GRPO: no division",
                marker={"size": 9, "color": "#9467bd", "symbol": "x"}, row=1, col=1)
fig.update_xaxes(title_text="std of the group's learned rewards", row=1, col=1)
fig.update_yaxes(title_text="mean |advantage| in the group", row=1, col=1)
print(f"{len(group_std)} groups of {config.group_size}: reward std from {group_std.min():.2f} to "
      f"{group_std.max():.2f}; mean |A| with the std division {scaled.min():.2f}-{scaled.max():.2f}, "
      f"without {centred.min():.2f}-{centred.max():.2f}")

# %% [markdown]
# **Bias 1: the std.** In the left panel, with the division (green) every group's advantages have
# about the same size, whatever its spread. The groups whose answers the reward can barely tell apart
# push as hard as the clear ones, so the noise of the learned reward gets amplified. Without it
# (purple), a group pushes in proportion to how much its answers differ.
#
# **Bias 2: the length.** GRPO as published averages each response's per-token loss over *its own*
# length $|o_i|$, then over the $B$ responses:
#
# $$L_{\text{GRPO}} = -\frac1B\sum_i \frac{1}{|o_i|}\sum_t \rho_{i,t} A_i \quad\Rightarrow\quad
# \text{weight of one token of } i = \frac{A_i}{B\,|o_i|}$$
#
# So a long response with a negative advantage is penalised *less* per token than a short one, and
# "when wrong, be long" is rewarded. Dr. GRPO (TRL `loss_type="dr_grpo"`) divides by a constant,
# $B \cdot L_{\max}$; DAPO (TRL 1.16's default, `"dapo"`) by the number of tokens in the batch, also
# the same for every response.
#
# ### Exercise 2: the weight each loss puts on one token
#
# For `loss_type` "grpo" and "dr_grpo", return the (B, T) weight $w_{i,t}$ such that the loss is
# $-\sum_{i,t} w_{i,t}\,\log\pi(y_{i,t})$ (at ratio 1). The check differentiates each loss with autograd
# and compares.

# %%
# EXERCISE 2
def token_weights(advantages: torch.Tensor, mask: torch.Tensor, loss_type: str, max_length: int) -> torch.Tensor:
    """(B,) advantages, (B, T) mask of response tokens -> (B, T) weight of each token (0 at padding)."""
    raise NotImplementedError


# %%
def aggregated_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, loss_type: str,
                    max_length: int) -> torch.Tensor:
    """The two aggregations as TRL 1.16 writes them (GRPOTrainer._compute_loss), at ratio 1."""
    per_token = -advantages[:, None] * logp  # (B, T)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    return (per_token * mask).sum() / (per_token.size(0) * max_length)  # dr_grpo


def check_token_weights():
    gen = torch.Generator().manual_seed(2)
    B, T = 6, 9
    mask = (torch.arange(T)[None, :] < torch.tensor([2, 9, 4, 1, 7, 5])[:, None]).float()  # (B, T)
    advantages = torch.randn(B, generator=gen)
    for loss_type in ("grpo", "dr_grpo"):
        logp = torch.randn(B, T, generator=gen).requires_grad_()
        aggregated_loss(logp, advantages, mask, loss_type, T).backward()
        torch.testing.assert_close(token_weights(advantages, mask, loss_type, T), -logp.grad)


exercise_check("Exercise 2 (token_weights)", check_token_weights)

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def token_weights(advantages: torch.Tensor, mask: torch.Tensor, loss_type: str, max_length: int) -> torch.Tensor:
#     """(B,) advantages, (B, T) mask of response tokens -> (B, T) weight of each token (0 at padding)."""
#     B = mask.shape[0]
#     if loss_type == "grpo":  # 1/|o_i| inside, 1/B outside
#         return advantages[:, None] * mask / (B * mask.sum(dim=1, keepdim=True).clamp(min=1.0))
#     return advantages[:, None] * mask / (B * max_length)  # dr_grpo: one constant for every token
# ```
# </details>

# %% [markdown]
# The right panel uses your `token_weights` (or, until it is written, the same formula here) on the real
# groups above, with Dr. GRPO's advantages, so that only the aggregation differs:

# %%
def _weights(advantages, mask, loss_type, max_length):
    try:
        return token_weights(advantages, mask, loss_type, max_length)
    except NotImplementedError:  # the exercise is not done yet: the formula of Solution 2
        B = mask.shape[0]
        denominator = mask.sum(1, keepdim=True).clamp(min=1.0) if loss_type == "grpo" else max_length
        return advantages[:, None] * mask / (B * denominator)


flat_advantages = rlhf_helpers.grpo_advantages(rewards, scale="none").flatten()  # (16 G,)
negative = flat_advantages < 0  # the responses the update pushes down
for loss_type, color in (("grpo", "#2ca02c"), ("dr_grpo", "#9467bd")):
    w = _weights(flat_advantages, samples.mask, loss_type, config.max_new_tokens)  # (16 G, R)
    per_token = (w.sum(1) / samples.mask.sum(1))[negative]  # mean weight of one token of each response
    fig.add_scatter(x=lengths.flatten()[negative].tolist(), y=(-per_token).tolist(), mode="markers",
                    name=f"{loss_type}: push-down per token (A < 0)", marker={"size": 8, "color": color},
                    row=1, col=2)
fig.update_xaxes(title_text="response length, tokens", row=1, col=2)
fig.update_yaxes(title_text="|weight| of one token", type="log", row=1, col=2)
fig.update_layout(width=1000, height=420, template="plotly_white", title="Dr. GRPO's two biases, on real groups",
                  legend={"orientation": "h", "y": -0.25})
fig.show()

# %% [markdown]
# The push-down per token falls with length under "grpo": a long bad answer is punished less per token
# than a short one. Under "dr_grpo" it depends only on the advantage. The comparison below uses TRL
# 1.16's default for GRPO (`loss_type="dapo"`, `scale_rewards="group"`): no length bias, but the std
# division kept.
#
# ## 3. KL in the reward, or KL in the loss?
#
# All three methods keep the policy near the SFT model, each in its own way:
#
# | | where the KL goes | estimator |
# |---|---|---|
# | PPO (here) | per token, in the **reward**: $r_t = -\beta(\log\pi - \log\pi_{\text{ref}})$, then GAE | $k_1$ |
# | RLOO (TRL) | per sequence, in the **reward**, before the baseline: $r - \beta\sum_t(\log\pi - \log\pi_{\text{ref}})$ | $k_1$ |
# | GRPO (TRL) | per token, added to the **loss**: $\beta\,k_3$ with $k_3 = \frac{\pi_{\text{ref}}}{\pi} - \log\frac{\pi_{\text{ref}}}{\pi} - 1$ | $k_3 \ge 0$ |
#
# KL in the reward is part of the return, so the policy-gradient theorem applies to it: its expected
# gradient is $\nabla_\theta \mathrm{KL}(\pi\,\|\,\pi_{\text{ref}})$, the KL the objective names.
# KL in the loss is differentiated directly. For one sampled token, $\nabla k_3 = (1 - \pi_{\text{ref}}/\pi)\nabla\log\pi$,
# whose expectation under $\pi$ is $\sum_y(\pi - \pi_{\text{ref}})\nabla\log\pi = -\sum_y \pi_{\text{ref}}\nabla\log\pi
# = \nabla\,\mathrm{KL}(\pi_{\text{ref}}\,\|\,\pi)$: the *other* direction of the KL. The cell below
# computes all four gradients exactly (sums over a 6-word vocabulary, no sampling) for a softmax policy.

# %%
def exact_gradients(theta: torch.Tensor, ref_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Exact gradients (sums over the vocabulary) w.r.t. the logits theta of a softmax policy."""
    ref = torch.log_softmax(ref_logits, -1)  # (V,)

    def grad_of(fn):
        t = theta.detach().clone().requires_grad_()
        fn(t).backward()
        return t.grad

    def kl_pi_ref(t):  # KL(pi || ref)
        logp = torch.log_softmax(t, -1)
        return (logp.exp() * (logp - ref)).sum()

    def kl_ref_pi(t):  # KL(ref || pi)
        return (ref.exp() * (ref - torch.log_softmax(t, -1))).sum()

    def k1_in_reward(t):  # REINFORCE with reward -k1: E_pi[grad log pi(y) * (log pi(y) - log ref(y))]
        logp = torch.log_softmax(t, -1)
        weight = (logp - ref).detach()  # the reward is a number, not differentiated
        return (logp.exp().detach() * logp * weight).sum()

    def k3_in_loss(t):  # E_{y ~ pi (sampled, not differentiated)}[grad k3(y)]
        logp = torch.log_softmax(t, -1)
        log_ratio = ref - logp
        return (logp.exp().detach() * (log_ratio.exp() - log_ratio - 1)).sum()

    return {"grad KL(pi||ref)": grad_of(kl_pi_ref), "grad KL(ref||pi)": grad_of(kl_ref_pi),
            "k1 in the reward": grad_of(k1_in_reward), "k3 in the loss": grad_of(k3_in_loss)}


gen = torch.Generator().manual_seed(3)
ref_logits = torch.randn(6, generator=gen)
far = exact_gradients(ref_logits + 1.5 * torch.randn(6, generator=gen), ref_logits)
torch.testing.assert_close(far["k1 in the reward"], far["grad KL(pi||ref)"])  # KL(pi || ref), exactly
torch.testing.assert_close(far["k3 in the loss"], far["grad KL(ref||pi)"])  # the reverse KL, exactly
cos = torch.nn.functional.cosine_similarity(far["k1 in the reward"], far["k3 in the loss"], dim=0)
near = exact_gradients(ref_logits + 0.05 * torch.randn(6, generator=gen), ref_logits)
cos_near = torch.nn.functional.cosine_similarity(near["k1 in the reward"], near["k3 in the loss"], dim=0)
print(f"far from the reference:  cosine(k1-in-reward, k3-in-loss) = {cos:.3f}")
print(f"near the reference:      cosine = {cos_near:.4f} (both KLs agree to second order at pi = ref)")

# %% [markdown]
# Near the reference the two are the same gradient (both KLs are $\tfrac12$ the Fisher distance to
# second order). Far from it they point in different directions: the k3 loss pulls toward covering
# every answer the reference gives ($\mathrm{KL}(\pi_{\text{ref}}\|\pi)$ is large where $\pi$ drops a
# reference answer), whereas the k1 reward penalises the policy for putting mass where the reference
# has little. With the small KLs of the runs below both keep the policy close. The difference matters
# when $\beta$ is small and the policy drifts far. Two more practical differences: KL in the reward is
# centred by the baseline with the score, so in RLOO it trades off against the reward inside each
# group; KL in the loss is a separate term whose gradient does not depend on the advantage.
#
# ## 4. The race: one reward, one budget, one judge
#
# Every method below trains a fresh LoRA policy (same rank, alpha and modules) on the same SFT model.
# It samples 64 responses per batch from the same training prompts, is scored by the same learned
# reward adapter, and has the same learning rate and $\beta$. It trains for the same budget of CPU
# seconds of this process (wall seconds on a GPU). Model building and evaluations are not counted.
# Then the same function judges each one: one sample per held-out prompt with a fixed seed, its
# hidden score (never seen in training), its learned reward and its KL to the SFT model.
#
# | | PPO (ours, `rlhf_helpers.ppo`) | GRPO (TRL `GRPOTrainer`) | RLOO (TRL `RLOOTrainer`) |
# |---|---|---|---|
# | per batch | 64 prompts x 1 response | 16 prompts x G = 4 | 16 prompts x G = 4 |
# | baseline | critic (value adapter + head) and GAE, per token | group mean / group std | leave-one-out mean |
# | updates per batch | 4 epochs x 4 minibatches, clipped ratio per token | 4 minibatches, clipped ratio per token | 4 minibatches, clipped ratio **per sequence** |
# | KL ($\beta$ = 0.2 in the tiny profile) | $k_1$ per token in the reward | $k_3$ per token in the loss | $k_1$ per sequence in the reward |
#
# Best-of-n is the reference point that needs no training: draw $n$ SFT responses, keep the one the
# learned reward likes best. Its KL to the SFT model is exactly $\log n - (n-1)/n$.

# %%
best_of = run_best_of_n(config, profile, reward_dir, eval_prompts)
for n, row in best_of.items():
    print(f"SFT best-of-{n:<2}  hidden {row['hidden']:+.3f} (se {row['hidden_se']:.3f})  "
          f"learned reward {row['reward']:+.3f}  KL {row['kl']:.3f}")

# %%
runs = {method: run_method(method, config, profile, reward_dir, eval_prompts) for method in ("ppo", "grpo", "rloo")}

# %%
clock = runs["ppo"].clock
fig = comparison_figure(list(runs.values()), best_of, clock=clock, title=(
    f"{profile.name} profile: {config.train_seconds:.0f} {'CPU ' if clock == 'cpu' else ''}s per method, "
    f"seed {config.seed}, same reward and judge"))
fig.show()

# %%
best4 = best_of[4]["hidden"] if 4 in best_of else best_of[max(best_of)]["hidden"]
header = f"{'method':<20}{'hidden':>8}{'reward':>8}{'KL':>7}{'steps':>7}{'samples':>9}{'> best-of-4 at':>16}{'trained params':>16}{'peak MB':>9}"
print(header)
for run in runs.values():
    f = run.final
    first = run.first_time_above(best4)
    print(f"{run.label:<20}{f['eval_hidden_score']:>+8.3f}{f['eval_score']:>+8.2f}{f['eval_kl']:>7.2f}"
          f"{f['step']:>7.0f}{f['samples']:>9.0f}{'never' if first is None else f'{first:.0f} s':>16}"
          f"{run.trainable_parameters:>16,}{run.peak_memory_mb:>9.0f}")
print(f"peak memory: {runs['ppo'].memory_how}")

# %% [markdown]
# **Do the trainers compute what section 1 says?** `rlhf_helpers.compare` keeps every generation
# batch's learned rewards (the reward function records them) and the advantages TRL computed from them.
# GRPO's must equal `grpo_advantages` of the rewards, every batch. RLOO subtracts
# $\beta \cdot$ sequence KL from the reward first, and that KL is exactly 0 on the first batch (the
# fresh LoRA adapter is the SFT model). So there, and only there, RLOO's advantages must equal
# `rloo_advantages` of the raw rewards. `tests/test_compare.py` checks every batch with $\beta = 0$.

# %%
grpo_run, rloo_run = runs["grpo"], runs["rloo"]
for rewards_batch, advantages_batch in zip(grpo_run.rewards, grpo_run.advantages, strict=True):
    expected = rlhf_helpers.grpo_advantages(group_rewards(rewards_batch, config.group_size),
                                            scale=config.grpo_scale_rewards).flatten()  # (N G,)
    torch.testing.assert_close(advantages_batch, expected, atol=1e-5, rtol=0)  # float32 rounding only
first = rlhf_helpers.rloo_advantages(group_rewards(rloo_run.rewards[0], config.group_size)).flatten()
torch.testing.assert_close(rloo_run.advantages[0], first, atol=1e-5, rtol=0)
print(f"GRPO: {len(grpo_run.advantages)} batches of advantages = grpo_advantages(rewards); "
      f"RLOO: first batch = rloo_advantages(rewards)")

# %% [markdown]
# ## 5. Reading the race
#
# - **The frontier (left panel)** is the fair comparison. Each method buys hidden score with KL, and
#   $\beta$ sets where it stops; a method is better if its points lie *above* another's at the same KL.
#   Best-of-n's diamonds are the frontier of pure selection from the SFT model, with no training.
# - **CPU seconds (middle)** mix the algorithm with the implementation: our PPO runs fused LoRA layers
#   and its own sampler, TRL runs Hugging Face `generate` and PEFT's layers. **Samples (right)** remove
#   the implementation: at the same number of sampled responses, which one learned more?
# - **Memory.** PPO trains a second adapter, a value head and their Adam state: twice the trainable
#   parameters here. On this tiny model the measured difference is tens of MB, close to the noise of a
#   process's resident memory. On a real model the critic's forward and backward activations, and in the
#   classic four-model set-up a whole second model, are what GRPO and RLOO save.
# - **One seed, a short budget.** Each curve is one run; differences of about 0.1 in the hidden score
#   are within the noise (the best-of-n standard errors above give its scale).
#   `python -m benchmarks.bench_algorithms` runs 3 seeds x 180 CPU s per method; its table and figure
#   are in [benchmarks/README.md](../benchmarks/README.md#ppo-against-grpo-and-rloo-issue-15).
#
# In that benchmark (3 seeds x 180 CPU s per method, 2-core CPU; figures in benchmarks/README.md):
# - **One frontier.** The three methods' points lie along the same curve of hidden score against KL.
#   GRPO travels further along it: 3.3 nats at the end against 2.1-2.2 for PPO and RLOO with the same
#   $\beta$. A likely reason: its $k_3$ loss term restrains $\mathrm{KL}(\pi_{\text{ref}}\|\pi)$, not the
#   KL measured here (section 3). Best-of-n sits on or above that curve: at 0.64 nats best-of-4 scores
#   0.64, where the trained policies score about 0.35.
# - **Per CPU second, PPO climbed first.** It passed best-of-4 after 10-15 CPU s, RLOO after 15-30 and
#   GRPO after 16-61. By 180 CPU s the order had turned: GRPO 1.04 (at KL 3.3), RLOO 0.94, PPO 0.89
#   (at KL 2.2). RLOO against PPO is within the noise.
# - **Per sampled response, PPO learned the most.** It reuses each batch for 4 epochs x 4 minibatches
#   with per-token credit, and reached its level after about 500 responses, where the group methods
#   needed 1,500 or more. PPO pays for it with about 2.6x their CPU time per batch of 64 responses (the
#   value pass, the value loss and 16 updates instead of 4).
# - **Memory.** PPO trains twice the parameters (98k against 49k) and rose 278 MB above its start,
#   against 189 MB for GRPO and RLOO, although their processes also hold a second copy of the
#   model for the reward and the judge.
#
# On this task, where one scalar score judges a short answer, the critic did not buy a better
# frontier. It bought sample efficiency and an early lead, which matter when sampling, not the
# update, is what costs.
#
# ## 6. Where each method fits
#
# - **PPO with a critic**: when per-token credit matters and you can afford the second network. Long
#   responses whose quality is decided by a few tokens, multi-turn or tool-using episodes with rewards
#   along the way, and settings where you can sample only one response per prompt (expensive
#   environments). It is also the most knobs (GAE, value clipping, warm-up; notebook 06 shows what
#   breaks).
# - **RLOO**: the simplest unbiased baseline. Use it when you can sample $G \ge 2$ answers per prompt
#   and the reward is one number per answer. It has no critic to warm up and one adapter to train; in
#   TRL the KL sits in the reward, as in PPO.
# - **GRPO**: the same group idea with std normalisation, the standard choice for verifiable rewards
#   (maths, code, tests pass or fail), where a group is all right or all wrong and the std division
#   rescales the rest. Mind its biases (section 2): `loss_type="dr_grpo"` with `scale_rewards="none"`
#   removes both. And it regularises toward $\mathrm{KL}(\pi_{\text{ref}}\|\pi)$, not $\mathrm{KL}(\pi\|\pi_{\text{ref}})$ (section 3).
# - **DPO** (not raced here; TRL `DPOTrainer`): no sampling during training and no reward model. It
#   fits the policy to the preference pairs directly, as if the Bradley-Terry reward of notebook 02 were
#   $\beta\log\frac{\pi}{\pi_{\text{ref}}}$. It is the cheapest when you have a fixed preference data set
#   and no need to explore beyond it. It cannot improve on answers the pairs do not cover, which online
#   methods like the three above do by sampling and scoring new ones.
#
# Whichever you choose, keep what this course measured: a held-out judge the policy never trains on,
# the KL to the starting model next to every score, and best-of-n as the bar to clear.
