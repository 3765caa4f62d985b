# Source of notebooks/06_failure_modes.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 06 · Failure-modes lab: break PPO on purpose, measure it, fix it
#
# {{colab_badge}}
#
# **You will learn** to recognise five bugs that real RLHF code has shipped with, each from its numbers
# and curves, broken and fixed side by side:
# - **(a)** reference log-probs used as the *old* log-probs: the ratio is not 1 at the first minibatch,
#   and the clip fraction and approx-KL measure the distance to the SFT model;
# - **(b)** pad equal to EOS: the EOS token is masked as padding, so the update no longer moves the stop
#   decision in the direction of its advantage (measured);
# - **(c)** KL coefficient 0: the learned reward climbs while the true (hidden) score falls; a fit of
#   Gao et al.'s law locates the KL where the hidden score peaks;
# - **(d)** the $k_1$ KL estimator goes negative on single responses; $k_3$ cannot;
# - **(e)** an untrained value head: explained variance near 0 when the policy starts to move; a value
#   warm-up trains the critic first.
#
# The engine (`rlhf_helpers.ppo`) has none of these bugs. To break it, this notebook subclasses or wraps
# its pieces here, in the notebook, never with switches inside the library. Runs are short (sizes come
# from the profile), so each curve is one noisy run: look for the shape, not the third decimal.

# %% [setup]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import dataclasses
import math

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from tqdm.auto import tqdm

import rlhf_helpers
from rlhf_helpers.core.tokens import mask_to_first_eos as library_mask_to_first_eos
from rlhf_helpers.ppo.build import build_shared_model
from rlhf_helpers.ppo.config import PPOConfig
from rlhf_helpers.ppo.metrics import plot_curves
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.reward import ensure_reward_model
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.world.scorer import hidden_scores, score_breakdown

profile = get_profile()
ensure_sft_model(profile)  # gpu profile: fine-tuned once per runtime (notebook 02 may have done it), then reused
torch.manual_seed(profile.seed)
if profile.device == "cpu":
    torch.set_num_threads(1)  # the tiny model's matrices are too small to gain from a second thread

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


def step_extras(trainer):
    """What the sections below read from one finished step, beyond `trainer.history`."""
    batch = trainer.last_batch
    P = batch.context_length
    real = batch.mask.bool()  # (B, R)
    is_eos = (batch.sequences[:, P:] == model.eos_token_id) & real  # (B, R): the sampled EOS tokens
    with torch.no_grad():
        new_logprobs = model.policy_logprobs(batch.sequences, batch.attention_mask, P).float()  # (B, R)
    change = new_logprobs - batch.old_logprobs  # (B, R): what this step's update did to each sampled token
    seq_k1 = (rlhf_helpers.kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k1") * batch.mask).sum(1)  # (B,)
    seq_k3 = (rlhf_helpers.kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k3") * batch.mask).sum(1)  # (B,)
    first = trainer.last_update_stats[0]  # the first minibatch of the first epoch
    return {
        # advantages of the correct pipeline (trainer.last_batch is never the broken copy)
        "eos_advantage": batch.advantages[is_eos].tolist(), "eos_change": change[is_eos].tolist(),
        "other_advantage": batch.advantages[real & ~is_eos].tolist(), "other_change": change[real & ~is_eos].tolist(),
        "first_ratio_mean": first["ratio_mean"], "first_clipfrac": first["clipfrac"],
        "k1_mean": float(seq_k1.mean()), "k3_mean": float(seq_k3.mean()),
        "k1_negative": float((seq_k1 < 0).float().mean()), "k3_negative": float((seq_k3 < 0).float().mean()),
    }


def run(trainer_class, config, steps, desc, start_state=initial_state):
    """Train `steps` PPO iterations from `start_state`; return the trainer and per-step extras."""
    load_state(start_state)
    trainer = trainer_class(config, model, tokenizer, prompts, hidden_score_fn=hidden_scores)
    extras = []
    for _ in tqdm(range(steps), desc=desc):
        trainer.step()
        extras.append(step_extras(trainer))
    return trainer, extras


def series(trainer, key):
    return [row["step"] for row in trainer.history], [row[key] for row in trainer.history]


def correlation(xs, ys):
    """Pearson correlation of two lists (nan with fewer than 3 points)."""
    if len(xs) < 3:
        return float("nan")
    return float(torch.corrcoef(torch.tensor([xs, ys]))[0, 1])


def third_means(values):
    """Means of the first, middle and last third of a curve (a short run is noisy: compare thirds)."""
    n = len(values)
    cuts = [0, max(1, n // 3), max(2, 2 * n // 3), n]
    return [sum(values[a:b]) / (b - a) if b > a else float("nan") for a, b in zip(cuts, cuts[1:], strict=False)]

# %% [markdown]
# ## The healthy baseline
#
# One correct run with the profile's KL coefficient $\beta$. It is the "fixed" side of (b), (c) and (e),
# its final state (a policy that has moved away from the reference) is where both sides of (a) start,
# and (d) reads its batches.

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
# one thing, the old log-probs its update sees. Both runs start from the baseline's final state (at
# the very start of training the policy *is* the reference, and the bug is invisible) and train a few
# more steps.

# %%
class RefAsOldTrainer(PPOTrainer):
    """BROKEN ON PURPOSE: the update uses the reference log-probs as the old log-probs."""

    def update(self, batch, generator):
        return super().update(dataclasses.replace(batch, old_logprobs=batch.ref_logprobs), generator)


a_steps = max(2, short_steps // 4)
fixed_a, fixed_a_extras = run(PPOTrainer, lab_config, a_steps, "(a) fixed", start_state=trained_state)
broken_a, broken_a_extras = run(RefAsOldTrainer, lab_config, a_steps, "(a) broken: ref as old",
                                start_state=trained_state)

assert all(abs(e["first_ratio_mean"] - 1.0) < 1e-4 for e in fixed_a_extras)  # correct engine: ratio 1 at the start
for name, extras, trainer in (("fixed ", fixed_a_extras, fixed_a), ("broken", broken_a_extras, broken_a)):
    print(f"{name}: first-minibatch ratio mean per step {[round(e['first_ratio_mean'], 2) for e in extras]}\n"
          f"        clip fraction per step {[round(row['clipfrac'], 3) for row in trainer.history]}")

fig = make_subplots(rows=1, cols=3, subplot_titles=("ratio mean, first minibatch of each step",
                                                    "clip fraction (mean over the update)", "approx-KL of the update"))
for name, trainer, extras, color in (("broken: ref log-probs as old", broken_a, broken_a_extras, "crimson"),
                                     ("fixed: old = sampling policy", fixed_a, fixed_a_extras, "royalblue")):
    xs = series(trainer, "clipfrac")[0]
    fig.add_scatter(x=xs, y=[e["first_ratio_mean"] for e in extras], name=name, row=1, col=1, line_color=color)
    for col, key in ((2, "clipfrac"), (3, "approx_kl")):
        fig.add_scatter(x=xs, y=series(trainer, key)[1], name=name, row=1, col=col, line_color=color,
                        showlegend=False)
fig.update_xaxes(title_text="PPO step after the baseline")
fig.update_layout(title="(a) The same trained state, updated with the right and with the wrong old log-probs")
fig.show()

# %% [markdown]
# **Recognise it:** look at the first panel. A correct update starts every step at ratio exactly 1
# (the assert above checks it; so do the engine's tests); the broken one starts wherever
# $\pi_\theta / \pi_{\text{ref}}$ happens to be. Then compare the clip fraction and approx-KL with
# the healthy run's: a clip fraction far above a few percent on a learning rate that was fine before,
# and an approx-KL that measures the distance to the SFT model (it grows as training goes on) instead
# of the size of one update. The clipped tokens get no gradient, so much of each batch is wasted.

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
# What the update does to the stop decision, measured: after every step, the change in log-probability
# of each sampled token, $\Delta_t = \log\pi_{\text{new}}(y_t) - \log\pi_{\text{old}}(y_t)$, against the
# advantage $\hat A_t$ the **correct** pipeline gives that token. A working policy gradient raises
# tokens with $\hat A_t > 0$ and lowers the others, so $\Delta_t$ and $\hat A_t$ are positively
# correlated. Below: every sampled EOS token of the first steps of the baseline (fixed) and of the
# broken run, and the same correlation on all other tokens as a control.

# %%
fixed_b_extras = baseline_extras[:short_steps]  # the baseline's first steps: same start, same seeds
fig = make_subplots(rows=1, cols=2, subplot_titles=("broken: pad == EOS", "fixed: mask up to and including EOS"))
for col, extras, color in ((1, broken_b_extras, "crimson"), (2, fixed_b_extras, "royalblue")):
    fig.add_scatter(x=[a for e in extras for a in e["eos_advantage"]], y=[d for e in extras for d in e["eos_change"]],
                    mode="markers", marker=dict(size=4, opacity=0.5, color=color), row=1, col=col, showlegend=False)
fig.update_xaxes(title_text="advantage of the sampled EOS token (correct pipeline)")
fig.update_yaxes(title_text="change of its log-prob in the update", row=1, col=1)
fig.update_layout(title=f"(b) EOS tokens of {short_steps} PPO steps: does the update follow their advantage?")
fig.show()

for name, extras in (("broken", broken_b_extras), ("fixed ", fixed_b_extras)):
    eos_corr = correlation([a for e in extras for a in e["eos_advantage"]], [d for e in extras for d in e["eos_change"]])
    other_corr = correlation([a for e in extras for a in e["other_advantage"]],
                             [d for e in extras for d in e["other_change"]])
    print(f"{name}: correlation(advantage, log-prob change)  EOS tokens {eos_corr:+.2f}   other tokens {other_corr:+.2f}")

# %% [markdown]
# **Recognise it:** EOS positions that are 0 in the loss mask (print one row of the mask, as above), and
# an EOS probability that does not follow its advantage: compare the EOS correlation of the two runs,
# and each with its control. The broken run's EOS tokens still move a little (they share weights with
# the tokens that do get a gradient), but not in the direction their own advantage asks for. A policy
# that cannot be taught when to stop drifts in length with no pressure on the stop token; a long run
# can end with responses cut at `max_new_tokens` (watch `eos_fraction` and `response_length`). The fix
# is a pad token distinct from EOS (`rlhf_helpers.runtime.models.ensure_distinct_pad`) and a mask built from
# the first EOS.
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
    torch.testing.assert_close(mask_to_first_eos(random_ids, eos), library_mask_to_first_eos(random_ids, eos))


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
# trained and is accurate. PPO is free to find what $r_\phi$ over-rates (notebook 02: repetition, piles
# of praise). The signature to look for (Gao et al. 2022): the **learned** reward keeps rising while the
# **hidden** score, what we actually want, rises at first and then falls. This is the key plot of RLHF.
# Both runs below share their first steps (same start, same seeds) and part ways as the policy leaves
# the reference.

# %%
broken_c, _ = run(PPOTrainer, lab_config.replace(kl_coef=0.0), long_steps, "(c) broken: kl_coef = 0")

fig = make_subplots(rows=1, cols=3, subplot_titles=("broken: beta = 0", f"fixed: beta = {lab_config.kl_coef}",
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

print("means over the first, middle and last third of each run:")
for name, trainer in (("broken (beta = 0)", broken_c), (f"fixed (beta = {lab_config.kl_coef})", baseline)):
    learned, hidden, kl = (third_means(series(trainer, key)[1]) for key in ("score", "hidden_score", "kl"))
    print(f"  {name:<20} learned {' '.join(f'{v:+.2f}' for v in learned)}   hidden "
          f"{' '.join(f'{v:+.2f}' for v in hidden)}   KL {' '.join(f'{v:.1f}' for v in kl)}")
    parted = hidden[2] < hidden[1] and learned[2] >= learned[1]
    print(f"  {'':<20} last third: hidden score {'fell' if hidden[2] < hidden[1] else 'did not fall'}, learned "
          f"reward {'did not fall' if learned[2] >= learned[1] else 'fell'} -> over-optimisation signature: "
          f"{'yes' if parted else 'no'}")
print("\nresponses of the beta = 0 policy, with their hidden score terms:")
hacked = broken_c.last_batch
for prompt, response in list(zip(hacked.prompts, hacked.responses, strict=True))[:3]:
    terms = score_breakdown(prompt, response)
    print(f"  {response}\n    hidden {terms.total:+.2f} (fluency {terms.fluency:+.2f}, repetition {terms.repetition:+.2f}, "
          f"length {terms.length:+.2f})")

# %% [markdown]
# **Recognise it:** the signature of over-optimisation is a KL that keeps growing, a learned reward
# that is still rising or flat, and a hidden score that falls; the cell above checks the last two on
# the thirds of each run (one noisy run each: compare the thirds, not single steps). Samples read worse:
# look at the fluency and repetition terms of the hidden score of the $\beta = 0$ samples. In real runs
# there is no hidden score: read samples, and keep a held-out evaluation the policy is not optimised
# on. The fix is the KL penalty (fixed $\beta$ or an adaptive controller with a target KL), and early
# stopping.

# %% [markdown]
# ### How far can the proxy be pushed?
#
# Gao et al. (2022, "Scaling laws for reward model overoptimization") measure the distance from the
# initial policy as $d = \sqrt{\mathrm{KL}}$ and fit the gold (here: hidden) score with two laws, one per
# way of optimising:
#
# $$\text{best-of-}n:\; h(d) = c_{\text{G}} + d\,(\alpha_{\text{G}} - \beta_{\text{G}}\, d), \qquad
# \text{RL}:\; h(d) = c_{\text{G}} + d\,(\alpha_{\text{G}} - \beta_{\text{G}} \log d)$$
#
# ($c_{\text{G}}$: the SFT model's hidden score; the subscript G marks Gao et al.'s coefficients, so
# $\beta_{\text{G}}$ is not the KL penalty $\beta$).
# PPO is RL, so the second form is the one to expect; the first is drawn for comparison. Both are
# linear in their coefficients: a least-squares fit on the features $(1, d, d^2)$ or $(1, d, d\log d)$.
# The RL form peaks where $h'(d) = \alpha_{\text{G}} - \beta_{\text{G}}(\log d + 1) = 0$:
#
# $$d^* = \exp\!\left(\frac{\alpha_{\text{G}}}{\beta_{\text{G}}} - 1\right), \qquad \mathrm{KL}^* = (d^*)^2 .$$
#
# Each PPO step of the $\beta = 0$ run is one point (KL of its batch, mean hidden score); the penalised
# run's points are drawn in the same plane.

# %%
def law_features(d: np.ndarray, form: str) -> np.ndarray:
    """(N,) distances -> (N, 3) design matrix of the best-of-n ("bon") or the RL ("rl") law."""
    d_log_d = d * np.log(np.where(d > 0, d, 1.0))  # (N,): d log d -> 0 as d -> 0
    return np.stack([np.ones_like(d), d, -(d**2) if form == "bon" else -d_log_d], axis=1)


kl_c, hidden_c = series(broken_c, "kl")[1], series(broken_c, "hidden_score")[1]
d_c = np.sqrt(np.clip(kl_c, 0.0, None))  # (N,): k1 batch means can dip below 0 early on
fig = go.Figure()
fig.add_scatter(x=d_c, y=hidden_c, mode="markers", name="beta = 0, one point per step", marker_color="crimson")
fig.add_scatter(x=np.sqrt(np.clip(series(baseline, "kl")[1], 0.0, None)), y=series(baseline, "hidden_score")[1],
                mode="markers", name=f"beta = {lab_config.kl_coef}", marker_color="royalblue")
if len(d_c) >= 6:  # three coefficients need clearly more than three points
    grid = np.linspace(0.0, d_c.max(), 100)
    fits = {}
    for form, label, dash in (("rl", "RL law", "solid"), ("bon", "best-of-n law", "dash")):
        coef, *_ = np.linalg.lstsq(law_features(d_c, form), hidden_c, rcond=None)  # (c, alpha, beta_G)
        rss = float(((law_features(d_c, form) @ coef - hidden_c) ** 2).sum())
        fits[form] = (coef, rss)
        fig.add_scatter(x=grid, y=law_features(grid, form) @ coef, mode="lines", name=f"{label} fit",
                        line=dict(color="black", dash=dash))
        print(f"{label:>13}: c {coef[0]:+.3f}  alpha {coef[1]:+.3f}  beta_G {coef[2]:+.3f}   "
              f"residual sum of squares {rss:.2f}")
    better = min(fits, key=lambda form: fits[form][1])
    print(f"the {'RL' if better == 'rl' else 'best-of-n'} form fits this run better")
    (c_g, alpha_g, beta_g), _ = fits["rl"]
    d_star = float(np.exp(alpha_g / beta_g - 1)) if beta_g > 0 else float("inf")
    if 0 < d_star <= d_c.max():
        fig.add_vline(x=d_star, line_dash="dot", line_color="gray")
        print(f"the RL law's hidden score peaks at KL* = {d_star**2:.1f} nats per response (d* = {d_star:.2f}); "
              f"the beta = {lab_config.kl_coef} run ended at KL {baseline.history[-1]['kl']:.1f}")
    else:
        print("the RL law's fitted curve has no peak inside the range (no rise-then-fall in this run)")
else:
    print(f"only {len(d_c)} steps: too few points to fit three coefficients")
fig.update_layout(title="(c) Hidden score against the distance from the SFT model",
                  xaxis_title="d = sqrt(KL to the reference)", yaxis_title="mean hidden score of the batch")
fig.show()

# %% [markdown]
# **Read it:** left of $d^*$ optimising the learned reward also improves what we want; right of it
# every extra nat of KL makes it worse. A KL penalty (or a target KL) is how you choose where on this
# curve training stops. The fit is one noisy run: read $d^*$ as a rough location, not a constant.
#
# ### Exercise 2: fit the over-optimisation law
# Write `fit_overoptimisation(kl, hidden)`: the least-squares coefficients $(c_{\text{G}}, \alpha_{\text{G}}, \beta_{\text{G}})$
# of Gao et al.'s RL law $h = c_{\text{G}} + \alpha_{\text{G}} d - \beta_{\text{G}}\, d \log d$, $d = \sqrt{\mathrm{KL}}$, from two
# lists of equal length, as three Python floats, without numpy (the check compares against
# `numpy.linalg.lstsq`). Treat negative KL values as 0, and use $d \log d = 0$ at $d = 0$ (its limit).

# %%
# EXERCISE 2
def fit_overoptimisation(kl: list[float], hidden: list[float]) -> tuple[float, float, float]:
    """Least-squares (c, alpha, beta_G) of hidden = c + alpha * d - beta_G * d * log(d), d = sqrt(kl)."""
    raise NotImplementedError


# %%
def check_fit_overoptimisation():
    kl = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    exact = [0.3 + 0.8 * k**0.5 - 0.1 * k**0.5 * math.log(k**0.5) if k > 0 else 0.3 for k in kl]  # obeys the law
    c, alpha, beta_g = fit_overoptimisation(kl, exact)
    assert max(abs(c - 0.3), abs(alpha - 0.8), abs(beta_g - 0.1)) < 1e-6, (c, alpha, beta_g)
    g = torch.Generator().manual_seed(3)
    noisy_kl = (torch.rand(40, generator=g, dtype=torch.float64) * 50 - 1).tolist()  # a few negative values
    noisy_h = (torch.randn(40, generator=g, dtype=torch.float64)).tolist()
    d = np.sqrt(np.clip(noisy_kl, 0.0, None))
    reference, *_ = np.linalg.lstsq(law_features(d, "rl"), np.array(noisy_h), rcond=None)  # independent
    np.testing.assert_allclose(fit_overoptimisation(noisy_kl, noisy_h), reference, rtol=1e-6, atol=1e-9)


exercise_check("Exercise 2 (fit_overoptimisation)", check_fit_overoptimisation)

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def fit_overoptimisation(kl: list[float], hidden: list[float]) -> tuple[float, float, float]:
#     """Least-squares (c, alpha, beta_G) of hidden = c + alpha * d - beta_G * d * log(d), d = sqrt(kl)."""
#     d = torch.tensor(kl, dtype=torch.float64).clamp(min=0).sqrt()  # (N,)
#     d_log_d = torch.where(d > 0, d * torch.log(d.clamp(min=1e-300)), torch.zeros_like(d))  # (N,)
#     X = torch.stack([torch.ones_like(d), d, -d_log_d], dim=1)  # (N, 3): the design matrix
#     y = torch.tensor(hidden, dtype=torch.float64)[:, None]  # (N, 1)
#     c, alpha, beta_g = torch.linalg.lstsq(X, y).solution[:, 0].tolist()
#     return c, alpha, beta_g
# ```
# </details>

# ## (d) Negative KL from the $k_1$ estimator
#
# The logged KL is estimated from the sampled tokens. With $\log w_t = \log\pi_{\text{ref}}(a_t) - \log\pi(a_t)$:
#
# $$k_1 = -\log w_t, \qquad k_3 = (w_t - 1) - \log w_t \;\ge 0 .$$
#
# Both are unbiased estimates of $\mathrm{KL}(\pi \Vert \pi_{\text{ref}})$ when $a_t \sim \pi$, but
# $k_1$ is negative on every token the reference likes more than the policy, and a *sequence* or a small
# batch can sum to a negative KL. Seeing "KL = -0.3" for one response is not a bug in the maths. A
# batch *mean* that stays negative is a different sign: the samples did not come from $\pi$ (top-k,
# top-p, a temperature other than 1, or the wrong log-probs, as in (a)); sampled from the reference,
# for instance, $\mathbb{E}[k_1] = -\mathrm{KL}(\pi_{\text{ref}} \Vert \pi) \le 0$. Here both
# estimators on the **same** batch, and per step over the baseline run:

# %%
def k3_scratch(logprobs, ref_logprobs):
    """(w - 1) - log w with w = pi_ref / pi, per token: (B, R) -> (B, R)."""
    log_w = ref_logprobs - logprobs  # (B, R)
    return torch.exp(log_w) - 1 - log_w


batch = baseline.last_batch
k1 = rlhf_helpers.kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k1") * batch.mask  # (B, R)
k3 = rlhf_helpers.kl_estimate(batch.old_logprobs, batch.ref_logprobs, kind="k3") * batch.mask  # (B, R)
torch.testing.assert_close(k3, k3_scratch(batch.old_logprobs, batch.ref_logprobs) * batch.mask)
real = batch.mask.bool()
seq_k1, seq_k3 = k1.sum(dim=1), k3.sum(dim=1)  # (B,), (B,)
print(f"per token: k1 negative on {(k1[real] < 0).float().mean():.0%} of tokens, k3 on {(k3[real] < 0).float().mean():.0%}")
print(f"per sequence: k1 negative for {(seq_k1 < 0).float().mean():.0%} of responses, k3 for {(seq_k3 < 0).float().mean():.0%}")
print(f"batch mean sequence KL: k1 {seq_k1.mean():+.3f}   k3 {seq_k3.mean():+.3f}")

fig = make_subplots(rows=1, cols=3, subplot_titles=("k1 per token, last batch", "k3 per token, last batch",
                                                    "share of responses with sequence KL < 0"))
fig.add_histogram(x=k1[real].tolist(), nbinsx=60, row=1, col=1, marker_color="crimson", name="k1", showlegend=False)
fig.add_histogram(x=k3[real].tolist(), nbinsx=60, row=1, col=2, marker_color="royalblue", name="k3", showlegend=False)
steps_d = series(baseline, "kl")[0]
for kind, color in (("k1", "crimson"), ("k3", "royalblue")):
    fig.add_scatter(x=steps_d, y=[e[f"{kind}_negative"] for e in baseline_extras], name=kind, row=1, col=3,
                    line_color=color)
fig.update_xaxes(title_text="KL estimate per token", row=1, col=1)
fig.update_xaxes(title_text="KL estimate per token", row=1, col=2)
fig.update_xaxes(title_text="PPO step (baseline)", row=1, col=3)
fig.update_layout(title="(d) k1 against k3: the same tokens, the same responses")
fig.show()
print("batch-mean sequence KL per step, k1:", " ".join(f"{e['k1_mean']:+.2f}" for e in baseline_extras))
print("                                 k3:", " ".join(f"{e['k3_mean']:+.2f}" for e in baseline_extras))

# %% [markdown]
# **Recognise it:** negative per-response (or small-batch) KL values in the log, from the $k_1$ sum;
# $k_3$ gives none (right panel). $k_3$ pays for that with a heavy right tail: a token the reference
# finds far likelier than the policy ($w_t \gg 1$) adds $w_t - 1 - \log w_t$, so a single
# batch mean can jump (compare the two printed rows step by step). Use $k_3$ (or $k_2$)
# for *reporting*; in the reward, $k_1$ per token is fine on average, but its negative tokens become
# *positive* rewards, a bonus for going where the reference is more confident.
#
# ### Exercise 3: sequence KL with $k_3$
# Write `sequence_kl_k3(logprobs, ref_logprobs, mask)`: the $k_3$ estimate summed over each response's
# real tokens, shape (B,).

# %%
# EXERCISE 3
def sequence_kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t m_t ((w_t - 1) - log w_t), w_t = exp(ref_t - logp_t): (B, R) x3 -> (B,)."""
    raise NotImplementedError


# %%
def check_sequence_kl_k3():
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(6, 9, generator=g) * 3  # (B, R)
    ref = logp + 0.5 * torch.randn(6, 9, generator=g)  # (B, R)
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 3, 5, 1, 7, 8])[:, None]).float()  # (B, R)
    expected = torch.tensor([sum(((r - lp).exp() - 1 - (r - lp)).item() for lp, r, m in zip(lr, rr, mr, strict=True) if m)
                             for lr, rr, mr in zip(logp, ref, mask, strict=True)])
    got = sequence_kl_k3(logp, ref, mask)
    torch.testing.assert_close(got, expected)
    assert bool((got >= 0).all()), "k3 sums of real tokens can never be negative"
    torch.testing.assert_close(sequence_kl_k3(logp, logp, mask), torch.zeros(6))  # same policy: KL 0


exercise_check("Exercise 3 (sequence_kl_k3)", check_sequence_kl_k3)

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def sequence_kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
#     """sum_t m_t ((w_t - 1) - log w_t), w_t = exp(ref_t - logp_t): (B, R) x3 -> (B,)."""
#     log_w = ref_logprobs - logprobs  # (B, R)
#     return ((torch.expm1(log_w) - log_w) * mask).sum(dim=1)  # (B,)
# ```
# </details>

# %% [markdown]
# ## (e) An untrained value head
#
# GAE's advantages are only as good as the critic: $\hat A_t = \sum_l (\gamma\lambda)^l \delta_{t+l}$ with
# $\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)$. A fresh value head outputs $V \approx 0$ everywhere, so
# early advantages are just the $\lambda$-faded returns, $\hat A_t \approx (\gamma\lambda)^{n-1-t}\,\text{score}$
# plus KL terms: no state-dependent baseline, every token carries the whole spread of the final score
# across responses, and the policy moves on that high-variance signal. The critic's quality is
# measured by
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
first_k = max(1, warmup_steps)  # policy updates compared: the first few of each run
for name, rows in (("no warm-up", baseline.history[:first_k]),
                   (f"after {warmup_steps} warm-up steps", fixed_e.history[warmup_steps : warmup_steps + first_k])):
    ev = [row["explained_variance"] for row in rows]
    v_loss = [row["value_loss"] for row in rows]
    print(f"{name:<22}: explained variance of the first policy update {ev[0]:+.3f}, mean of the first {len(ev)} "
          f"{sum(ev) / len(ev):+.3f};  value loss mean {sum(v_loss) / len(v_loss):.3f}")

# %% [markdown]
# **Recognise it:** explained variance near 0 (or below) and a large value loss in the first steps
# while the policy is already updating: look at the curves left of the dotted line and at the printed
# explained variance of the batch of the first policy update. The fix moves the policy's start past
# the critic's first steps; a critic initialised from the reward model is another. With a warm-up this
# short, in a run this short, the rest of the curves are one noisy run each: do not read the hidden
# score panel as a verdict.


# %% [markdown]
# ## Summary: what each failure looks like
#
# | bug | first sign | curve to look at |
# |---|---|---|
# | (a) ref log-probs as old | ratio $\ne 1$ on the first minibatch of a step | clip fraction and approx-KL far above a healthy run's |
# | (b) pad == EOS | EOS positions 0 in the loss mask | EOS log-probs that do not follow their advantages; length drift, `eos_fraction` |
# | (c) $\beta = 0$ | KL grows without a bound | learned reward up, hidden score (held-out evaluation) down |
# | (d) $k_1$ for reporting | negative per-response KL values | share of negative sequence KL: $k_1$ > 0, $k_3$ = 0 |
# | (e) untrained critic | explained variance $\approx 0$ when the policy starts updating | value loss and explained variance of the first steps |
#
# `docs/metrics.md` and `rlhf_helpers.ppo.metrics.GLOSSARY` describe every logged metric.
