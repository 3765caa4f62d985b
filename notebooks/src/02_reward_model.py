# Source of notebooks/02_reward_model.ipynb; rebuild with `python tools/build_notebooks.py`.

# %% [markdown]
# # 02 · The reward model: learning a score from preferences
#
# {{colab_badge}}
#
# **Prerequisites:** notebook 01 (a language model as a policy; the stages pretraining, SFT, RLHF); PyTorch tensors, autograd and cross-entropy; the sigmoid and log-probabilities.
#
# **Time:** about 150 min for the core, in two sittings (the second from *4. Train the reward model*); the deep dives add about 110 min.
#
# **You will learn** where every model starts (SFT); preference data and the Bradley-Terry loss; the best
# accuracy noisy labels allow; and a reward model as the SFT model plus a LoRA adapter and a score head
# read at the **last real token**. A known *hidden* score makes the labels, so we can compare with the truth.

# %% tags=["colab-setup"]

# %%
from rlhf_helpers.course.notebook import exercise_check, show_environment

env_info = show_environment()

# %%
import json
import math
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from IPython.display import display
from plotly.subplots import make_subplots
from transformers import AutoConfig, AutoModelForCausalLM

import rlhf_helpers
from rlhf_helpers.core.printed import format_number, wrap_printed
from rlhf_helpers.course.claims import check_claims
from rlhf_helpers.ppo.model.sampling import sample
from rlhf_helpers.runtime.artifacts import shown_path
from rlhf_helpers.runtime.data import load_preferences, load_prompts, load_sft_corpus
from rlhf_helpers.runtime.models import load_causal_lm, load_sequence_classifier, load_tokenizer
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.stages.sft import ensure_sft_model
from rlhf_helpers.world import Annotator, accuracy_ceiling, grammar, hidden_scores, score_breakdown
from rlhf_helpers.world.annotator import DEFAULT_TEMPERATURE, preference_probability
from rlhf_helpers.world.scorer import BIAS, MAX_WORDS, SCORE_BOUND, tokenize_words
from rlhf_helpers.world.tiny_model import TinyModelConfig, collate, encode_examples

profile = get_profile()
ensure_sft_model(profile)  # gpu profile: fine-tunes the hub model once per runtime, then reuses it; tiny: ships it
torch.manual_seed(profile.seed)
torch.set_num_threads(1)  # a model this small: a second thread only adds hand-offs (4x slower per step under load)
tokenizer = load_tokenizer(profile)
print(f"profile {profile.name}: base {shown_path(profile.sft_model_path)}, reward epochs {profile.reward_epochs}, "
      f"batch {profile.reward_batch_size}, lr {profile.reward_lr}")

# %% [markdown]
# ## 1. Where the models start: supervised fine-tuning (SFT)
#
# Every model in this course starts as the **SFT model**, a language model fine-tuned on (prompt, good
# response) pairs, here movie reviews: the reward model here, and the policy and reference of notebook 05.
# SFT is next-token cross-entropy on the response and its EOS (so the model learns to stop), not the prompt:
#
# $$\mathcal L_{\text{SFT}}(\theta) = -\frac{\sum_i \sum_{t \ge 1} m_{i,t} \log \pi_\theta(x_{i,t} \mid x_{i,<t})}{\sum_i \sum_{t \ge 1} m_{i,t}},
# \qquad m_{i,t} = \begin{cases} 1 & x_{i,t} \text{ is a response token or the EOS,} \\ 0 & x_{i,t} \text{ is a prompt token or padding.} \end{cases}$$
#
# `ensure_sft_model(profile)` (above) runs TRL's `SFTTrainer` on SmolLM2-135M (gpu profile); the tiny
# profile's model is shipped: 600 steps on every token from random weights, then 400 masked steps, in
# batches of 64.

# %% tags=["claim-check"]
tiny_log_path = Path(profile.sft_model_path) / "training_log.json"
tiny_log = json.loads(tiny_log_path.read_text())["config"] if tiny_log_path.is_file() else {}
check_claims({
    "the shipped model: 600 steps on every token, then 400 masked steps, batches of 64":
        (tiny_log.get("pretrain_steps"), tiny_log.get("sft_steps"), tiny_log.get("batch_size")) == (600, 400, 64),
})

# %% [markdown]
# ### Deep dive: the SFT loss written out, and 40 steps of it from random weights
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# The batch and the loss above, written out and checked against the library's batches; then 40 steps of
# it on fresh random weights of the same architecture.

# %%
sft_records = load_sft_corpus()  # [{"prompt": ..., "completion": ...}, ...]


def sft_batch(records: list[dict], max_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and loss mask m of "prompt completion<eos>": three (B, L) tensors."""
    rows, counted = [], []
    for record in records:
        prompt_ids = tokenizer(record["prompt"])["input_ids"]
        response_ids = tokenizer(record["completion"])["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt_ids + response_ids)[:max_length])
        counted.append(([0] * len(prompt_ids) + [1] * len(response_ids))[:max_length])  # m: response + EOS
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)  # (B, L)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)  # (B, L)
    loss_mask = torch.zeros(len(rows), width)  # (B, L)
    for i, (ids, m) in enumerate(zip(rows, counted, strict=True)):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        loss_mask[i, : len(ids)] = torch.tensor(m, dtype=torch.float)
    return input_ids.to(profile.device), attention_mask.to(profile.device), loss_mask.to(profile.device)


def sft_loss(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             loss_mask: torch.Tensor) -> torch.Tensor:
    """The masked next-token loss above: three (B, L) tensors -> scalar."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, L, V)
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, L-1, V): position t predicts t+1
    token_logprobs = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, L-1): log pi(x_t | x_<t)
    m = loss_mask[:, 1:]  # (B, L-1): m of each predicted token
    return -(token_logprobs * m).sum() / m.sum()

# %% [markdown]
# The check: on 64 records, `sft_loss` on the course's SFT model equals the library's language-model loss
# `rlhf_helpers.lm_loss` (shifted logits, labels $-100$ not counted) on the batches the library fine-tuned
# the tiny model with (`world.tiny_model.collate` with `response_only=True`: label $-100$ on the prompt
# and the padding). The two build the mask differently, so they agree only if both mask the same tokens.

# %%
sft_model = load_causal_lm(profile)  # the course's SFT model
eval_records = sft_records[:64]
library_batch = collate(encode_examples(tokenizer, eval_records, profile.max_length), tokenizer.pad_token_id,
                        response_only=True)
with torch.no_grad():
    ours = sft_loss(sft_model, *sft_batch(eval_records, profile.max_length))
    library_logits = sft_model(input_ids=library_batch["input_ids"].to(profile.device),
                               attention_mask=library_batch["attention_mask"].to(profile.device)).logits  # (B, L, V)
    theirs = rlhf_helpers.lm_loss(library_logits, library_batch["labels"].to(profile.device))
torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
print(f"sft_loss matches the library's labelled batches: {ours.item():.3f} nats per response token")
del sft_model  # the reward model below loads its own copy

# %% [markdown]
# The loss above, minimised for 40 steps on fresh random weights of the same architecture (no
# pretraining at all, so the fall is easy to see), a few seconds in the tiny profile. Each model is
# judged by its loss on the 64 check records and by 32 samples, drawn as PPO draws them.

# %%
sft_steps, sft_batch_size = 40, 32
sample_prompts = load_prompts("test")[:32]  # held-out prompts to sample from
prompt_batch = tokenizer(sample_prompts, return_tensors="pt", padding=True, padding_side="left").to(profile.device)


def sft_report(model: torch.nn.Module, name: str) -> dict:
    """The loss on the 64 check records, and one sample per prompt as PPO samples (temperature 1, no top-k)."""
    with torch.no_grad():
        loss = sft_loss(model, *sft_batch(eval_records, profile.max_length)).item()
    torch.manual_seed(profile.seed)  # the same draws for every model
    sequences = sample(model, prompt_batch["input_ids"], prompt_batch["attention_mask"], 40,
                       tokenizer.eos_token_id, tokenizer.pad_token_id).sequences  # (B, P + R)
    responses = sequences[:, prompt_batch["input_ids"].shape[1]:]  # (B, R): pad after each row's EOS
    ended = (responses == tokenizer.eos_token_id).any(dim=1)  # (B,)
    first = sample_prompts[0] + " " + tokenizer.decode(responses[0], skip_special_tokens=True).strip()
    return {"model": name, "loss": loss, "ended": int(ended.sum()), "sample": first}


torch.manual_seed(profile.seed)  # the fresh weights
fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(profile.sft_model_path)).to(profile.device)
before = sft_report(fresh, "fresh random weights (before)")
# the tiny model's peak rate (3e-3): from random weights, a fine-tuning rate would barely move the loss
optimizer = torch.optim.AdamW(fresh.parameters(), lr=TinyModelConfig().learning_rate, weight_decay=0.01)
order = torch.Generator().manual_seed(profile.seed)  # which records each step sees
sft_losses = []
for _ in range(sft_steps):
    rows = torch.randint(len(sft_records), (sft_batch_size,), generator=order).tolist()
    loss = sft_loss(fresh, *sft_batch([sft_records[i] for i in rows], profile.max_length))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(fresh.parameters(), 1.0)  # as the library does: one odd batch cannot jump far
    optimizer.step()
    sft_losses.append(loss.item())
after = sft_report(fresh, f"after {sft_steps} steps of SFT")
course_sft = sft_report(load_causal_lm(profile), "the course's SFT model (ensure_sft_model)")
uniform_loss = math.log(fresh.config.vocab_size)  # a uniform guess over the vocabulary
del optimizer, fresh

# %%
fig = go.Figure(go.Scatter(x=list(range(1, sft_steps + 1)), y=sft_losses, mode="lines+markers",
                           name="masked loss of each step's batch"))
fig.add_hline(y=uniform_loss, line_dash="dot", annotation_text="log V: a uniform guess")
fig.add_hline(y=course_sft["loss"], line_dash="dash", annotation_text="the course's SFT model (check records)")
fig.update_layout(title="SFT from random weights: the masked next-token loss", xaxis_title="step",
                  yaxis_title="loss (nats per response token)")
fig.show()
sft_table = pd.DataFrame([before, after, course_sft]).rename(columns={
    "loss": "loss on the 64 check records", "ended": f"samples ending with EOS (of {len(sample_prompts)})",
    "sample": "first sample (prompt + response)"})
display(sft_table.style.hide(axis="index").format(precision=2))

# %% [markdown]
# The fresh model's loss starts at $\log V \approx 6.0$ ($V = 403$ tokens in the tiny profile): random
# weights spread the probability evenly, and its samples are strings of unrelated words that rarely stop
# (at most a quarter end with EOS). In 40 steps of 32 records the loss falls below 3 nats per token,
# and the samples turn into review-like sentences that stop: at least three quarters end with EOS. The
# course's SFT model, trained for 1000 steps of 64, is lower still (about 1.7 on the check records) and
# ends every sample with EOS.
#
# The demo leaves out what matters only at scale: the library warms the learning rate up and decays it
# (cosine), and goes through the corpus in epochs instead of drawing random batches (the tiny model's
# recipe also batches records of similar length together, so less of each batch is padding).

# %% tags=["claim-check"]
check_claims({
    "the fresh model's first loss is log V ~ 6.0 (within 0.3)":
        abs(sft_losses[0] - uniform_loss) < 0.3 and abs(uniform_loss - 6.0) < 0.05,
    "after 40 steps the loss is below 3 (mean of the last 10 steps)": sum(sft_losses[-10:]) / 10 < 3.0,
    "the course's SFT model is lower still, about 1.7": 1.6 < course_sft["loss"] < min(1.8, after["loss"]),
    "the course's SFT model ends every sample with EOS": course_sft["ended"] == len(sample_prompts),
    "the fresh model ends at most a quarter of its samples": before["ended"] <= len(sample_prompts) // 4,
    "after 40 steps at least three quarters end with EOS": after["ended"] >= 3 * len(sample_prompts) // 4,
})

# %% [markdown]
# ## 2. Preference data and the annotator
#
# Each record is a prompt and two responses, one labelled better. Here the labeller is simulated: it
# knows each response's hidden score $h$ (sentiment, specific details, grammar, no repeated content words,
# at most 30 words, the prompt's genre; `rlhf_helpers.world.scorer`) and prefers $a$ over $b$ with the
# Bradley-Terry probability
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
    print(wrap_printed(f"\n{pair['prompt']}\n  chosen   (hidden {h_c:+.2f}):{pair['chosen']}\n"
                       f"  rejected (hidden {h_r:+.2f}):{pair['rejected']}\n  P(annotator prefers chosen) = {p:.2f}",
                       indent=" " * 25))  # a response's next lines start under its first word
first_terms = score_breakdown(test_pairs[0]["prompt"], test_pairs[0]["chosen"])
print(wrap_printed(f"\nterms of the first chosen response (total {first_terms.total:+.2f}):\n  " + ", ".join(
    f"{name} {format_number(getattr(first_terms, name), '+.2f')}"
    for name in ("sentiment", "specificity", "fluency", "repetition", "length", "genre"))))

# %% [markdown]
# ### Label noise, and the best accuracy any reward model can reach
# Because the labels are random, even a perfect model (one that knows $h$) cannot predict all of them.
# It predicts the more likely label and is right with probability $\max(p, 1 - p)$, so on a set of pairs
#
# $$\text{ceiling} = \frac{1}{N}\sum_i c_i, \qquad c_i = \max(p_i, 1 - p_i), \qquad p_i = P(\text{chosen}_i \succ \text{rejected}_i).$$
#
# The ceiling is an **expectation** over the annotator's coin flips; on one set of $N$ labels, even the
# perfect model's accuracy scatters around it (each pair a Bernoulli($c_i$) trial) with standard error
#
# $$\mathrm{SE} = \frac{1}{N}\sqrt{\sum_i c_i (1 - c_i)}.$$

# %%
def pair_hidden_scores(pairs: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
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
print(f"annotator ceiling on the {len(best_odds)} held-out pairs: {ceiling:.3f} +- {ceiling_se:.3f}\n"
      "  (+-: the standard error of a perfect model's measured accuracy)")

fig = go.Figure(go.Histogram(x=p_chosen.tolist(), nbinsx=40))
fig.update_layout(title=f"P(annotator prefers the labelled 'chosen') over held-out pairs (ceiling {ceiling:.3f})",
                  xaxis_title="p", yaxis_title="pairs")
fig.show()

# %% [markdown]
# About one held-out label in eight names as "chosen" the response with the lower hidden score, and the
# ceiling is about 0.85 with a standard error of about 0.014: no reward model can be expected to agree
# with more than about 85% of these labels.

# %% tags=["claim-check"]
check_claims({
    "about one label in eight favours the lower hidden score (0.10 to 0.15)": 0.10 < flipped < 0.15,
    "the ceiling is about 0.85 (0.83 to 0.87)": 0.83 < ceiling < 0.87,
    "its standard error is about 0.014 (0.012 to 0.016)": 0.012 < ceiling_se < 0.016,
}, any_profile=True)

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
    a, b = torch.randn(2, 200, generator=torch.Generator().manual_seed(0))  # (N,) each; the global RNG untouched

    def ceiling_loop(scale: float) -> float:  # mean of max(p, 1 - p), p = sigmoid((a - b) * scale), as a loop
        probabilities = [1 / (1 + math.exp(-(x - y) * scale)) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
        return sum(max(p, 1 - p) for p in probabilities) / len(probabilities)

    got, expected = ceiling_from_scores(a, b, 0.7), ceiling_loop(1 / 0.7)
    assert isinstance(got, float), f"return a Python float (a tensor's .item()), got {type(got).__name__}"
    mean_p = sum(1 / (1 + math.exp(-(x - y) / 0.7)) for x, y in zip(a.tolist(), b.tolist(), strict=True)) / 200
    known = {"the mean of p itself: the share of labels 'chosen' wins, not the best guess's accuracy": mean_p,
             "the mean of min(p, 1 - p): the worse guess, not the better": 1 - expected,
             "sigmoid(a - b) without the temperature": ceiling_loop(1.0),
             "(a - b) * temperature: the temperature divides the difference": ceiling_loop(0.7)}
    why = next((name for name, value in known.items() if abs(got - value) < 1e-5), "")
    assert abs(got - expected) < 1e-5, (f"on 200 random pairs at temperature 0.7 your ceiling is {got:.4f}, "
                                        f"expected {expected:.4f}" + (f"; that is {why}" if why else ""))
    # Known limits: identical scores give a coin flip (0.5); far-apart scores give certainty (1.0).
    same = ceiling_from_scores(a, a, 0.7)
    assert abs(same - 0.5) < 1e-6, f"identical scores must give 0.5 (each label a coin flip), got {same}"
    far = ceiling_from_scores(a + 100, a, 0.7)
    assert abs(far - 1.0) < 1e-6, f"scores 100 apart must give 1.0 (every label predictable), got {far}"


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
# ## Deep dive: why compare instead of score?
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# Ask people for an absolute score (say 1 to 10) and each uses the scale differently: one is generous,
# one is harsh, one spreads the scale wide. Model rater $j$'s judgement of a response of true quality $q$ as
#
# $$y = s_j\, q + b_j + \varepsilon, \qquad s_j > 0 \text{ (scale)}, \quad b_j \text{ (offset)}, \quad \varepsilon \sim \mathcal N(0, \sigma^2) \text{ (noise)}.$$
#
# A **comparison** is one rater judging both responses and saying which is better, the sign of
#
# $$y_a - y_b = s_j (q_a - q_b) + \varepsilon_a - \varepsilon_b :$$
#
# the offset cancels, and a positive scale cannot flip the order (only the noise can). **Scores** are
# usually collected one response at a time, so the two responses of a pair are often scored by two
# raters $j \ne k$, and then $y_a - y_b = s_j q_a - s_k q_b + (b_j - b_k) + \varepsilon_a - \varepsilon_b$:
# both raters' offsets and scales enter the order.
#
# The cell simulates this model; it does not measure people, it shows what the model implies. To keep
# the protocols comparable, all three use the same pool of 20 raters (the same scales and offsets), the
# same noise draws ($\sigma = 0.3$), and the hidden scores of the held-out pairs as $q$; only who judges
# what differs:
# - **compare**: one rater per pair judges both responses (the same numbers as that rater scoring both);
# - **score, two raters**: each response scored by its own rater from the pool;
# - **score, two raters, standardised**: those scores with each rater's scores shifted and scaled to mean 0
#   and standard deviation 1 over all the responses that rater scored (about 50 each), the usual repair.
#
# We count the pairs each protocol orders the way $q$ does, as the spread of the offsets $b_j$ grows.

# %%
gen = torch.Generator().manual_seed(profile.seed)
q_a, q_b = h_chosen, h_rejected  # (N,): true qualities of the two responses of each pair
n, n_raters, noise = len(q_a), 20, 0.3
offset_spreads = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0]
# one draw of everything random, shared by every protocol and every spread
scale = torch.exp(0.3 * torch.randn(n_raters, generator=gen))  # (R,): s_j, around 1
unit_offset = torch.randn(n_raters, generator=gen)  # (R,): b_j = spread * unit_offset_j
pair_rater, rater_a, rater_b = torch.randint(n_raters, (3, n), generator=gen)  # (N,) each
eps_a, eps_b = noise * torch.randn(2, n, generator=gen)  # (N,) each: the noise of each judgement
truth = torch.sign(q_a - q_b)  # (N,)
keep = truth != 0  # (N,): a pair of equal quality has no right order


def judge(q: torch.Tensor, rater: torch.Tensor, eps: torch.Tensor, spread: float) -> torch.Tensor:
    """y = s_j q + b_j + eps of each response, judged by rater[i]: (M,) -> (M,)."""
    return scale[rater] * q + spread * unit_offset[rater] + eps


def standardise_per_rater(y: torch.Tensor, rater: torch.Tensor) -> torch.Tensor:
    """Each rater's scores shifted and scaled to mean 0 and standard deviation 1: (M,) -> (M,)."""
    z = torch.empty_like(y)
    for j in range(n_raters):
        theirs = rater == j  # (M,)
        z[theirs] = (y[theirs] - y[theirs].mean()) / y[theirs].std()
    return z


def ordered_right(y_a: torch.Tensor, y_b: torch.Tensor) -> float:
    """Share of pairs (with a right order) that y_a - y_b orders the way q does."""
    return (torch.sign(y_a - y_b) == truth)[keep].float().mean().item()

# %%
score_raters = torch.cat([rater_a, rater_b])  # (2N,): who scores each response
rows = []
for spread in offset_spreads:
    scores = judge(torch.cat([q_a, q_b]), score_raters, torch.cat([eps_a, eps_b]), spread)  # (2N,)
    standard = standardise_per_rater(scores, score_raters)  # (2N,)
    rows.append({"offset spread": spread,
                 "compare (one rater)": ordered_right(judge(q_a, pair_rater, eps_a, spread),
                                                      judge(q_b, pair_rater, eps_b, spread)),
                 "score, two raters": ordered_right(scores[:n], scores[n:]),
                 "score, two raters, standardised": ordered_right(standard[:n], standard[n:])})
protocols = pd.DataFrame(rows).set_index("offset spread")  # share of pairs ordered correctly
per_rater = torch.bincount(score_raters, minlength=n_raters)  # (R,)
print(f"each rater scored between {per_rater.min().item()} and {per_rater.max().item()} responses")

fig = go.Figure([go.Scatter(x=offset_spreads, y=protocols[c].tolist(), name=c, mode="lines+markers")
                 for c in protocols.columns])
fig.update_layout(title="Pairs ordered correctly: the same raters, three protocols",
                  xaxis_title="spread of rater offsets", yaxis_title="fraction of pairs ordered correctly",
                  yaxis_range=[0.5, 1.0])
fig.show()
display(protocols.round(3))

# %% [markdown]
# What the run shows, for this model of raters:
# - **comparing** orders the same share of pairs (about 0.92) at every offset spread: the offset cancels
#   inside one rater's judgement;
# - **scoring with two raters** is already a little worse without any offsets (the two raters' scales
#   differ) and loses more than 0.1 of accuracy as the offsets spread to 2;
# - **standardising** each rater's scores repairs almost all of it (within 0.02 of comparing at every
#   spread), because each rater here scored about 50 responses, enough to estimate their offset and scale.
#
# So in this model comparisons are barely more informative than calibrated scores. Their advantage is
# that they need no calibration: one judgement by one person cancels that person's offset, with no
# history of their other ratings. Whether real raters behave like this model is a question about
# people that a simulation cannot answer.

# %% tags=["claim-check"]
compared, two_raters = protocols["compare (one rater)"], protocols["score, two raters"]
check_claims({
    "comparing: the same share at every spread, about 0.92": compared.max() - compared.min() < 0.005
                                                             and abs(compared.mean() - 0.92) < 0.02,
    "two raters: below comparing already at spread 0": two_raters.iloc[0] < compared.iloc[0] - 0.01,
    "two raters: loses more than 0.1 from spread 0 to 2": two_raters.iloc[0] - two_raters.iloc[-1] > 0.1,
    "standardised: within 0.02 of comparing at every spread":
        (protocols["score, two raters, standardised"] - compared).abs().max() < 0.02,
    "each rater scored about 50 responses (30 to 70)": 30 <= per_rater.min().item() and per_rater.max().item() <= 70,
})

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
# Only differences matter: adding a constant to every score changes nothing, so the zero point is
# arbitrary (this course's PPO uses the score as it is; some implementations normalise it).
# $-\log\sigma(m) = \log(1 + e^{-m})$ is the softplus of $-m$; its gradient with respect to the margin is
# $-(1 - \sigma(m))$: large for wrongly ordered pairs, vanishing once a pair is ordered with a comfortable margin.

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
# a margin of $-100$ must give a loss of about 100, not `inf`. Training follows the loss's gradient, so
# the check compares it too, with respect to both score vectors: with $m_i = r_{c,i} - r_{r,i}$ over $N$ pairs,
#
# $$\frac{\partial \mathcal L}{\partial r_{c,i}} = -\frac{1 - \sigma(m_i)}{N}, \qquad
# \frac{\partial \mathcal L}{\partial r_{r,i}} = +\frac{1 - \sigma(m_i)}{N}.$$

# %%
# EXERCISE 2
def bt_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """Mean Bradley-Terry loss -log sigmoid(r_c - r_r): (N,), (N,) -> scalar."""
    raise NotImplementedError

# %%
# Part of the check below: it compares the loss's gradients with the formula above and says which one differs.
def check_bt_gradients(loss: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor, margins: list[float]
                         ) -> None:
    """Raise AssertionError unless d loss / d chosen = -(1 - sigmoid(m)) / N and d loss / d rejected = +(...)."""
    push = torch.tensor([(1 - 1 / (1 + math.exp(-m))) / len(margins) for m in margins], dtype=torch.float64)  # (N,)
    assert loss.requires_grad, "the loss has no gradient at all: it was rebuilt outside the graph (.item(), torch.tensor)"
    grads = torch.autograd.grad(loss, (chosen, rejected), allow_unused=True)
    for name, grad, want, formula in (("chosen", grads[0], -push, "-(1 - sigmoid(m)) / N"),
                                      ("rejected", grads[1], push, "+(1 - sigmoid(m)) / N")):
        grad = torch.zeros_like(want) if grad is None else grad  # (N,): None when the branch is cut
        assert grad.abs().max() > 0, (f"no gradient reaches the {name} scores: that branch is cut from the graph "
                                      "(.detach(), .item() or a new tensor), so training would never move them")
        assert not torch.allclose(grad, -want), (f"the gradient with respect to the {name} scores has the wrong "
                                                 "sign: a step would move them the wrong way")
        torch.testing.assert_close(grad, want, msg=f"the gradient with respect to the {name} scores differs from "
                                   f"{formula}")

# %%
def check_bt_loss():
    c, r = torch.randn(2, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # (N,) each

    def loop(margins: list[float]) -> torch.Tensor:  # mean of -log(1 / (1 + exp(-m))), one pair at a time
        return torch.tensor(sum(-math.log(1 / (1 + math.exp(-m))) for m in margins) / len(margins),
                            dtype=torch.float64)

    margins = (c - r).tolist()
    expected = loop(margins)
    c_leaf, r_leaf = c.clone().requires_grad_(True), r.clone().requires_grad_(True)  # (N,) each
    got = bt_loss(c_leaf, r_leaf)
    assert isinstance(got, torch.Tensor) and got.dim() == 0, \
        f"return a scalar tensor (the mean over the pairs), got {type(got).__name__} {tuple(getattr(got, 'shape', ()))}"
    assert got.dtype == c.dtype, f"the loss should keep the scores' dtype ({c.dtype}), got {got.dtype}"
    known = {"the margin the wrong way round (r_r - r_c, or softplus(m) for softplus(-m)): it favours the rejected":
             loop([-m for m in margins]),
             "log sigmoid without the minus sign: a log-probability is <= 0, the loss is its negative": -expected,
             "the sum over the pairs, not the mean": expected * len(margins),
             "r_c + r_r: the rejected score enters with a plus sign": loop((c + r).tolist())}
    why = next((name for name, value in known.items() if torch.allclose(got.detach().double(), value)), "")
    torch.testing.assert_close(got.detach(), expected, msg=f"on 32 random pairs your loss is {got.item():.4f}, expected "
                               f"{expected.item():.4f}" + (f"; that is {why}" if why else ""))
    far = bt_loss(torch.tensor([0.0]), torch.tensor([100.0]))
    assert torch.isfinite(far), (f"a margin of -100 gives {far.item()}: sigmoid(-100) rounds to 0 and log(0) = -inf; "
                                 "use F.logsigmoid(m) (or -F.softplus(-m)), which never forms sigmoid(m)")
    assert abs(far.item() - 100.0) < 1e-3, f"a margin of -100 should cost about 100, got {far.item():.4f}"
    check_bt_gradients(got, c_leaf, r_leaf, margins)


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
# Fine-tuning every weight for every role would need a copy of the model per role. **LoRA** (Hu et al.
# 2021) freezes each weight matrix $W_0$ and learns a low-rank correction next to it,
#
# $$f(x) = W_0 x + \frac{\alpha}{r}\, B A x, \qquad A \in \mathbb{R}^{r \times d_{\text{in}}},\ B \in \mathbb{R}^{d_{\text{out}} \times r},\ r \ll \min(d_{\text{in}}, d_{\text{out}}),$$
#
# with $B$ starting at zero, so a fresh adapter changes nothing, and switching the adapter off gives
# $W_0$ back exactly (notebook 05's frozen reference model, for free). Only $A$ and $B$ are trained:
# $r(d_{\text{in}} + d_{\text{out}})$ numbers instead of $d_{\text{in}} d_{\text{out}}$ per matrix.

# %% [markdown]
# ### Deep dive: LoRA checked against peft
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# $A$ starts random and $B$ at zero. The cell below gives $B$ random values (as if training had moved
# it) and checks the equation above against peft on one projection of the profile's model.

# %%
from peft import get_peft_model

from rlhf_helpers.ppo.model.adapters import lora_config, uses_conv1d

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
print(f"one MLP projection ({mlp_in}): W0 {tuple(layer.base_layer.weight.shape)} (stored {layout}),\n"
      f"  A {tuple(A.shape)}, B {tuple(B.shape)}; B is all zero at the start: {bool((B == 0).all())}")
with torch.no_grad():
    B.copy_(torch.randn(B.shape, generator=torch.Generator().manual_seed(0)))  # pretend training moved B
    x = torch.randn(3, A.shape[1], generator=torch.Generator().manual_seed(1)).to(A.device)  # (N, d_in)
    W0 = layer.base_layer.weight.T if conv1d else layer.base_layer.weight  # (d_out, d_in)
    b0 = layer.base_layer.bias if layer.base_layer.bias is not None else 0.0  # (d_out,); Llama has none
    f_scratch = x @ W0.T + b0 + (profile.lora.alpha / profile.lora.r) * x @ A.T @ B.T  # (N, d_out)
    # float32 sums of d_in products in another order differ by ~1e-6 relative; a wrong formula by O(1)
    torch.testing.assert_close(layer(x), f_scratch, rtol=1e-5, atol=1e-5)
d_in, d_out = A.shape[1], B.shape[0]
print(f"f(x) = W0 x + (alpha / r) B A x matches peft's layer;\n"
      f"  trained numbers per projection: {profile.lora.r * (d_in + d_out):,} instead of {d_in * d_out:,}")
del lora_demo

# %% [markdown]
# ### Deep dive: the TRL and peft calls, run for 8 steps
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# The calls most tutorials use, which `rlhf_helpers.stages.reward` makes for the real run: a `LoraConfig`
# with `task_type="SEQ_CLS"` (the score head in `modules_to_save`, so it is trained and saved with the
# adapter), a `RewardConfig`, and a `RewardTrainer` on `{"prompt", "chosen", "rejected"}` records, run here for 8 steps on 256 pairs. What
# sets up the machine rather than the learning comes from `reward_config_kwargs(profile)`.

# %%
import tempfile

from datasets import Dataset
from peft import LoraConfig
from transformers import PrinterCallback
from trl import RewardConfig, RewardTrainer

from rlhf_helpers.ppo.model.adapters import uses_conv1d
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
    demo_trainer.remove_callback(PrinterCallback)  # its raw log dicts: the losses are printed below
    demo_trainer.train()
losses = [round(entry["loss"], 3) for entry in demo_trainer.state.log_history if "loss" in entry]
print(f"Bradley-Terry loss after 4 and 8 steps: {losses} (log 2 = {math.log(2):.3f} is a coin flip)")
del demo_trainer, demo_base

# %% [markdown]
# ### The course's reward model
#
# The reward model is the SFT model with a linear **score head** ($H \to 1$) in place of its language-model
# head, and a LoRA adapter on the attention and MLP projections: only the two are trained, by TRL's
# `RewardTrainer` on the Bradley-Terry loss. `ensure_reward_model(profile)` trains it once (a while on the
# tiny profile's CPU) and caches it under `runs/reward-<profile>/` for notebooks 05 and 06.

# %%
from peft import PeftModel

from rlhf_helpers.stages.reward import ensure_reward_model, is_cached_reward_model, reward_metrics
from rlhf_helpers.stages.reward_training import RewardTrainingConfig, score_pairs

reward_config = RewardTrainingConfig.from_profile(profile)
print(wrap_printed(str(reward_config), indent=" " * 4))
was_cached = is_cached_reward_model(profile, reward_config)
print("loading the cached reward adapter" if was_cached else "training the reward adapter (TRL RewardTrainer)...")
reward_dir = ensure_reward_model(profile, reward_config)
stored = reward_metrics(reward_dir)
print(f"reward adapter in {shown_path(reward_dir)};\n  trained on {stored['train_pairs']:.0f} distinct pairs "
      f"({stored.get('pairs_seen', stored['train_pairs']):.0f} pair passes) in {stored['train_seconds']:.0f} s")

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
# Batches are padded to one length, and where the last real token sits depends on the padding
# ($a$ is the attention mask, 1 on real tokens):
# - **left** padding (`0 0 1 1 1`; what the course uses, because batched generation needs every prompt
#   to end at the same column): the last column, $\ell = L - 1$;
# - **right** padding (`1 1 1 0 0`; how TRL's reward trainer pads): $\ell = \sum_t a_t - 1$;
# - a left-padded prompt followed by a response padded after its EOS (`0 1 1 1 1 0`; the rollouts of
#   notebook 05, which the reward model scores): neither formula.
#
# Reading a padding position scores a pad token's hidden state: a number that looks like a score and is
# not, a silent bug. Below, from scratch on a left-padded batch (GPT-2 needs `position_ids` counted over
# the real tokens), checked against `score_pairs` (Hugging Face's sequence-classification forward).

# %%
# float32 from here on (a no-op in the tiny profile): the scratch path and score_pairs run different
# kernels on differently padded batches, which in bf16/fp16 (gpu profile) would round apart by ~1e-2
# and hide what the checks compare; float32 keeps that rounding near 1e-6, so 1e-4 is a tight check
reward_model = reward_model.float()
lm_with_head = reward_model.base_model.model  # GPT2ForSequenceClassification (tiny; Llama... on gpu) with LoRA
backbone = getattr(lm_with_head, lm_with_head.base_model_prefix)  # the transformer without a head
score_head = lm_with_head.score  # Linear(H, 1) (peft keeps its trained copy)
device = next(reward_model.parameters()).device

few_pairs = test_pairs[:6]
prompts = [p["prompt"] for p in few_pairs]
responses = [p["chosen"] for p in few_pairs]
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
print("last-column reading matches rlhf_helpers.stages.reward_training.score_pairs:\n  "
      + ", ".join(format_number(s, "+.3f") for s in scratch_scores.tolist()))

# %% [markdown]
# ### Deep dive: the same batch right-padded, read at the last column
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# On the shorter rows the last column is a pad token; reading it gives a number that looks like a score.

# %%
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
# ### Exercise 3: the score at the last real token, whatever the padding
#
# The head applied at every position gives $s_{i,t} = w^\top \mathbf{z}_{i,t}$ (B, L), and row $i$'s reward is
# $r_i = s_{i, \ell_i}$ with $\ell_i = \max\{t : a_{i,t} = 1\}$. Write `score_at_last_token(head_outputs,
# attention_mask)`: (B, L) outputs and 0/1 mask give the (B,) scores $r_i$, for a batch mixing every layout
# above, without a Python loop over the rows. The check compares the gradient with respect to
# `head_outputs` too (each row's last real token only).

# %%
# EXERCISE 3
def score_at_last_token(head_outputs: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's entry of head_outputs at its last real token: (B, L), (B, L) 0/1 mask -> (B,)."""
    raise NotImplementedError

# %%
# Part of the check below: it compares your scores with a loop and says which row differs, and where you read it.
def check_each_row(got: torch.Tensor, expected: torch.Tensor, outputs: torch.Tensor, rows: list[list[int]],
                names: list[str], last: list[int]) -> None:
    """Raise AssertionError at the first row whose score differs, naming the position it was read at."""
    for i, (row, name) in enumerate(zip(rows, names, strict=True)):
        if abs(got[i].item() - expected[i].item()) < 1e-5:  # a float32 copy of the right value passes
            continue
        known = {sum(row) - 1: "sum(mask) - 1, the last real token only when the padding is on the right",
                 len(row) - 1: "the last column, the last real token only when the padding is on the left",
                 row.index(1): "the first real token, not the last (argmax returns the first maximum)"}
        read_at = [t for t in range(len(row)) if abs(got[i].item() - outputs[i, t].item()) < 1e-5]
        where = f"; you read position {read_at[0]}" if read_at else "; that is no single position's output"
        why = known.get(read_at[0], "") if read_at else ""
        raise AssertionError(f"row {i} ({name}, mask {row}): got {got[i].item():.4f}, expected "
                             f"{expected[i].item():.4f}, the output at position {last[i]}" + where
                             + (f", {why}" if why else ""))

# %%
def check_score_at_last_token():
    layouts = {"left-padded": [0, 0, 0, 1, 1, 1, 1, 1], "left-padded, one pad": [0, 1, 1, 1, 1, 1, 1, 1],
               "right-padded": [1, 1, 1, 1, 0, 0, 0, 0], "right-padded, one real token": [1, 0, 0, 0, 0, 0, 0, 0],
               "prompt left-padded, response right-padded": [0, 0, 1, 1, 1, 1, 1, 0],
               "prompt left-padded, short response": [0, 1, 1, 1, 1, 0, 0, 0], "unpadded": [1] * 8}
    rows = list(layouts.values())
    generator = torch.Generator().manual_seed(0)
    outputs = torch.randn(len(rows), 8, dtype=torch.float64, generator=generator).requires_grad_(True)  # (B, L)
    weights = torch.randn(len(rows), dtype=torch.float64, generator=generator)  # (B,): a loss's d/d score
    last = [max(t for t, a in enumerate(row) if a == 1) for row in rows]  # the loop definition of l_i
    expected = torch.stack([outputs[i, t] for i, t in enumerate(last)]).detach()  # (B,)
    got = score_at_last_token(outputs, torch.tensor(rows))
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    assert shape != (len(rows), len(rows)), ("your scores are (B, B): head_outputs[:, index] takes every row's "
                                             "index from every row; pair row i with its own index, "
                                             "head_outputs[torch.arange(B), index]")
    assert shape == (len(rows),), f"expected ({len(rows)},) scores, one per row, got {shape}"
    check_each_row(got.detach(), expected, outputs.detach(), rows, list(layouts), last)
    assert got.requires_grad, ("no gradient reaches head_outputs: the scores were rebuilt outside the autograd "
                               "graph (torch.tensor, .tolist(), .item() or .detach()), so training could not "
                               "move the score head or the adapter")
    (grad,) = torch.autograd.grad((got * weights).sum(), outputs)  # (B, L)
    expected_grad = torch.zeros_like(grad)  # (B, L): d (w . r) / d s = w_i at (i, l_i), 0 elsewhere
    for i, t in enumerate(last):
        expected_grad[i, t] = weights[i]
    torch.testing.assert_close(grad, expected_grad, msg="the gradient with respect to head_outputs must be "
                               "each row's loss weight at its last real token and 0 everywhere else")


exercise_check("Exercise 3 (score_at_last_token)", check_score_at_last_token,
               hidden=[rlhf_helpers.last_token_index])

# %% [markdown]
# <details><summary>Solution 3</summary>
#
# ```python
# def score_at_last_token(head_outputs: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
#     """Each row's entry of head_outputs at its last real token: (B, L), (B, L) 0/1 mask -> (B,)."""
#     B, L = attention_mask.shape
#     positions = torch.arange(L, device=attention_mask.device)  # (L,)
#     last = (positions * attention_mask.long()).max(dim=1).values  # (B,): the largest position holding a 1
#     rows = torch.arange(B, device=head_outputs.device)  # (B,)
#     return head_outputs[rows, last]  # (B,): row i's output at its own last real token
# ```
# </details>

# %% [markdown]
# ## 6. How good is it? Held-out accuracy against the ceiling
#
# Pairwise accuracy is the share of held-out pairs where the learned score ranks the labelled "chosen"
# higher; in expectation no model exceeds the annotator ceiling of section 2.

# %%
test_prompts = [p["prompt"] for p in test_pairs]
r_chosen = score_pairs(reward_model, tokenizer, test_prompts, [p["chosen"] for p in test_pairs])  # (N,)
r_rejected = score_pairs(reward_model, tokenizer, test_prompts, [p["rejected"] for p in test_pairs])  # (N,)
accuracy = rlhf_helpers.pairwise_accuracy(r_chosen, r_rejected)
print(f"held-out pairwise accuracy {accuracy:.3f}; annotator ceiling {ceiling:.3f} +- {ceiling_se:.3f}")

# %% [markdown]
# The reward model ranks about 81% of the held-out pairs the way their labels do, against a ceiling of
# about 85%.

# %% tags=["claim-check"]
check_claims({
    "accuracy about 81% (0.78 to 0.84)": 0.78 < accuracy < 0.84,
})

# %% [markdown]
# ### Deep dive: whose shortfall is it, and learned against hidden
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# A measured accuracy is one draw of the labels: it scatters around its expectation by about the
# standard error of section 2. Comparing the reward model pair by pair with the perfect model (ranking
# by $h$) on the same labels removes the label draw from the comparison. The paired difference's
# standard error is not smaller than that of one 500-label accuracy (both are about 1.4 points here);
# it is smaller than the about $\sqrt 2$ times as much, some 2 points, that the difference of two
# accuracies on independent label draws would have.
#
# Since the labels follow $\sigma((h_a - h_b)/T_{\text{ann}})$, a reward model that fits them perfectly
# would be $r = h / T_{\text{ann}} + \text{const}$: a line of slope $1/T_{\text{ann}} = 2$. A real one
# falls short of it: the least-squares slope of $r$ on $h$ is
# $\operatorname{corr}(r, h)\cdot\operatorname{sd}(r)/\operatorname{sd}(h)$, and every part of $h$ the
# model cannot see (a few thousand noisy labels, two epochs, a LoRA adapter) lowers the correlation and
# shrinks the spread of $r$, so the slope is expected below 2.

# %%
held_out_loss = rlhf_helpers.reward_model_loss(r_chosen, r_rejected).item()
learned = torch.cat([r_chosen, r_rejected])  # (2N,)
hidden_all = torch.cat([h_chosen, h_rejected]).float()  # (2N,)
correlation = torch.corrcoef(torch.stack([learned, hidden_all]))[0, 1].item()
centred = hidden_all - hidden_all.mean()  # (2N,)
slope = (((learned - learned.mean()) * centred).sum() / (centred**2).sum()).item()
model_right = (r_chosen > r_rejected).float() + 0.5 * (r_chosen == r_rejected).float()  # (N,)
oracle_right = (h_chosen > h_rejected).float() + 0.5 * (h_chosen == h_rejected).float()  # (N,)
oracle_accuracy = oracle_right.mean().item()
z_ceiling = (accuracy - ceiling) / ceiling_se
paired = model_right - oracle_right  # (N,): per pair, reward model minus perfect model
paired_mean, paired_se = paired.mean().item(), (paired.std() / len(paired) ** 0.5).item()
display(pd.DataFrame({"value": {
    "held-out pairwise accuracy of the reward model": accuracy,
    "annotator ceiling (a perfect model's expected accuracy)": ceiling,
    f"standard error of a {len(test_pairs)}-label accuracy": ceiling_se,
    "reward model minus ceiling, in standard errors": z_ceiling,
    "ranking by the hidden score, on the same labels": oracle_accuracy,
    "reward model minus ranking by h, same labels": paired_mean,
    "its paired standard error": paired_se,
    "held-out Bradley-Terry loss": held_out_loss,
    "corr(learned, hidden)": correlation,
    f"slope of learned on hidden (perfect fit: 1/T_ann = {1 / DEFAULT_TEMPERATURE:.0f})": slope,
}}).round(3))

# %%
fig = make_subplots(rows=1, cols=2, column_widths=[0.35, 0.65],
                    subplot_titles=("pairwise accuracy (held out)", f"learned vs hidden score (Pearson {correlation:.2f})"))
fig.add_bar(x=["reward model", "annotator ceiling", "chance"], y=[accuracy, ceiling, 0.5], row=1, col=1,
            error_y=dict(array=[0.0, 2 * ceiling_se, 0.0]),  # +- 2 SE of a 500-label accuracy
            marker_color=["royalblue", "gray", "lightgray"], showlegend=False)
fig.add_scatter(x=hidden_all.tolist(), y=learned.tolist(), mode="markers", marker=dict(size=4, opacity=0.5),
                name="held-out responses", row=1, col=2)
fig.update_yaxes(range=[0.4, 0.95], row=1, col=1)  # no tick at 1.0 under the panel title
fig.update_xaxes(title_text="hidden score h", row=1, col=2)
fig.update_yaxes(title_text="learned reward r", row=1, col=2)
fig.update_layout(title="The trained reward model on the held-out pairs")
fig.show()

# %% [markdown]
# The reward model ranks about 81% of the held-out pairs the way their labels do, against a ceiling of
# about 85%: below it by more than one and a half standard errors (about 2.7 here). Whether that is the
# luck of the labels, the paired comparison settles: on the same labels, ranking by the hidden score
# gets about 86% (this draw of labels is a little kinder than the ceiling's expectation), and the reward
# model trails it by about 5 points, more than twice the paired standard error of about 1.4 points: the
# shortfall is the model's.
# Its scores still follow the hidden ones closely (correlation about 0.93), with a slope of about 1.5:
# three quarters of the perfect fit's 2.

# %% tags=["claim-check"]
check_claims({
    "more than 1.5 standard errors below the ceiling": z_ceiling < -1.5,
    "ranking by h on the same labels: about 86%, above the ceiling": 0.85 < oracle_accuracy < 0.87
                                                                      and oracle_accuracy > ceiling,
    "the reward model trails it by about 5 points (3 to 7)": -0.07 < paired_mean < -0.03,
    "by more than twice the paired standard error, about 1.4 points": paired_mean < -2 * paired_se
                                                                       and 0.012 < paired_se < 0.016,
    "the paired SE about that of one accuracy, below sqrt(2) times it": 0.8 < paired_se / ceiling_se < 1.2,
    "correlation about 0.93 (0.90 to 0.96)": 0.90 < correlation < 0.96,
    "slope about 1.5 (1.3 to 1.7), below 2": 1.3 < slope < 1.7,
})

# %% [markdown]
# ## Deep dive: what a reward model has never seen, a preview of reward hacking
#
# *Optional: skip it on a first pass; nothing after it needs it.*
#
# The reward model learned from reviews that never repeat a content word and never run past 30 words
# (the data's generator writes them that way; the check below counts them). No label ever showed it
# what repeating costs, so whatever it says about a repeated sentence is extrapolation from reviews
# that don't repeat. The hidden score does know: each repeated content word costs a fixed amount, and
# the sum of all terms is then clipped to $[-B, B]$ (`SCORE_BOUND` in `rlhf_helpers.world.scorer`), so
# once it hits the floor more repetition costs nothing more.

# %% tags=["claim-check"]
train_terms = [score_breakdown(p["prompt"], text) for p in train_pairs for text in (p["chosen"], p["rejected"])]
check_claims({
    "no training response repeats a content word": all(t.repetition == 0 for t in train_terms),
    "no training response runs past 30 words": MAX_WORDS == 30 and max(t.n_words for t in train_terms) <= MAX_WORDS,
}, any_profile=True)

# %% [markdown]
# Score a good review sentence repeated $k$ times with both. The table shows, for each $k$, the
# repetition term of the hidden score and the sum of its terms before the clip.

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
gaming_learned = score_pairs(reward_model, tokenizer, [prompt] * len(gaming), gaming).tolist()  # (K,)
gaming_hidden = hidden_scores([prompt] * len(gaming), gaming)
typical = torch.cat([r_chosen, r_rejected]).quantile(0.9).item()  # of real held-out responses


def repeated_content_words(text: str) -> int:
    """Content words (outside grammar.FUNCTION_WORDS) that repeat an earlier one, as the scorer counts them."""
    content = [w for w in tokenize_words(text) if w.isalpha() and w not in grammar.FUNCTION_WORDS]
    return len(content) - len(set(content))


terms = [score_breakdown(prompt, g) for g in gaming]
n_repeated = [repeated_content_words(g) for g in gaming]
unclipped = [t.sentiment + t.specificity + t.fluency + t.repetition + t.length + t.genre + BIAS for t in terms]
cost_per_word = [t.repetition / n for t, n in zip(terms, n_repeated, strict=True) if n > 0]
print(f"prompt: {prompt}\nsentence:{sentence}")
print(f"hidden score: {cost_per_word[0]:+.1f} per repeated content word, total clipped to "
      f"[{-SCORE_BOUND:+.0f}, {SCORE_BOUND:+.0f}]\n"
      f"90th percentile of the learned reward on real held-out responses: {typical:+.2f}")
display(pd.DataFrame({"times repeated": repeats, "learned reward": gaming_learned, "hidden score": gaming_hidden,
                      "repeated content words": n_repeated, "repetition term": [t.repetition for t in terms],
                      "sum of the terms before the clip": unclipped}).set_index("times repeated").round(2))

# %% tags=["claim-check"]
check_claims({  # the scorer's rule, as the text above states it
    "the hidden score is the sum of its terms clipped to [-B, B]":
        all(abs(max(-SCORE_BOUND, min(SCORE_BOUND, raw)) - t.total) < 1e-9
            for t, raw in zip(terms, unclipped, strict=True)),
    "every repeated content word costs the same": max(cost_per_word) - min(cost_per_word) < 1e-9,
}, any_profile=True)

# %%
fig = go.Figure()
fig.add_scatter(x=repeats, y=gaming_learned, name="learned reward", mode="lines+markers")
fig.add_scatter(x=repeats, y=gaming_hidden, name="hidden score", mode="lines+markers")
fig.update_layout(title="The same sentence repeated: learned reward (the proxy) and hidden score (the truth)",
                  xaxis_title="times repeated", yaxis_title="score")
fig.show()

# %% [markdown]
# On this sentence the learned reward is higher for every repeated version than for the sentence said
# once. It is highest at 2× (about +2.7 against +1.4, near the 90th percentile of real held-out
# responses), then lower at 3× and 4× (under +2) but still above +1.4. The hidden score falls from
# +1.3 to -1.6 at 2× and sits on the floor, -3, from 3× on.
#
# So the reward model is not blind to the repetition: its score drops after 2×. What the run supports
# is narrower: on this sentence the learned reward stays above the sentence said once at every $k$ up
# to 4, while the hidden score drops by about 3 points at 2× and to its floor after. The training data
# contain no repeated sentence, so no label tied repetition to a cost: the learned reward of a repeated
# sentence is an extrapolation, and here it points the wrong way at 2× and is too weak after.

# %% tags=["claim-check"]
once, twice = gaming_learned[0], gaming_learned[1]
check_claims({
    "learned: every repeated version scores above the sentence said once": min(gaming_learned[1:]) > once,
    "learned: highest at 2x, about +2.7 against about +1.4": max(gaming_learned) == twice
                                                             and 2.4 < twice < 3.0 and 1.1 < once < 1.7,
    "learned at 2x: near the 90th percentile of real responses (within 0.4)": abs(twice - typical) < 0.4,
    "learned: lower at 3x and 4x (under +2), by more than 0.5 below 2x":
        max(gaming_learned[2:]) < min(2.0, twice - 0.5),
    "hidden: +1.3 once, -1.6 at 2x, the floor -3 from 3x on":
        [round(h, 1) for h in gaming_hidden] == [1.3, -1.6, -SCORE_BOUND, -SCORE_BOUND],
})

# %% [markdown]
# PPO maximises the *learned* reward. Where the learned and the hidden scores disagree (here at every
# $k \ge 2$: the learned reward is above the sentence said once, the hidden score far below it), an
# optimiser strong enough will find the disagreement: the learned reward climbs while the true quality
# falls (**reward over-optimisation**, Gao et al. 2022). The per-token KL penalty towards the SFT model
# (notebook 03) is the leash that keeps the policy where the reward model was trained; notebook 06
# removes it and measures what happens.

# %% [markdown]
# ## Summary
# - Every model starts as the SFT model: next-token cross-entropy on the response and its EOS.
# - Bradley-Terry: $P(y_c \succ y_r) = \sigma(r_c - r_r)$, loss $-\log\sigma(r_c - r_r)$; only score differences matter.
# - On noisy labels no model beats the annotator ceiling in expectation.
# - The reward model is the SFT model plus a LoRA adapter and a scalar head read at the last real token
#   (the last column only with left padding).
#
# Next: notebook 03 turns one reward score per response into a reward per token.

# %% [markdown]
# ## Check your understanding
#
# 1. You add 3.0 to every score the reward model gives. What changes in the Bradley-Terry loss, its
#    gradients, and the pairwise accuracy?
#
# <details><summary>Answer</summary>
#
# Nothing: all three depend on the scores only through the margin $r_c - r_r$.
# </details>
#
# 2. Why can no reward model be expected to agree with more than about 85% of the held-out labels here?
#
# <details><summary>Answer</summary>
#
# The labels are Bradley-Terry coin flips: even a model that knows $h$ is right on a pair only with
# probability $\max(p, 1 - p)$, and the ceiling is the mean of that. It is an expectation: one draw of
# 500 labels scatters around it by about one standard error.
# </details>
#
# 3. A row has the mask `0 0 1 1 1 1 0 0` (a left-padded prompt, then a response padded after its EOS).
#    Which position gives its reward, and what would `mask.sum() - 1` and the last column read?
#
# <details><summary>Answer</summary>
#
# Position 5, the last 1 (the EOS). `mask.sum() - 1` is 3, a token before the end of the response; the
# last column, 7, is padding.
# </details>
#
# 4. Which pairs move the reward model most, and how much does a pair ordered with a margin of 5 contribute?
#
# <details><summary>Answer</summary>
#
# Wrong or barely right orders: $1 - \sigma(m)$ exceeds one half for $m < 0$, nears it for small
# $m > 0$. At $m = 5$ it is about 0.007: barely any push.
# </details>
