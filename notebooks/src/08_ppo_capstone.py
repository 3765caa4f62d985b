# Source of notebooks/08_ppo_capstone.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 08 · Capstone: one whole PPO iteration, written by you
#
# {{colab_badge}}
#
# **Prerequisites:** notebooks 03 (GAE and whitening), 04 (the clipped losses) and 05 (the shared model,
# its four roles and `PPOTrainer`).
#
# **Time:** about 230 min for the core, in two sittings (the second from *Exercise 2*); the deep dives add about 120 min.
#
# **You will learn**
# - to write one PPO iteration whole, top to bottom, as CleanRL writes its single-file agents;
# - the update loop: the epochs of shuffled minibatches, what each minibatch recomputes and what stays fixed
#   from the rollout, and why `zero_grad`, `backward`, the gradient clip and `step` come in that order;
# - to check a reimplementation against the library's `PPOTrainer` on the same batch and seed, step by step,
#   within a rounding budget set from the model's shape;
# - to break your iteration on purpose and read what the check says of it;
# - to train the tiny model with it; as a stretch goal, to stop an iteration early on approx-KL.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
from dataclasses import dataclass
from functools import partial

import torch
from tqdm.auto import tqdm

import rlhf_helpers
from rlhf_helpers.core.printed import format_number, wrap_printed
from rlhf_helpers.course import capstone
from rlhf_helpers.course.capstone import library_iteration
from rlhf_helpers.course.capstone_breaks import BREAKS, break_iteration, check_message
from rlhf_helpers.course.capstone_reference import plain_experience, plain_iteration, plain_update
from rlhf_helpers.course.capstone_stretch import kl_stop_case, kl_stop_difference
from rlhf_helpers.course.claims import check_claims
from rlhf_helpers.course.notebook import EXERCISE_PASSED, exercise_outcome
from rlhf_helpers.ppo import iteration as library_steps
from rlhf_helpers.ppo.evaluation import evaluate_policy
from rlhf_helpers.ppo.iteration import collect_experience
from rlhf_helpers.ppo.metrics import plot_curves
from rlhf_helpers.ppo.model.build import build_shared_model
from rlhf_helpers.ppo.model.samples import Samples, sample_responses
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.precision import needs_grad_scaler
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.reward import ensure_reward_model
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.world.scorer import hidden_scores

# %%
profile = get_profile()
ensure_sft_model(profile)  # gpu profile: fine-tuned once per runtime, then reused
torch.manual_seed(profile.seed)
if profile.device == "cpu":
    torch.set_num_threads(1)  # the tiny model's matrices are too small to gain from a second thread
config = profile.ppo
reward_dir = ensure_reward_model(profile)  # notebook 02's reward adapter, cached under runs/
model, tokenizer = build_shared_model(profile, config, reward_dir)
train_prompts, eval_prompts = load_prompts("train"), load_prompts("test")[: config.n_eval_prompts]

# %% [markdown]
# ## 1. One iteration on one page
#
# Notebook 05 built PPO in pieces; here you write one iteration whole, in two functions:
#
# ```text
# ppo_iteration(model, tokenizer, prompts, policy_opt, value_opt, config, generator):
#     samples ← sample_responses(...)               # given: the policy at config.temperature, stop at EOS
#     batch   ← make_experience(model, samples)     # Exercise 1, no gradient:
#               log π_old, log π_ref, V_old, score → rewards r → GAE (Â, G) → whiten Â
#     for epoch in 1 .. config.ppo_epochs:          # Exercise 2
#         for rows in a fresh shuffle, config.mini_batch_size at a time:
#             log π_θ, V_ψ with gradient → L^CLIP(ρ = π_θ / π_old, Â), L^V(V_ψ, V_old, G)
#             one backward of L^CLIP + c_V L^V;  clip each adapter's gradient norm;  step both
#     return batch, [(L^CLIP, L^V) of every minibatch]
# ```
#
# The shared model gives every forward pass (sequences: left-padded prompts of width $P$, then responses of
# width $R$; `mask`: 1 on the real response tokens, EOS included; $T_{\text{samp}}$ = `config.temperature`, the
# sampling temperature, a subscript because plain $T$ is a length in this course):
#
# | call | returns |
# |---|---|
# | `model.policy_logprobs(seq, attn, P, temperature=config.temperature)` | (B, R) $\log\pi_\theta(y_t)$ under $\operatorname{softmax}(z/T_{\text{samp}})$, with gradient |
# | `model.ref_logprobs(seq, attn, P, temperature=config.temperature)` | (B, R) $\log\pi_{\text{ref}}(y_t)$, every adapter off |
# | `model.values(seq, attn, P)` | (B, R) $V_\psi(s_t)$, with gradient |
# | `model.reward_scores(seq, attn)` | (B,) the reward model's score at each row's last real token |

# %%
@dataclass
class Rollout:
    """One experience batch (the field names of the library's `Experience`): B prompts, widths P and R."""

    prompts: list[str]
    responses: list[str]
    sequences: torch.Tensor  # (B, P + R) left-padded prompt ids, then response ids
    attention_mask: torch.Tensor  # (B, P + R) 1 on real tokens
    context_length: int  # P
    mask: torch.Tensor  # (B, R) 1 on real response tokens, EOS included
    old_logprobs: torch.Tensor  # (B, R) log pi_old(y_t), at config.temperature
    ref_logprobs: torch.Tensor  # (B, R) log pi_ref(y_t), at config.temperature
    values: torch.Tensor  # (B, R) V_old(s_t), 0 at padding
    scores: torch.Tensor  # (B,)
    rewards: torch.Tensor  # (B, R) shaped rewards, 0 at padding
    advantages: torch.Tensor  # (B, R) whitened over the batch's real tokens
    returns: torch.Tensor  # (B, R) raw advantages + values

    def __len__(self) -> int:
        return self.sequences.shape[0]


demo = sample_responses(model, tokenizer, train_prompts[:2], config.max_prompt_length, config.max_new_tokens)
print(f"sequences {tuple(demo.sequences.shape)}, P = {demo.context_length}, mask {tuple(demo.mask.shape)}; responses:")
print("\n".join(wrap_printed(f"  {response!r}") for response in demo.responses))

# %% [markdown]
# ### Exercise 1: the experience
#
# Write `make_experience(model, samples, config)`: everything the update reads, without gradient. With
# $\beta$ = `config.kl_coef`, $\gamma$ = `config.gamma`, $\lambda$ = `config.lam` and $\ell_i$ the last real
# token of row $i$:
#
# $$\log\pi_{\text{old}}(y_t) = \log\operatorname{softmax}(z_{t}/T_{\text{samp}})[y_t] \ \text{(policy adapter on)}, \qquad
# \log\pi_{\text{ref}}(y_t)\ \text{the same with every adapter off},$$
#
# $$r_{it} = -\beta\,\big(\log\pi_{\text{old}}(y_{it}) - \log\pi_{\text{ref}}(y_{it})\big) + [t = \ell_i]\,\text{score}_i
# \quad\text{on real tokens, 0 at padding},$$
#
# $$\delta_t = r_t + \gamma V_{t+1} - V_t \ \ (V = 0 \text{ after } \ell_i), \qquad
# \hat A_t = \delta_t + \gamma\lambda\,\hat A_{t+1}, \qquad G_t = \hat A_t + V_t,$$
#
# $$\hat A_t \leftarrow \frac{\hat A_t - \mu}{\sqrt{\sigma^2 + 10^{-8}}}, \qquad \mu, \sigma^2: \text{mean and unbiased
# variance of } \hat A \text{ over the real tokens of the whole batch.}$$
#
# Most of it you wrote before: your shaped reward (notebook 05, Exercise 1), your `gae_loop` (05, Exercise 2)
# and your masked whitening (03, Exercise 3). **Where they go:** this notebook starts a fresh kernel, so none of
# them is defined here. Paste them into a new cell above this exercise and call them, or write their lines
# inline, as the solution does. Do not import the library's versions (`rlhf_helpers.shape_rewards`,
# `compute_gae`, `masked_whiten`): the check hides them while it runs, so a call to one fails it.
#
# Take the returns **before** whitening. The check samples a batch from a policy moved away from the
# reference, each setting at a value of its own ($T_{\text{samp}} = 0.7$, $\beta = 0.15$, $\gamma = 0.95$,
# $\lambda = 0.9$), and compares your rollout with `collect_experience`'s, tensor by tensor on the real tokens.

# %%
# EXERCISE 1
@torch.no_grad()  # the experience is data for the update: no gradient flows into it
def make_experience(model: SharedLoRAModel, samples: Samples, config: PPOConfig) -> Rollout:
    """Log-probs, reference log-probs, values, scores, shaped rewards, GAE and whitening of one batch."""
    # seq, attn, P, mask = samples.sequences, samples.attention_mask, samples.context_length, samples.mask
    # TODO log pi_old and log pi_ref of the sampled tokens at config.temperature (B, R); the values (B, R);
    #      the reward model's scores (B,)
    # TODO shaped rewards (B, R); GAE by a reverse loop over the columns; the returns; whitened advantages
    raise NotImplementedError


# %%
# The checks' own model: the policy adapter moved away from the reference (random weights added), so that
# the policy's log-probs and the reference's differ, and the checks leave `model` as it is.
check_model, _ = build_shared_model(profile, config, reward_dir)
with torch.no_grad():
    g_moved = torch.Generator().manual_seed(1)
    for param in check_model.policy_parameters():
        param.add_(0.05 * torch.randn(param.shape, generator=g_moved).to(param))
check_start = capstone.ModelSnapshot(check_model)  # each attempt runs on a fresh copy of this: none reaches the next
# every setting the iteration reads gets a value of its own: no two equal, none at the value that hides it, none
# at a default a loop could have written in (clip_eps 0.2, vf_coef 1 or CleanRL's 0.5)
check_config = config.replace(rollout_batch_size=12, mini_batch_size=4, ppo_epochs=2, temperature=0.7,
                              kl_coef=0.15, gamma=0.95, lam=0.9, clip_eps=0.25, value_clip=0.3, vf_coef=0.6,
                              max_grad_norm=1e6)  # first without gradient clipping; a binding clip below
check_prompts = train_prompts[:12]
SEEDS, LRS = (3, 4), (2.0, 0.05)  # sampling and shuffling seeds; SGD learning rates of the policy, the critic
rtol = capstone.rounding_rtol(check_model, check_config)  # the rounding budget, relative (deep dive below)
# the library's iteration, run here once (before the checks hide it), from the same weights every time
free_run = capstone.run_iteration(library_iteration, check_model, tokenizer, check_prompts, check_config, SEEDS,
                                  LRS, check_start)
norms = free_run.step_norms["policy"] + free_run.step_norms["value"]
clipped_config = check_config.replace(max_grad_norm=0.5 * min(norms))  # binds on every step of both adapters
clipped_run = capstone.run_iteration(library_iteration, check_model, tokenizer, check_prompts, clipped_config,
                                     SEEDS, LRS, check_start)
passed_code = capstone.PassedCode()  # the functions Exercise 2's check passed with: section 2 trains only with them
print(f"check batch: {int(free_run.mask.sum())} response tokens, {len(free_run.losses)} minibatch steps per adapter;\n"
      f"  gradient clip of the second setting {clipped_config.max_grad_norm:.3f}; rounding budget {rtol:.1e} (relative)")


def check_make_experience():
    rollout = capstone.run_experience(make_experience, check_model, tokenizer, check_prompts, check_config, SEEDS[0],
                                      check_start)
    problem = capstone.experience_difference(rollout, free_run, rtol)
    assert problem is None, problem


exercise_check("Exercise 1 (make_experience)", check_make_experience,
               hidden=[collect_experience, library_steps.rollout, library_iteration, rlhf_helpers.shape_rewards, rlhf_helpers.kl_estimate,
                       rlhf_helpers.compute_gae, rlhf_helpers.td_errors, rlhf_helpers.gae_reference, rlhf_helpers.masked_whiten,
                       rlhf_helpers.masked_mean, rlhf_helpers.masked_var, plain_experience, plain_iteration])

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# @torch.no_grad()  # the experience is data for the update: no gradient flows into it
# def make_experience(model: SharedLoRAModel, samples: Samples, config: PPOConfig) -> Rollout:
#     """Log-probs, reference log-probs, values, scores, shaped rewards, GAE and whitening of one batch."""
#     seq, attn, P, mask = samples.sequences, samples.attention_mask, samples.context_length, samples.mask
#     logprobs = model.policy_logprobs(seq, attn, P, temperature=config.temperature).float()  # (B, R): log pi_old
#     ref_logprobs = model.ref_logprobs(seq, attn, P, temperature=config.temperature).float()  # (B, R)
#     values = model.values(seq, attn, P).float()  # (B, R)
#     scores = model.reward_scores(seq, attn).float()  # (B,)
#     beta, gamma, lam = config.kl_coef, config.gamma, config.lam
#     # r_t = -beta k1_t on every real token, + the score on the last real one (your shaped_rewards, notebook 05)
#     rewards = -beta * torch.where(mask.bool(), logprobs - ref_logprobs, torch.zeros_like(logprobs))  # (B, R)
#     last = mask.sum(dim=1).long() - 1  # (B,): responses are right-padded after their EOS
#     rewards[torch.arange(len(scores)), last] += scores
#     # delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lambda A_{t+1}  (your gae_loop, notebook 05)
#     advantages = torch.zeros_like(rewards)  # (B, R)
#     running = torch.zeros_like(rewards[:, 0])  # (B,): A_{t+1}, 0 past the end
#     next_value = torch.zeros_like(rewards[:, 0])  # (B,): V(s_{t+1}), 0 past the end
#     for t in reversed(range(rewards.shape[1])):
#         delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
#         running = (delta + gamma * lam * running) * mask[:, t]  # 0 on padding: the last real token starts fresh
#         advantages[:, t] = running
#         next_value = values[:, t] * mask[:, t]  # padding's value never reaches a real token
#     returns = (advantages + values) * mask  # (B, R): before whitening
#     # whiten over the real tokens of the whole batch (your masked_whiten_scratch, notebook 03)
#     n = mask.sum()
#     mean = (advantages * mask).sum() / n
#     var = (((advantages - mean) * mask) ** 2).sum() / (n - 1)
#     advantages = (advantages - mean) / torch.sqrt(var + 1e-8) * mask  # (B, R)
#     return Rollout(samples.prompts, samples.responses, seq, attn, P, mask, logprobs, ref_logprobs, values * mask,
#                    scores, rewards, advantages, returns)
# ```
# The library reads the old log-probs from the sampling loop's own logits, not from a second forward pass;
# the two agree to float32 rounding.
# </details>

# %% [markdown]
# ### The update loop
#
# After the rollout, PPO takes several gradient steps on the one batch. Each of `config.ppo_epochs` epochs
# visits every row once, in a fresh random order cut into minibatches of `config.mini_batch_size` rows. Two
# kinds of tensor meet in each minibatch:
#
# | fixed for the whole iteration (the rollout's, no gradient) | recomputed on every minibatch (with gradient) |
# |---|---|
# | $\log\pi_{\text{old}}$, $V_{\text{old}}$, $\hat A$, $G$, the mask | $\log\pi_\theta$ and $V_\psi$: one forward pass each on its rows |
#
# The left column is data. $\pi_{\text{old}}$ is the policy that drew the samples, and the ratio
# $\rho_t = \pi_\theta(y_t) / \pi_{\text{old}}(y_t)$ corrects for drawing them from it, so its denominator stays
# what it was at sampling. Recomputed from the current weights it would equal the numerator: every ratio 1, no
# clip ever, and with a gradient the two log-probs' gradients cancel. The returns are the critic's targets:
# recomputed from the critic as it learns, they would chase its own output. Only $\pi_\theta$ and $V_\psi$
# change from one minibatch to the next, because the weights do. Each minibatch then takes one step per
# adapter:
#
# ```text
# for epoch in 1 .. config.ppo_epochs:
#     order ← torch.randperm(B, generator=generator)         # a fresh shuffle every epoch
#     for rows in order, config.mini_batch_size at a time:
#         log π_θ, V_ψ ← forward passes on those rows          # with gradient
#         loss ← L^CLIP + c_V L^V                              # against the fixed column
#         zero_grad  →  backward  →  clip each adapter's gradient norm  →  step
# ```
#
# The order follows from how PyTorch keeps gradients. `backward()` **adds** into each parameter's `.grad`, so
# without `zero_grad()` first, a step applies this minibatch's gradient plus the earlier ones'.
# `clip_grad_norm_` rescales `.grad` in place: after `backward()` has filled it, before `step()` reads it. The
# step comes last, and the next minibatch's forward passes see the moved weights.

# %% [markdown]
# ### Exercise 2: the iteration
#
# Write `ppo_iteration(...)`: sample (the call is given), make the experience with Exercise 1, then run the
# loop above, shuffling with `torch.randperm(B, generator=generator)`. On each minibatch, with the policy's
# log-probs at $T_{\text{samp}}$, $\epsilon$ = `config.clip_eps` and $\epsilon_V$ = `config.value_clip`:
#
# $$\rho_t = \exp\big(\log\pi_\theta(y_t) - \log\pi_{\text{old}}(y_t)\big), \qquad
# L^{\text{CLIP}} = -\frac{\sum_t m_t \min\big(\rho_t \hat A_t,\ \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\,\hat A_t\big)}{\sum_t m_t},$$
#
# $$V^{\text{clip}}_t = V_{\text{old},t} + \operatorname{clip}(V_t - V_{\text{old},t}, -\epsilon_V, \epsilon_V), \qquad
# L^V = \tfrac12\,\frac{\sum_t m_t \max\big((V_t - G_t)^2, (V^{\text{clip}}_t - G_t)^2\big)}{\sum_t m_t},$$
#
# then one backward pass of $L^{\text{CLIP}} + c_V L^V$ ($c_V$ = `config.vf_coef`), the gradient norm of
# **each** adapter (`model.policy_parameters()`, `model.value_parameters()`) clipped to `config.max_grad_norm`
# on its own, and one step of each optimiser. Return the rollout and the $(L^{\text{CLIP}}, L^V)$ of every
# minibatch, as floats, in order ($L^V$ without the $c_V$).
#
# The check (it runs your `make_experience` too) compares your iteration with the library's
# (`collect_experience`, then `PPOTrainer.update`) run from the same weights, prompts and seeds, with plain
# SGD (the deep dive says why), without and then with a binding gradient clip. It names the first difference:
# the experience, each minibatch's losses, the gradient of each optimiser step, the weights after the update.

# %%
# EXERCISE 2
def ppo_iteration(model: SharedLoRAModel, tokenizer, prompts: list[str], policy_opt: torch.optim.Optimizer,
                  value_opt: torch.optim.Optimizer, config: PPOConfig,
                  generator: torch.Generator) -> tuple[Rollout, list[tuple[float, float]]]:
    """Sample, make the experience, then config.ppo_epochs epochs of shuffled minibatches; returns the rollout
    and the (policy loss, value loss) of every minibatch, in order."""
    # samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length, config.max_new_tokens,
    #                            temperature=config.temperature)  # given: sampling is machinery
    # TODO batch = make_experience(...); for each epoch a fresh shuffle; for each minibatch: log-probs and
    #      values with gradient, L^CLIP and L^V, one backward, each adapter's gradient clipped, both steps
    raise NotImplementedError


# %%
ITERATION_HIDDEN = [PPOTrainer.update, library_steps.update_epochs, library_steps.minibatch_backward,
                    collect_experience, library_steps.rollout, library_iteration, rlhf_helpers.policy_loss,
                    rlhf_helpers.value_loss, rlhf_helpers.clipped_surrogate, rlhf_helpers.masked_mean,
                    rlhf_helpers.shape_rewards, rlhf_helpers.compute_gae, rlhf_helpers.masked_whiten,
                    plain_experience, plain_update, plain_iteration]


def check_ppo_iteration():
    for cfg, expected, setting in ((check_config, free_run, "without gradient clipping"),
                                   (clipped_config, clipped_run, "with a binding gradient clip")):
        got = capstone.run_iteration(ppo_iteration, check_model, tokenizer, check_prompts, cfg, SEEDS, LRS, check_start)
        problem = capstone.first_difference(got, expected, cfg, rtol)
        assert problem is None, f"{setting}: {problem}"
    passed_code.record(make_experience=make_experience, ppo_iteration=ppo_iteration)


exercise_check("Exercise 2 (ppo_iteration)", check_ppo_iteration, hidden=ITERATION_HIDDEN)

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def ppo_iteration(model, tokenizer, prompts, policy_opt, value_opt, config, generator) -> tuple[Rollout, list]:
#     """Sample, make the experience, then config.ppo_epochs epochs of shuffled minibatches; returns the rollout
#     and the (policy loss, value loss) of every minibatch, in order."""
#     samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length, config.max_new_tokens,
#                                temperature=config.temperature)  # given: sampling is machinery
#     batch = make_experience(model, samples, config)  # Exercise 1
#     P, B, eps_v = batch.context_length, len(batch), config.value_clip
#     losses = []
#     for epoch in range(config.ppo_epochs):
#         order = torch.randperm(B, generator=generator)  # (B,): a new shuffle every epoch
#         for first in range(0, B, config.mini_batch_size):
#             rows = order[first : first + config.mini_batch_size]  # (b,)
#             seq, attn, m = batch.sequences[rows], batch.attention_mask[rows], batch.mask[rows]  # (b, L), (b, L), (b, R)
#             A, G, V_old = batch.advantages[rows], batch.returns[rows], batch.values[rows]  # (b, R) each
#             # L^CLIP: the ratio against the log-probs stored at sampling (1 at padding)
#             logp = model.policy_logprobs(seq, attn, P, temperature=config.temperature).float()  # (b, R)
#             rho = torch.exp(torch.where(m.bool(), logp - batch.old_logprobs[rows], 0.0))  # (b, R)
#             pg_loss = -(torch.min(rho * A, rho.clamp(1 - config.clip_eps, 1 + config.clip_eps) * A) * m).sum() / m.sum()
#             # L^V: the new value clipped around the rollout's, the larger squared error
#             V = model.values(seq, attn, P).float()  # (b, R)
#             V_clip = V if eps_v is None else V_old + (V - V_old).clamp(-eps_v, eps_v)  # (b, R)
#             v_loss = 0.5 * (torch.max((V - G) ** 2, (V_clip - G) ** 2) * m).sum() / m.sum()
#             # one backward: the adapters share no parameter, so each gets its own loss's gradient
#             policy_opt.zero_grad()
#             value_opt.zero_grad()
#             (pg_loss + config.vf_coef * v_loss).backward()
#             torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)  # each adapter on its own
#             torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)
#             policy_opt.step()
#             value_opt.step()
#             losses.append((pg_loss.item(), v_loss.item()))
#     return batch, losses
# ```
# The clipped loss is inline, as CleanRL writes it. Inside the clip band the two branches of the $\min$ are
# equal, a tie, and autograd sends half the gradient through each: a `.detach()` on the clipped branch keeps the
# loss and halves the gradient of every in-band token (on the first minibatch, every token). That is why the
# check compares each step's gradient as well as the losses.
# </details>

# %% [markdown]
# ### Break your iteration
#
# A check earns trust by what it refuses. Once your iteration passes, give it one of a classmate's mistakes:
# the cell below wraps your `ppo_iteration` so that it makes the mistake named by `BREAK` (your code stays as
# it is) and prints what the check then says. Before you run it, predict where the first difference shows:
# in the experience, in a loss or in a step's gradient, and at which minibatch. Then try the other mistakes.

# %%
BREAK = "no zero_grad"  # or: "half the policy gradient", "reference as old", "update at temperature 1",
#                         "vf_coef in the logged value loss"
if passed_code.holds_for(make_experience=make_experience, ppo_iteration=ppo_iteration):
    said = check_message(break_iteration(ppo_iteration, BREAK), check_model, tokenizer, check_prompts, check_config,
                         SEEDS, LRS, free_run, rtol, check_start)
    print(wrap_printed(f"Injected: {BREAKS[BREAK]}.\nThe check says: {said}"))
else:
    print("Come back once your ppo_iteration passes Exercise 2's check: this cell breaks a working iteration.")

# %% [markdown]
# <details><summary>Answer</summary>
#
# `no zero_grad`: minibatch 0's step matches, as there is no earlier gradient to add to; minibatch 1's step
# applies the sum of two minibatches' gradients, and the check names left-over gradients from the ratio of the
# norms. `half the policy gradient`: minibatch 0's loss matches and its step's norm is exactly half.
# `reference as old`: the experience, before any update. `update at temperature 1`: minibatch 0's policy loss,
# on weights that have not moved yet. `vf_coef in the logged value loss`: minibatch 0's value loss, off by the
# factor $c_V$ exactly.
# </details>

# %% [markdown]
# ## Deep dive: why the check uses SGD, and how its rounding budget was set
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# **SGD.** Adam divides each step by $\sqrt{v}$, the running size of the gradient. Where a gradient is nearly
# zero, float rounding decides the sign of a step of full size, so two correct implementations can drift apart
# by far more than rounding within a few steps. With SGD at learning rate $\eta$, a difference $\delta_k$
# between the two runs' weights after $k$ steps evolves, to first order, as
# $\delta_{k+1} = (I - \eta H)\,\delta_k + e_k$, with $H$ the loss's Hessian and $e_k$ the new step's rounding.
# At a step size where $I - \eta H$ does not expand it (every eigenvalue of $\eta H$ between 0 and 2), the old
# difference does not grow and each step adds its own rounding: after $k$ steps the difference is bounded by
# about $k + 1$ steps' worth of rounding. It is not constant, but it grows no faster than that, which is why
# the check grants $k + 1$ budgets after $k$ steps (below). Training (section 2) uses Adam; only the check uses
# SGD.
#
# **The budget.** Your iteration and the library's compute the same numbers in a different order: the
# library reads the old log-probs from the sampling loop, one token at a time with a cache, where you run one
# forward pass; its GAE is a matrix product where yours is a loop; it cuts each minibatch to the columns that
# hold a real token. Each float32 operation returns its exact result times $(1 + d)$ with $|d| \le u = 2^{-24}$,
# so an inner product of $n$ terms, summed in any order, is off by at most about $n u$ times the sum of its
# terms' sizes (Higham, *Accuracy and Stability of Numerical Algorithms*, section 3.1). `rounding_rtol` counts the roundings
# $K$ on the longest path to one log-prob of this model: per layer two layer norms and the MLP's first product
# (sums of `hidden` terms each), a query, key or value and the output projection (`hidden`), an attention score
# (`hidden / heads`), the softmax and the weighted values (the context length each), the MLP's second product
# (`inner`); then the last layer norm, the LM head and the log-sum-exp over the vocabulary. For the tiny model
# that is about 4,500 roundings, and the check allows $K u$, near $3 \times 10^{-4}$, of each compared tensor's
# largest entry; a loss or a gradient that follows $k$ optimiser steps gets $k + 1$ such budgets.
#
# That is a budget, not a bound. Cancellation makes a sum's error large against the sum itself, and the
# layers amplify an error by factors the count leaves out: a layer norm divides by a standard deviation, a
# softmax exponentiates. The budget was set from the model's shape, not fitted to one machine's numbers; the
# cell below measures how well it works as one. It runs the worked solutions as one plain loop
# (`capstone_reference.plain_iteration`) and the same loop with a subtle real bug: the whitening's variance
# divided by $n$ instead of $n - 1$, which scales every advantage by $\sqrt{n / (n - 1)}$, $n$ the batch's real
# tokens. The worked solutions stay inside the budget at their largest difference (the share they use
# depends on the CPU's rounding, from under 1% to about a third under the roundings listed in
# `docs/claim_margins.md`); the biased variance exceeds it more than five times over.

# %%
used = {label: capstone.budget_used(
    capstone.run_iteration(partial(plain_iteration, mistake=mistake), check_model, tokenizer, check_prompts,
                           check_config, SEEDS, LRS, check_start), free_run, check_config, rtol)
    for label, mistake in (("the worked solutions", None), ("a variance divided by n", "biased_variance"))}
for label, share in used.items():
    print(f"{label:<24} largest difference = {share:.2%} of the rounding budget")

# %% tags=["claim-check"]
check_claims({
    "the tiny model's rounding budget is a relative tolerance near 3e-4": 2.5e-4 < rtol < 3e-4,
    "the worked solutions stay inside the budget": used["the worked solutions"] < 1,
    "a variance divided by n exceeds it more than five times over": used["a variance divided by n"] > 5,
})

# %% [markdown]
# ## 2. Your iteration trains the model
#
# The loop below runs `RUN_ITERATIONS` iterations (at most the profile's `total_steps`) from fresh adapters,
# with Adam. It trains with your `ppo_iteration` if its check passed for the functions defined now (one
# redefined since is checked again first), else with the library's; the line it prints says which. Before and
# after, the policy answers the held-out prompts (`evaluate_policy`), graded by the hidden true score.

# %%
RUN_ITERATIONS = 12
if exercise_outcome("Exercise 2 (ppo_iteration)") == EXERCISE_PASSED and not passed_code.holds_for(
        make_experience=make_experience, ppo_iteration=ppo_iteration):  # redefined since their check passed
    exercise_check("Re-check 2 (ppo_iteration)", check_ppo_iteration, hidden=ITERATION_HIDDEN)
yours = passed_code.holds_for(make_experience=make_experience, ppo_iteration=ppo_iteration)
left_out = capstone.left_out_settings(config) + (["an fp16 base"] if needs_grad_scaler(model) else [])
iteration = ppo_iteration if yours and not left_out else library_iteration
if iteration is ppo_iteration:
    print("This run trains with your make_experience and ppo_iteration, the functions whose check passed.")
elif yours:
    print("This run trains with the library's iteration: this profile uses settings yours leaves out:", left_out)
else:
    print("This run trains with the library's iteration (collect_experience, then PPOTrainer.update):\n"
          "  your ppo_iteration has not passed its check (Exercise 2) as it is defined now.")


def batch_metrics(step: int, rollout, losses) -> dict[str, float]:
    """Mean reward-model score, hidden score, k1 sequence KL and value loss of one iteration's batch."""
    seq_kl = ((rollout.old_logprobs - rollout.ref_logprobs) * rollout.mask).sum(dim=1)  # (B,)
    hidden = hidden_scores(rollout.prompts, rollout.responses)
    return {"step": step, "score": float(rollout.scores.mean()), "hidden_score": sum(hidden) / len(hidden),
            "kl": float(seq_kl.mean()), "value_loss": sum(v for _, v in losses) / len(losses)}


def held_out(policy) -> dict[str, float]:
    """One sample per held-out prompt at the run's temperature (fixed seed): score, hidden score, KL."""
    return evaluate_policy(policy, tokenizer, eval_prompts, max_prompt_length=config.max_prompt_length,
                           max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                           batch_size=config.eval_batch_size, hidden_score_fn=hidden_scores)

# %%
torch.manual_seed(profile.seed)
model, tokenizer = build_shared_model(profile, config, reward_dir)  # fresh adapters: re-running restarts
policy_opt = torch.optim.Adam(model.policy_parameters(), lr=config.policy_lr)
value_opt = torch.optim.Adam(model.value_parameters(), lr=config.value_lr)
generator = torch.Generator().manual_seed(config.seed)  # the prompts and the shuffles of every iteration
start_eval, history = held_out(model), []
for step in tqdm(range(min(RUN_ITERATIONS, config.total_steps)), desc="PPO iterations"):
    order = torch.randperm(len(train_prompts), generator=generator)[: config.rollout_batch_size]
    torch.manual_seed(config.seed + step)  # this iteration's sampling
    rollout, losses = iteration(model, tokenizer, [train_prompts[i] for i in order.tolist()], policy_opt, value_opt,
                                config, generator)
    history.append(batch_metrics(step + 1, rollout, losses))
end_eval = held_out(model)
print(f"{'held-out prompts':<18}" + "".join(f"{key.removeprefix('eval_'):>16}" for key in start_eval))
for when, held_out_eval in (("before", start_eval), ("after", end_eval)):
    print(f"{when:<18}" + "".join(f"{format_number(value, '.3f'):>16}" for value in held_out_eval.values()))
plot_curves(history, keys=["score", "hidden_score", "kl", "value_loss"], columns=4,
            title="Your iteration, one batch at a time (or the library's: see the line above)").show()

# %% [markdown]
# On the shipped seed the twelve iterations take the held-out hidden score from below $-0.3$ (the SFT model)
# to above $0.6$, at a KL to the reference below 3 nats, with the library's iteration and with the worked
# solutions alike. Your numbers may differ from both: under Adam a rounding difference can grow, and one
# sampled token that flips changes every later batch. A correct iteration should still clear these thresholds.

# %% tags=["claim-check"]
check_claims({
    "the held-out hidden score starts below -0.3": start_eval["eval_hidden_score"] < -0.3,
    "and ends above 0.6": end_eval["eval_hidden_score"] > 0.6,
    "at a KL below 3 nats": end_eval["eval_kl"] < 3.0,
})

# %% [markdown]
# ## Deep dive: stretch goal, stop early on approx-KL
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# The equations above say what one minibatch computes, not how many minibatches an iteration takes. The clip
# removes the incentive to push a token's ratio past the band, but it does not bound the ratio, so several
# epochs of steps can still carry the policy far from $\pi_{\text{old}}$ on average. CleanRL's PPO adds a guard it calls `target_kl`: after each epoch, when the approx-KL of that
# epoch's last minibatch exceeds the threshold, no further epoch runs. (This course's `PPOConfig.target_kl` is
# another knob, the target of notebook 06's adaptive KL controller, so here the threshold is `stop_kl`.)
#
# Write `ppo_iteration_kl_stop(..., stop_kl)`: your `ppo_iteration` with that rule. What the equations leave
# to you: how to measure approx-KL on a minibatch (notebook 04: this course logs $k_3$, the masked mean over
# the real tokens of $(\rho_t - 1) - \log\rho_t$), when to measure it (from the minibatch's forward pass,
# before its step, without gradient), and where the test goes in the two loops.
#
# The check runs the library's iteration with every epoch (3 here), reads the approx-KL it logs for each
# minibatch and sets `stop_kl` well clear of every epoch's value, so that the rule keeps a definite number of
# epochs, fewer than all. The library has no early stop of its own, but the rule only decides how many epochs
# run, and `ppo_epochs` is the library's option for that: your iteration must take the same minibatch steps,
# with the same losses, gradients and weights, as the library's with `ppo_epochs` set to the epochs the rule
# keeps.

# %%
stop_config = check_config.replace(ppo_epochs=3)
kl_case = kl_stop_case(check_model, tokenizer, check_prompts, stop_config, SEEDS, LRS, check_start)
print(wrap_printed(f"approx-KL of each epoch's last minibatch, the library's with every epoch run: "
                   f"{', '.join(f'{kl:.4f}' for kl in kl_case.end_kls)}; stop_kl {kl_case.stop_kl:.4f}"))

# %%
# EXERCISE 3
def ppo_iteration_kl_stop(model: SharedLoRAModel, tokenizer, prompts: list[str], policy_opt: torch.optim.Optimizer,
                          value_opt: torch.optim.Optimizer, config: PPOConfig, generator: torch.Generator,
                          stop_kl: float) -> tuple[Rollout, list[tuple[float, float]]]:
    """ppo_iteration, with no further epoch once the approx-KL of an epoch's last minibatch exceeds stop_kl."""
    # TODO your ppo_iteration, plus: each minibatch's approx-KL (k3, before its step, no gradient); after each
    #      epoch, stop when its last minibatch's approx-KL exceeds stop_kl
    raise NotImplementedError


# %%
def check_ppo_iteration_kl_stop():
    got = capstone.run_iteration(partial(ppo_iteration_kl_stop, stop_kl=kl_case.stop_kl), check_model, tokenizer,
                                 check_prompts, stop_config, SEEDS, LRS, check_start)
    problem = kl_stop_difference(got, kl_case, rtol)
    assert problem is None, problem


exercise_check("Exercise 3 (ppo_iteration_kl_stop)", check_ppo_iteration_kl_stop, hidden=ITERATION_HIDDEN)

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def ppo_iteration_kl_stop(model, tokenizer, prompts, policy_opt, value_opt, config, generator,
#                           stop_kl: float) -> tuple[Rollout, list]:
#     """ppo_iteration, with no further epoch once the approx-KL of an epoch's last minibatch exceeds stop_kl."""
#     samples = sample_responses(model, tokenizer, prompts, config.max_prompt_length, config.max_new_tokens,
#                                temperature=config.temperature)
#     batch = make_experience(model, samples, config)
#     P, B, eps_v = batch.context_length, len(batch), config.value_clip
#     losses = []
#     for epoch in range(config.ppo_epochs):
#         order = torch.randperm(B, generator=generator)  # (B,)
#         for first in range(0, B, config.mini_batch_size):
#             rows = order[first : first + config.mini_batch_size]  # (b,)
#             seq, attn, m = batch.sequences[rows], batch.attention_mask[rows], batch.mask[rows]  # (b, L), (b, L), (b, R)
#             A, G, V_old = batch.advantages[rows], batch.returns[rows], batch.values[rows]  # (b, R) each
#             logp = model.policy_logprobs(seq, attn, P, temperature=config.temperature).float()  # (b, R)
#             log_rho = torch.where(m.bool(), logp - batch.old_logprobs[rows], 0.0)  # (b, R)
#             rho = torch.exp(log_rho)  # (b, R)
#             pg_loss = -(torch.min(rho * A, rho.clamp(1 - config.clip_eps, 1 + config.clip_eps) * A) * m).sum() / m.sum()
#             # new: approx-KL, k3 = (rho - 1) - log rho over the real tokens, before this minibatch's step
#             approx_kl = (((rho - 1) - log_rho) * m).sum().item() / m.sum().item()
#             V = model.values(seq, attn, P).float()  # (b, R)
#             V_clip = V if eps_v is None else V_old + (V - V_old).clamp(-eps_v, eps_v)  # (b, R)
#             v_loss = 0.5 * (torch.max((V - G) ** 2, (V_clip - G) ** 2) * m).sum() / m.sum()
#             policy_opt.zero_grad()
#             value_opt.zero_grad()
#             (pg_loss + config.vf_coef * v_loss).backward()
#             torch.nn.utils.clip_grad_norm_(model.policy_parameters(), config.max_grad_norm)
#             torch.nn.utils.clip_grad_norm_(model.value_parameters(), config.max_grad_norm)
#             policy_opt.step()
#             value_opt.step()
#             losses.append((pg_loss.item(), v_loss.item()))
#         # new: the test, once per epoch, on its last minibatch (CleanRL's target_kl)
#         if approx_kl > stop_kl:
#             break
#     return batch, losses
# ```
# The test sits after the inner loop: a `break` inside it would end only the epoch, and the next epoch would
# run. SB3 tests every minibatch, before its step, at 1.5 times its threshold: another rule, with other
# numbers.
# </details>

# %% [markdown]
# ## Check your understanding
#
# **1.** A fresh policy equals the reference. Why does a ratio taken against the reference's log-probs pass
# the first training iteration unnoticed, and how does the check catch it?
#
# <details><summary>Answer</summary>
#
# With the policy adapter at zero, the stored log-probs equal the reference's, and so does every ratio. The
# check's model has its policy adapter moved on purpose: the two differ from its first minibatch on.
# </details>
#
# **2.** The check sets `value_clip` 0.3, `clip_eps` 0.25 and `vf_coef` 0.6. What would it miss with
# `value_clip = clip_eps`, `clip_eps = 0.2`, or `vf_coef = 1`?
#
# <details><summary>Answer</summary>
#
# A value loss that reads `config.clip_eps`, a ratio clamped to a written-in band `(0.8, 1.2)`, or a loop that
# forgets `vf_coef`, would compute the same numbers as the correct code. A setting equal to its neighbour, at
# the value where it does nothing (temperature 1, a coefficient 1, $\gamma = 1$), or at a default that code
# could have written in (`clip_eps` 0.2), cannot tell code that reads it from code that ignores it.
# </details>
#
# **3.** Why one backward pass of $L^{\text{CLIP}} + c_V L^V$, but two gradient clips?
#
# <details><summary>Answer</summary>
#
# The two adapters share no trained parameter and neither loss reads the other's output, so the sum's
# gradient is $\nabla L^{\text{CLIP}}$ for the policy and $c_V \nabla L^V$ for the critic. One clip over
# both would scale both by their joint norm: a large critic gradient would shrink the policy's step.
# </details>
#
# **4.** What changes if each minibatch's advantages are whitened again?
#
# <details><summary>Answer</summary>
#
# Each minibatch's advantages then average 0 over the real tokens of $b$ responses instead of $B$: a minibatch of mostly good
# responses pushes some of them down. CleanRL does this; this course's engine, like TRL's, whitens once per batch.
# </details>
