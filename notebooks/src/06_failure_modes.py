# Source of notebooks/06_failure_modes.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 06 · Failure-modes lab: break PPO on purpose, measure it, fix it
#
# {{colab_badge}}
#
# **You will learn** to recognise five bugs that real RLHF code has shipped with, each from its numbers
# and curves, broken and fixed side by side:
# - **(a)** reference log-probs used as the *old* log-probs: the ratio is not 1 at the first minibatch;
# - **(b)** pad equal to EOS: the EOS token is masked as padding and gets no learning signal;
# - **(c)** KL coefficient 0: the learned reward climbs while the true (hidden) score falls;
# - **(d)** the $k_1$ KL estimator goes negative; $k_3$ cannot;
# - **(e)** an untrained value head: poor explained variance and noisy early advantages; a value
#   warm-up fixes it.
#
# The engine (`rlhf_helpers.ppo`) has none of these bugs. To break it, this notebook subclasses or wraps
# its pieces here, in the notebook, never with switches inside the library. Runs are short (sizes come
# from the profile), so each curve is one noisy run: look for the shape, not the third decimal.

# %% [setup]

# %%
from rlhf_helpers.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import dataclasses

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from tqdm.auto import tqdm

import rlhf_helpers
from rlhf_helpers.data import load_prompts
from rlhf_helpers.ppo.build import build_shared_model
from rlhf_helpers.ppo.config import PPOConfig
from rlhf_helpers.ppo.experience import explained_variance, response_mask_to_first_eos
from rlhf_helpers.ppo.metrics import plot_curves
from rlhf_helpers.ppo.reward_training import ensure_reward_model
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.profiles import get_profile
from rlhf_helpers.world import score_breakdown

profile = get_profile()
torch.manual_seed(profile.seed)
torch.set_num_threads(min(2, torch.get_num_threads()))  # a tiny model: more threads only add overhead

# Lab sizes, derived from the profile: smaller batches and fewer steps than a full run (notebook 05).
lab_batch = max(2, profile.rollout_batch_size // 4)  # prompts per PPO step
lab_config = PPOConfig.from_profile(
    profile, rollout_batch_size=lab_batch, mini_batch_size=max(1, lab_batch // 2),
    ppo_epochs=max(1, profile.ppo_epochs // 2), progress_bar=False)
long_steps = max(2, profile.ppo_steps // 2)  # experiment (c): long enough to over-optimise
short_steps = max(2, profile.ppo_steps // 3)  # experiments (b) and (e)
warmup_steps = max(1, short_steps // 5)  # critic-only steps of the fix in (e)
print(f"lab: {lab_config.rollout_batch_size} prompts/step, minibatch {lab_config.mini_batch_size}, "
      f"{lab_config.ppo_epochs} epochs; {long_steps} steps for (c), {short_steps} for (b) and (e)")

reward_dir = ensure_reward_model(profile)  # trained in notebook 02 (trains now if it is not cached)
model, tokenizer = build_shared_model(profile, lab_config, reward_dir)
prompts = load_prompts("train")

# Every experiment starts from the same fresh policy and value adapters.
initial_state = [p.detach().clone() for p in model.policy_parameters() + model.value_parameters()]


def load_state(state):
    """Copy saved policy/value adapter (and value head) weights back into the shared model."""
    with torch.no_grad():
        for param, saved in zip(model.policy_parameters() + model.value_parameters(), state, strict=True):
            param.copy_(saved)


def run(trainer_class, config, steps, desc, start_state=initial_state):
    """Train `steps` PPO iterations from `start_state`; return the trainer and per-step extras."""
    load_state(start_state)
    trainer = trainer_class(config, model, tokenizer, prompts)
    extras = []
    for _ in tqdm(range(steps), desc=desc):
        trainer.step()
        batch = trainer.last_batch
        responses = batch.sequences[:, batch.context_length:]  # (B, R)
        is_eos = (responses == model.eos_token_id) & batch.mask.bool()  # (B, R): the EOS positions
        extras.append({"eos_logprob": float(batch.old_logprobs[is_eos].mean()) if is_eos.any() else float("nan")})
    return trainer, extras


def series(trainer, key):
    return [row["step"] for row in trainer.history], [row[key] for row in trainer.history]

# %% [markdown]
# ## The healthy baseline
#
# One correct run with the profile's KL coefficient $\beta$. It is the "fixed" side of (b), (c) and (e),
# and its final state is where (a) and (d) start (a policy that has moved away from the reference).

# %%
baseline, baseline_extras = run(PPOTrainer, lab_config, long_steps, "baseline (correct)")
trained_state = [p.detach().clone() for p in model.policy_parameters() + model.value_parameters()]
fig = plot_curves(baseline.history, keys=("score", "hidden_score", "kl", "response_length",
                                          "explained_variance", "clipfrac"),
                 title="Baseline: a correct lab run")
fig.show()

# %% [markdown]
# ## (a) Reference log-probs used as the old log-probs
#
# PPO's ratio compares the policy being updated with the policy **that sampled the batch**:
#
# $$\rho_t = \frac{\pi_\theta(a_t \mid s_t)}{\pi_{\theta_{\text{old}}}(a_t \mid s_t)}, \qquad \rho_t = 1 \text{ on the first minibatch of every update.}$$
#
# A widely copied script stored the *reference* model's log-probs there. Then
# $\rho_t = \pi_\theta / \pi_{\text{ref}}$: far from 1 as soon as training has moved the policy, the
# clip binds on many tokens from the first minibatch on (zero gradient there), and the "trust region"
# is around the SFT model instead of around the last policy. The broken trainer below changes exactly
# one thing, the old log-probs its update sees. Both start from the baseline's final state.

# %%
class RefAsOldTrainer(PPOTrainer):
    """BROKEN ON PURPOSE: the update uses the reference log-probs as the old log-probs."""

    def update(self, batch, generator):
        return super().update(dataclasses.replace(batch, old_logprobs=batch.ref_logprobs), generator)


fixed_a, _ = run(PPOTrainer, lab_config, 1, "(a) fixed: one update", start_state=trained_state)
broken_a, _ = run(RefAsOldTrainer, lab_config, 1, "(a) broken: one update", start_state=trained_state)

first_fixed, first_broken = fixed_a.last_update_stats[0], broken_a.last_update_stats[0]
assert abs(first_fixed["ratio_mean"] - 1.0) < 1e-4  # the correct engine: ratio exactly 1 at the start
for name, first in (("fixed ", first_fixed), ("broken", first_broken)):
    print(f"{name}: first minibatch ratio mean {first['ratio_mean']:.3f}  max {first['ratio_max']:.3f}  "
          f"clipfrac {first['clipfrac']:.3f}  approx_kl {first['approx_kl']:.3f}")

fig = make_subplots(rows=1, cols=2, subplot_titles=("broken: ref log-probs as old", "fixed: old = sampling policy"))
for col, trainer in ((1, broken_a), (2, fixed_a)):
    stats = trainer.last_update_stats
    xs = list(range(1, len(stats) + 1))
    fig.add_scatter(x=xs, y=[s["clipfrac"] for s in stats], name="clipfrac", row=1, col=col,
                    line_color="crimson", showlegend=col == 1)
    fig.add_scatter(x=xs, y=[s["ratio_mean"] - 1 for s in stats], name="ratio mean - 1", row=1, col=col,
                    line_color="royalblue", showlegend=col == 1)
fig.update_xaxes(title_text="minibatch of one PPO update")
fig.update_layout(title="(a) Clip fraction and ratio over one update, from the same trained state")
fig.show()

# %% [markdown]
# **Recognise it:** a clip fraction that is already high on the first minibatch of an update, an
# approx-KL that grows with training instead of staying near the per-update step size, and learning
# that stalls as the policy moves away from the SFT model. The first minibatch of a correct update
# always has ratio exactly 1 (the engine's tests check this).

# %% [markdown]
# ## (b) Pad equal to EOS
#
# Batches are padded after each response's EOS. If the pad id equals the EOS id, the usual mask
# `responses != pad_id` also hides the **real** EOS:
#
# $$m_t = [y_t \ne \texttt{pad}] \;\Rightarrow\; m_{t_{\text{EOS}}} = 0 .$$
#
# Then the EOS token gets no advantage and no gradient: the decision to *stop* is never reinforced or
# punished, and the score lands on the token before it. (`SharedLoRAModel` refuses pad == EOS, and the
# library builds the mask from the first EOS instead.) The broken trainer rebuilds its update batch
# with the naive mask, then recomputes rewards, GAE and whitening with the library's own functions.

# %%
def eos_masked_as_padding(batch, eos_token_id, config, kl_coef):
    """The experience batch as a pad == EOS pipeline would see it: EOS positions masked out."""
    P = batch.context_length
    responses = batch.sequences[:, P:]  # (B, R)
    naive_mask = batch.mask * (responses != eos_token_id).float()  # (B, R): "not padding" hides EOS too
    # a response that was only EOS would have no token left; keep it as it was (rare)
    naive_mask = torch.where(naive_mask.sum(1, keepdim=True) > 0, naive_mask, batch.mask)  # (B, R)
    attention_mask = torch.cat([batch.attention_mask[:, :P], naive_mask.long()], dim=1)  # (B, P + R)
    rewards, kl = rlhf_helpers.shape_rewards(batch.scores, batch.old_logprobs, batch.ref_logprobs, naive_mask,
                                             kl_coef, kl_kind=config.kl_kind)  # (B, R), (B, R)
    values = batch.values * naive_mask  # (B, R)
    advantages, returns = rlhf_helpers.compute_gae(rewards, values, naive_mask, config.gamma, config.lam)
    if config.whiten_advantages:
        advantages = rlhf_helpers.masked_whiten(advantages, naive_mask)  # (B, R)
    return dataclasses.replace(batch, mask=naive_mask, attention_mask=attention_mask, rewards=rewards, kl=kl,
                               values=values, advantages=advantages, returns=returns)


class PadIsEosTrainer(PPOTrainer):
    """BROKEN ON PURPOSE: the update masks EOS as if it were padding."""

    def update(self, batch, generator):
        return super().update(eos_masked_as_padding(batch, model.eos_token_id, self.config,
                                                    self.kl_controller.value), generator)


# The masks of three sampled responses: the right one (1 up to and including EOS) and the naive one.
batch = baseline.last_batch
naive = eos_masked_as_padding(batch, model.eos_token_id, lab_config, 0.0).mask  # (B, R)
for row in range(3):
    ids = batch.sequences[row, batch.context_length:].tolist()
    n = int(batch.mask[row].sum()) + 1  # show one pad after the EOS
    tokens = tokenizer.convert_ids_to_tokens(ids[:n])
    print(" ".join(f"{t}" for t in tokens[-6:]))
    print("  right mask:", batch.mask[row, :n].int().tolist()[-6:], "  naive mask:", naive[row, :n].int().tolist()[-6:])

broken_b, broken_b_extras = run(PadIsEosTrainer, lab_config, short_steps, "(b) broken: pad == EOS")

# %% [markdown]
# Side by side: the mean log-probability of the EOS tokens the policy sampled (how sure it is when it
# stops), the response length and the share of responses that end with EOS. In the fixed run the EOS
# decision gets credit like any other token; in the broken run it drifts only through its neighbours.

# %%
fig = make_subplots(rows=1, cols=3, subplot_titles=("log-prob of the sampled EOS", "response length (tokens)",
                                                    "share ending with EOS"))
for name, trainer, extras, color in (("broken: pad == EOS", broken_b, broken_b_extras, "crimson"),
                                     ("fixed", baseline, baseline_extras, "royalblue")):
    steps_b = [row["step"] for row in trainer.history][:short_steps]
    fig.add_scatter(x=steps_b, y=[e["eos_logprob"] for e in extras][:short_steps], name=name, row=1, col=1,
                    line_color=color)
    for col, key in ((2, "response_length"), (3, "eos_fraction")):
        fig.add_scatter(x=steps_b, y=series(trainer, key)[1][:short_steps], name=name, row=1, col=col,
                        line_color=color, showlegend=False)
fig.update_xaxes(title_text="PPO step")
fig.update_layout(title="(b) Pad == EOS against the correct EOS-aware mask")
fig.show()
for name, extras in (("broken", broken_b_extras), ("fixed ", baseline_extras[:short_steps])):
    print(f"{name}: mean log-prob of sampled EOS, first step {extras[0]['eos_logprob']:+.3f}, "
          f"last step {extras[-1]['eos_logprob']:+.3f}")

# %% [markdown]
# **Recognise it:** EOS positions that are 0 in the loss mask (print one row of the mask!), an EOS
# probability that does not respond to training, and in longer runs responses that run to
# `max_new_tokens` (`eos_fraction` falls). The fix is a pad token distinct from EOS
# (`rlhf_helpers.models.ensure_distinct_pad`) and a mask built from the first EOS.
#
# ### Exercise 1: an EOS-aware response mask
# Write `mask_to_first_eos(responses, eos_id)`: for each row of a (B, R) tensor of token ids, 1 on every
# token up to **and including** the first EOS, 0 after it (rows without EOS are all 1). Do not look at
# the pad id at all.

# %%
# EXERCISE 1
def mask_to_first_eos(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it: (B, R) ids -> (B, R) float."""
    raise NotImplementedError


# %%
def check_mask_to_first_eos():
    eos = 2
    ids = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).float()
    torch.testing.assert_close(mask_to_first_eos(ids, eos), expected)
    random_ids = torch.randint(0, 6, (20, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(mask_to_first_eos(random_ids, eos), response_mask_to_first_eos(random_ids, eos))


exercise_check("Exercise 1 (mask_to_first_eos)", check_mask_to_first_eos)

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def mask_to_first_eos(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
#     """1 up to and including the first EOS of each row, 0 after it: (B, R) ids -> (B, R) float."""
#     is_eos = (responses == eos_id).long()  # (B, R)
#     eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # (B, R): EOS tokens strictly before t
#     return (eos_before == 0).float()
# ```
# </details>

# %% [markdown]
# ## (c) KL coefficient 0: reward over-optimisation
#
# The per-token reward is $r_t = -\beta\,\widehat{\mathrm{KL}}_t + [t = \text{last}]\; r_\phi(x, y)$.
# With $\beta = 0$ nothing holds the policy near the SFT model, where the reward model $r_\phi$ was
# trained and is accurate. PPO then finds what $r_\phi$ over-rates (notebook 02: repetition, piles of
# praise): the **learned** reward keeps rising while the **hidden** score, what we actually want, rises
# at first and then falls (Gao et al. 2022). This is the key plot of RLHF.

# %%
broken_c, _ = run(PPOTrainer, lab_config.replace(kl_coef=0.0), long_steps, "(c) broken: kl_coef = 0")

fig = make_subplots(rows=1, cols=3, subplot_titles=(f"broken: beta = 0", f"fixed: beta = {lab_config.kl_coef}",
                                                    "KL to the reference (nats / response)"))
for col, trainer in ((1, broken_c), (2, baseline)):
    for key, color in (("score", "darkorange"), ("hidden_score", "seagreen")):
        label = "learned reward" if key == "score" else "hidden score"
        fig.add_scatter(x=series(trainer, key)[0], y=series(trainer, key)[1], name=label, row=1, col=col,
                        line_color=color, showlegend=col == 1)
for name, trainer, color in (("beta = 0", broken_c, "crimson"), (f"beta = {lab_config.kl_coef}", baseline, "royalblue")):
    fig.add_scatter(x=series(trainer, "kl")[0], y=series(trainer, "kl")[1], name=name, row=1, col=3, line_color=color)
fig.update_xaxes(title_text="PPO step")
fig.update_layout(title="(c) Learned reward against hidden score, without and with the KL penalty")
fig.show()

for name, trainer in (("broken (beta = 0)", broken_c), (f"fixed (beta = {lab_config.kl_coef})", baseline)):
    last = trainer.history[-max(1, long_steps // 6):]  # mean of the last few steps
    best_hidden = max(row["hidden_score"] for row in trainer.history)
    print(f"{name}: last steps learned {sum(r['score'] for r in last) / len(last):+.2f}   hidden "
          f"{sum(r['hidden_score'] for r in last) / len(last):+.2f}   (best hidden on the way {best_hidden:+.2f})   "
          f"KL {sum(r['kl'] for r in last) / len(last):.1f}")
print("\nresponses of the beta = 0 policy, with their hidden score terms:")
hacked = broken_c.last_batch
for prompt, response in list(zip(hacked.prompts, hacked.responses, strict=True))[:3]:
    terms = score_breakdown(prompt, response)
    print(f"  {response}\n    hidden {terms.total:+.2f} (fluency {terms.fluency:+.2f}, repetition {terms.repetition:+.2f}, "
          f"length {terms.length:+.2f})")

# %% [markdown]
# **Recognise it:** the learned reward goes up and the KL grows without bound; samples read worse (here
# the hidden score's fluency and repetition terms fall). In real runs there is no hidden score: read
# samples, and keep a held-out evaluation the policy is not optimised on. The fix is the KL penalty
# (fixed $\beta$ or an adaptive controller with a target KL), and early stopping.

# %% [markdown]
# ## (d) Negative KL from the $k_1$ estimator
#
# The logged KL is estimated from the sampled tokens. With $\log\rho_t = \log\pi_{\text{ref}}(a_t) - \log\pi(a_t)$:
#
# $$k_1 = -\log\rho_t, \qquad k_3 = (\rho_t - 1) - \log\rho_t \;\ge 0 .$$
#
# Both are unbiased estimates of $\mathrm{KL}(\pi \Vert \pi_{\text{ref}})$ when $a_t \sim \pi$, but
# $k_1$ is negative on every token the reference likes more than the policy, and a *sequence* or a small
# batch can sum to a negative KL. Seeing "KL = -0.3" in a log is not a bug in the maths; seeing it
# persistently is a sign that the samples did not come from $\pi$ (top-k, top-p, a temperature other
# than 1, or the wrong log-probs, as in (a)). Here both estimators on the **same** batch:

# %%
def k3_scratch(logprobs, ref_logprobs):
    """(rho - 1) - log rho with rho = pi_ref / pi, per token: (B, R) -> (B, R)."""
    log_rho = ref_logprobs - logprobs  # (B, R)
    return torch.exp(log_rho) - 1 - log_rho


batch = baseline.last_batch
k1 = rlhf_helpers.kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k1") * batch.mask  # (B, R)
k3 = rlhf_helpers.kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k3") * batch.mask  # (B, R)
torch.testing.assert_close(k3, k3_scratch(batch.old_logprobs, batch.ref_logprobs) * batch.mask)
real = batch.mask.bool()
seq_k1, seq_k3 = k1.sum(dim=1), k3.sum(dim=1)  # (B,), (B,)
print(f"per token: k1 negative on {(k1[real] < 0).float().mean():.0%} of tokens, k3 on {(k3[real] < 0).float().mean():.0%}")
print(f"per sequence: k1 negative for {(seq_k1 < 0).float().mean():.0%} of responses, k3 for {(seq_k3 < 0).float().mean():.0%}")
print(f"batch mean sequence KL: k1 {seq_k1.mean():+.3f}   k3 {seq_k3.mean():+.3f}")

fig = make_subplots(rows=1, cols=2, subplot_titles=("k1 per token (can be < 0)", "k3 per token (never < 0)"))
fig.add_histogram(x=k1[real].tolist(), nbinsx=60, row=1, col=1, marker_color="crimson", name="k1")
fig.add_histogram(x=k3[real].tolist(), nbinsx=60, row=1, col=2, marker_color="royalblue", name="k3")
fig.update_xaxes(title_text="KL estimate")
fig.update_layout(title="(d) k1 against k3 on the same batch (the trained baseline's last rollouts)", showlegend=False)
fig.show()

# %% [markdown]
# **Recognise it:** negative per-sequence (or small-batch) KL values in the log. Use $k_3$ (or $k_2$)
# for *reporting*; in the reward, $k_1$ per token is fine on average, but its negative tokens become
# *positive* rewards, a bonus for going where the reference is more confident.
#
# ### Exercise 2: sequence KL with $k_3$
# Write `sequence_kl_k3(logprobs, ref_logprobs, mask)`: the $k_3$ estimate summed over each response's
# real tokens, shape (B,).

# %%
# EXERCISE 2
def sequence_kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t m_t ((rho_t - 1) - log rho_t), rho_t = exp(ref_t - logp_t): (B, R) x3 -> (B,)."""
    raise NotImplementedError


# %%
def check_sequence_kl_k3():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(6, 9, generator=g) * 3  # (B, R)
    ref = logp + 0.5 * torch.randn(6, 9, generator=g)  # (B, R)
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 3, 5, 1, 7, 8])[:, None]).float()  # (B, R)
    expected = torch.tensor([sum(((r - l).exp() - 1 - (r - l)).item() for l, r, m in zip(lr, rr, mr, strict=True) if m)
                             for lr, rr, mr in zip(logp, ref, mask, strict=True)])
    got = sequence_kl_k3(logp, ref, mask)
    torch.testing.assert_close(got, expected)
    assert bool((got >= 0).all()), "k3 sums of real tokens can never be negative"
    torch.testing.assert_close(sequence_kl_k3(logp, logp, mask), torch.zeros(6))  # same policy: KL 0


exercise_check("Exercise 2 (sequence_kl_k3)", check_sequence_kl_k3)

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def sequence_kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
#     """sum_t m_t ((rho_t - 1) - log rho_t), rho_t = exp(ref_t - logp_t): (B, R) x3 -> (B,)."""
#     log_rho = ref_logprobs - logprobs  # (B, R)
#     return ((torch.expm1(log_rho) - log_rho) * mask).sum(dim=1)  # (B,)
# ```
# </details>

# %% [markdown]
# ## (e) An untrained value head
#
# GAE's advantages are only as good as the critic: $\hat A_t = \sum_l (\gamma\lambda)^l \delta_{t+l}$ with
# $\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)$. A fresh value head outputs $V \approx 0$ everywhere, so
# early advantages are the raw returns: every token of a response gets about the same credit, and the
# policy's first updates follow noise. The critic's quality is measured by
#
# $$\text{explained variance} = 1 - \frac{\operatorname{Var}[R_t - V(s_t)]}{\operatorname{Var}[R_t]}$$
#
# (1: perfect, 0: no better than a constant, below 0: worse). The fix: a **value warm-up**, a few
# iterations that train only the critic on the SFT policy's rollouts before the policy moves
# (`PPOConfig.value_warmup_steps`). The broken side is the baseline's first steps (no warm-up).

# %%
fixed_e, _ = run(PPOTrainer, lab_config.replace(value_warmup_steps=warmup_steps), short_steps + warmup_steps,
                 f"(e) fixed: {warmup_steps} critic-only steps first")

fig = make_subplots(rows=1, cols=3, subplot_titles=("explained variance", "value loss", "hidden score"))
for name, trainer, offset, color in (("broken: no warm-up", baseline, 0, "crimson"),
                                     (f"fixed: {warmup_steps} warm-up steps", fixed_e, warmup_steps, "royalblue")):
    for col, key in ((1, "explained_variance"), (2, "value_loss"), (3, "hidden_score")):
        xs, ys = series(trainer, key)
        # x = policy updates done: the warm-up steps sit at x <= 0
        fig.add_scatter(x=[x - offset for x in xs][: short_steps + offset], y=ys[: short_steps + offset], name=name,
                        row=1, col=col, line_color=color, showlegend=col == 1)
fig.add_vline(x=0.5, line_dash="dot", line_color="gray")
fig.update_xaxes(title_text="PPO step (policy updates; <= 0: critic warm-up)")
fig.update_layout(title="(e) The critic without and with a value warm-up")
fig.show()
ev_broken = baseline.history[0]["explained_variance"]
ev_fixed = fixed_e.history[warmup_steps]["explained_variance"]
print(f"explained variance of the batch of the first policy update: no warm-up {ev_broken:+.3f}   "
      f"after {warmup_steps} warm-up steps {ev_fixed:+.3f}")

# %% [markdown]
# **Recognise it:** explained variance near or below 0 and a large value loss in the first steps, while
# the policy is already updating. A warm-up (or a critic initialised from the reward model) fixes it;
# with very short warm-ups in a short run, as here, the difference is one noisy run, so compare the
# explained variance of the first policy update above rather than the whole curve.
#
# ### Exercise 3: explained variance
# Write `explained_variance_scratch(values, returns, mask)`: $1 - \operatorname{Var}[R - V] / \operatorname{Var}[R]$
# over the real tokens only (unbiased variances), as a Python float.

# %%
# EXERCISE 3
def explained_variance_scratch(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[returns - values] / Var[returns] over positions with mask == 1: (B, R) x3 -> float."""
    raise NotImplementedError


# %%
def check_explained_variance():
    g = torch.Generator().manual_seed(2)
    returns = torch.randn(5, 8, generator=g)  # (B, R)
    values = returns + 0.5 * torch.randn(5, 8, generator=g)  # (B, R)
    mask = (torch.arange(8)[None, :] < torch.tensor([8, 2, 5, 6, 3])[:, None]).float()  # (B, R)
    got = explained_variance_scratch(values, returns, mask)
    assert abs(got - explained_variance(values, returns, mask)) < 1e-5, got
    assert abs(explained_variance_scratch(returns, returns, mask) - 1.0) < 1e-6  # perfect critic
    constant = torch.full_like(returns, 3.0)
    assert abs(explained_variance_scratch(constant, returns, mask)) < 1e-5  # a constant explains nothing
    padded = values.masked_fill(mask == 0, 1e6)  # padding must not matter
    assert abs(explained_variance_scratch(padded, returns, mask) - got) < 1e-5


exercise_check("Exercise 3 (explained_variance_scratch)", check_explained_variance)

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def explained_variance_scratch(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
#     """1 - Var[returns - values] / Var[returns] over positions with mask == 1: (B, R) x3 -> float."""
#     real = mask.bool()
#     target = returns[real]
#     return (1 - (target - values[real]).var() / target.var()).item()
# ```
# </details>

# %% [markdown]
# ## Summary: what each failure looks like
#
# | bug | first sign | curve |
# |---|---|---|
# | (a) ref log-probs as old | ratio $\ne 1$ and clipfrac high on the first minibatch | learning stalls as KL grows |
# | (b) pad == EOS | EOS positions 0 in the loss mask | EOS probability stops responding; lengths drift |
# | (c) $\beta = 0$ | KL grows without bound | learned reward up, hidden score down |
# | (d) $k_1$ for reporting | negative sequence KL in the log | noisy KL curve around 0 early on |
# | (e) untrained critic | explained variance $\le 0$ | large value loss in the first steps |
#
# `docs/metrics.md` and `rlhf_helpers.ppo.metrics.GLOSSARY` describe every logged metric.
