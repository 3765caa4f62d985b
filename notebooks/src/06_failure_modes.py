# Source of notebooks/06_failure_modes.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 06 · Failure-modes lab: break PPO on purpose, measure it, fix it
#
# {{colab_badge}}
#
# **Prerequisites:** notebooks 02 to 05: the PPO ratio and its clip, the KL penalty in the reward, GAE and explained variance.
#
# **Time:** about 170 min for the core, in two sittings (the second from *(c) KL coefficient 0*); the deep dives add about 195 min.
#
# **You will learn** to recognise bugs that real RLHF code has shipped with, from their numbers and
# curves, broken and fixed side by side, and to ask the **run doctor** (`rlhf_helpers.doctor`),
# which names them from a run's metrics:
# - **(a)** reference log-probs used as the *old* log-probs: the ratio is not 1 at the first minibatch;
# - **(b)** pad equal to EOS: the stop decision gets no gradient of its own;
# - **(c)** KL coefficient 0: the learned reward rises while the true (hidden) score falls; you write
#   the adaptive KL controller that steers $\beta$ to a target KL; why PPO for RLHF runs without an
#   entropy bonus (the KL penalty holds one);
# - then to break a run of your own and read the doctor's findings.
#
# Deep dives: (e) an untrained value head; Gao et al.'s over-optimisation law; what pad == EOS does to
# the stop token; (d) the KL estimators on the run's own tokens; the knobs left off (an entropy bonus, the
# score's scale and `score_clip`, `missing_eos_penalty` and length). The engine (`rlhf_helpers.ppo`) has none
# of these bugs: the notebook breaks it by subclassing its pieces. Runs are short: look for the shape,
# not the third decimal.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import dataclasses
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import display
from plotly.subplots import make_subplots

import rlhf_helpers
from rlhf_helpers.core.printed import cell_formatter, format_number, wrap_printed
from rlhf_helpers.core.tokens import mask_to_first_eos as library_mask_to_first_eos
from rlhf_helpers.core.tolerances import ratio_tolerance
from rlhf_helpers.course.claims import check_claims
from rlhf_helpers.course.failure_runs import (
    LabSizes,
    adapter_state,
    correlation,
    load_adapter_state,
    run_variant,
    seed_band,
    series,
    third_stats,
)
from rlhf_helpers.doctor import diagnose, format_findings
from rlhf_helpers.ppo.build import build_shared_model
from rlhf_helpers.ppo.metrics import plot_curves
from rlhf_helpers.ppo.samples import sample_responses
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.reward import ensure_reward_model, reward_metrics
from rlhf_helpers.stages.reward_training import RewardTrainingConfig
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.widgets.style import fit_labels
from rlhf_helpers.world.scorer import score_breakdown

# %%
profile = get_profile()
ensure_sft_model(profile)  # gpu profile: fine-tuned once per runtime (notebook 02 may have done it), then reused
torch.manual_seed(profile.seed)
if profile.device == "cpu":
    torch.set_num_threads(1)  # the tiny model's matrices are too small to gain from a second thread

lab = LabSizes.from_profile(profile)  # smaller batches and fewer steps than a full run (notebook 05)
lab_config = lab.ppo_config(profile)
print(f"lab: {lab.batch} prompts/step, minibatch {lab.mini_batch}, {lab.epochs} epochs;\n"
      f"  {lab.long_steps} steps for the baseline and (c), {lab.short_steps} for (b); (e) over seeds {lab.seeds}")

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
# One correct run with the profile's KL coefficient $\beta$: the "fixed" side of (b) and (c). Its final
# state, a policy that has moved away from the reference, is where both sides of (a) start.

# %%
baseline = run(PPOTrainer, lab_config, lab.long_steps, "baseline (correct)", extras=True)
trained_state = adapter_state(model)
fig = plot_curves(baseline.history, keys=("score", "hidden_score", "kl", "response_length",
                                          "explained_variance", "clipfrac"),
                 title="Baseline: a correct lab run")
fig.show()


# %% [markdown]
# ### The run doctor
#
# Every experiment below ends with the **run doctor**: `diagnose` reads a run's logged metrics and names
# the failure signatures it recognises, with the steps, the numbers and what to check first
# ([docs/metrics.md](../docs/metrics.md#the-run-doctor) lists the rules and their thresholds). A finding is an "error" (broken), a "warning" (likely a problem) or
# an "info" (worth knowing). On the baseline it finds one info: the policy's first update used a critic
# that explained nothing, as every run from fresh value adapters without a warm-up does (deep dive (e)).

# %%
def doctor(history_or_run, facts=None):
    """Print the run doctor's findings on a lab run (its trainer: history and settings) or on a history judged
    with `facts` (a run's settings, with the dtype it computed in); return them as {rule: severity}."""
    source = history_or_run.trainer if hasattr(history_or_run, "trainer") else history_or_run
    diagnosis = diagnose(source, facts=facts)
    print(format_findings(diagnosis))
    return {f.rule: f.severity for f in diagnosis.findings}


baseline_findings = doctor(baseline)

# %% tags=["claim-check"]
check_claims({
    "the baseline's one finding is the untrained critic, an info": baseline_findings == {"untrained_critic": "info"},
})

# %% [markdown]
# ## (a) Reference log-probs used as the old log-probs
#
# PPO's ratio compares the policy being updated with the policy **that sampled the batch**:
#
# $$\rho_t = \frac{\pi_\theta(a_t \mid s_t)}{\pi_{\text{old}}(a_t \mid s_t)}, \qquad \rho_t = 1 \text{ on the first minibatch of every update.}$$
#
# A widely copied script stored the *reference* model's log-probs there. Then
# $\rho_t = \pi_\theta / \pi_{\text{ref}}$, far from 1 once training has moved the policy: the clip binds
# from the first minibatch on (zero gradient there), and the "trust region" surrounds the SFT model
# instead of the last policy. The broken trainer changes only the old log-probs its update sees. Both
# runs start from the baseline's final state (at the start of training the policy *is* the reference,
# and the bug is invisible).

# %%
class RefAsOldTrainer(PPOTrainer):
    """BROKEN ON PURPOSE: the update uses the reference log-probs as the old log-probs."""

    def update(self, batch, generator):
        return super().update(dataclasses.replace(batch, old_logprobs=batch.ref_logprobs), generator)


fixed_a = run(PPOTrainer, lab_config, lab.ref_as_old_steps, "(a) fixed", start=trained_state, extras=True)
broken_a = run(RefAsOldTrainer, lab_config, lab.ref_as_old_steps, "(a) broken: ref as old", start=trained_state,
               extras=True)

# correct engine: ratio 1 at the start, up to rounding: the run doctor's tolerance. float32: 1e-4; bf16/fp16 (gpu
# profile): eps / 8, as the old log-probs' forward and the update's run on other shapes (core.tolerances)
ratio_tol = ratio_tolerance(profile.dtype)
first_ratios = [e["first_ratio_mean"] for e in fixed_a.extras]
print(f"fixed: largest |first-minibatch ratio mean - 1| {max(abs(r - 1.0) for r in first_ratios):.1e}\n"
      f"  (the check below allows {ratio_tol:g}: {profile.dtype} rounding)")
table_a = pd.DataFrame([{"run": name, "step": k + 1, "ratio mean, first minibatch": e["first_ratio_mean"],
                         "clip fraction": row["clipfrac"], "approx-KL": row["approx_kl"]}
                        for name, lab_run in (("fixed", fixed_a), ("broken", broken_a))
                        for k, (e, row) in enumerate(zip(lab_run.extras, lab_run.history, strict=True))])
display(table_a.style.hide(axis="index").format(cell_formatter(".3f")))
mean_a = table_a.groupby("run")[["clip fraction", "approx-KL"]].mean()  # mean over each run's steps

# %% [markdown]
# **Recognise it:** in the table, a correct update starts every step at ratio 1 up to float rounding
# (here within $10^{-6}$; the check allows $10^{-4}$ in float32). The broken one starts wherever
# $\pi_\theta / \pi_{\text{ref}}$ happens to be: about 1.6, then about 1.2. Its clip fraction and
# approx-KL now measure the distance to the SFT model, not the size of one update: averaged over the
# steps, about 0.17 and 0.13, each more than ten times the fixed run's (about 0.01 and 0.003).

# %% tags=["claim-check"]
check_claims({
    "the fixed update starts every step at ratio 1, within float rounding":
        all(abs(r - 1.0) < ratio_tol for r in first_ratios),
}, any_profile=True)

# %% tags=["claim-check"]
check_claims({
    "the fixed run's first-minibatch ratio deviates from 1 by less than 1e-6":
        max(abs(r - 1.0) for r in first_ratios) < 1e-6,
    "the broken run's first ratio is about 1.6, then about 1.2":
        1.45 < broken_a.extras[0]["first_ratio_mean"] < 1.75 and 1.1 < broken_a.extras[1]["first_ratio_mean"] < 1.35,
    "broken clip fraction about 0.17, fixed about 0.01, more than ten times apart":
        abs(mean_a.loc["broken", "clip fraction"] - 0.17) < 0.03 and mean_a.loc["fixed", "clip fraction"] < 0.02
        and mean_a.loc["broken", "clip fraction"] > 10 * mean_a.loc["fixed", "clip fraction"],
    "broken approx-KL about 0.13, fixed about 0.003, more than ten times apart":
        abs(mean_a.loc["broken", "approx-KL"] - 0.13) < 0.03 and mean_a.loc["fixed", "approx-KL"] < 0.006
        and mean_a.loc["broken", "approx-KL"] > 10 * mean_a.loc["fixed", "approx-KL"],
})

# %%
print("(a) fixed:")
findings_a = {"fixed": doctor(fixed_a)}
print("\n(a) broken:")
findings_a["broken"] = doctor(broken_a)

# %% [markdown]
# The doctor names the bug: `first_ratio_not_one`, an error at both steps of the broken run. It adds a
# warning, `off_policy`, because the broken run's approx-KL is far above a healthy update's; that is a
# consequence of the same bug, as its "check first" line says. The fixed run has no finding.

# %% tags=["claim-check"]
check_claims({
    "broken: first_ratio_not_one, an error at both steps":
        [f.steps for f in diagnose(broken_a.trainer).findings if f.rule == "first_ratio_not_one"] == [(1, 2)]
        and findings_a["broken"]["first_ratio_not_one"] == "error",
    "broken: besides it only the off_policy warning": set(findings_a["broken"]) == {"first_ratio_not_one", "off_policy"},
    "fixed: no finding": findings_a["fixed"] == {},
})


# %% [markdown]
# ## (b) Pad equal to EOS
#
# Batches are padded after each response's EOS. If the pad id equals the EOS id, the usual mask
# `responses != pad_id` also hides the **real** EOS:
#
# $$m_t = [y_t \ne \texttt{pad}] \;\Rightarrow\; m_{t_{\text{EOS}}} = 0 .$$
#
# Then the EOS token gets no advantage and no gradient: the decision to *stop* is never reinforced or
# punished, and the score lands on the token before it. The broken trainer rebuilds its update batch
# with the naive mask, then recomputes rewards, GAE and whitening with the library's functions.

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

# %%
print("(b) fixed (the baseline's first steps):")
findings_b = {"fixed": doctor(baseline.history[: lab.short_steps], facts=diagnose(baseline.trainer).facts)}
print("\n(b) broken:")
findings_b["broken"] = doctor(broken_b)
for name, history in (("fixed", baseline.history[: lab.short_steps]), ("broken", broken_b.history)):
    print(wrap_printed(f"eos_in_mask of the {name} run, by step: "
                       + ", ".join(format_number(row["eos_in_mask"], "g") for row in history)))

# %% [markdown]
# The doctor names it: `eos_masked`, an error. `eos_in_mask`, the share of sampled EOS tokens the
# update's mask keeps, is 0 at most steps and below 0.1 at every step (the broken mask keeps only the EOS
# of a response that is nothing else). The fixed side logs exactly 1 at every step and has only the info
# about the untrained critic.

# %% tags=["claim-check"]
check_claims({
    "broken: eos_masked, an error": findings_b["broken"].get("eos_masked") == "error",
    "broken: eos_in_mask below 0.1 at every step, 0 at most steps":
        all(row["eos_in_mask"] < 0.1 for row in broken_b.history)
        and sum(row["eos_in_mask"] == 0.0 for row in broken_b.history) * 2 > len(broken_b.history),
    "fixed: eos_in_mask exactly 1 at every step":
        all(row["eos_in_mask"] == 1.0 for row in baseline.history[: lab.short_steps]),
    "fixed: nothing above info": all(severity == "info" for severity in findings_b["fixed"].values()),
})

# %% [markdown]
# **Recognise it:** EOS positions that are 0 in the loss mask (as printed above), and `eos_in_mask`
# below 1. The EOS tokens get no gradient of their own (they still move through shared weights; the
# deep dive below measures how). With no pressure on the stop token, a long run can drift in length
# until responses are cut at `max_new_tokens` (watch `eos_fraction`). The fix: a pad token distinct from
# EOS (`rlhf_helpers.runtime.models.ensure_distinct_pad`; `SharedLoRAModel` refuses pad == EOS) and a
# mask built from the first EOS.
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
def first_mask_error(got: torch.Tensor, responses: torch.Tensor, eos_id: int) -> str | None:
    """What is wrong with a (B, R) EOS mask, said in the exercise's terms (None when it is right)."""
    if not isinstance(got, torch.Tensor) or got.shape != responses.shape:
        return f"expected a tensor of shape {tuple(responses.shape)}, got {getattr(got, 'shape', type(got))}"
    if not got.is_floating_point():
        return f"your mask has dtype {got.dtype}: return a float mask (it multiplies float losses)"
    for row, ids in enumerate(responses.tolist()):
        first = ids.index(eos_id) if eos_id in ids else None  # position of the first EOS, or no EOS
        for t in range(len(ids)):
            want = 1.0 if first is None or t <= first else 0.0
            if float(got[row, t]) != want:
                where = ("row without any EOS: every token is real" if first is None else
                         "the first EOS itself: it is a real token, so it belongs in the mask" if t == first else
                         f"before the first EOS (at {first})" if t < first else
                         f"after the first EOS (at {first}): padding or a later EOS, not part of the response")
                return (f"row {row} {ids}, position {t}: your mask is {float(got[row, t]):g}, expected {want:g} "
                        f"({where})")
    return None


def check_mask_to_first_eos():
    eos = 2
    ids = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]])  # (4, 5)
    random_ids = torch.randint(0, 6, (20, 12), generator=torch.Generator().manual_seed(0))  # (20, 12)
    for responses in (ids, random_ids):
        error = first_mask_error(mask_to_first_eos(responses.clone(), eos), responses, eos)
        assert error is None, error


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
# ### Deep dive: what pad == EOS does to the stop decision
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Measured: after every step, the change in log-probability
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
fit_labels(fig).show()  # long subplot and axis titles wrapped to their panels

corr_rows = []  # one row per run and token group: correlation(advantage, log-prob change)
for name, extras in (("broken", broken_b.extras), ("fixed", fixed_b_extras)):
    for group, prefix in (("EOS", "eos"), ("other", "other")):
        xs, ys = [a for e in extras for a in e[f"{prefix}_advantage"]], [d for e in extras for d in e[f"{prefix}_change"]]
        r = correlation(xs, ys)
        corr_rows.append({"run": name, "tokens": group, "n": len(xs), "correlation": r,
                          "standard error": math.sqrt((1 - r**2) / max(len(xs) - 2, 1))})  # of a Pearson r
corr_table = pd.DataFrame(corr_rows).set_index(["run", "tokens"])
display(corr_table.style.format({"correlation": "{:+.2f}", "standard error": "{:.3f}"}))
corr = corr_table["correlation"].to_dict()  # (run, tokens) -> r
corr_se = corr_table["standard error"].to_dict()

# %% [markdown]
# **What this run shows:** over the first 12 steps (about 190 sampled EOS tokens on each side), the
# update moves the EOS tokens' log-probs with their advantage in the fixed run (correlation about
# $+0.4$) and against it in the broken run (about $-0.2$). The gap, about 0.6, is more than four times
# the standard error of a difference of the two correlations (about 0.1). The control, every other
# token, correlates alike in both runs (about $+0.3$ each, within 0.05 of each other): the broken
# update still follows the advantages everywhere except at the stop decision.

# %% tags=["claim-check"]
eos_gap = corr["fixed", "EOS"] - corr["broken", "EOS"]
check_claims({
    "at least 150 EOS tokens on each side": min(corr_table.loc[(run, "EOS"), "n"] for run in ("broken", "fixed")) >= 150,
    "fixed EOS correlation about +0.4": 0.25 < corr["fixed", "EOS"] < 0.55,
    "broken EOS correlation about -0.2": -0.35 < corr["broken", "EOS"] < -0.05,
    "the EOS gap is about 0.6 and more than four standard errors of a difference":
        0.45 < eos_gap < 0.8 and eos_gap > 4 * math.hypot(corr_se["fixed", "EOS"], corr_se["broken", "EOS"]),
    "other tokens correlate alike (about +0.3, within 0.05)":
        abs(corr["fixed", "other"] - corr["broken", "other"]) < 0.05
        and all(0.2 < corr[run, "other"] < 0.4 for run in ("broken", "fixed")),
})

# %% [markdown]
# ## (c) KL coefficient 0: reward over-optimisation
#
# The per-token reward is $r_t = -\beta\,\widehat{\mathrm{KL}}_t + [t = \text{last}]\; r_\phi(x, y)$.
# With $\beta = 0$ nothing holds the policy near the SFT model, where the reward model $r_\phi$ is
# accurate, so PPO is free to find what $r_\phi$ over-rates (notebook 02: repetition, piles of praise).
# The signature (Gao et al. 2022): the **learned** reward keeps rising while the **hidden** score, what
# we want, rises and then falls. Both runs start from the same adapters and seeds; only $\beta$ differs.
# Each point is the mean of **that step's training batch** (16 responses), so the runs are compared
# over thirds of their steps, each third's mean with its standard error.

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
fig.update_layout(title="(c) Training batches: learned reward against hidden score, without and with the KL penalty")
fit_labels(fig).show()  # long subplot and axis titles wrapped to their panels


# %%
thirds = {}  # (run, metric) -> [(mean, se)] * 3
for name, lab_run in (("beta = 0", broken_c), (f"beta = {lab_config.kl_coef}", baseline)):
    for key in ("score", "hidden_score", "kl", "entropy"):
        thirds[name, key] = third_stats(series(lab_run.history, key)[1])
        print(f"{name:>10}  {key:>12}, first / middle / last third: "
              + "   ".join(f"{m:+.2f} ± {se:.2f}" for m, se in thirds[name, key]))
print("responses of the beta = 0 policy (its last batch), with their hidden score terms:")
hacked = broken_c.trainer.last_batch
for prompt, response in list(zip(hacked.prompts, hacked.responses, strict=True))[:3]:
    terms = score_breakdown(prompt, response)
    print(wrap_printed(f"  {response}", indent=""))  # a long response goes on under its first word
    print(f"    hidden {terms.total:+.2f} (fluency {terms.fluency:+.2f}, repetition {terms.repetition:+.2f}, "
          f"length {terms.length:+.2f})")

# %% [markdown]
# **What this run shows** (means over thirds of the training batches, ± standard error):
# - $\beta = 0$: the KL reaches about 30 to 65 nats per response in the last third, more than ten times
#   the penalised run's (about 2). From the middle to the last third the learned reward still rises (about
#   $+2.65 \to +2.9$ to $+3.0$) while the hidden score falls by about 1.2 to 1.3 (from about $+0.3$ to
#   about $-0.9$ to $-1.0$), more than four standard errors: the over-optimisation signature.
# - $\beta = 0.2$: from the middle to the last third the hidden score changes by less than two standard
#   errors (about $+0.8 \to +0.9$): no fall.

# %% tags=["claim-check"]
def third_change(run: str, key: str) -> tuple[float, float]:
    """(last third - middle third, its standard error) of one run's metric."""
    (m1, s1), (m2, s2) = thirds[run, key][1:]
    return m2 - m1, math.hypot(s1, s2)


free, penalised = "beta = 0", f"beta = {lab_config.kl_coef}"
check_claims({
    "beta = 0: KL about 30 to 65 in the last third, more than ten times the penalised run's (about 2)":
        30 < thirds[free, "kl"][2][0] < 65 and 1.5 < thirds[penalised, "kl"][2][0] < 3.5
        and thirds[free, "kl"][2][0] > 10 * thirds[penalised, "kl"][2][0],
    "beta = 0: the learned reward rises from the middle to the last third (about +2.65 to +2.9-3.0)":
        0.05 < third_change(free, "score")[0] < 0.6,
    "beta = 0: the hidden score falls by about 1.2 to 1.3, more than four standard errors":
        -1.7 < third_change(free, "hidden_score")[0] < -0.9
        and -third_change(free, "hidden_score")[0] > 4 * third_change(free, "hidden_score")[1],
    "beta = 0.2: the hidden score changes by less than two standard errors (no fall)":
        abs(third_change(penalised, "hidden_score")[0]) < 2 * third_change(penalised, "hidden_score")[1],
})

# %%
print("(c) broken (beta = 0):")
findings_c = doctor(broken_c)

# %% [markdown]
# The doctor flags the $\beta = 0$ run with `over_optimisation`, a warning: the hidden score's last third
# lies more than two standard errors below its best third while the learned score did not fall. The
# baseline ($\beta = 0.2$, its findings above) has no such finding.

# %% tags=["claim-check"]
check_claims({
    "beta = 0: over_optimisation, a warning, and no error":
        findings_c.get("over_optimisation") == "warning" and "error" not in findings_c.values(),
    "beta = 0.2 (the baseline): no over_optimisation": "over_optimisation" not in baseline_findings,
})

# %% [markdown]
# **Recognise it:** a KL that keeps growing, a learned reward still rising or flat, and a hidden score
# that falls; compare thirds with their standard errors, not single steps, and read the samples. In real
# runs there is no hidden score: read samples, and keep a held-out evaluation the policy is not trained
# on (notebook 05 has one). The fix is the KL penalty, a fixed $\beta$ or a target KL, and early stopping.

# %% [markdown]
# ### Why RLHF runs without an entropy bonus
#
# PPO on Atari adds an entropy bonus to its loss so that the policy keeps exploring; `PPOConfig.entropy_coef`
# is that bonus, and RLHF leaves it at 0 (InstructGPT's objective has none). The KL penalty holds one
# already. At each prefix $s$,
#
# $$\mathrm{KL}(\pi \Vert \pi_{\text{ref}}) = \sum_v \pi(v \mid s) \log\frac{\pi(v \mid s)}{\pi_{\text{ref}}(v \mid s)}
#   = -H(\pi) - \mathbb{E}_{v \sim \pi}\big[\log \pi_{\text{ref}}(v \mid s)\big],$$
#
# so the penalty $-\beta\,\mathrm{KL}$ is an entropy bonus of weight $\beta$ plus a pull towards the tokens
# the reference finds likely. Together they hold the policy's distribution, and so its entropy, near the
# reference's: a collapse onto a few tokens lowers $H$, a spread onto tokens the reference rules out lowers
# $\mathbb{E}_\pi[\log \pi_{\text{ref}}]$. The runs above show it (the `entropy` lines of the thirds): with
# $\beta = 0.2$ the last third's mean entropy stays within 0.15 nats of step 1's (about 1.6); with
# $\beta = 0$ it climbs above 1.9 nats, more than 0.3 above the penalised run's, as the policy drifts onto
# tokens the reference finds unlikely. A bonus would only have pushed that drift further. It helps where
# nothing else holds the entropy ($\beta$ small or 0) and the policy **collapses**, giving (nearly) the
# same reply to every prompt: the run doctor's `collapse` finding, whose "check first" names
# `entropy_coef` after the learning rate and $\beta$. The last deep dive runs one.

# %% tags=["claim-check"]
check_claims({
    "beta = 0.2: the last third's mean entropy within 0.15 nats of step 1's (about 1.6)":
        abs(thirds[penalised, "entropy"][2][0] - baseline.history[0]["entropy"]) < 0.15
        and 1.5 < baseline.history[0]["entropy"] < 1.75,
    "beta = 0: the last third's mean entropy above 1.9 nats, more than 0.3 above the penalised run's":
        thirds[free, "entropy"][2][0] > 1.9 and thirds[free, "entropy"][2][0] > thirds[penalised, "entropy"][2][0] + 0.3,
})

# %% [markdown]
# ### Exercise 2: an adaptive KL controller
#
# A fixed $\beta$ is a guess: too small and the run above happens, too large and the policy cannot move.
# Ziegler et al. (2019, "Fine-Tuning Language Models from Human Preferences") steer $\beta$ so that the
# measured KL stays near a target. After step $t$, with $\mathrm{KL}_t$ its measured KL (nats per
# response) and $n$ the responses it sampled:
#
# $$e_t = \operatorname{clip}\!\Big(\frac{\mathrm{KL}_t - \mathrm{KL}_{\text{target}}}{\mathrm{KL}_{\text{target}}},
#   -0.2,\ 0.2\Big), \qquad \beta_{t+1} = \beta_t\,(1 + K_\beta\, e_t), \qquad
#   K_\beta = \min\!\Big(\frac{n}{\text{horizon}},\ 1\Big).$$
#
# A KL above the target raises $\beta$; the clip keeps one odd batch from moving it by more than
# $20\% \times K_\beta$. The horizon counts **samples**, not steps. Ziegler et al.'s code and TRL's old
# `AdaptiveKLController` use $K_\beta = n / \text{horizon}$ (horizon 10,000 by default); the course's
# caps it at 1: for $n > 5 \times$ horizon and a KL below the target, $\beta$ would turn negative.
#
# Write `adaptive_kl_betas(kls, init_beta, target, horizon, batch_size)`: the $\beta$ after each update,
# for the KLs measured at successive steps, each step sampling `batch_size` responses.

# %%
# EXERCISE 2
def adaptive_kl_betas(kls: list[float], init_beta: float, target: float, horizon: int, batch_size: int) -> list[float]:
    """beta after each update of the proportional controller fed the KLs in order, from init_beta."""
    raise NotImplementedError


# %%
def check_hints_adaptive_kl(kls, init_beta, target, horizon, batch_size) -> dict[str, np.ndarray]:
    """The (T,) betas each plausible mistake would give, keyed by the hint that names it."""
    gain = min(batch_size / horizon, 1.0)

    def clip(x):
        return min(max(x, -0.2), 0.2)

    def relative(kl):
        return clip((kl - target) / target)

    def betas(k, error, step=lambda beta, k, e: beta * (1 + k * e)) -> np.ndarray:
        out = [init_beta]
        for kl in kls:
            out.append(step(out[-1], k, error(kl)))
        return np.array(out[1:])

    return {
        "an unclipped error: e_t is clipped to [-0.2, 0.2]": betas(gain, lambda kl: (kl - target) / target),
        "the clip on the absolute error KL - target: divide by the target, then clip":
            betas(gain, lambda kl: clip(kl - target) / target),
        "the error relative to the measured KL: e_t divides by the target, not by KL_t":
            betas(gain, lambda kl: clip((kl - target) / kl)),
        "the sign flipped: a KL above the target raises beta": betas(gain, lambda kl: -relative(kl)),
        "K_beta = 1 / horizon: the horizon counts samples, so one step covers batch_size / horizon of it":
            betas(min(1 / horizon, 1.0), relative),
        "K_beta = horizon / batch_size, upside down: it is batch_size / horizon":
            betas(min(horizon / batch_size, 1.0), relative),
        f"K_beta = batch_size / horizon = {batch_size / horizon:g}, not capped at 1: beta can turn negative":
            betas(batch_size / horizon, relative),
        "an additive update beta + K e_t: the update multiplies beta by 1 + K e_t":
            betas(gain, relative, step=lambda beta, k, e: beta + k * e),
        "the beta before each update (your list starts with init_beta): return the beta after each":
            np.concatenate([[init_beta], betas(gain, relative)[:-1]]),
    }


# %%
def check_adaptive_kl_betas():
    cases = [  # (init_beta, target, horizon, batch_size, KLs): no two settings equal, none at a value that hides
        (0.15, 6.0, 400, 48, [13.0, 6.6, 2.0, 5.4, 6.0, 9.5, 7.2, 0.5, 4.8, 30.0]),  # K = 0.12
        (0.3, 2.5, 16, 96, [1.0, 2.75, 0.2, 2.25, 5.0, 1.9]),  # n / horizon = 6: K capped at 1
    ]
    for init_beta, target, horizon, batch_size, kls in cases:
        got = adaptive_kl_betas(list(kls), init_beta, target, horizon, batch_size)
        assert len(got) == len(kls), f"expected one beta per measured KL ({len(kls)}), got {len(got)}"
        got = np.array([float(beta) for beta in got])  # (T,)
        # the reference as a product: beta_t = init_beta * prod_{s <= t} (1 + K e_s)
        errors = np.clip(np.array(kls) / target - 1.0, -0.2, 0.2)  # (T,): the clipped relative errors
        gain = min(batch_size / horizon, 1.0)
        expected = init_beta * np.cumprod(1.0 + gain * errors)  # (T,)
        if np.allclose(got, expected, rtol=1e-9, atol=1e-12):
            continue
        same = [what for what, values in check_hints_adaptive_kl(kls, init_beta, target, horizon, batch_size).items()
                if np.allclose(got, values, rtol=1e-9, atol=1e-12)]
        t = int(np.argmax(~np.isclose(got, expected, rtol=1e-9, atol=1e-12)))  # the first update that differs
        raise AssertionError(
            f"target {target}, horizon {horizon}, batch_size {batch_size}, init_beta {init_beta}: after update "
            f"{t} (KL {kls[t]}) your beta is {got[t]:.6f}, expected {expected[t]:.6f} (e_t = {errors[t]:+.3f}, "
            f"K_beta = {gain:g})" + (f"; yours match {same[0]}" if same else ""))


exercise_check("Exercise 2 (adaptive_kl_betas)", check_adaptive_kl_betas,
               hidden=[rlhf_helpers.AdaptiveKLController.update])  # the trainer's controller

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def adaptive_kl_betas(kls: list[float], init_beta: float, target: float, horizon: int, batch_size: int) -> list[float]:
#     """beta after each update of the proportional controller fed the KLs in order, from init_beta."""
#     gain = min(batch_size / horizon, 1.0)  # K_beta: the share of the horizon (in samples) one step covers
#     betas = [init_beta]
#     for kl in kls:
#         error = min(max((kl - target) / target, -0.2), 0.2)  # e_t: the relative error, clipped
#         betas.append(betas[-1] * (1.0 + gain * error))
#     return betas[1:]
# ```
# </details>
#
# `PPOConfig(target_kl=..., kl_horizon=...)` gives the trainer this controller, started at `kl_coef`;
# it updates after every step. Started at $\beta = 0$ it would stay at 0 (the update multiplies), so the
# library refuses that start.

# %%
gain = min(lab.batch / lab_config.kl_horizon, 1.0)  # K_beta of one lab step at the config's horizon
most = (1 + 0.2 * gain) ** lab.long_steps  # the largest rise over a whole lab run: e_t = +0.2 at every step
print(f"horizon {lab_config.kl_horizon} samples, {lab.batch} responses per step: K_beta = {gain:.4f},\n"
      f"  so beta moves by at most {0.2 * gain:.2%} a step and rises by a factor of at most {most:.4f} "
      f"over {lab.long_steps} steps")

# %% [markdown]
# **Units matter:** at the default horizon of 10,000 samples and this lab's 16 responses a step,
# $K_\beta = 0.0016$: $\beta$ moves by less than 1% over a whole 30-step lab run. On a run this short the
# controller acts only with a horizon of a few batches.

# %% tags=["claim-check"]
check_claims({
    "K_beta = 0.0016 here; beta moves by less than 1% over a whole 30-step lab run":
        lab.batch == 16 and lab.long_steps == 30 and abs(gain - 0.0016) < 1e-12 and 1.009 < most < 1.01,
})

# %% [markdown]
# ### Deep dive: how far can the proxy be pushed?
#
# *Optional: skip it on a first pass; nothing after it needs it.*
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
# Each PPO step of the $\beta = 0$ run is one point (the $k_1$ KL and the mean hidden score of its
# training batch); the penalised run's points are drawn in the same plane. How precisely one run
# locates the peak: refit on the steps drawn with replacement, 1,000 times (a bootstrap over the steps),
# and read the middle 95% of the refitted $\mathrm{KL}^*$ and the spread of the refitted peak heights.

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


def rl_peak(coef: np.ndarray) -> tuple[float, float]:
    """(d*, h(d*)) where the RL law peaks, d* = exp(alpha_G / beta_G - 1); (inf, nan) when beta_G <= 0."""
    c_g, alpha_g, beta_g = coef
    if beta_g <= 0:
        return math.inf, math.nan
    d_star = float(np.exp(alpha_g / beta_g - 1))
    return d_star, float(law_features(np.array([d_star]), "rl")[0] @ coef)


def bootstrap_peak(kl: list[float], hidden: list[float], n: int = 1000, seed: int = 0) -> dict[str, float]:
    """Refit the RL law on the steps drawn with replacement: the middle 95% of KL* and the standard
    deviation of the peak height over the refits (a fit without a peak counts as KL* = inf)."""
    rng = np.random.default_rng(seed)
    kl, hidden = np.asarray(kl), np.asarray(hidden)
    peaks = [rl_peak(fit_law(kl[i], hidden[i], "rl")[0]) for i in rng.integers(0, len(kl), (n, len(kl)))]
    kl_star = np.array([d**2 for d, _ in peaks])  # (n,)
    low, high = np.quantile(kl_star, [0.025, 0.975], method="inverted_cdf")  # no interpolation next to inf
    return {"KL* low": float(low), "KL* high": float(high), "peak se": float(np.nanstd([h for _, h in peaks]))}


# %%
kl_c, hidden_c = series(broken_c.history, "kl")[1], series(broken_c.history, "hidden_score")[1]
d_c = np.sqrt(np.clip(kl_c, 0.0, None))  # (N,)
enough = len(d_c) >= 6  # three coefficients need clearly more than three points
fits = {form: fit_law(kl_c, hidden_c, form) for form in ("rl", "bon")}  # form -> (coefficients, RSS)
display(pd.DataFrame([{"law": {"rl": "RL", "bon": "best-of-n"}[form], "c_G": coef[0], "alpha_G": coef[1],
                       "beta_G": coef[2], "residual sum of squares": rss} for form, (coef, rss) in fits.items()])
        .style.hide(axis="index").format(cell_formatter(".3f")))
d_star, peak_c = rl_peak(fits["rl"][0])
no_boot = dict.fromkeys(("KL* low", "KL* high", "peak se"), math.nan)  # too few steps to refit
boot_c = bootstrap_peak(kl_c, hidden_c) if enough else no_boot
print(f"free intercept c_G of the RL fit {fits['rl'][0][0]:+.3f};\n"
      f"  hidden score of the first batch, sampled from the SFT policy before any update: {hidden_c[0]:+.3f}")
print(f"RL law: hidden score peaks at KL* = {d_star**2:.1f} nats per response (d* = {d_star:.2f}, fitted peak "
      f"{peak_c:+.2f});\n  bootstrap: KL* from {boot_c['KL* low']:.1f} to {boot_c['KL* high']:.1f}, peak height "
      f"+- {boot_c['peak se']:.2f};\n"
      f"  the beta = {lab_config.kl_coef} run ended at KL {baseline.history[-1]['kl']:.1f}")

# %%
fig = go.Figure()
fig.add_scatter(x=d_c, y=hidden_c, mode="markers", name="beta = 0, one point per step", marker_color="crimson")
fig.add_scatter(x=np.sqrt(np.clip(series(baseline.history, "kl")[1], 0.0, None)),
                y=series(baseline.history, "hidden_score")[1], mode="markers", name=f"beta = {lab_config.kl_coef}",
                marker_color="royalblue")
grid = np.linspace(0.0, d_c.max(), 100)
for form, label, dash in (("rl", "RL law", "solid"), ("bon", "best-of-n law", "dash")):
    if enough:
        fig.add_scatter(x=grid, y=law_features(grid, form) @ fits[form][0], mode="lines", name=f"{label} fit",
                        line=dict(color="black", dash=dash))
if enough and 0 < d_star <= d_c.max():
    fig.add_vline(x=d_star, line_dash="dot", line_color="gray")
fig.update_layout(title="(c) Hidden score of the training batches against the distance from the SFT model",
                  xaxis_title="d = sqrt(KL to the reference)", yaxis_title="mean hidden score of the batch")
fig.show()

# %% [markdown]
# **What this run shows:** the two forms fit the $\beta = 0$ run about equally well: residual sums of
# squares of about 2 to 3 each. The printed numbers say which is lower on your run; the margin between
# them is a few tenths, and one run cannot rank the two forms firmly. The RL form's free intercept (between about
# $-0.3$ and $-0.65$) lies within 0.3 of the first batch's hidden score (about $-0.3$). Its hidden score
# peaks at $\mathrm{KL}^* \approx 4$ nats per response; the bootstrap puts $\mathrm{KL}^*$ between about
# 3 and 5.5. The fitted curve is the $\beta = 0$ run's alone: its batches' hidden score against their
# distance from the SFT model. The penalised run ended at a KL of about 2.3, below the bootstrap's
# whole range: it stopped at a distance where the $\beta = 0$ run's fitted score was still rising. The
# curve is no prediction of the penalised run's hidden score: that run followed a path of its own, drawn
# as the blue points.

# %% tags=["claim-check"]
check_claims({
    "both forms fit about equally well (RSS about 2 to 3 each)":
        1.6 < fits["rl"][1] < 3.4 and 1.6 < fits["bon"][1] < 3.4,
    "the free intercept (about -0.3 to -0.65) is within 0.3 of the first batch's hidden score (about -0.3)":
        abs(fits["rl"][0][0] - hidden_c[0]) < 0.3 and -0.65 < fits["rl"][0][0] < -0.3 and -0.4 < hidden_c[0] < -0.2,
    "KL* is about 4 nats per response": 3.5 < d_star**2 < 5,
    "the bootstrap puts KL* between about 3 and 5.5": 2.5 < boot_c["KL* low"] < 3.8 and 4.8 < boot_c["KL* high"] < 6.2,
    "the penalised run ended at a KL of about 2.3, below the bootstrap's range of KL* (the fit still rising there)":
        1.8 < baseline.history[-1]["kl"] < 2.8 and baseline.history[-1]["kl"] < min(boot_c["KL* low"], d_star**2),
})

# %% [markdown]
# **Read it:** along the $\beta = 0$ run, left of $d^*$ optimising the learned reward also improved what
# we want; right of it every extra nat of KL made it worse. Gao et al. found that a KL penalty did not
# raise the gold score reached at a given KL: it acted like early stopping, choosing where along such a
# curve a run ends (one run per $\beta$ here cannot test that). The fit is one noisy run: read $d^*$ as
# a rough location (the bootstrap range), not a constant.
#
# #### A weaker reward model
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

# %%
sweep = {}  # name -> what the figure and the claims read
for name, folder, lab_run, color in (("all pairs", reward_dir, broken_c, "crimson"),
                                     ("250 pairs", weak_dir, weak_c, "darkorange")):
    metrics = reward_metrics(folder)
    kl, hidden = series(lab_run.history, "kl")[1], series(lab_run.history, "hidden_score")[1]
    coef = fit_law(kl, hidden, "rl")[0]
    d_star_rm, peak_rm = rl_peak(coef)
    sweep[name] = dict(pairs=int(metrics["train_pairs"]), color=color, d=np.sqrt(np.clip(kl, 0.0, None)), coef=coef,
                       hidden=hidden, proxy=series(lab_run.history, "score")[1], d_star=d_star_rm, peak=peak_rm,
                       accuracy=metrics["pairwise_accuracy"], correlation=metrics["score_hidden_correlation"],
                       **(bootstrap_peak(kl, hidden) if enough else no_boot))
sweep_table = pd.DataFrame([{"reward model": f"{row['pairs']} pairs", "held-out pair accuracy": row["accuracy"],
                             "correlation with hidden": row["correlation"], "c_G": row["coef"][0],
                             "alpha_G": row["coef"][1], "beta_G": row["coef"][2], "KL*": row["d_star"] ** 2,
                             "KL* low (bootstrap)": row["KL* low"], "KL* high (bootstrap)": row["KL* high"],
                             "fitted peak": row["peak"], "peak se (bootstrap)": row["peak se"]} for row in sweep.values()])
display(sweep_table.style.hide(axis="index").format(cell_formatter(".2f")))

# %%
fig = make_subplots(rows=1, cols=2, subplot_titles=("learned (proxy) reward of its own reward model",
                                                    "hidden (gold) score, with the RL law's fit"))
for row in sweep.values():
    label = f"reward model on {row['pairs']} pairs"
    fig.add_scatter(x=row["d"], y=row["proxy"], mode="markers", name=label, marker_color=row["color"], row=1, col=1)
    fig.add_scatter(x=row["d"], y=row["hidden"], mode="markers", name=label, marker_color=row["color"],
                    showlegend=False, row=1, col=2)
    if enough:
        grid = np.linspace(0.0, row["d"].max(), 100)
        fig.add_scatter(x=grid, y=law_features(grid, "rl") @ row["coef"], mode="lines", line_color=row["color"],
                        name=f"RL law fit, {row['pairs']} pairs", row=1, col=2)
    if enough and 0 < row["d_star"] <= row["d"].max():
        fig.add_vline(x=row["d_star"], line_dash="dot", line_color=row["color"], row=1, col=2)
fig.update_xaxes(title_text="d = sqrt(KL to the reference)")
fig.update_layout(title="(c) beta = 0 on a reward model trained on all pairs and on 250 pairs")
fit_labels(fig).show()  # long subplot and axis titles wrapped to their panels

# %% [markdown]
# **What this run shows:** the reward model trained on 250 pairs is the weaker one on held-out pairs
# (accuracy about 0.75 against 0.81; correlation with the hidden score about 0.77 against 0.93). Pushed
# with $\beta = 0$, it over-optimises sooner: its fitted hidden score peaks at $\mathrm{KL}^* \approx 1$
# nat per response against about 4, and the two bootstrap ranges do not overlap. Its fitted peak is
# lower too (about $+0.3$ against $+0.4$ to $+0.5$), but by less than two standard errors of the difference: one
# run per reward model does not settle the height.

# %% tags=["claim-check"]
strong, weak = sweep["all pairs"], sweep["250 pairs"]
check_claims({
    "the 250-pair model is weaker on held-out pairs (about 0.75 against 0.81)":
        0.70 < weak["accuracy"] < 0.78 and 0.78 < strong["accuracy"] < 0.84 and weak["accuracy"] < strong["accuracy"],
    "its correlation with the hidden score is lower (about 0.77 against 0.93)":
        0.72 < weak["correlation"] < 0.82 and 0.90 < strong["correlation"] < 0.96,
    "KL* about 1 against about 4": 0.7 < weak["d_star"] ** 2 < 1.4 and 3.5 < strong["d_star"] ** 2 < 5,
    "the bootstrap ranges of KL* do not overlap": weak["KL* high"] < strong["KL* low"],
    "the weak model's fitted peak is lower (about +0.3 against +0.4 to +0.5) by less than two standard errors":
        0.15 < weak["peak"] < 0.35 and 0.33 < strong["peak"] < 0.6
        and 0 < strong["peak"] - weak["peak"] < 2 * math.hypot(strong["peak se"], weak["peak se"]),
})

# %% [markdown]
# One run per reward model: read the two peaks as rough locations. In real work there is no hidden
# score to fit; what carries over is the habit of checking a reward model's held-out accuracy (in the
# table above) before trusting how far the policy may be pushed on it.
#
# #### Exercise 3: fit the over-optimisation law
# Write `fit_overoptimisation(kl, hidden)`: the least-squares coefficients $(c_{\text{G}}, \alpha_{\text{G}}, \beta_{\text{G}})$
# of Gao et al.'s RL law $h = c_{\text{G}} + \alpha_{\text{G}} d - \beta_{\text{G}}\, d \log d$, $d = \sqrt{\mathrm{KL}}$, from two
# lists of equal length, as three Python floats. Any least-squares solver will do (`torch.linalg.lstsq`,
# `numpy.linalg.lstsq`); the check hides this notebook's `fit_law` and `law_features`, so build the
# design matrix yourself. Treat negative KL values as 0, and use $d \log d = 0$ at $d = 0$ (its limit).

# %%
# EXERCISE 3
def fit_overoptimisation(kl: list[float], hidden: list[float]) -> tuple[float, float, float]:
    """Least-squares (c, alpha, beta_G) of hidden = c + alpha * d - beta_G * d * log(d), d = sqrt(kl)."""
    raise NotImplementedError


# %%
def check_fit_overoptimisation():
    kl = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    exact = [0.3 + 0.8 * k**0.5 - 0.1 * k**0.5 * math.log(k**0.5) if k > 0 else 0.3 for k in kl]  # obeys the law
    got = fit_overoptimisation(list(kl), list(exact))
    assert len(got) == 3 and all(isinstance(v, float) for v in got), \
        f"return three Python floats (c_G, alpha_G, beta_G), got {got!r}"
    assert not any(math.isnan(v) for v in got), \
        f"your fit returned nan {got}: is a negative or zero KL reaching a sqrt or a log (d log d = 0 at d = 0)?"
    c, alpha, beta_g = got
    hint = (" your beta_G has the right size and the wrong sign: the law subtracts beta_G d log d"
            if abs(beta_g + 0.1) < 1e-6 else " are you fitting on d = sqrt(KL), with the columns (1, d, -d log d)?")
    assert max(abs(c - 0.3), abs(alpha - 0.8), abs(beta_g - 0.1)) < 1e-6, \
        (f"on points that obey h = 0.3 + 0.8 d - 0.1 d log d exactly, your fit gives c_G {c:.4f}, alpha_G "
         f"{alpha:.4f}, beta_G {beta_g:.4f} (expected 0.3, 0.8, 0.1);" + hint)
    g = torch.Generator().manual_seed(3)
    noisy_kl = (torch.rand(40, generator=g, dtype=torch.float64) * 50 - 1).tolist()  # a few negative values
    noisy_h = (torch.randn(40, generator=g, dtype=torch.float64)).tolist()
    d = np.sqrt(np.clip(noisy_kl, 0.0, None))
    d_log_d = np.array([x * math.log(x) if x > 0 else 0.0 for x in d])  # (40,): d log d, 0 at d = 0
    reference, *_ = np.linalg.lstsq(np.stack([np.ones_like(d), d, -d_log_d], axis=1), np.array(noisy_h),
                                    rcond=None)  # the normal equations' solution, from numpy
    try:
        got = fit_overoptimisation(list(noisy_kl), list(noisy_h))
    except RuntimeError as error:  # e.g. a least-squares solver that met nan
        raise AssertionError(f"on 40 noisy points, some with KL < 0, your fit raised {type(error).__name__}: does a "
                             "negative KL reach the square root (nan)? Treat KL < 0 as 0 first") from None
    why = (" a negative KL reached the square root: clamp KL at 0 first" if any(math.isnan(v) for v in got)
           else " the points with KL < 0 count as d = 0")
    assert np.allclose(got, reference, rtol=1e-6, atol=1e-9), \
        (f"on 40 noisy points (some KL < 0) your fit gives {np.round(got, 4).tolist()}, numpy's least squares "
         f"{np.round(reference, 4).tolist()}:" + why)


exercise_check("Exercise 3 (fit_overoptimisation)", check_fit_overoptimisation, hidden=[fit_law, law_features])

# %% [markdown]
# <details><summary>Solution 3</summary>
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
# ## Deep dive: (d) negative KL from the $k_1$ estimator
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Notebook 03 introduced the estimators; here they meet a trained run. The logged KL is estimated from the sampled tokens. With $\log w_t = \log\pi_{\text{ref}}(a_t) - \log\pi(a_t)$:
#
# $$k_1 = -\log w_t, \qquad k_3 = (w_t - 1) - \log w_t \;\ge 0 .$$
#
# Both are unbiased estimates of $\mathrm{KL}(\pi \Vert \pi_{\text{ref}})$ when $a_t \sim \pi$, but
# $k_1$ is negative on every token the reference likes more than the policy, and a *sequence* or a small
# batch can sum to a negative KL. Seeing "KL = -0.3" for one response is not a bug in the maths. A
# batch *mean* that stays negative is a different sign: the samples did not come from the $\pi$ whose
# log-probs enter $k_1$ (top-k, top-p, log-probs computed at another temperature than the one that
# sampled, say sampled at 0.7 and scored at 1, or the wrong log-probs, as in (a)). A temperature other than
# 1 alone does not do it: the course computes both $\log\pi$ and $\log\pi_{\text{ref}}$ at the sampling
# temperature. Sampled from the reference,
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

# %%
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
fit_labels(fig).show()  # long subplot and axis titles wrapped to their panels
per_step = {kind: [format_number(e[f"{kind}_mean"], "+6.2f") for e in baseline.extras] for kind in ("k1", "k3")}
print("batch-mean sequence KL per step (nats per response):")
for first in range(0, len(baseline.extras), 10):  # ten steps a line, k3 under k1
    last = min(first + 10, len(baseline.extras))
    print(f"  steps {first + 1:>2}-{last:<2}  k1 {' '.join(per_step['k1'][first:last])}\n"
          f"               k3 {' '.join(per_step['k3'][first:last])}")

# %% [markdown]
# **What this run shows:** in the baseline's last batch, $k_1$ is negative on about half of the real
# tokens (between 35% and 60%) and its sum is negative for a few responses (fewer than 15%, more than
# none); $k_3$ is negative on no token and no response. Per step, $k_3$'s batch mean jumps where
# $k_1$'s does not: at one step it exceeds $k_1$'s by more than 4 nats per response.

# %% tags=["claim-check"]
check_claims({
    "k1 is negative on 35-60% of the real tokens": 0.35 < float((k1[real] < 0).float().mean()) < 0.6,
    "k1's sum is negative for some responses, fewer than 15%": 0 < float((seq_k1 < 0).float().mean()) < 0.15,
    "k3 is negative on no token and no response": not bool((k3[real] < 0).any() or (seq_k3 < 0).any()),
    "at one step k3's batch mean exceeds k1's by more than 4 nats":
        max(e["k3_mean"] - e["k1_mean"] for e in baseline.extras) > 4,
})

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
# sampled; it removes the noise of the sampled next token, which usually makes it the lowest-variance
# one (below it is called "exact" in that per-prefix sense, and the second table measures its spread).
#
# First on a known case: one token drawn from two categorical distributions over 50 words whose KL is
# set to 0.1, 1 and 2 nats. The line printed first is the baseline's KL per response and **per
# token** (the response's KL divided by its length): the per-token figure is the one to place in this
# table. The mean and standard deviation of each estimator are exact sums over the 50 words, and a
# sample of 10,000 draws shows what a logged mean sees.

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


# %%
baseline_last = baseline.history[-1]
kl_per_token = baseline_last["kl"] / baseline_last["response_length"]
print(f"the baseline's last batch: KL {baseline_last['kl']:.2f} nats per response (k1 mean)\n"
      f"  over {baseline_last['response_length']:.1f} tokens: {kl_per_token:.3f} nats per token")
known_rows = []  # one row per (target KL, estimator): exact moments over the 50 words, and a sample mean
for target in (0.1, 1.0, 2.0):
    logp = policy_at_kl(target)  # (V,)
    draws = torch.multinomial(logp.exp(), 10_000, replacement=True, generator=gen)  # (N,) words y ~ pi
    for kind in ("k1", "k2", "k3"):
        k = rlhf_helpers.kl_estimate(logp, ref_logp, kind=kind)  # (V,): the estimate if word v is drawn
        mean = float((logp.exp() * k).sum())  # exact expectation under pi
        known_rows.append({"KL": exact_kl(logp, ref_logp), "target": target, "estimator": kind, "E[k]": mean,
                           "E[k] - KL": mean - exact_kl(logp, ref_logp),
                           "std[k]": math.sqrt(float((logp.exp() * (k - mean) ** 2).sum())),
                           "largest k": float(k.max()), "mean of 10,000 draws": float(k[draws].mean())})
known = pd.DataFrame(known_rows)
spread = known.pivot(index="target", columns="estimator", values="std[k]")  # (3 KLs, 3 estimators)
bias = known.pivot(index="target", columns="estimator", values="E[k] - KL")
display(known.drop(columns="target").style.hide(axis="index").format(cell_formatter(".3f")))
display(pd.DataFrame({"KL": [f"{t:g}" for t in spread.index], "std[k3] / std[k1]": spread["k3"] / spread["k1"]})
        .style.hide(axis="index").format(cell_formatter(".2f")))

# %% [markdown]
# **What the table shows** (exact sums over the 50 words, fixed seed): $k_1$ and $k_3$ have expectation
# exactly the KL; $k_2$'s expectation misses it by a gap that grows with the KL (about $-0.004$,
# $+0.03$ and $+0.77$ nats). $k_3$'s standard deviation grows fast with the KL: about a third of
# $k_1$'s at 0.1 nat, about 7 times $k_1$'s at 1 nat and hundreds of times at 2 nats, where one rare word
# gives $k_3$ above a million: a mean of 10,000 draws seldom contains it, and then misses $\mathbb E[k_3]$
# (compare the last column with $\mathbb E[k]$). The baseline's last batch averages about 0.1 nat per
# token, but that is an average over tokens: on the tokens where the policy has moved far from the
# reference, $k_3$'s spread is the larger one, as the next cells measure on the run's own responses.

# %% tags=["claim-check"]
check_claims({
    "k1 and k3 are unbiased: E[k] = KL": bool((bias[["k1", "k3"]].abs() < 1e-9).all().all()),
    "k2's gap grows with the KL: about -0.004, +0.03, +0.77":
        abs(bias.loc[0.1, "k2"] + 0.004) < 0.002 and abs(bias.loc[1.0, "k2"] - 0.03) < 0.01
        and abs(bias.loc[2.0, "k2"] - 0.77) < 0.03,
    "k3's spread grows with the KL": spread.loc[0.1, "k3"] < spread.loc[1.0, "k3"] < spread.loc[2.0, "k3"],
    "std k3 / std k1: about 1/3 at 0.1 nat, about 7 at 1, hundreds at 2":
        0.25 < spread.loc[0.1, "k3"] / spread.loc[0.1, "k1"] < 0.4
        and 5.5 < spread.loc[1.0, "k3"] / spread.loc[1.0, "k1"] < 7.5
        and spread.loc[2.0, "k3"] / spread.loc[2.0, "k1"] > 100,
    "at 2 nats one word gives k3 above a million":
        float(known.query("target == 2.0 and estimator == 'k3'")["largest k"].iloc[0]) > 1e6,
}, any_profile=True)

# %% tags=["claim-check"]
check_claims({
    "the baseline's last batch has about 0.1 nat of KL per token": 0.05 < kl_per_token < 0.15,
})

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
response_table = pd.DataFrame([{"estimator": name, "mean": float(v.mean()), "std": float(v.std()),
                                "min": float(v.min()), "max": float(v.max()),
                                "mean - exact": float((v - per_response["exact"]).mean()),
                                "its standard error": float((v - per_response["exact"]).std() / B**0.5)}
                               for name, v in per_response.items()]).set_index("estimator")
print(f"sequence KL (nats per response) over the same {B} held-out responses:")
display(response_table.style.format(cell_formatter(".3f")).format(cell_formatter("+.3f"), subset=["mean - exact"]))

# %% [markdown]
# **What this run shows:** over these 200 responses the spread across responses orders exact $<k_1<k_2<k_3$
# (standard deviations about 1.0, 1.6, 2.9 and 5.6 nats); $k_1$ goes below 0 for some responses,
# $k_3$ never. Each estimator's batch mean lies within two standard errors of the exact one (gaps
# about $+0.13$, $-0.03$ and $+0.32$, standard errors about 0.12, 0.16 and 0.36).

# %% tags=["claim-check"]
std_of = response_table["std"]
gap_in_se = (response_table["mean - exact"] / response_table["its standard error"]).drop("exact")
check_claims({
    "spread: exact < k1 < k2 < k3": bool(std_of["exact"] < std_of["k1"] < std_of["k2"] < std_of["k3"]),
    "standard deviations about 1.0, 1.6, 2.9 and 5.6":
        bool(np.allclose(std_of[["exact", "k1", "k2", "k3"]], [1.0, 1.6, 2.9, 5.6], rtol=0.12)),
    "k1 below 0 for some responses, k3 never": bool(response_table.loc["k1", "min"] < 0 <= response_table.loc["k3", "min"]),
    "each batch mean within two standard errors of the exact one": bool((gap_in_se.abs() < 2).all()),
})

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

# %% [markdown]
# ## Deep dive: (e) an untrained value head
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# GAE's advantages are only as good as the critic: $\hat A_t = \sum_l (\gamma\lambda)^l \delta_{t+l}$ with
# $\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)$. A fresh value head outputs $V \approx 0$ everywhere, so
# early advantages are just the $\lambda$-faded returns, $\hat A_t \approx (\gamma\lambda)^{|y|-1-t}\,\text{score}$
# plus KL terms: no state-dependent baseline, every token carries the spread of the final score across
# responses (faded by $(\gamma\lambda)^{|y|-1-t}$), and the policy moves on that high-variance signal. The critic's quality is
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


# %%
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
fit_labels(fig).show()  # long subplot and axis titles wrapped to their panels

# %%
ev_rows = []  # one row per side and seed: the first policy update's batch, and the value loss after it
for name, runs, offset in (("no warm-up", no_warmup, 0), (f"{lab.warmup_steps} warm-up steps", warmed, lab.warmup_steps)):
    for seed, r in runs.items():
        ev_rows.append({"side": name, "seed": seed, "explained variance, first policy update":
                        r.history[offset]["explained_variance"], "value loss, mean of the first updates":
                        np.mean([row["value_loss"] for row in r.history[offset : offset + lab.critic_steps]])})
ev_table = pd.DataFrame(ev_rows)
display(ev_table.style.hide(axis="index").format(cell_formatter(".3f")))
before, after = (ev_table[ev_table["side"] == side]["explained variance, first policy update"].to_numpy()
                 for side in ev_table["side"].unique())
change = after - before  # (seeds,): paired by seed
change_se = change.std(ddof=1) / math.sqrt(len(change))  # standard error of the mean change over the seeds
print(f"change of the first update's explained variance, mean over {len(change)} seeds: {change.mean():+.3f} "
      f"(standard error {change_se:.3f})")

# %% [markdown]
# **What this run shows:** without a warm-up, the critic explains nothing of the returns at the first
# policy update (explained variance within 0.03 of 0 in each of the 3 seeds). After 4 warm-up steps it
# explains about a fifth of their variance (between 0.15 and 0.3 in every seed). The mean change,
# about $+0.22$, is more than five times its standard error over the seeds (about 0.03).

# %% tags=["claim-check"]
check_claims({
    "no warm-up: explained variance within 0.03 of 0 in every seed": bool((np.abs(before) < 0.03).all()),
    "after the warm-up: between 0.15 and 0.3 in every seed": bool(((after > 0.15) & (after < 0.3)).all()),
    "mean change about +0.22, more than five standard errors":
        0.17 < change.mean() < 0.27 and change.mean() > 5 * change_se,
})

# %%
findings_e = {}
for name, runs in (("no warm-up", no_warmup), ("warm-up", warmed)):
    for seed, r in runs.items():
        print(f"(e) {name}, seed {seed}:")
        findings_e[name, seed] = doctor(r)

# %% [markdown]
# Without a warm-up the doctor notes `untrained_critic` in each of the three seeds: the explained
# variance is below 0.1 at the policy's first update. After the warm-up it notes nothing. The rule is an
# info, not a warning, by design: a policy that starts on an untrained critic still learns (the baseline
# does), only from a noisier signal at first, so the doctor points it out without calling the run
# broken. Its warning for the critic, `critic_not_learning`, is for a critic that still explains nothing
# five steps after the warm-up.

# %% tags=["claim-check"]
check_claims({
    "no warm-up: untrained_critic (info) and nothing else, in every seed":
        all(findings_e["no warm-up", seed] == {"untrained_critic": "info"} for seed in lab.seeds),
    "warm-up: no finding in any seed": all(findings_e["warm-up", seed] == {} for seed in lab.seeds),
})

# %% [markdown]
# **Recognise it:** explained variance near 0 (or below) in the first steps while the policy is already
# updating: look at the curves right of the dotted line and at the table's explained variance of the
# batch of each seed's first policy update. The value loss is a weaker sign (compare its two columns
# in the table and the overlap of the bands): its scale moves with the returns, explained variance does
# not. The fix moves the policy's start past the critic's first steps; a critic initialised from the
# reward model is another. The bands show how far three seeds of one setting already differ in runs
# this short.


# %% [markdown]
# ## Your turn: break a run and ask the doctor
#
# The cell below raises the policy's learning rate thirty-fold and trains eight steps from the fresh
# adapters. Predict which rules will fire before you run it. Then break a run your own way and read each
# finding's "check first" line. Some breaks to try:
# - `kl_coef=0.0` with `my_steps = lab.long_steps` (eight steps are too few for over-optimisation);
# - `ppo_epochs=16`, or `clip_eps=10.0` (no clip at all);
# - `target_kl=2.0, kl_horizon=32` (your controller of Exercise 2: $\beta$ is logged as `kl_coef`);
# - `RefAsOldTrainer` with `my_start = trained_state`, or `PadIsEosTrainer`.

# %%
shipped_break = lab_config.replace(policy_lr=lab_config.policy_lr * 30)
my_config = shipped_break  # your change here, e.g. lab_config.replace(kl_coef=0.0)
my_trainer_class = PPOTrainer  # or RefAsOldTrainer, PadIsEosTrainer, a subclass of your own
my_steps, my_start = lab.short_steps * 2 // 3, initial_state
my_run = run(my_trainer_class, my_config, my_steps, "your broken run", start=my_start)
my_findings = doctor(my_run)
shipped = (my_config is shipped_break and my_trainer_class is PPOTrainer and my_steps == lab.short_steps * 2 // 3
           and my_start is initial_state)  # the text below describes the shipped break only

# %% [markdown]
# On the shipped seed: no error, the untrained critic's info, and these warnings. `off_policy` from the
# first step (clip fraction or approx-KL above the band). `collapse`: by the sixth step at most three
# distinct texts among the 16 responses, and entropy below half its step-1 value. `length_collapse`:
# the text is (nearly) empty, at most two tokens on average by the sixth step. The KL penalty does that
# here. The first, oversized update moves the policy far from the reference: at step 2 the KL is above 20
# nats per response, and its penalty, $\beta$ times the KL, more than twice the mean score. That penalty
# is paid token by token, so the shorter a response, the less it pays, and the policy learns to stop at
# once. (A negative score alone would give no such reason: with $\gamma = 1$ every response is paid its
# score once, whatever its length.) The root cause is the step size, which `collapse` names first.

# %% tags=["claim-check"]
if shipped:  # the text describes the shipped break only
    check_claims({
        "no error, the untrained critic's info, and the warnings off_policy, collapse and length_collapse":
            {"off_policy", "collapse", "length_collapse"} <= {r for r, sev in my_findings.items() if sev == "warning"}
            and "error" not in my_findings.values() and my_findings.get("untrained_critic") == "info",
        "off_policy from the first step": [f.steps[0] for f in diagnose(my_run.trainer).findings
                                           if f.rule == "off_policy"] == [1],
        "by step 6 the 16 responses hold at most three distinct texts":
            lab.batch == 16 and len(my_run.history) >= 6
            and min(round(row["distinct_responses"] * 16) for row in my_run.history[:6]) <= 3,
        "entropy below half its step-1 value by step 6":
            min(row["entropy"] for row in my_run.history[:6]) < 0.5 * my_run.history[0]["entropy"],
        "by step 6 the mean response is at most two tokens long":
            min(row["response_length"] for row in my_run.history[:6]) <= 2,
        "at step 2 the KL is above 20 nats, and beta times it more than twice the mean score":
            len(my_run.history) >= 2 and my_run.history[1]["kl"] > 20
            and my_config.kl_coef * my_run.history[1]["kl"] > 2 * my_run.history[1]["score"] > 0,
    })

# %% [markdown]
# ## Deep dive: the knobs left off: an entropy bonus, the score's scale and clip, length
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# The course's profiles leave three `PPOConfig` fields off: `entropy_coef`, `score_clip` and
# `missing_eos_penalty`; and nothing normalises the reward model's scores. What each one does, what it
# guards against, and what it costs.
#
# ### An entropy bonus on top of the KL penalty
#
# With `entropy_coef` $= c$ the policy's loss on a minibatch is, as in CleanRL,
#
# $$L = L^{\text{clip}} - c\,\bar H, \qquad \bar H = \text{the mean over its real tokens of }
#   H_t = -\sum_v \pi(v \mid s_t) \log \pi(v \mid s_t).$$
#
# $\beta$ acts through the rewards, before the advantages are whitened; $c$ acts on the loss, beside a
# clipped objective on whitened (unit-scale) advantages, so the two are not on one scale. The run below
# adds $c = 2$ to the baseline's settings, from the same start with the same seeds, for as many steps as
# the break above; the weight is large on purpose, so that the effect shows within eight steps. The
# table sets it beside the baseline's first steps.

# %%
bonus_steps = lab.short_steps * 2 // 3  # as many steps as the break of "Your turn"
with_bonus = run(PPOTrainer, lab_config.replace(entropy_coef=2.0), bonus_steps, "entropy bonus c = 2 (beta = 0.2)")
bonus_table = pd.DataFrame([{"step": int(row["step"]), "entropy": row["entropy"], "entropy, c = 2": bonus["entropy"],
                             "KL": row["kl"], "KL, c = 2": bonus["kl"], "hidden score": row["hidden_score"],
                             "hidden score, c = 2": bonus["hidden_score"]}
                            for row, bonus in zip(baseline.history[:bonus_steps], with_bonus.history, strict=True)])
display(bonus_table.style.hide(axis="index").format(cell_formatter(".2f")))

# %% [markdown]
# **What this run shows:** by step 8 the bonus has raised the entropy by more than 0.2 nats over the
# baseline's, and the KL far more: above 5 nats per response, more than five times the baseline's. The
# hidden score at step 8 lies more than 1 below the baseline's. The bonus spreads probability onto tokens
# the policy, still close to the reference, finds unlikely: exactly what the KL's second term,
# $-\mathbb{E}_\pi[\log \pi_{\text{ref}}]$, charges for, and those tokens do not make fluent reviews. On top
# of the KL penalty, a bonus fights it.
#
# A bonus is worth its KL where a policy collapses and nothing holds its entropy: $\beta$ small or 0, and
# the doctor's `collapse` (entropy far below its first step's, or few distinct responses, for several
# steps). Start small (CleanRL's Atari setting is 0.01) and watch the KL beside the entropy. Check the step
# size first: the break of "Your turn" collapses because its updates are too large, and a bonus does not
# make them smaller.

# %% tags=["claim-check"]
base_8, bonus_8 = baseline.history[bonus_steps - 1], with_bonus.history[-1]
check_claims({
    "by step 8 the entropy is more than 0.2 nats above the baseline's":
        bonus_steps == 8 and bonus_8["entropy"] > base_8["entropy"] + 0.2,
    "by step 8 the KL is above 5 nats per response, more than five times the baseline's":
        bonus_8["kl"] > 5 and bonus_8["kl"] > 5 * base_8["kl"],
    "the hidden score at step 8 lies more than 1 below the baseline's": bonus_8["hidden_score"] < base_8["hidden_score"] - 1,
})

# %% [markdown]
# ### The score's scale, and `score_clip`
#
# The course hands the reward model's score to `shape_rewards` as it is: it normalises no score and
# whitens no reward; only the advantages are whitened (notebook 03). Whitening removes the overall scale of
# the returns from the update, but not the balance inside them. Multiplying every score by $c > 0$ only
# changes what $\beta$ means:
#
# $$-\beta\, k_t + [t = \text{last}]\; c\,s = c\,\Big(-\frac{\beta}{c}\, k_t + [t = \text{last}]\; s\Big),$$
#
# GAE is linear in the rewards and the values, and whitening removes the factor $c$: the policy's update from scores
# times $c$ at $\beta$ is that from the scores at $\beta / c$, once the critic has learned values $c$ times as large. The
# cell checks it on the baseline's last batch, with the library's pieces.

# %%
batch = baseline.trainer.last_batch


def whitened_advantages(scores: torch.Tensor, beta: float, values: torch.Tensor) -> torch.Tensor:
    """The update's advantages (B, R) from scores (B,), this batch's KL terms, and values (B, R)."""
    rewards, _ = rlhf_helpers.shape_rewards(scores, batch.old_logprobs, batch.ref_logprobs, batch.mask, beta)  # (B, R)
    advantages, _ = rlhf_helpers.compute_gae(rewards, values, batch.mask, lab_config.gamma, lab_config.lam)  # (B, R)
    return rlhf_helpers.masked_whiten(advantages, batch.mask)  # (B, R)


scale = 4.0  # a power of two: scaling is exact in floating point, so only whitening's epsilon differs
torch.testing.assert_close(whitened_advantages(scale * batch.scores, lab_config.kl_coef, scale * batch.values),
                           whitened_advantages(batch.scores, lab_config.kl_coef / scale, batch.values))
print(f"scores x {scale:g} at beta = {lab_config.kl_coef:g} give the advantages of the scores at "
      f"beta = {lab_config.kl_coef / scale:g}")

# %% [markdown]
# So $\beta$ means something only on the reward model's scale, which Bradley-Terry leaves free (notebook 02:
# only differences of scores count). **Normalising the scores**, subtracting their mean and dividing by
# their standard deviation over samples of the SFT policy (once before training, or with running
# statistics), fixes that scale, so that a $\beta$ carries over from one reward model to the next; some
# implementations also whiten the rewards of each batch. The course does neither: the tiny profile's
# $\beta = 0.2$ was set on this reward model's scale. A constant added to every score changes nothing the
# policy learns once the critic has learned it: with $\gamma = 1$ every response is paid its score once,
# whatever its length, so the shift moves every return alike.
#
# `score_clip` clamps each score to $\pm$`score_clip` before the shaping, as Atari's PPO bounds each
# reward (it keeps only the reward's sign). It guards against outliers. A reward model is trained on responses like the SFT
# model's; on text unlike them it can return scores far outside its usual range, and one such score does
# harm twice: it dominates its batch (whitening divides by a standard deviation it inflates, so every
# other advantage shrinks), and it marks an error of the reward model that the policy can climb towards.
# The clip caps what one response can earn. Its price: scores beyond it are all equal, so the reward no
# longer ranks those responses. `score_clipped` logs the share of a batch at the clip, and the doctor's
# `reward_saturated` fires when half a batch sits there for several steps. Set the clip from the scores
# of the SFT policy's samples, a few standard deviations out, not from a trained policy's.
#
# ### Length: the score pulls one way, the KL penalty the other
#
# `missing_eos_penalty` is added to the score of every response cut at `max_new_tokens` without an EOS.
# Notebook 03 ("Where a response ends") says why one is needed: after a cut $V = 0$ and the reward model
# scores the text as it stands, so a cut answer it likes is worth as much as a finished one. In the runs
# above, cut responses show up in the $\beta = 0$ run: its last third has a mean `eos_fraction` below 0.95,
# the penalised run's above 0.97. A negative penalty there makes finishing pay.
#
# Reward models tend to pay for length: longer answers often win in preference data, and PPO can raise
# the learned reward just by writing more. Singhal et al. (2023, "A Long Way to Go") found that much of
# the reward PPO gained on common RLHF tasks came from longer outputs. In this world the preference pairs
# never exceed 30 words, and the hidden score takes 0.15 off per word beyond 30, a cost the reward model
# never saw. The baseline's responses grow as its learned reward rises: their mean length rises by more
# than 3 tokens from the first third of the run to the last.
#
# The KL penalty pulls the other way: each token pays its own $\beta\,k_t$, so once the policy has moved,
# a longer response pays more. The doctor names each extreme: `length_runaway` (responses cut at the
# limit: the score, or an EOS that never trains, wins) and `length_collapse` (a token or two: the KL cost
# wins, or the reward model likes short answers). The break of "Your turn" showed the second. The same
# break with $\beta = 0$, from the same start:

# %%
shipped_run = my_run if shipped else run(PPOTrainer, shipped_break, lab.short_steps * 2 // 3, "the break of 'Your turn'")
no_kl_break = run(PPOTrainer, shipped_break.replace(kl_coef=0.0), lab.short_steps * 2 // 3, "the same break, beta = 0")
for name, lab_run in ((f"beta = {shipped_break.kl_coef:g}", shipped_run), ("beta = 0", no_kl_break)):
    print(f"{name:>10}: mean response length by step "
          + " ".join(format_number(row["response_length"], "5.1f") for row in lab_run.history))

# %% [markdown]
# **What this run shows:** without the KL penalty the same oversized updates no longer shorten the
# responses: at each of the last three steps they average more than 10 tokens, against fewer than 4 with
# the penalty. The collapse came from the penalty paid per token; the scores are paid once per response,
# whatever its length.

# %% tags=["claim-check"]
length_thirds = {name: third_stats(series(lab_run.history, "response_length")[1])
                 for name, lab_run in (("baseline", baseline), ("beta = 0", broken_c))}
eos_last_third = {name: third_stats(series(lab_run.history, "eos_fraction")[1])[2][0]
                  for name, lab_run in (("baseline", baseline), ("beta = 0", broken_c))}
check_claims({
    "beta = 0: the last third's mean eos_fraction below 0.95, the penalised run's above 0.97":
        eos_last_third["beta = 0"] < 0.95 and eos_last_third["baseline"] > 0.97,
    "the baseline's mean length rises by more than 3 tokens from the first third to the last":
        length_thirds["baseline"][2][0] > length_thirds["baseline"][0][0] + 3,
    "the break with beta = 0: more than 10 tokens at each of the last three steps; with beta = 0.2 fewer than 4":
        min(row["response_length"] for row in no_kl_break.history[-3:]) > 10
        and max(row["response_length"] for row in shipped_run.history[-3:]) < 4,
})

# %% [markdown]
# ## Summary: what each failure looks like
#
# | failure | first sign | the run doctor says |
# |---|---|---|
# | (a) ref log-probs as old | ratio $\ne 1$ on a step's first minibatch; clip fraction and approx-KL far above a healthy run's | `first_ratio_not_one` (error), `off_policy` (warning) |
# | (b) pad == EOS | EOS positions 0 in the loss mask: `eos_in_mask` below 1 | `eos_masked` (error) |
# | (c) $\beta = 0$ | KL grows without a bound; learned reward up, hidden score (in a real run: a held-out evaluation, samples) down | `over_optimisation` (warning) |
# | (d) one KL estimator trusted (deep dive) | negative $k_1$ per response; $k_3$ means that jump | `negative_kl` (warning) after 5 negative batch means in a row |
# | (e) untrained critic (deep dive) | explained variance $\approx 0$ when the policy starts updating | `untrained_critic` (info) |
#
# [docs/metrics.md](../docs/metrics.md) and `rlhf_helpers.ppo.metrics.GLOSSARY` describe every logged metric.

# %% [markdown]
# ## Check your understanding
#
# 1. In a run's log, the mean ratio on the first minibatch of step 10 is 1.4. What is wrong, and what do
#    that run's clip fraction and approx-KL measure?
#
# <details><summary>Answer</summary>
#
# The old log-probs are not the sampling policy's (typically the reference's, as in (a)): on the first
# minibatch the ratio must be 1. It is $\pi_\theta / \pi_{\text{ref}}$ instead, so the clip fraction and
# approx-KL measure the distance to the SFT model, not one update's size.
# </details>
#
# 2. With pad == EOS and the mask `responses != pad_id`, which token loses its gradient, and why can its
#    probability still change?
#
# <details><summary>Answer</summary>
#
# The EOS that ends each response: masked like padding, it gets no loss term, so the decision to stop
# is never reinforced or punished directly. It still moves through the weights it shares with the
# tokens that do get gradients.
# </details>
#
# 3. With $\beta = 0$ the learned reward still rises at the end of the run. Why is that not good news,
#    and what would you watch in a real run, with no hidden score?
#
# <details><summary>Answer</summary>
#
# The reward model is accurate only near the SFT model's responses; unheld, PPO finds what it
# over-rates while the true quality falls. Watch the KL, read samples, and keep a held-out evaluation.
# </details>
#
# 4. An adaptive controller starts at $\beta = 0.1$, with a target KL of 6 nats, a horizon of 10,000
#    samples and 64 responses a step; the measured KL is 12 at every step. What is $\beta$ after 100
#    steps? And if it started at $\beta = 0$?
#
# <details><summary>Answer</summary>
#
# $e_t = \operatorname{clip}((12 - 6)/6, -0.2, 0.2) = 0.2$ and $K_\beta = 0.0064$, so every step multiplies
# $\beta$ by 1.00128: $0.1 \times 1.00128^{100} \approx 0.114$. Started at 0 it stays 0 (the update
# multiplies).
# </details>
