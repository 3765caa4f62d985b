# Source of notebooks/06_failure_modes.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 06 · Failure-modes lab: break PPO on purpose, measure it, fix it
#
# {{colab_badge}}
#
# **You will learn** to recognise four bugs that real RLHF code has shipped with, and one misreading
# of a logged number, each from its numbers and curves, broken and fixed side by side:
# - **(a)** reference log-probs used as the *old* log-probs: the ratio is not 1 at the first minibatch,
#   and the clip fraction and approx-KL measure the distance to the SFT model;
# - **(b)** pad equal to EOS: the EOS token is masked as padding, so its own advantage no longer
#   reaches the stop decision (measured);
# - **(c)** KL coefficient 0: nothing holds the policy near the SFT model, so the learned reward and
#   the true (hidden) score can part ways; a fit of Gao et al.'s law locates the KL where the hidden
#   score peaks, for a reward model trained on all the preference pairs and for one trained on few;
# - **(d)** reading the logged KL: the $k_1$ estimator goes negative on single responses, $k_3$ cannot
#   but its variance grows fast with the per-token KL (measured); with the logits at hand, the KL summed
#   over the vocabulary at each sampled prefix costs one softmax;
# - **(e)** an untrained value head: watch the explained variance when the policy starts to move; a
#   value warm-up trains the critic first.
#
# The engine (`rlhf_helpers.ppo`) has none of these bugs. To break it, this notebook subclasses or wraps
# its pieces here, in the notebook, never with switches inside the library; the harness that runs each
# variant from a saved start is `rlhf_helpers.course.failure_runs`. Runs are short (sizes come from the
# profile), so most curves are one noisy run: look for the shape, not the third decimal. Experiment (e)
# repeats its runs over three seeds and draws their spread.

# %% tags=["colab-setup"]

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

import rlhf_helpers
from rlhf_helpers.core.tokens import mask_to_first_eos as library_mask_to_first_eos
from rlhf_helpers.core.tolerances import close_tolerance
from rlhf_helpers.course.failure_runs import (
    LabSizes,
    adapter_state,
    correlation,
    load_adapter_state,
    run_variant,
    seed_band,
    series,
    third_means,
)
from rlhf_helpers.ppo.build import build_shared_model
from rlhf_helpers.ppo.metrics import plot_curves
from rlhf_helpers.ppo.samples import sample_responses
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.reward import ensure_reward_model, reward_metrics
from rlhf_helpers.stages.reward_training import RewardTrainingConfig
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.world.scorer import score_breakdown

profile = get_profile()
ensure_sft_model(profile)  # gpu profile: fine-tuned once per runtime (notebook 02 may have done it), then reused
torch.manual_seed(profile.seed)
if profile.device == "cpu":
    torch.set_num_threads(1)  # the tiny model's matrices are too small to gain from a second thread

lab = LabSizes.from_profile(profile)  # smaller batches and fewer steps than a full run (notebook 05)
lab_config = lab.ppo_config(profile)
print(f"lab: {lab.batch} prompts/step, minibatch {lab.mini_batch}, {lab.epochs} epochs; {lab.long_steps} steps "
      f"for the baseline and (c), {lab.short_steps} for (b); (e) over seeds {lab.seeds}")

reward_dir = ensure_reward_model(profile)  # trained in notebook 02 (trains now if it is not cached)
model, tokenizer = build_shared_model(profile, lab_config, reward_dir)
prompts = load_prompts("train")
initial_state = adapter_state(model)  # every experiment starts from these fresh policy and value adapters


def run(trainer_class, config, steps, desc, start=initial_state, extras=False):
    """Train `steps` PPO iterations of `trainer_class` on the lab's model from `start` (`run_variant`);
    `extras`: also record what `step_extras` reads after each step (EOS tokens, first ratio, k1/k3)."""
    return run_variant(trainer_class, config, model, tokenizer, prompts, steps, start=start, desc=desc,
                       extras=extras)

# %% [markdown]
# ## The healthy baseline
#
# One correct run with the profile's KL coefficient $\beta$. It is the "fixed" side of (b), (c) and (e),
# its final state (a policy that has moved away from the reference) is where both sides of (a) start,
# and (d) reads its batches.

# %%
baseline = run(PPOTrainer, lab_config, lab.long_steps, "baseline (correct)", extras=True)
trained_state = adapter_state(model)
fig = plot_curves(baseline.history, keys=("score", "hidden_score", "kl", "response_length",
                                          "explained_variance", "clipfrac"),
                 title="Baseline: a correct lab run")
fig.show()

# %% [markdown]
# ## (a) Reference log-probs used as the old log-probs
#
# PPO's ratio compares the policy being updated with the policy **that sampled the batch**:
#
# $$\rho_t = \frac{\pi_\theta(a_t \mid s_t)}{\pi_{\text{old}}(a_t \mid s_t)}, \qquad \rho_t = 1 \text{ on the first minibatch of every update.}$$
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


fixed_a = run(PPOTrainer, lab_config, lab.ref_as_old_steps, "(a) fixed", start=trained_state, extras=True)
broken_a = run(RefAsOldTrainer, lab_config, lab.ref_as_old_steps, "(a) broken: ref as old", start=trained_state,
               extras=True)

# correct engine: ratio 1 at the start, up to rounding. float32: 1e-4; bf16/fp16 (gpu profile): the old
# log-probs' forward and the update's run on other shapes, so other kernels round them (core.tolerances)
ratio_tol = close_tolerance(profile.torch_dtype, atol=1e-4, rtol=1e-4)["rtol"]
first_ratios = [e["first_ratio_mean"] for e in fixed_a.extras]
assert all(abs(r - 1.0) < ratio_tol for r in first_ratios), (first_ratios, ratio_tol)
print(f"fixed : largest |first-minibatch ratio mean - 1| {max(abs(r - 1.0) for r in first_ratios):.1e} "
      f"(the check allows {ratio_tol:g}: {profile.dtype} rounding)")
for name, lab_run in (("fixed ", fixed_a), ("broken", broken_a)):
    print(f"{name}: first-minibatch ratio mean per step {[round(e['first_ratio_mean'], 2) for e in lab_run.extras]}\n"
          f"        clip fraction per step {[round(row['clipfrac'], 3) for row in lab_run.history]}\n"
          f"        approx-KL per step {[round(row['approx_kl'], 3) for row in lab_run.history]}")

fig = make_subplots(rows=1, cols=3, subplot_titles=("ratio mean, first minibatch of each step",
                                                    "clip fraction (mean over the update)", "approx-KL of the update"))
for name, lab_run, color in (("broken: ref log-probs as old", broken_a, "crimson"),
                             ("fixed: old = sampling policy", fixed_a, "royalblue")):
    xs = series(lab_run.history, "clipfrac")[0]
    fig.add_scatter(x=xs, y=[e["first_ratio_mean"] for e in lab_run.extras], name=name, row=1, col=1, line_color=color)
    for col, key in ((2, "clipfrac"), (3, "approx_kl")):
        fig.add_scatter(x=xs, y=series(lab_run.history, key)[1], name=name, row=1, col=col, line_color=color,
                        showlegend=False)
fig.update_xaxes(title_text="PPO step after the baseline")
fig.update_layout(title="(a) The same trained state, updated with the right and with the wrong old log-probs")
fig.show()

for key in ("clipfrac", "approx_kl"):
    broken_values, fixed_values = series(broken_a.history, key)[1], series(fixed_a.history, key)[1]
    broken_mean, fixed_mean = np.mean(broken_values), np.mean(fixed_values)
    trend = "rose" if broken_values[-1] > broken_values[0] else "fell"
    print(f"{key:>9}, mean over the steps: broken {broken_mean:.3f}, fixed {fixed_mean:.3f} "
          f"(broken / fixed = {broken_mean / max(fixed_mean, 1e-12):.1f}); over its {len(broken_values)} steps the "
          f"broken run's {trend} from {broken_values[0]:.3f} to {broken_values[-1]:.3f}")

# %% [markdown]
# **Recognise it:** look at the first panel. A correct update starts every step at ratio 1 (exactly
# 1 up to float rounding; the assert above checks it, and so do the engine's tests); the broken one starts wherever
# $\pi_\theta / \pi_{\text{ref}}$ happens to be. Then compare the clip fraction and approx-KL with
# the healthy run's (the last two printed lines give the ratio): in the broken run both measure how far
# the policy is from the SFT model, not the size of one update, and every token the clip catches gets
# no gradient. Whether that distance rises or falls over the steps is not a rule (the clip is now
# centred on the SFT model): the printed line says which way it went here.

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
batch = baseline.trainer.last_batch
naive = eos_masked_as_padding(batch, model.eos_token_id, lab_config, 0.0).mask  # (B, R)
for row in range(3):
    ids = batch.sequences[row, batch.context_length:].tolist()
    n = int(batch.mask[row].sum()) + 1  # show one pad after the EOS
    tokens = tokenizer.convert_ids_to_tokens(ids[:n])
    print(" ".join(f"{t}" for t in tokens[-6:]))
    print("  right mask:", batch.mask[row, :n].int().tolist()[-6:], "  naive mask:", naive[row, :n].int().tolist()[-6:])

broken_b = run(PadIsEosTrainer, lab_config, lab.short_steps, "(b) broken: pad == EOS", extras=True)

# %% [markdown]
# What the update does to the stop decision, measured: after every step, the change in log-probability
# of each sampled token, $\Delta_t = \log\pi_{\text{new}}(y_t) - \log\pi_{\text{old}}(y_t)$, against the
# advantage $\hat A_t$ the **correct** pipeline gives that token. A working policy gradient raises
# tokens with $\hat A_t > 0$ and lowers the others, so $\Delta_t$ and $\hat A_t$ are positively
# correlated. Below: every sampled EOS token of the first steps of the baseline (fixed) and of the
# broken run, and the same correlation on all other tokens as a control.

# %%
fixed_b_extras = baseline.extras[: lab.short_steps]  # the baseline's first steps: same start, same seeds
fig = make_subplots(rows=1, cols=2, subplot_titles=("broken: pad == EOS", "fixed: mask up to and including EOS"))
for col, extras, color in ((1, broken_b.extras, "crimson"), (2, fixed_b_extras, "royalblue")):
    fig.add_scatter(x=[a for e in extras for a in e["eos_advantage"]], y=[d for e in extras for d in e["eos_change"]],
                    mode="markers", marker=dict(size=4, opacity=0.5, color=color), row=1, col=col, showlegend=False)
fig.update_xaxes(title_text="advantage of the sampled EOS token (correct pipeline)")
fig.update_yaxes(title_text="change of its log-prob in the update", row=1, col=1)
fig.update_layout(title=f"(b) EOS tokens of {lab.short_steps} PPO steps: does the update follow their advantage?")
fig.show()

corr = {}  # (run, "EOS" or "other") -> correlation(advantage, log-prob change)
for name, extras in (("broken", broken_b.extras), ("fixed", fixed_b_extras)):
    corr[name, "EOS"] = correlation([a for e in extras for a in e["eos_advantage"]],
                                    [d for e in extras for d in e["eos_change"]])
    corr[name, "other"] = correlation([a for e in extras for a in e["other_advantage"]],
                                      [d for e in extras for d in e["other_change"]])
    print(f"{name:<6}: correlation(advantage, log-prob change)  EOS tokens {corr[name, 'EOS']:+.2f}   "
          f"other tokens {corr[name, 'other']:+.2f}")
gap = {name: corr[name, "other"] - corr[name, "EOS"] for name in ("broken", "fixed")}
print(f"EOS tokens follow their advantage {'less' if corr['broken', 'EOS'] < corr['fixed', 'EOS'] else 'no less'} "
      f"in the broken run than in the fixed one ({corr['broken', 'EOS']:+.2f} against {corr['fixed', 'EOS']:+.2f}); "
      f"control minus EOS: broken {gap['broken']:+.2f}, fixed {gap['fixed']:+.2f}")

# %% [markdown]
# **Recognise it:** EOS positions that are 0 in the loss mask (print one row of the mask, as above), and
# an EOS probability that does not follow its advantage: compare the EOS correlation of the two runs,
# and each with its control (the last printed line). In the broken run the EOS tokens get no gradient
# of their own; they can still move, because they share weights with the tokens that do. A policy
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
    expected = torch.zeros(20, 12)  # a loop: 1 up to and including the first EOS of each row
    for row, ids in enumerate(random_ids.tolist()):
        for t, token in enumerate(ids):
            expected[row, t] = 1.0
            if token == eos:
                break
    torch.testing.assert_close(mask_to_first_eos(random_ids, eos), expected)


exercise_check("Exercise 1 (mask_to_first_eos)", check_mask_to_first_eos, hidden=[library_mask_to_first_eos])

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
# Both runs below start from the same adapters with the same seeds: only $\beta$ differs.

# %%
broken_c = run(PPOTrainer, lab_config.replace(kl_coef=0.0), lab.long_steps, "(c) broken: kl_coef = 0")

fig = make_subplots(rows=1, cols=3, subplot_titles=("broken: beta = 0", f"fixed: beta = {lab_config.kl_coef}",
                                                    "KL to the reference (nats / response)"))
for col, lab_run in ((1, broken_c), (2, baseline)):
    for key, color in (("score", "darkorange"), ("hidden_score", "seagreen")):
        label = "learned reward" if key == "score" else "hidden score"
        fig.add_scatter(x=series(lab_run.history, key)[0], y=series(lab_run.history, key)[1], name=label,
                        row=1, col=col, line_color=color, showlegend=col == 1)
for name, lab_run, color in (("beta = 0", broken_c, "crimson"),
                             (f"beta = {lab_config.kl_coef}", baseline, "royalblue")):
    fig.add_scatter(x=series(lab_run.history, "kl")[0], y=series(lab_run.history, "kl")[1], name=name, row=1, col=3,
                    line_color=color)
fig.update_xaxes(title_text="PPO step")
fig.update_layout(title="(c) Learned reward against hidden score, without and with the KL penalty")
fig.show()

print("means over the first, middle and last third of each run:")
for name, lab_run in (("broken (beta = 0)", broken_c), (f"fixed (beta = {lab_config.kl_coef})", baseline)):
    learned, hidden, kl = (third_means(series(lab_run.history, key)[1]) for key in ("score", "hidden_score", "kl"))
    print(f"  {name:<20} learned {' '.join(f'{v:+.2f}' for v in learned)}   hidden "
          f"{' '.join(f'{v:+.2f}' for v in hidden)}   KL {' '.join(f'{v:.1f}' for v in kl)}")
    parted = hidden[2] < hidden[1] and learned[2] >= learned[1]
    print(f"  {'':<20} last third: hidden score {'fell' if hidden[2] < hidden[1] else 'did not fall'}, learned "
          f"reward {'did not fall' if learned[2] >= learned[1] else 'fell'} -> over-optimisation signature: "
          f"{'yes' if parted else 'no'}")
print("\nresponses of the beta = 0 policy, with their hidden score terms:")
hacked = broken_c.trainer.last_batch
for prompt, response in list(zip(hacked.prompts, hacked.responses, strict=True))[:3]:
    terms = score_breakdown(prompt, response)
    print(f"  {response}\n    hidden {terms.total:+.2f} (fluency {terms.fluency:+.2f}, repetition {terms.repetition:+.2f}, "
          f"length {terms.length:+.2f})")

# %% [markdown]
# **Recognise it:** the signature of over-optimisation is a KL that keeps growing, a learned reward
# that is still rising or flat, and a hidden score that falls; the cell above checks the last two on
# the thirds of each run (one noisy run each: compare the thirds, not single steps). Read the samples
# too, with the fluency and repetition terms of their hidden score printed under each. In real runs
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
# (the subscript G marks Gao et al.'s coefficients, so $\beta_{\text{G}}$ is not the KL penalty $\beta$).
# Gao et al. measure the gold score relative to the initial policy, so their laws have no constant:
# $R(0) = 0$ by construction. The hidden score here is not shifted, so the fits below add an intercept
# $c_{\text{G}}$ and fit it **freely**, by least squares together with $\alpha_{\text{G}}$ and
# $\beta_{\text{G}}$. It plays the part of the SFT model's hidden score but is not pinned to it: the
# cell prints both.
#
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


def fit_law(kl: list[float], hidden: list[float], form: str) -> tuple[np.ndarray, float]:
    """Least-squares (c_G, alpha_G, beta_G) of one law, all three free, and its residual sum of squares."""
    d = np.sqrt(np.clip(kl, 0.0, None))  # (N,): k1 batch means can dip below 0 early on
    coef, *_ = np.linalg.lstsq(law_features(d, form), np.asarray(hidden), rcond=None)  # (3,)
    return coef, float(((law_features(d, form) @ coef - hidden) ** 2).sum())


def rl_peak(coef: np.ndarray) -> float:
    """d* where the RL law's h(d) peaks, exp(alpha_G / beta_G - 1); inf when beta_G <= 0 (no peak)."""
    c_g, alpha_g, beta_g = coef
    return float(np.exp(alpha_g / beta_g - 1)) if beta_g > 0 else math.inf


kl_c, hidden_c = series(broken_c.history, "kl")[1], series(broken_c.history, "hidden_score")[1]
d_c = np.sqrt(np.clip(kl_c, 0.0, None))  # (N,)
fig = go.Figure()
fig.add_scatter(x=d_c, y=hidden_c, mode="markers", name="beta = 0, one point per step", marker_color="crimson")
fig.add_scatter(x=np.sqrt(np.clip(series(baseline.history, "kl")[1], 0.0, None)),
                y=series(baseline.history, "hidden_score")[1], mode="markers", name=f"beta = {lab_config.kl_coef}",
                marker_color="royalblue")
if len(d_c) >= 6:  # three coefficients need clearly more than three points
    grid = np.linspace(0.0, d_c.max(), 100)
    fits = {}
    for form, label, dash in (("rl", "RL law", "solid"), ("bon", "best-of-n law", "dash")):
        fits[form] = fit_law(kl_c, hidden_c, form)
        coef, rss = fits[form]
        fig.add_scatter(x=grid, y=law_features(grid, form) @ coef, mode="lines", name=f"{label} fit",
                        line=dict(color="black", dash=dash))
        print(f"{label:>13}: c_G {coef[0]:+.3f}  alpha_G {coef[1]:+.3f}  beta_G {coef[2]:+.3f}   "
              f"residual sum of squares {rss:.2f}")
    better = min(fits, key=lambda form: fits[form][1])
    print(f"the {'RL' if better == 'rl' else 'best-of-n'} form fits this run better")
    print(f"free intercept c_G of the RL fit {fits['rl'][0][0]:+.3f}; hidden score of the first batch, sampled "
          f"from the SFT policy before any update: {hidden_c[0]:+.3f}")
    d_star = rl_peak(fits["rl"][0])
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
# ### A weaker reward model
#
# Gao et al. also vary the reward model: with more parameters or more preference data, the gold score
# rises higher and over-optimisation sets in more slowly. Here: the same $\beta = 0$ run,
# from the same start with the same seeds, on a reward model trained with notebook 02's settings on
# only the first 250 preference pairs (trained now, then cached like the other). For each reward model:
# its learned (proxy) reward and the hidden (gold) score against $d$, and the RL law fitted to the
# hidden score. Its proxy scores are on its own scale (each reward model's scale is arbitrary), so the
# left panel compares shapes, not heights.

# %%
weak_dir = ensure_reward_model(profile, RewardTrainingConfig.from_profile(profile, max_train_pairs=250))
weak_model, _ = build_shared_model(profile, lab_config, weak_dir)  # same base, tokenizer and adapter shapes
weak_c = run_variant(PPOTrainer, lab_config.replace(kl_coef=0.0), weak_model, tokenizer, prompts, lab.long_steps,
                     start=initial_state, desc="(c) beta = 0, weak reward model")

sweep = {}  # name -> what the figure and the verdicts read
for name, folder, lab_run, color in (("all pairs", reward_dir, broken_c, "crimson"),
                                     ("250 pairs", weak_dir, weak_c, "darkorange")):
    metrics = reward_metrics(folder)
    kl, hidden = series(lab_run.history, "kl")[1], series(lab_run.history, "hidden_score")[1]
    d = np.sqrt(np.clip(kl, 0.0, None))  # (N,)
    coef = fit_law(kl, hidden, "rl")[0] if len(d) >= 6 else None  # three coefficients need more than 3 points
    d_star = rl_peak(coef) if coef is not None else math.inf
    peak_inside = 0 < d_star <= d.max()
    sweep[name] = dict(pairs=int(metrics["train_pairs"]), color=color, d=d, hidden=hidden, coef=coef, d_star=d_star,
                       proxy=series(lab_run.history, "score")[1], peak_inside=peak_inside,
                       peak=float(law_features(np.array([d_star]), "rl")[0] @ coef) if peak_inside else math.nan)
    fit = ("too few points to fit" if coef is None else f"RL fit c_G {coef[0]:+.2f} alpha_G {coef[1]:+.2f} "
           f"beta_G {coef[2]:+.2f}; " + (f"hidden score peaks at KL* = {d_star**2:.1f} (fitted peak "
                                         f"{sweep[name]['peak']:+.2f})" if peak_inside else "no peak inside the range"))
    print(f"reward model on {sweep[name]['pairs']:>4} pairs: held-out pair accuracy "
          f"{metrics['pairwise_accuracy']:.3f}, correlation with the hidden score {metrics['score_hidden_correlation']:.2f};  {fit}")

fig = make_subplots(rows=1, cols=2, subplot_titles=("learned (proxy) reward of its own reward model",
                                                    "hidden (gold) score, with the RL law's fit"))
for row in sweep.values():
    label = f"reward model on {row['pairs']} pairs"
    fig.add_scatter(x=row["d"], y=row["proxy"], mode="markers", name=label, marker_color=row["color"], row=1, col=1)
    fig.add_scatter(x=row["d"], y=row["hidden"], mode="markers", name=label, marker_color=row["color"],
                    showlegend=False, row=1, col=2)
    if row["coef"] is not None:
        grid = np.linspace(0.0, row["d"].max(), 100)
        fig.add_scatter(x=grid, y=law_features(grid, "rl") @ row["coef"], mode="lines", line_color=row["color"],
                        name=f"RL law fit, {row['pairs']} pairs", row=1, col=2)
    if row["peak_inside"]:
        fig.add_vline(x=row["d_star"], line_dash="dot", line_color=row["color"], row=1, col=2)
fig.update_xaxes(title_text="d = sqrt(KL to the reference)")
fig.update_layout(title="(c) beta = 0 on a reward model trained on all pairs and on 250 pairs")
fig.show()

strong, weak = sweep["all pairs"], sweep["250 pairs"]
if strong["peak_inside"] and weak["peak_inside"]:
    print(f"the reward model on {weak['pairs']} pairs over-optimises "
          f"{'sooner' if weak['d_star'] < strong['d_star'] else 'later'}: its fitted hidden score peaks at KL* = "
          f"{weak['d_star']**2:.1f} against {strong['d_star']**2:.1f} nats, and "
          f"{'lower' if weak['peak'] < strong['peak'] else 'higher'} "
          f"({weak['peak']:+.2f} against {strong['peak']:+.2f})")
else:
    print("at least one fit has no peak inside its range: no comparison of the peaks in this run")

# %% [markdown]
# One run per reward model: read the two peaks as rough locations. In real work there is no hidden
# score to fit; what carries over is the habit of checking a reward model's held-out accuracy (printed
# above) before trusting how far the policy may be pushed on it.
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
    d_log_d = np.array([x * math.log(x) if x > 0 else 0.0 for x in d])  # (40,): d log d, 0 at d = 0
    reference, *_ = np.linalg.lstsq(np.stack([np.ones_like(d), d, -d_log_d], axis=1), np.array(noisy_h),
                                    rcond=None)  # the normal equations' solution, from numpy
    np.testing.assert_allclose(fit_overoptimisation(noisy_kl, noisy_h), reference, rtol=1e-6, atol=1e-9)


exercise_check("Exercise 2 (fit_overoptimisation)", check_fit_overoptimisation, hidden=[fit_law, law_features])

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

# %% [markdown]
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


batch = baseline.trainer.last_batch
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
steps_d = series(baseline.history, "kl")[0]
for kind, color in (("k1", "crimson"), ("k3", "royalblue")):
    fig.add_scatter(x=steps_d, y=[e[f"{kind}_negative"] for e in baseline.extras], name=kind, row=1, col=3,
                    line_color=color)
fig.update_xaxes(title_text="KL estimate per token", row=1, col=1)
fig.update_xaxes(title_text="KL estimate per token", row=1, col=2)
fig.update_xaxes(title_text="PPO step (baseline)", row=1, col=3)
fig.update_layout(title="(d) k1 against k3: the same tokens, the same responses")
fig.show()
print("batch-mean sequence KL per step, k1:", " ".join(f"{e['k1_mean']:+.2f}" for e in baseline.extras))
print("                                 k3:", " ".join(f"{e['k3_mean']:+.2f}" for e in baseline.extras))

# %% [markdown]
# ### Which KL to report?
#
# Every logged KL above is a sample estimate. Three estimators, with $\log w = \log\pi_{\text{ref}}(y) - \log\pi(y)$
# and $y \sim \pi$ (Schulman 2020):
#
# $$k_1 = -\log w, \qquad k_2 = \tfrac12 (\log w)^2, \qquad k_3 = (w - 1) - \log w .$$
#
# $k_1$ and $k_3$ are unbiased, $k_2$ is not; they differ in variance. With the logits of both models at
# hand (a forward pass computes them anyway), the KL **at each sampled prefix** needs no estimate over
# the next token:
#
# $$\mathrm{KL}_t = \sum_{v \in \mathcal V} \pi(v \mid s_t)\,
#   \big(\log\pi(v \mid s_t) - \log\pi_{\text{ref}}(v \mid s_t)\big).$$
#
# Summed over a response it is still an estimate of the policy's KL, because the prefixes $s_t$ are
# sampled; it is the lowest-variance one (below it is called "exact" in that per-prefix sense).
#
# First on a known case: one token drawn from two categorical distributions over 50 words whose KL is
# set to 0.1, 1 and 2 nats. The first line printed is the baseline's KL per response and **per
# token** (the response's KL divided by its length): the per-token figure is the one to place in this
# table. The mean and standard
# deviation of each estimator are exact sums over the 50 words, and a sample of 10,000 draws shows what
# a logged mean sees.

# %%
gen = torch.Generator().manual_seed(0)
ref_logits = torch.randn(50, generator=gen, dtype=torch.float64)  # (V,)
direction = torch.randn(50, generator=gen, dtype=torch.float64)  # (V,): the policy moves the logits along it
ref_logp = torch.log_softmax(ref_logits, -1)  # (V,)


def exact_kl(logp: torch.Tensor, ref: torch.Tensor) -> float:
    """sum_v pi(v) (log pi(v) - log ref(v)): (V,), (V,) -> a float."""
    return float((logp.exp() * (logp - ref)).sum())


def policy_at_kl(target: float) -> torch.Tensor:
    """log pi (V,) = log_softmax(ref_logits + t * direction), with t found by bisection so that KL = target."""
    low, high = 0.0, 50.0
    for _ in range(60):
        t = (low + high) / 2
        too_close = exact_kl(torch.log_softmax(ref_logits + t * direction, -1), ref_logp) < target
        low, high = (t, high) if too_close else (low, t)
    return torch.log_softmax(ref_logits + (low + high) / 2 * direction, -1)


baseline_last = baseline.history[-1]
print(f"the baseline's last batch: KL {baseline_last['kl']:.2f} nats per response (k1 mean) over "
      f"{baseline_last['response_length']:.1f} tokens: "
      f"{baseline_last['kl'] / baseline_last['response_length']:.3f} nats per token")
print(f"{'KL':>5} {'estimator':>9} {'E[k]':>8} {'std[k]':>9} {'largest k':>10} {'mean of 10,000 draws':>21}")
spread, k2_gap = {}, {}  # (target KL, kind) -> std of one draw; target KL -> E[k2] - KL
for target in (0.1, 1.0, 2.0):
    logp = policy_at_kl(target)  # (V,)
    draws = torch.multinomial(logp.exp(), 10_000, replacement=True, generator=gen)  # (N,) words y ~ pi
    for kind in ("k1", "k2", "k3"):
        k = rlhf_helpers.kl_estimate(logp, ref_logp, kind=kind)  # (V,): the estimate if word v is drawn
        mean = float((logp.exp() * k).sum())  # exact expectation under pi
        spread[target, kind] = math.sqrt(float((logp.exp() * (k - mean) ** 2).sum()))
        if kind == "k2":
            k2_gap[target] = mean - exact_kl(logp, ref_logp)
        print(f"{exact_kl(logp, ref_logp):5.2f} {kind:>9} {mean:8.3f} {spread[target, kind]:9.3f} "
              f"{float(k.max()):10.1f} {float(k[draws].mean()):21.3f}")
    torch.testing.assert_close(float((logp.exp() * rlhf_helpers.kl_estimate(logp, ref_logp, kind="k3")).sum()),
                               exact_kl(logp, ref_logp))  # k3 is unbiased: E[k3] = KL exactly
for target in (0.1, 1.0, 2.0):
    ratio = spread[target, "k3"] / spread[target, "k1"]
    print(f"KL {target}: k3's standard deviation is {ratio:.2f} x k1's ({'smaller' if ratio < 1 else 'larger'})")
assert spread[0.1, "k3"] < spread[1.0, "k3"] < spread[2.0, "k3"], "the text says k3's spread grows with the KL"
assert abs(k2_gap[0.1]) < abs(k2_gap[1.0]) < abs(k2_gap[2.0]), "the text says k2's bias grows with the KL"

# %% [markdown]
# Then on the run's own tokens: the baseline's final policy answers the held-out prompts, and each
# response's KL is summed over its tokens, exactly (sum over the vocabulary at every position) and by
# each estimator. Every line is over the same responses; the last column is each estimator's batch
# mean minus the exact one, with its standard error.

# %%
load_adapter_state(model, trained_state)  # the baseline's final policy
torch.manual_seed(profile.seed)
samples = sample_responses(model, tokenizer, load_prompts("test"), lab_config.max_prompt_length,
                           lab_config.max_new_tokens)
P = samples.context_length
with torch.no_grad():
    logits = model.policy_logits(samples.sequences, samples.attention_mask)[:, P - 1 : -1].float()  # (B, R, V)
    with model.reference():
        ref_all = model.policy_logits(samples.sequences, samples.attention_mask)[:, P - 1 : -1].float()  # (B, R, V)
logp_all, ref_all = torch.log_softmax(logits, -1), torch.log_softmax(ref_all, -1)  # (B, R, V)
ids = samples.sequences[:, P:, None]  # (B, R, 1)
logp, ref_lp = logp_all.gather(-1, ids)[..., 0], ref_all.gather(-1, ids)[..., 0]  # (B, R): the sampled tokens
torch.testing.assert_close(ref_lp, model.ref_logprobs(samples.sequences, samples.attention_mask, P))  # same reference
per_response = {"exact": ((logp_all.exp() * (logp_all - ref_all)).sum(-1) * samples.mask).sum(1)}  # (B,)
for kind in ("k1", "k2", "k3"):
    per_response[kind] = (rlhf_helpers.kl_estimate(logp, ref_lp, kind=kind) * samples.mask).sum(1)  # (B,)
B = len(logp)
print(f"{'':>6} {'mean':>7} {'std':>7} {'min':>7} {'max':>7} {'mean - exact':>18}   over {B} responses")
for name, values in per_response.items():
    diff = values - per_response["exact"]  # (B,)
    print(f"{name:>6} {values.mean():7.3f} {values.std():7.3f} {values.min():7.2f} {values.max():7.2f} "
          f"{diff.mean():+9.3f} +- {diff.std() / B**0.5:.3f}")
order = sorted(per_response, key=lambda name: float(per_response[name].std()))
print(f"spread across responses, smallest to largest: {' < '.join(order)}")
close = [name for name in ("k1", "k2", "k3") if abs(float((per_response[name] - per_response["exact"]).mean()))
         <= 2 * float((per_response[name] - per_response["exact"]).std()) / B**0.5]
print(f"batch means within 2 standard errors of the exact one: {', '.join(close) or 'none'}")

# %% [markdown]
# **Recognise it:** negative per-response (or small-batch) KL values in the log come from the $k_1$
# sum; $k_3$ gives none (it is $\ge 0$ for every token). $k_3$ pays for that with a heavy right tail: a
# token the reference finds far likelier than the policy ($w_t \gg 1$) adds $w_t - 1 - \log w_t$, so
# a single batch mean can jump (compare the two printed rows step by step). The table of known KLs
# shows how its spread grows with the per-token KL; at this run's per-token KL (printed with it) the
# spread per token is moderate, and a response's large $k_3$ spread comes from its few tokens whose
# KL is high. **Report** the exact per-token KL over the vocabulary when you
# have the logits (it costs a softmax over logits the forward pass already made), or else the $k_1$
# sum averaged over a batch: unbiased, and its negative single values are noise, not a bug. $k_2$ is
# biased: its expectation is not the KL (the table of known KLs; the gap grows with the per-token KL,
# so on tokens whose KL is small it can hide in the noise). In the reward, $k_1$ per token is fine on
# average, but its negative tokens become *positive* rewards, a bonus for going where the reference is
# more confident.
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


exercise_check("Exercise 3 (sequence_kl_k3)", check_sequence_kl_k3,
               hidden=[rlhf_helpers.kl_estimate, rlhf_helpers.masked_sum, rlhf_helpers.shape_rewards, k3_scratch,
                       rlhf_helpers.core.kl._kl_terms])  # the estimator of the section above, and its library core

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
# early advantages are just the $\lambda$-faded returns, $\hat A_t \approx (\gamma\lambda)^{|y|-1-t}\,\text{score}$
# plus KL terms: no state-dependent baseline, every token carries the whole spread of the final score
# across responses, and the policy moves on that high-variance signal. The critic's quality is
# measured by
#
# $$\text{explained variance} = 1 - \frac{\operatorname{Var}[G^\lambda_t - \hat V(s_t)]}{\operatorname{Var}[G^\lambda_t]}$$
#
# over the real tokens of a batch (1: perfect, 0: no better than a constant, below 0: worse). The fix: a **value warm-up**, a few
# iterations that train only the critic on the SFT policy's rollouts before the policy moves
# (`PPOConfig.value_warmup_steps`). The broken side is the baseline's first steps (no warm-up). Each
# side runs with three seeds (sampling and prompt order; the same starting adapters): the curves are
# their mean, the bands their min-max range.

# %%
no_warmup = {lab.seeds[0]: baseline}  # the baseline ran with the first seed
no_warmup.update({seed: run(PPOTrainer, lab_config.replace(seed=seed), lab.critic_steps, f"(e) no warm-up, seed {seed}")
                  for seed in lab.seeds[1:]})
warmed = {seed: run(PPOTrainer, lab_config.replace(seed=seed, value_warmup_steps=lab.warmup_steps),
                    lab.warmup_steps + lab.critic_steps, f"(e) {lab.warmup_steps} warm-up steps, seed {seed}")
          for seed in lab.seeds}


def add_band(fig, band, offset, name, color, row, col, showlegend):
    """The mean of several seeds as a line, their min-max range as a shaded band; x shifted by -offset."""
    xs = [x - offset for x in band["step"]]
    fig.add_scatter(x=xs + xs[::-1], y=band["high"] + band["low"][::-1], fill="toself", line_width=0,
                    fillcolor=color, opacity=0.2, hoverinfo="skip", showlegend=False, row=row, col=col)
    fig.add_scatter(x=xs, y=band["mean"], name=name, line_color=color, showlegend=showlegend, row=row, col=col)


fig = make_subplots(rows=1, cols=2, subplot_titles=("explained variance", "value loss"))
for name, runs, offset, color in (("broken: no warm-up", no_warmup, 0, "crimson"),
                                  (f"fixed: {lab.warmup_steps} warm-up steps", warmed, lab.warmup_steps, "royalblue")):
    histories = [r.history[: offset + lab.critic_steps] for r in runs.values()]
    for col, key in ((1, "explained_variance"), (2, "value_loss")):
        # x = policy updates done: the warm-up steps sit at x <= 0
        add_band(fig, seed_band(histories, key), offset, f"{name} (mean of {len(runs)} seeds, min-max band)",
                 color, 1, col, col == 1)
fig.add_vline(x=0.5, line_dash="dot", line_color="gray")
fig.update_xaxes(title_text="PPO step (policy updates; <= 0: critic warm-up)")
fig.update_layout(title="(e) The critic without and with a value warm-up")
fig.show()

first_ev = {}  # side -> explained variance of the batch of the first policy update, per seed
for name, runs, offset in (("no warm-up", no_warmup, 0), (f"after {lab.warmup_steps} warm-up steps", warmed,
                                                          lab.warmup_steps)):
    first_ev[name] = [r.history[offset]["explained_variance"] for r in runs.values()]
    v_loss = [row["value_loss"] for r in runs.values() for row in r.history[offset : offset + lab.critic_steps]]
    print(f"{name:<22}: explained variance of the first policy update per seed "
          f"{' '.join(f'{v:+.3f}' for v in first_ev[name])} (mean {np.mean(first_ev[name]):+.3f});  value loss over "
          f"the first {lab.critic_steps} policy updates, mean {np.mean(v_loss):.3f}")
before, after = first_ev.values()
wins = sum(a > b for a, b in zip(after, before, strict=True))
change = np.subtract(after, before)  # paired by seed
change_se = change.std(ddof=1) / math.sqrt(len(change))  # standard error of the mean change over the seeds
if abs(change.mean()) <= 2 * change_se:
    verdict = "did not move the mean explained variance beyond two standard errors of no change"
else:
    verdict = f"{'raised' if change.mean() > 0 else 'lowered'} the mean explained variance"
print(f"the warm-up {verdict} of the first policy update ({np.mean(before):+.3f} -> {np.mean(after):+.3f}, "
      f"change {change.mean():+.3f}, standard error {change_se:.3f} over {len(change)} seeds); higher in {wins} of "
      f"{len(after)} seeds")

# %% [markdown]
# **Recognise it:** explained variance near 0 (or below) in the first steps while the policy is already
# updating: look at the curves right of the dotted line and at the printed explained variance of the
# batch of each seed's first policy update. The value loss is a weaker sign (compare the two printed
# means and the overlap of their bands): its scale moves with the returns, explained variance does not. The fix moves the policy's start
# past the critic's first steps; a critic initialised from the reward model is another. The bands show
# how far three seeds of one setting already differ in runs this short.


# %% [markdown]
# ## Summary: what each failure looks like
#
# | failure | first sign | curve to look at |
# |---|---|---|
# | (a) ref log-probs as old | ratio $\ne 1$ on the first minibatch of a step | clip fraction and approx-KL far above a healthy run's |
# | (b) pad == EOS | EOS positions 0 in the loss mask | EOS log-probs that do not follow their advantages; length drift, `eos_fraction` |
# | (c) $\beta = 0$ | KL grows without a bound | learned reward up, hidden score (held-out evaluation) down |
# | (d) one KL estimator trusted | negative $k_1$ per response; $k_3$ means that jump | exact KL against $k_1$, $k_2$, $k_3$ |
# | (e) untrained critic | explained variance $\approx 0$ when the policy starts updating | value loss and explained variance of the first steps |
#
# [docs/metrics.md](../docs/metrics.md) and `rlhf_helpers.ppo.metrics.GLOSSARY` describe every logged metric.
