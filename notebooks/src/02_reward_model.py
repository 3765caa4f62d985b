# Source of notebooks/02_reward_model.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 02 · The reward model: learning a score from preferences
#
# {{colab_badge}}
#
# **You will learn**
# - what preference data is (prompt, chosen, rejected), where its labels come from, and why people are
#   asked to *compare* two answers instead of *scoring* one (**measured** on simulated raters);
# - the Bradley-Terry model and its loss $-\log\sigma(r_{\text{chosen}} - r_{\text{rejected}})$, and its shape;
# - a reward model = the SFT model plus a scalar score head, read at the **last real token** (with left
#   padding), written from scratch and checked against the library;
# - training it with TRL's `RewardTrainer` and a LoRA adapter; its held-out accuracy against the best any
#   model can reach on noisy labels; its score against the hidden true score;
# - what a reward model has never seen, and what PPO will do with that (a preview of reward hacking).
#
# The course's world is synthetic on purpose: the labels come from a known *hidden* score, so we can
# compare what the reward model learned with the truth, which no real data set allows.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import math

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

import rlhf_helpers
from rlhf_helpers.runtime.data import load_preferences
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.world import Annotator, accuracy_ceiling, grammar, hidden_scores, score_breakdown
from rlhf_helpers.world.annotator import DEFAULT_TEMPERATURE, preference_probability
from rlhf_helpers.world.scorer import BIAS, SCORE_BOUND, tokenize_words

profile = get_profile()
ensure_sft_model(profile)  # gpu profile: fine-tunes the hub model once per runtime, then reuses it; tiny: ships it
torch.manual_seed(profile.seed)
torch.set_num_threads(1)  # a model this small: a second thread only adds hand-offs (4x slower per step under load)
print(f"profile {profile.name}: base {profile.sft_model_path}, reward epochs {profile.reward_epochs}, "
      f"batch {profile.reward_batch_size}, lr {profile.reward_lr}")

# %% [markdown]
# ## 1. Preference data and the annotator
#
# Each record is a prompt and two responses; a labeller read both and said which one is better. Here
# the labeller is simulated: it knows each response's hidden score $h$ (positive sentiment, specific
# details, grammatical sentences, no repeated words, the prompt's genre; `rlhf_helpers.world.scorer`) and prefers $a$ over $b$ with
# the Bradley-Terry probability
#
# $$P(a \succ b) = \sigma\!\left(\frac{h(a) - h(b)}{T_{\text{ann}}}\right), \qquad T_{\text{ann}} = 0.5$$
# (the annotator's temperature; plain $T$ is a sequence length everywhere in the course),
#
# so two responses of similar quality get a near coin-flip label, as with real people.

# %%
train_pairs = load_preferences("train")
test_pairs = load_preferences("test")
annotator = Annotator()
print(f"{len(train_pairs)} training pairs, {len(test_pairs)} held-out pairs; annotator temperature "
      f"{annotator.temperature}")
for pair in test_pairs[:3]:
    h_c, h_r = hidden_scores([pair["prompt"]] * 2, [pair["chosen"], pair["rejected"]])
    p = annotator.probability(pair["prompt"], pair["chosen"], pair["rejected"])
    print(f"\n{pair['prompt']}\n  chosen   (hidden {h_c:+.2f}):{pair['chosen']}\n"
          f"  rejected (hidden {h_r:+.2f}):{pair['rejected']}\n  P(annotator prefers chosen) = {p:.2f}")
print("\nterms of the first chosen response:", score_breakdown(test_pairs[0]["prompt"], test_pairs[0]["chosen"]))

# %% [markdown]
# ### Label noise, and the best accuracy any reward model can reach
# Because the labels are random, even a perfect model (one that knows $h$) cannot predict all of them.
# It predicts the more likely label and is right with probability $\max(p, 1 - p)$, so on a set of pairs
#
# $$\text{ceiling} = \frac{1}{N}\sum_i c_i, \qquad c_i = \max(p_i, 1 - p_i), \qquad p_i = P(\text{chosen}_i \succ \text{rejected}_i).$$
#
# The ceiling is an **expectation** over the annotator's coin flips. On one set of $N$ labelled pairs,
# even the perfect model's measured accuracy scatters around it: each pair is an independent
# Bernoulli($c_i$) trial, so its standard error is
#
# $$\mathrm{SE} = \frac{1}{N}\sqrt{\sum_i c_i (1 - c_i)}.$$

# %%
def pair_hidden_scores(pairs):
    """Hidden score of every chosen and every rejected response: two (N,) tensors."""
    prompts = [p["prompt"] for p in pairs]
    chosen = torch.tensor(hidden_scores(prompts, [p["chosen"] for p in pairs]))  # (N,)
    rejected = torch.tensor(hidden_scores(prompts, [p["rejected"] for p in pairs]))  # (N,)
    return chosen, rejected


h_chosen, h_rejected = pair_hidden_scores(test_pairs)  # (N,), (N,)
p_chosen = torch.sigmoid((h_chosen - h_rejected) / DEFAULT_TEMPERATURE)  # (N,)
ceiling = accuracy_ceiling(p_chosen.tolist())
best_odds = torch.maximum(p_chosen, 1 - p_chosen)  # (N,): c_i, the perfect model's chance per pair
ceiling_se = ((best_odds * (1 - best_odds)).sum().sqrt() / len(best_odds)).item()
flipped = (h_chosen < h_rejected).float().mean().item()
print(f"held-out pairs whose 'chosen' has the LOWER hidden score: {flipped:.1%}")
print(f"annotator ceiling on the {len(best_odds)} held-out pairs: {ceiling:.3f} +- {ceiling_se:.3f} "
      "(standard error of a perfect model's measured accuracy)")

fig = go.Figure(go.Histogram(x=p_chosen.tolist(), nbinsx=40))
fig.update_layout(title=f"P(annotator prefers the labelled 'chosen') over held-out pairs (ceiling {ceiling:.3f})",
                  xaxis_title="p", yaxis_title="pairs")
fig.show()

# %% [markdown]
# ### Exercise 1: the ceiling from the hidden scores
# Write `ceiling_from_scores(score_a, score_b, temperature)`: the annotator's probabilities
# $\sigma((h_a - h_b)/T_{\text{ann}})$ for each pair, then the mean of $\max(p, 1-p)$. Return a Python float.

# %%
# EXERCISE 1
def ceiling_from_scores(score_a: torch.Tensor, score_b: torch.Tensor, temperature: float) -> float:
    """Best achievable pairwise accuracy on Bradley-Terry labels with these hidden scores: (N,), (N,) -> float."""
    raise NotImplementedError


# %%
def check_ceiling_from_scores():
    a, b = torch.randn(200), torch.randn(200)
    # a loop: P(a preferred) = sigmoid((a - b) / T); the better guess is right with probability max(p, 1 - p)
    probabilities = [1 / (1 + math.exp(-(x - y) / 0.7)) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    expected = sum(max(p, 1 - p) for p in probabilities) / len(probabilities)
    got = ceiling_from_scores(a, b, 0.7)
    assert abs(got - expected) < 1e-5, f"expected {expected:.6f}, got {got}"
    # Known limits: identical scores give a coin flip (0.5); far-apart scores give certainty (1.0).
    assert abs(ceiling_from_scores(a, a, 0.7) - 0.5) < 1e-6
    assert abs(ceiling_from_scores(a + 100, a, 0.7) - 1.0) < 1e-6


exercise_check("Exercise 1 (ceiling_from_scores)", check_ceiling_from_scores,
               hidden=[accuracy_ceiling, preference_probability])

# %% [markdown]
# <details><summary>Solution 1</summary>
#
# ```python
# def ceiling_from_scores(score_a: torch.Tensor, score_b: torch.Tensor, temperature: float) -> float:
#     """Best achievable pairwise accuracy on Bradley-Terry labels with these hidden scores: (N,), (N,) -> float."""
#     p = torch.sigmoid((score_a - score_b) / temperature)  # (N,)
#     return torch.maximum(p, 1 - p).mean().item()
# ```
# </details>

# %% [markdown]
# ## 2. Why compare instead of score?
#
# Ask people for an absolute score (say 1 to 10) and each one uses the scale differently: one is
# generous, one is harsh, one uses only the middle. Model rater $j$'s absolute rating of a response
# with true quality $q$ as $y = s_j q + b_j + \varepsilon$ (scale $s_j$, offset $b_j$, noise
# $\varepsilon$). If two responses were rated by two different raters, ordering them by their ratings
# mixes the raters' offsets into the comparison. Asked to *compare* the two, one rater's offset cancels;
# the scale does not cancel, but a positive scale cannot flip the order (only the noise can):
#
# $$y_a - y_b = s_j (q_a - q_b) + \varepsilon_a - \varepsilon_b .$$
#
# Below, $q$ is the hidden score of the held-out responses; we count how often each protocol orders a
# pair correctly as the raters' offsets spread out.

# %%
gen = torch.Generator().manual_seed(profile.seed)
q_a, q_b = h_chosen, h_rejected  # (N,): true qualities of the two responses of each pair
noise = 0.3  # per-judgement noise, the same in both protocols
offset_spreads = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0]
acc_scores, acc_compare = [], []
for spread in offset_spreads:
    n = len(q_a)
    scale_1, scale_2 = torch.exp(0.3 * torch.randn(2, n, generator=gen))  # (N,) each: rater scales
    offset_1, offset_2 = spread * torch.randn(2, n, generator=gen)  # (N,) each: rater offsets
    eps_a, eps_b = noise * torch.randn(2, n, generator=gen)  # (N,) each
    truth = torch.sign(q_a - q_b)  # (N,)
    # absolute scores: a rated by rater 1, b by rater 2
    y_a = scale_1 * q_a + offset_1 + eps_a  # (N,)
    y_b = scale_2 * q_b + offset_2 + eps_b  # (N,)
    # comparison: rater 1 sees both; the offset cancels
    d = scale_1 * (q_a - q_b) + eps_a - eps_b  # (N,)
    keep = truth != 0
    acc_scores.append((torch.sign(y_a - y_b) == truth)[keep].float().mean().item())
    acc_compare.append((torch.sign(d) == truth)[keep].float().mean().item())

fig = go.Figure()
fig.add_scatter(x=offset_spreads, y=acc_compare, name="compare the two (one rater)", mode="lines+markers")
fig.add_scatter(x=offset_spreads, y=acc_scores, name="score each (two raters)", mode="lines+markers")
fig.update_layout(title="Pairs ordered correctly: comparing vs scoring", xaxis_title="spread of rater offsets",
                  yaxis_title="fraction of pairs ordered correctly", yaxis_range=[0.5, 1.0])
fig.show()
for spread, s, c in zip(offset_spreads, acc_scores, acc_compare, strict=True):
    print(f"offset spread {spread:4.2f}: scoring {s:.3f}   comparing {c:.3f}")
drop_scores, drop_compare = acc_scores[0] - acc_scores[-1], acc_compare[0] - acc_compare[-1]
print(f"from no offsets to a spread of {offset_spreads[-1]}: scoring {'loses' if drop_scores > 0 else 'gains'} "
      f"{abs(drop_scores):.3f}, comparing {'loses' if drop_compare > 0 else 'gains'} {abs(drop_compare):.3f}")

# %% [markdown]
# ## 3. The Bradley-Terry loss
#
# A reward model $r_\phi(x, y)$ gives one number per (prompt, response). Bradley-Terry turns two such
# numbers into a preference probability, and training maximises the likelihood of the labels
# (Ouyang et al. 2022, eq. 1):
#
# $$P_\phi(y_c \succ y_r \mid x) = \sigma\big(r_\phi(x, y_c) - r_\phi(x, y_r)\big), \qquad
# \mathcal L(\phi) = -\,\mathbb E\left[\log \sigma(\underbrace{r_\phi(x, y_c) - r_\phi(x, y_r)}_{m \text{ (margin)}})\right].$$
#
# Only differences matter: adding a constant to every score changes nothing, so the reward model's
# zero point is arbitrary. (This course's PPO uses the score as it is: the value head learns its
# offset. Some implementations also normalise the reward model's scores. Ziegler et al. 2019
# ("Fine-Tuning Language Models from Human Preferences") scale them to mean 0 and standard deviation 1
# under the initial policy's samples, as Huang et al.'s 2023 reproduction, "The N Implementation
# Details of RLHF with PPO", does; Stiennon et al. 2020, and Huang et al. 2024 ("The N+ Implementation
# Details of RLHF with PPO"), only shift them so that the reference summaries score 0 on average.
# Normalising changes the scale the KL coefficient is weighed against.)
# $-\log\sigma(m) = \log(1 + e^{-m})$ is the softplus of $-m$; its gradient with
# respect to the margin is $-(1 - \sigma(m))$: large for wrongly ordered pairs, vanishing once a pair is
# ordered with a comfortable margin.

# %%
def bradley_terry_scratch(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """mean of -log sigmoid(r_c - r_r), computed stably as softplus(-(r_c - r_r)): (N,), (N,) -> scalar."""
    margin = chosen_scores - rejected_scores  # (N,)
    return F.softplus(-margin).mean()


r_c, r_r = torch.randn(64), torch.randn(64)
torch.testing.assert_close(bradley_terry_scratch(r_c, r_r), rlhf_helpers.reward_model_loss(r_c, r_r))
torch.testing.assert_close(bradley_terry_scratch(r_c + 5.0, r_r + 5.0), bradley_terry_scratch(r_c, r_r))
print("bradley_terry_scratch matches rlhf_helpers.reward_model_loss; a shift of both scores changes nothing")

margins = torch.linspace(-6, 6, 241, requires_grad=True)  # (G,)
loss_curve = F.softplus(-margins)  # (G,): per-pair loss
(grad_curve,) = torch.autograd.grad(loss_curve.sum(), margins)  # (G,): d loss / d margin
fig = go.Figure()
fig.add_scatter(x=margins.tolist(), y=loss_curve.tolist(), name="-log sigmoid(m)")
fig.add_scatter(x=margins.tolist(), y=grad_curve.tolist(), name="d loss / d m = -(1 - sigmoid(m))")
fig.add_scatter(x=margins.tolist(), y=torch.relu(-margins).tolist(), name="max(0, -m) (its limit)",
                line_dash="dot")
fig.update_layout(title="Bradley-Terry loss of one pair against the margin r_c - r_r", xaxis_title="margin m")
fig.show()

# %% [markdown]
# ### Exercise 2: the Bradley-Terry loss
# Write `bt_loss(chosen_scores, rejected_scores)`, the mean of $-\log\sigma(r_c - r_r)$. Make it stable:
# a margin of $-100$ must give a loss of about 100, not `inf`.

# %%
# EXERCISE 2
def bt_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """Mean Bradley-Terry loss -log sigmoid(r_c - r_r): (N,), (N,) -> scalar."""
    raise NotImplementedError


# %%
def check_bt_loss():
    c, r = torch.randn(32, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
    expected = torch.stack([-torch.log(1 / (1 + torch.exp(-(a - b)))) for a, b in zip(c, r, strict=True)]).mean()
    torch.testing.assert_close(bt_loss(c, r), expected)
    far = bt_loss(torch.tensor([0.0]), torch.tensor([100.0]))
    assert torch.isfinite(far) and abs(far.item() - 100.0) < 1e-3, f"margin -100 should cost ~100, got {far}"


exercise_check("Exercise 2 (bt_loss)", check_bt_loss, hidden=[rlhf_helpers.reward_model_loss, bradley_terry_scratch])

# %% [markdown]
# <details><summary>Solution 2</summary>
#
# ```python
# def bt_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
#     """Mean Bradley-Terry loss -log sigmoid(r_c - r_r): (N,), (N,) -> scalar."""
#     return -F.logsigmoid(chosen_scores - rejected_scores).mean()  # log-sigmoid is stable; log(sigmoid) is not
# ```
# </details>

# %% [markdown]
# ## 4. Train the reward model: TRL's RewardTrainer with a LoRA adapter
#
# ### LoRA in one equation
#
# Fine-tuning every weight of the model for every role (reward model here; policy and critic in
# notebook 05) would need a full copy of the model per role. **LoRA** (Hu et al. 2021) freezes each
# weight matrix $W_0 \in \mathbb{R}^{d_{\text{out}} \times d_{\text{in}}}$ and learns a low-rank correction
# next to it:
#
# $$f(x) = W_0 x + \frac{\alpha}{r}\, B A x, \qquad A \in \mathbb{R}^{r \times d_{\text{in}}},\ B \in \mathbb{R}^{d_{\text{out}} \times r},\ r \ll \min(d_{\text{in}}, d_{\text{out}}).$$
#
# $A$ starts random and $B$ starts at **zero**, so a fresh adapter changes nothing: the adapted model
# starts as the model it adapts. Only $A$ and $B$ are trained: $r(d_{\text{in}} + d_{\text{out}})$ numbers
# instead of $d_{\text{in}} d_{\text{out}}$. Switching the adapter off gives $W_0$ back exactly, which
# notebook 05 uses to get the frozen reference model for free. The cell checks the equation against
# peft on one projection of the profile's model.

# %%
from peft import get_peft_model

from rlhf_helpers.ppo.adapters import lora_config, uses_conv1d
from rlhf_helpers.runtime.models import load_causal_lm

# float32 for this check (the gpu profile computes in bf16 or fp16): it compares peft's layer with the
# equation, so both sides must round alike; in half precision they would differ by rounding alone
lora_demo = load_causal_lm(profile).float()
conv1d = uses_conv1d(lora_demo)  # GPT-2 (tiny profile) stores its projections as Conv1D: (d_in, d_out)
mlp_in = "c_fc" if conv1d else "up_proj"  # the MLP's first projection: GPT-2's c_fc, Llama's up_proj
lora_demo = get_peft_model(lora_demo, lora_config(profile.lora.r, profile.lora.alpha, [mlp_in],
                                                   fan_in_fan_out=conv1d))
layer = next(m for m in lora_demo.modules() if hasattr(m, "lora_A") and "default" in m.lora_A)
A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight  # (r, d_in), (d_out, r)
layout = "(d_in, d_out) by GPT-2's Conv1D" if conv1d else "(d_out, d_in) by nn.Linear"
print(f"one MLP projection ({mlp_in}): W0 {tuple(layer.base_layer.weight.shape)} (stored {layout}), "
      f"A {tuple(A.shape)}, B {tuple(B.shape)}; B is all zero at the start: {bool((B == 0).all())}")
with torch.no_grad():
    B.copy_(torch.randn(B.shape, generator=torch.Generator().manual_seed(0)))  # pretend training moved B
    x = torch.randn(3, A.shape[1], generator=torch.Generator().manual_seed(1)).to(A.device)  # (N, d_in)
    W0 = layer.base_layer.weight.T if conv1d else layer.base_layer.weight  # (d_out, d_in)
    b0 = layer.base_layer.bias if layer.base_layer.bias is not None else 0.0  # (d_out,); Llama has none
    f_scratch = x @ W0.T + b0 + (profile.lora.alpha / profile.lora.r) * x @ A.T @ B.T  # (N, d_out)
    # float32 sums of d_in products in another order differ by ~1e-6 relative; a wrong formula by O(1)
    torch.testing.assert_close(layer(x), f_scratch, rtol=1e-5, atol=1e-5)
d_in, d_out = A.shape[1], B.shape[0]
print(f"f(x) = W0 x + (alpha / r) B A x matches peft's layer; trained numbers per projection: "
      f"{profile.lora.r * (d_in + d_out):,} instead of {d_in * d_out:,}")
del lora_demo

# %% [markdown]
# ### Training
#
# The reward model is the SFT model with its language-model head replaced by a linear **score head**
# ($H \to 1$), and a LoRA adapter on the attention and MLP projections: only the adapter and the head
# are trained. In PPO (notebook 05) this adapter sits next to the policy and value adapters on the
# *same* base model.
#
# These are the TRL and peft calls, the ones most tutorials use: a
# `LoraConfig` with `task_type="SEQ_CLS"` (and the score head in `modules_to_save`, so it is trained
# and saved with the adapter), a `RewardConfig`, and a `RewardTrainer` on a data set of
# `{"prompt", "chosen", "rejected"}` records. The cell runs them for a few steps on 256 pairs, so you
# see them work. What sets up the machine rather than the learning (CPU or GPU, mixed precision,
# gradient checkpointing off, no trackers, no checkpoints) comes from one course helper,
# `reward_config_kwargs(profile)`; every argument that shapes the learning is written out.

# %%
import tempfile

from datasets import Dataset
from peft import LoraConfig
from trl import RewardConfig, RewardTrainer

from rlhf_helpers.runtime.models import load_sequence_classifier, load_tokenizer
from rlhf_helpers.runtime.precision import MASTER_DTYPE_NAME
from rlhf_helpers.stages.reward_training import reward_config_kwargs

demo_tokenizer = load_tokenizer(profile)
# the SFT model + a fresh (H -> 1) score head, in float32: the trained weights stay float32 masters
demo_base = load_sequence_classifier(profile.replace(dtype=MASTER_DTYPE_NAME), num_labels=1)
demo_lora = LoraConfig(
    r=profile.lora.r, lora_alpha=profile.lora.alpha, lora_dropout=0.0, bias="none",
    target_modules=list(profile.lora.target_modules), task_type="SEQ_CLS",
    modules_to_save=["score"],  # train and save the score head with the adapter
    fan_in_fan_out=uses_conv1d(demo_base),  # GPT-2 stores its projections as Conv1D (in, out)
)
with tempfile.TemporaryDirectory() as scratch:
    demo_args = RewardConfig(
        output_dir=scratch, per_device_train_batch_size=32, max_steps=8, learning_rate=profile.reward_lr,
        max_length=profile.max_length, seed=profile.seed, logging_steps=4, disable_tqdm=True,
        **reward_config_kwargs(profile),  # device, autocast dtype, checkpointing off, no trackers or saves
    )
    demo_trainer = RewardTrainer(model=demo_base, args=demo_args, processing_class=demo_tokenizer,
                                 peft_config=demo_lora, train_dataset=Dataset.from_list(train_pairs[:256]))
    demo_trainer.train()
losses = [round(entry["loss"], 3) for entry in demo_trainer.state.log_history if "loss" in entry]
print(f"Bradley-Terry loss after 4 and 8 steps: {losses} (log 2 = {math.log(2):.3f} is a coin flip)")
del demo_trainer, demo_base

# %% [markdown]
# `rlhf_helpers.stages.reward` makes the same calls for the real run (its loss is exactly the
# Bradley-Terry loss above; TRL appends EOS to every response, so the score is read on the EOS, as in
# PPO's rollouts). `ensure_reward_model(profile)` trains once and caches the adapter under
# `runs/reward-<profile>/`, where notebooks 05 and 06 find it. On the 2-core CPU of the tiny profile the
# first training takes a while (the cell prints how long); afterwards this cell only loads.

# %%
from peft import PeftModel

from rlhf_helpers.runtime.models import load_sequence_classifier, load_tokenizer
from rlhf_helpers.stages.reward import ensure_reward_model, is_cached_reward_model, reward_metrics
from rlhf_helpers.stages.reward_training import RewardTrainingConfig, score_pairs

reward_config = RewardTrainingConfig.from_profile(profile)
print(reward_config)
was_cached = is_cached_reward_model(profile, reward_config)
print("loading the cached reward adapter" if was_cached else "training the reward adapter (TRL RewardTrainer)...")
reward_dir = ensure_reward_model(profile, reward_config)
stored = reward_metrics(reward_dir)
print(f"reward adapter in {reward_dir}; trained on {stored['train_pairs']:.0f} distinct pairs "
      f"({stored.get('pairs_seen', stored['train_pairs']):.0f} pair passes) in {stored['train_seconds']:.0f} s")

tokenizer = load_tokenizer(profile)
reward_model = PeftModel.from_pretrained(load_sequence_classifier(profile, num_labels=1), str(reward_dir)).eval()
trainable = sum(p.numel() for n, p in reward_model.named_parameters() if "lora_" in n or "score" in n)
total = sum(p.numel() for p in reward_model.parameters())
print(f"adapter + score head: {trainable:,} of {total:,} parameters")

# %% [markdown]
# ## 5. The score head reads the last real token
#
# A causal model's hidden state at position $t$ has seen tokens $0..t$ only, so the state that has read
# the whole (prompt, response) is the one at the **last real token** (the EOS here):
#
# $$r_\phi(x, y) = w^\top \mathbf{z}_{\ell}, \qquad \ell = \text{index of the last real token},$$
#
# with $\mathbf{z}_\ell$ the backbone's hidden state there ($h$ stays the hidden score).
#
# Batches are padded to one length. With **left** padding (what the course uses, because batched
# generation needs every prompt to end at the same column) the last real token of every row is the last
# column, $\ell = L - 1$; with right padding it is $\ell = \sum_t m_t - 1$. Reading a padding position
# instead gives a score of the pad token, a silent bug. GPT-2 also needs `position_ids` counted over the
# real tokens (it does not derive them from a left-padded mask). Below, from scratch: tokenise a
# left-padded batch, run the backbone, read the last column, apply the head; then compare with
# `score_pairs`, which goes through Hugging Face's sequence-classification forward.

# %%
# float32 from here on (a no-op in the tiny profile): the scratch path and score_pairs run different
# kernels on differently padded batches, which in bf16/fp16 (gpu profile) would round apart by ~1e-2
# and hide what the checks compare; float32 keeps that rounding near 1e-6, so 1e-4 is a tight check
reward_model = reward_model.float()
lm_with_head = reward_model.base_model.model  # GPT2ForSequenceClassification (tiny; Llama... on gpu) with LoRA
backbone = getattr(lm_with_head, lm_with_head.base_model_prefix)  # the transformer without a head
score_head = lm_with_head.score  # Linear(H, 1) (peft keeps its trained copy)
device = next(reward_model.parameters()).device

sample = test_pairs[:6]
prompts = [p["prompt"] for p in sample]
responses = [p["chosen"] for p in sample]
texts = [x + y + tokenizer.eos_token for x, y in zip(prompts, responses, strict=True)]
enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left").to(device)
input_ids, attention_mask = enc["input_ids"], enc["attention_mask"]  # (B, L), (B, L)
position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, L): 0 on the first real token

with torch.no_grad():
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids).last_hidden_state  # (B, L, H)
    scratch_scores = score_head(hidden[:, -1, :]).squeeze(-1)  # (B,): left padding -> last column
library_scores = score_pairs(reward_model, tokenizer, prompts, responses).to(device)  # (B,)
torch.testing.assert_close(scratch_scores, library_scores, rtol=1e-4, atol=1e-4)
print("last-column reading matches rlhf_helpers.stages.reward_training.score_pairs:",
      [round(s, 3) for s in scratch_scores.tolist()])

# What goes wrong: the same batch right-padded, read at the last column (a pad token for the short rows).
enc_r = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right").to(device)
with torch.no_grad():
    pos_r = (enc_r["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
    hidden_r = backbone(input_ids=enc_r["input_ids"], attention_mask=enc_r["attention_mask"],
                        position_ids=pos_r).last_hidden_state  # (B, L, H)
    wrong = score_head(hidden_r[:, -1, :]).squeeze(-1)  # (B,): reads padding on shorter rows
    last = enc_r["attention_mask"].sum(dim=1) - 1  # (B,): right padding -> count - 1
    right = score_head(hidden_r[torch.arange(len(texts)), last]).squeeze(-1)  # (B,)
torch.testing.assert_close(right, library_scores, rtol=1e-4, atol=1e-4)
for n_pad, w, r in zip((enc_r["attention_mask"] == 0).sum(1).tolist(), wrong.tolist(), right.tolist(), strict=True):
    print(f"right-padded row with {n_pad} pads: last column {w:+.3f}   last real token {r:+.3f}")

# %% [markdown]
# ### Exercise 3: the last real token, whatever the padding
# Write `last_real_index(attention_mask)`: for each row of a (B, L) 0/1 mask, the index of its last 1
# (shape (B,), dtype long). It must work for left padding, right padding, and no padding.

# %%
# EXERCISE 3
def last_real_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of a (B, L) 0/1 mask, any padding side -> (B,) long."""
    raise NotImplementedError


# %%
def check_last_real_index():
    gen_check = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 10, (32,), generator=gen_check)  # (B,)
    cols = torch.arange(10)[None, :]  # (1, L)
    right_padded = (cols < lengths[:, None]).long()  # (B, L)
    left_padded = (cols >= 10 - lengths[:, None]).long()  # (B, L)
    for mask in (right_padded, left_padded, torch.ones(4, 7, dtype=torch.long)):
        expected = torch.tensor([max(t for t in range(mask.shape[1]) if row[t] == 1) for row in mask.tolist()])
        got = last_real_index(mask)
        assert got.dtype == torch.long, f"expected dtype long, got {got.dtype}"
        assert got.tolist() == expected.tolist(), f"expected {expected.tolist()}, got {got.tolist()}"


exercise_check("Exercise 3 (last_real_index)", check_last_real_index, hidden=[rlhf_helpers.last_token_index])

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def last_real_index(attention_mask: torch.Tensor) -> torch.Tensor:
#     """Index of the last 1 in each row of a (B, L) 0/1 mask, any padding side -> (B,) long."""
#     L = attention_mask.shape[1]
#     positions = torch.arange(L, device=attention_mask.device)  # (L,)
#     return (positions * attention_mask.long()).max(dim=1).values  # (B,): largest position holding a 1
# ```
# </details>

# %% [markdown]
# ## 6. How good is it? Held-out accuracy against the ceiling, and learned against hidden
#
# Pairwise accuracy = the share of held-out pairs where the learned score ranks the labelled "chosen"
# higher. In expectation over the labels no model exceeds the annotator ceiling of section 1, but a
# measured accuracy is one draw of these labels: it scatters around its own expectation by about the
# standard error of section 1. The cell says, from the numbers, whether the reward model's gap to the
# ceiling is larger than that noise, and compares it pair by pair with the perfect model (ranking by
# $h$) on the same labels, which removes the label draw from the comparison. Since the labels follow
# $\sigma((h_a - h_b)/T_{\text{ann}})$, a reward model that fits them perfectly would be $r = h / T_{\text{ann}} + \text{const}$:
# a line of slope $1/T_{\text{ann}} = 2$. A real one falls short of it: the least-squares slope of $r$ on $h$ is
# $\operatorname{corr}(r, h)\cdot\operatorname{sd}(r)/\operatorname{sd}(h)$, and every part of $h$ the model cannot
# see (a few thousand noisy labels, two epochs, a LoRA adapter) lowers the correlation and shrinks
# the spread of $r$, so the slope is expected below 2. The cell prints it.

# %%
test_prompts = [p["prompt"] for p in test_pairs]
r_chosen = score_pairs(reward_model, tokenizer, test_prompts, [p["chosen"] for p in test_pairs])  # (N,)
r_rejected = score_pairs(reward_model, tokenizer, test_prompts, [p["rejected"] for p in test_pairs])  # (N,)
accuracy = rlhf_helpers.pairwise_accuracy(r_chosen, r_rejected)
held_out_loss = rlhf_helpers.reward_model_loss(r_chosen, r_rejected).item()
learned = torch.cat([r_chosen, r_rejected])  # (2N,)
hidden = torch.cat([h_chosen, h_rejected]).float()  # (2N,)
correlation = torch.corrcoef(torch.stack([learned, hidden]))[0, 1].item()
slope = ((learned - learned.mean()) * (hidden - hidden.mean())).sum() / ((hidden - hidden.mean()) ** 2).sum()
model_right = (r_chosen > r_rejected).float() + 0.5 * (r_chosen == r_rejected).float()  # (N,)
oracle_right = (h_chosen > h_rejected).float() + 0.5 * (h_chosen == h_rejected).float()  # (N,)
oracle_accuracy = oracle_right.mean().item()
z_ceiling = (accuracy - ceiling) / ceiling_se
if abs(z_ceiling) < 2:
    verdict = "within label noise of the ceiling"
elif z_ceiling < 0:
    verdict = "below the ceiling by more than label noise"
else:
    verdict = "above the ceiling by more than label noise (a lucky draw of labels)"
paired = model_right - oracle_right  # (N,): per pair, reward model minus perfect model
paired_se = (paired.std() / len(paired) ** 0.5).item()
print(f"held-out pairwise accuracy {accuracy:.3f}; annotator ceiling {ceiling:.3f} +- {ceiling_se:.3f}: "
      f"{z_ceiling:+.1f} standard errors, {verdict}")
print(f"on the same {len(paired)} labels, ranking by the hidden score itself gets {oracle_accuracy:.3f} "
      f"({(oracle_accuracy - ceiling) / ceiling_se:+.1f} SE from the ceiling: the luck of this label draw); "
      f"the reward model differs from it by {paired.mean().item():+.3f} +- {paired_se:.3f} (paired SE)")
print(f"held-out Bradley-Terry loss {held_out_loss:.3f}   corr(learned, hidden) {correlation:.3f}   "
      f"slope {slope:.2f}, {'below' if slope < 1 / DEFAULT_TEMPERATURE else 'not below'} 1/T_ann = "
      f"{1 / DEFAULT_TEMPERATURE:.1f}: {slope * DEFAULT_TEMPERATURE:.0%} of a perfect fit")

fig = make_subplots(rows=1, cols=2, column_widths=[0.35, 0.65],
                    subplot_titles=("pairwise accuracy (held out)", f"learned vs hidden score (Pearson {correlation:.2f})"))
fig.add_bar(x=["reward model", "annotator ceiling", "chance"], y=[accuracy, ceiling, 0.5], row=1, col=1,
            error_y=dict(array=[0.0, 2 * ceiling_se, 0.0]),  # +- 2 SE of a 500-label accuracy
            marker_color=["royalblue", "gray", "lightgray"], showlegend=False)
fig.add_scatter(x=hidden.tolist(), y=learned.tolist(), mode="markers", marker=dict(size=4, opacity=0.5),
                name="held-out responses", row=1, col=2)
fig.update_yaxes(range=[0.4, 1.0], row=1, col=1)
fig.update_xaxes(title_text="hidden score h", row=1, col=2)
fig.update_yaxes(title_text="learned reward r", row=1, col=2)
fig.update_layout(title="The trained reward model on the held-out pairs")
fig.show()

# %% [markdown]
# ## 7. What a reward model has never seen: a preview of reward hacking
#
# The reward model learned from reviews that never repeat a content word and never run past 30 words
# (the data's generator writes them that way). It has learned "praise and detail are good"; nothing in
# its data tells it that saying the same sentence three times is bad. The hidden score does know:
# each repeated content word costs a fixed amount, and the sum of all terms is then clipped to
# $[-B, B]$ (`SCORE_BOUND` in `rlhf_helpers.world.scorer`), so once it hits the floor more repetition
# costs nothing more. The cell reads the cost per word and $B$ from the scorer and prints, for each $k$,
# the repetition term and the sum before the clip. Score a good review sentence repeated $k$ times with both:

# %%
prompt = test_pairs[0]["prompt"]
repeats = [1, 2, 3, 4]
# Candidates: the first sentence of each held-out "chosen" response, short enough that the prompt, four
# copies and the EOS fit into the model's context (profile.max_length tokens).
room = (profile.max_length - len(tokenizer(prompt)["input_ids"]) - 1) // max(repeats)
candidates = {" " + p["chosen"].strip().split(".")[0].strip() + "." for p in test_pairs}
candidates = sorted(c for c in candidates if len(tokenizer(c)["input_ids"]) <= room)
sentence = max(candidates, key=lambda c: hidden_scores([prompt], [c])[0])  # the best-scoring short one
gaming = [sentence * k for k in repeats]
gaming_learned = score_pairs(reward_model, tokenizer, [prompt] * len(gaming), gaming)  # (K,)
gaming_hidden = hidden_scores([prompt] * len(gaming), gaming)
typical = learned.quantile(0.9).item()


def repeated_content_words(text: str) -> int:
    """Content words (outside grammar.FUNCTION_WORDS) that repeat an earlier one, as the scorer counts them."""
    content = [w for w in tokenize_words(text) if w.isalpha() and w not in grammar.FUNCTION_WORDS]
    return len(content) - len(set(content))


terms = [score_breakdown(prompt, g) for g in gaming]
n_repeated = [repeated_content_words(g) for g in gaming]
unclipped = [t.sentiment + t.specificity + t.fluency + t.repetition + t.length + t.genre + BIAS for t in terms]
for t, raw in zip(terms, unclipped, strict=True):  # the scorer's rule: total = clip(sum of terms + BIAS, -B, B)
    assert abs(max(-SCORE_BOUND, min(SCORE_BOUND, raw)) - t.total) < 1e-9, (raw, t.total)
cost = {t.repetition / n for t, n in zip(terms, n_repeated, strict=True) if n > 0}  # one value: a fixed cost per word
assert len({round(c, 9) for c in cost}) == 1, cost
print(f"hidden score: {cost.pop():+.1f} per repeated content word, total clipped to "
      f"[{-SCORE_BOUND:+.0f}, {SCORE_BOUND:+.0f}]")
print(f"prompt: {prompt}\nsentence:{sentence}")
for k, r, h, n, t, raw in zip(repeats, gaming_learned.tolist(), gaming_hidden, n_repeated, terms, unclipped,
                                  strict=True):
    clip_note = f", clipped to {h:+.0f}" if raw < -SCORE_BOUND else ""
    print(f"  repeated {k}x: learned reward {r:+.2f}   hidden score {h:+.2f}   ({n} repeated content words, "
          f"repetition term {t.repetition + 0.0:+.2f}, sum before the clip {raw:+.2f}{clip_note})")
print(f"(90th percentile of the learned reward on real held-out responses: {typical:+.2f})")
learned_1x, hidden_1x = gaming_learned[0].item(), gaming_hidden[0]
more_learned = [k for k, r in zip(repeats[1:], gaming_learned[1:].tolist(), strict=True) if r > learned_1x]
less_hidden = [k for k, h in zip(repeats[1:], gaming_hidden[1:], strict=True) if h < hidden_1x]
print(f"against the sentence said once, the learned reward is higher at k = {more_learned or 'none'}; "
      f"the hidden score is lower at k = {less_hidden or 'none'}")

fig = go.Figure()
fig.add_scatter(x=repeats, y=gaming_learned.tolist(), name="learned reward", mode="lines+markers")
fig.add_scatter(x=repeats, y=gaming_hidden, name="hidden score", mode="lines+markers")
fig.update_layout(title="The same sentence repeated: learned reward (the proxy) and hidden score (the truth)",
                  xaxis_title="times repeated", yaxis_title="score")
fig.show()

# %% [markdown]
# PPO maximises the *learned* reward. Wherever the learned and the hidden scores disagree (the last
# printed line says at which $k$ they do here), an optimiser strong enough will find the disagreement:
# the learned reward climbs while the true quality falls (**reward over-optimisation**, Gao et al.
# 2022). The per-token KL penalty towards the
# SFT model (notebook 03) is the leash that keeps the policy where the reward model was trained;
# notebook 06 removes it and measures what happens.
#
# ## Summary
# - Preference pairs are labelled by comparing two responses; a comparison cancels the rater's offset,
#   and the rater's scale cannot flip its order, which is why comparisons are easier to collect
#   consistently than scores.
# - Bradley-Terry: $P(y_c \succ y_r) = \sigma(r_c - r_r)$, loss $-\log\sigma(r_c - r_r)$; only
#   differences of scores matter.
# - The reward model is the SFT model plus a LoRA adapter and a scalar head read at the last real token;
#   with left padding that is the last column.
# - On noisy labels the held-out accuracy is bounded by the annotator ceiling; the learned score tracks
#   the hidden one on data like its training data, and not beyond it.
#
# Next: notebook 03 turns one reward score per response into a reward per token.
