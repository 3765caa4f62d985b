"""The one source of truth for what every logged PPO metric means: formula, healthy range, failure
modes.

    from rlhf_helpers.ppo.metric_docs import METRICS
    group, doc = METRICS["clipfrac"]  # group "update"; doc.healthy: a good tiny-profile run
    METRICS["kl"][1].tracker          # "objective/kl": its name in TensorBoard / trackio / W&B
    python tools/write_docs.py        # rewrite docs/metrics.md (and docs/cluster.md) from the code

`rlhf_helpers.ppo.metrics.GLOSSARY` (name -> one line) is derived from METRICS, and docs/metrics.md
is generated from it, so the code, the plots' hover text and the docs say the same thing. Each entry
also names the metric for experiment trackers (`train_ppo --report-to`, `ppo.tracking`): grouped
like TRL's PPOTrainer (objective/, policy/, val/, loss/), with TRL's own name where TRL logs the
same quantity; metrics.jsonl keeps the short names. What an entry holds (`MetricDoc`), the
sections (`GROUPS`) and the notation (`NOTATION`) are in `metric_doc_types`, imported here.

Healthy ranges were read off `python -m rlhf_helpers.stages.train_ppo --profile tiny --steps 60
--eval-every 10` (the tiny profile's defaults: rollout batch 64, minibatch 16, 4 epochs, 40 new
tokens, beta 0.2, lr 1e-3; seed 0), and the failure examples off the same command with
`--kl-coef 0 --steps 40` (no KL penalty) and `--kl-coef 0.05` (a weak one).
They are guides for that profile, not laws: other models and batch sizes move them.
"""

from __future__ import annotations

from rlhf_helpers.ppo.metric_doc_types import (
    AT_MOST_ONE,
    ENTROPY,
    GROUPS,
    NON_NEGATIVE,
    NOTATION,
    SHARE,
    STEPS,
    MetricDoc,
)
from rlhf_helpers.ppo.metric_doc_types import metric_doc as _m

__all__ = ["GROUPS", "METRICS", "NOTATION", "MetricDoc"]


#: metric name -> its documentation, grouped by GROUPS (in the order docs/metrics.md lists them).
METRICS: dict[str, tuple[str, MetricDoc]] = {
    # ------------------------------------------------------------------ rollouts
    "score": ("rollout", _m("objective/scores",
        "mean reward-model score of the batch's responses (the proxy PPO maximises)",
        "mean_b s_b, s_b = score head on the reward adapter's hidden state at the last real token "
        "(+ missing_eos_penalty for responses cut off without EOS)",
        "rises fast, then flattens: about 0.25 at step 1, about 2 by step 5, 2.8-3.1 late.",
        "flat from the start: the policy does not learn (learning rate too low, advantages all "
        "zero, reward model ignores the response). Rising while hidden_score falls: reward hacking "
        "/ over-optimisation of the proxy (with --kl-coef 0 the score climbs to 3.6-3.7 while "
        "hidden_score falls to -2.7). Sudden jump to the score's ceiling with short or repetitive "
        "responses: the policy found an exploit of the reward model.")),
    "hidden_score": ("rollout", _m("objective/hidden_scores",
        "mean hidden ground-truth score of the same responses (what we really want)",
        "mean_b h(prompt_b, response_b), h = the review world's hidden scorer "
        "(rlhf_helpers.world.scorer, passed to PPOTrainer as hidden_score_fn: the engine logs it "
        "only when given one); the reward model was trained on noisy preferences drawn from it",
        "follows score up at first: about -0.5 at step 1, 0.7 by step 4, then 0.68-1.08 late "
        "(noisy, +-0.2 between steps).",
        "falling while score keeps rising: over-optimisation, the policy exploits the reward "
        "model's errors (raise kl_coef or stop earlier; the best checkpoint is where hidden_score "
        "peaked). Only available in this course's world: real RLHF has no hidden score, which is "
        "why KL and samples must be watched.")),
    "kl": ("rollout", _m("objective/kl",
        "mean sequence KL to the reference, sum_t (log pi - log ref) over response tokens (k1)",
        "mean_b sum_t m_t (log pi_old(y_t) - log ref(y_t)), the k1 estimate on the policy's own "
        "samples, before this step's update (with temperature T != 1: pi and ref both of "
        "logits / T)",
        "0 at step 1 (policy = reference), then grows and settles where reward gain and "
        "beta * KL balance: 2.0-2.7 nats late with beta = 0.2.",
        "growing without bound (19 nats by step 13 and 65-68 by step 40 with kl_coef 0): nothing "
        "holds the policy near the reference, expect reward hacking and broken language. Settling "
        "high (4.5-6.3 nats late with kl_coef 0.05, the held-out hidden score sagging to 0.73): "
        "the penalty is too weak for this model. Negative: possible per batch "
        "(k1 is an estimate), but a steadily negative mean means the samples do not come from the "
        "policy being scored (old log-probs / reference mix-up, sampling with top-k/top-p, "
        "log-probs of another temperature than the sampling one).")),
    "kl_coef": ("rollout", _m("objective/kl_coef",
        "beta, the weight of the per-token KL penalty this step (changes if adaptive)",
        "fixed: beta = kl_coef; adaptive (target_kl set): e = clip(kl / target - 1, -0.2, 0.2), "
        "beta <- beta * (1 + e * min(B / kl_horizon, 1)) after every step (the cap keeps beta > 0)",
        "constant 0.2 on the tiny profile (fixed controller); adaptive: drifts slowly towards the "
        "value that keeps kl near target_kl.",
        "adaptive beta growing every step: kl stays above target (the reward pulls harder than the "
        "penalty; the target may be too low). Shrinking to ~0: kl stays below target, the penalty "
        "no longer constrains anything.",
        possible=NON_NEGATIVE)),
    "entropy": ("rollout", _m("objective/token_entropy",
        "mean per-token entropy of the policy on its own responses (nats; at temperature T, of the "
        "sampling distribution softmax(logits / T))",
        "masked mean of H_t = -sum_v pi(v | context) log pi(v | context) at each response position",
        "1.6-1.76 nats in the first steps, 1.54-1.67 late (close to the tiny SFT model's "
        "own level).",
        "collapsing towards 0: mode collapse, every prompt gets the same response (lower the "
        "learning rate, raise kl_coef, or add entropy_coef). Climbing well above the start: the "
        "policy is becoming noisier than the SFT model, often with KL rising too (with kl_coef 0 "
        "it climbs to 2.0-2.1 as the policy drifts to odd tokens the reward model over-rates).",
        possible=ENTROPY)),
    "response_length": ("rollout", _m("completions/mean_length",
        "mean response length in tokens, EOS included",
        "mean_b sum_t m_t",
        "about 17 tokens at the start, growing to 22-24 late (the reward model likes longer "
        "reviews); max_new_tokens is 40.",
        "drifting to max_new_tokens (with eos_fraction falling): length hacking, the reward model "
        "pays for length; try missing_eos_penalty or a length-aware reward. Collapsing to 1-2 "
        "tokens: a shorter response returns more, because the KL penalty is paid per token (a "
        "policy far from the reference pays less the sooner it stops) or because the reward "
        "model scores short responses well; a negative score alone is no reason, as every "
        "response is paid its score once.",
        possible=NON_NEGATIVE)),
    "eos_fraction": ("rollout", _m("completions/eos_fraction",
        "fraction of responses that ended with EOS before max_new_tokens",
        "mean_b [response b contains EOS]",
        "0.97-1.0: nearly every response ends on its own.",
        "falling: responses run into max_new_tokens, their last token is not an EOS and the reward "
        "model reads an unfinished text (length hacking, or a broken EOS/pad setup: pad must "
        "differ from EOS).",
        possible=SHARE)),
    "score_std": ("rollout", _m("objective/scores_std",
        "spread (standard deviation) of the reward-model scores within the batch",
        "sqrt(mean_b (s_b - mean_b s_b)^2), over the batch's B responses",
        "1.16-1.78 in the first 5 steps, narrowing to 0.28-0.84 late as the policy settles on what "
        "the reward model likes.",
        "0: every response got the same reward, so the reward teaches nothing (a reward function "
        "that returns a constant, e.g. 0.0 after a parsing failure; a saturated reward model).",
        possible=NON_NEGATIVE)),
    "distinct_responses": ("rollout", _m("completions/distinct_share",
        "share of the batch's responses that are distinct texts",
        "number of distinct decoded responses / B",
        "0.97-1.0: at most one repeated response in a batch of 64.",
        "falling towards 1/B: the policy gives (nearly) every prompt the same reply, "
        "mode collapse.",
        possible=SHARE)),
    "score_clipped": ("rollout", _m("objective/scores_clipped",
        "share of the batch's scores at or beyond +-score_clip (logged only when "
        "score_clip is set)",
        "mean_b [|s_b| >= score_clip]",
        "not logged on the tiny profile (score_clip None); near 0 when the clip only "
        "trims outliers.",
        "half the batch or more: the reward is saturated, clipped responses all look equally good "
        "(raise score_clip; check what the policy found).",
        possible=SHARE)),
    "explained_variance": ("rollout", _m("val/explained_variance",
        "1 - Var[returns - values] / Var[returns] over real tokens (critic quality)",
        "1 - Var_t[G_t - V_t] / Var_t[G_t] over all real tokens of the batch (V: the critic before "
        "this step's update)",
        "about 0 at step 1 (untrained critic), 0.2-0.55 within a few steps, then noisy between "
        "0.28 and 0.76 late as the policy keeps moving.",
        "staying <= 0: the critic predicts nothing, advantages are pure Monte-Carlo noise (value "
        "learning rate too low, value head not warmed up, values masked wrongly). Near 1 with "
        "a falling score: suspicious, check that values do not see the future (alignment of "
        "V_t with the state before token t).",
        possible=AT_MOST_ONE)),
    "return_mean": ("rollout", _m("val/return_mean",
        "mean GAE return over real tokens (the critic's regression target)",
        "masked mean of G_t = A_t (raw, before whitening) + V_t",
        "a little below the score (the KL penalty still to come is subtracted): about 0.3 at step "
        "1, 2.75-2.92 late.",
        "far from score - beta * kl (its upper end): the reward shaping or GAE is off (score not "
        "on the last real token, gamma/lambda misset).")),
    "value_mean": ("rollout", _m("val/value_mean",
        "mean old value V(s_t) over real tokens",
        "masked mean of V_t from the value adapter + value head, before this step's update",
        "starts near 0 (small head init) and is within ~0.1 of return_mean after ~10 steps.",
        "lagging far behind return_mean for many steps: the critic learns too slowly (value_lr, "
        "value_warmup_steps). Exploding: value learning rate too high or returns not bounded.")),
    # ------------------------------------------------------------------ updates
    "policy_loss": ("update", _m("loss/policy_avg",
        "clipped surrogate loss -min(r A, clip(r) A), masked mean",
        "masked mean of -min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t), A whitened",
        "small and slightly negative: -0.024 to -0.005 (whitened advantages average 0, so its "
        "level says little; the trend within an update does).",
        "large in size (|loss| > 0.1 with whitened advantages): the ratios moved far from 1, see "
        "clipfrac and approx_kl. Exactly 0 every step: no advantages (reward constant) or nothing "
        "trains.")),
    "clipfrac": ("update", _m("policy/clipfrac_avg",
        "fraction of response tokens where the clipped term is selected (ratio past the band on "
        "the side the advantage favours: gradient 0)",
        "masked mean of [clip(rho_t) A_t < rho_t A_t], the tokens where the clipped term is chosen "
        "and the gradient is zero: the convention of TRL (`pg_losses2 > pg_losses`, on the negated "
        "terms), trlx and OpenRLHF (`torch.lt(surr2, surr1)`). CleanRL, Stable-Baselines3 and "
        "OpenAI baselines log another share under the same name, the ratios outside the band, "
        "[|rho_t - 1| > eps] (CleanRL: `((ratio - 1.0).abs() > args.clip_coef)`). It also counts "
        "the tokens past the band on the side the advantage wants undone, which keep their "
        "gradient, so on the same batch it is never lower than this one and can be well above it",
        "0.016-0.064 (a few percent: the update moves the policy, the clip rarely has to stop "
        "it); with kl_coef 0 it rises to 0.08-0.11 as the policy runs away.",
        "above ~0.2-0.3: the policy moves too far per update, most tokens get no gradient (lower "
        "the learning rate or ppo_epochs, or use a smaller minibatch count). Exactly 0 at every "
        "minibatch: the policy does not change (no gradient reaches the adapter).",
        possible=SHARE)),
    "approx_kl": ("update", _m("policy/approxkl_avg",
        "mean (rho - 1) - log rho, rho the ratio, between the updated and the sampling policy "
        "(k3 estimate)",
        "masked mean of (rho_t - 1) - log rho_t, an estimate of KL(pi_old || pi) that is "
        "never negative",
        "0.003-0.03 nats per token, mostly 0.004-0.01 (0.02-0.05 with kl_coef 0).",
        "above ~0.05-0.1 per token: each update is a big jump, PPO's trust region is not holding "
        "(lower the learning rate or the epochs). Not the KL to the reference: that is `kl`.")),
    "value_loss": ("update", _m("loss/value_avg",
        "clipped value loss 0.5 * max((V - G)^2, (clip(V) - G)^2), G the GAE return, masked mean",
        "0.5 * masked mean of max((V_t - G_t)^2, (V_old,t + clip(V_t - V_old,t, -c, c) - G_t)^2), "
        "c = value_clip",
        "0.3-0.85 in the first 5 steps (the critic starts at 0, returns near the score), "
        "0.016-0.09 late.",
        "not falling: the critic does not fit the returns (value learning rate, a value adapter "
        "that is not trained, masks). Rising late with vf_clipfrac high: the returns moved faster "
        "than value_clip lets the critic follow.",
        possible=NON_NEGATIVE)),
    "vf_clipfrac": ("update", _m("val/clipfrac_avg",
        "fraction of tokens where value clipping was active",
        "masked mean of [(V_clip,t - G_t)^2 > (V_t - G_t)^2], the tokens where the clipped error "
        "is used (0 when value_clip is None)",
        "0.3-0.5 in the first steps (the critic chases returns far above its start), 0.002-0.044 "
        "late.",
        "staying high: value_clip is too tight for the scale of the returns, the critic cannot "
        "catch up (raise value_clip or set it to None).",
        possible=SHARE)),
    "policy_grad_norm": ("update", _m("policy/grad_norm_avg",
        "policy gradient norm before clipping to max_grad_norm",
        "||grad of the policy loss w.r.t. the policy adapter||_2 before clip_grad_norm_",
        "0.07-0.18, well below max_grad_norm = 1 (0.3-0.6 with kl_coef 0).",
        "regularly above max_grad_norm: every step is clipped, the effective learning rate is "
        "lower than set; spikes: a few tokens with huge advantages or ratios. NaN/inf stops the "
        "run (exit status 3 from the command line). Exactly 0 at every step after the value "
        "warm-up (whose steps log 0): the policy never trains (a loss times 0, all-zero "
        "advantages).",
        possible=NON_NEGATIVE)),
    "value_grad_norm": ("update", _m("val/grad_norm_avg",
        "value gradient norm before clipping to max_grad_norm",
        "||grad of vf_coef * value loss w.r.t. the value adapter and head||_2 before clipping",
        "1.7-2.7 in the first 5 steps (clipped to 1), 0.35-1.2 late.",
        "staying far above max_grad_norm: the critic's targets are badly scaled (large returns; "
        "consider score_clip or reward normalisation).",
        possible=NON_NEGATIVE)),
    "entropy_update": ("update", _m("policy/entropy_avg",
        "mean policy entropy seen during the update epochs",
        "masked mean of H_t computed by the updating policy in each minibatch, averaged",
        "within ~0.01 of `entropy` (the policy changes little within one step).",
        "far from `entropy`: the policy changes a lot inside one step (see approx_kl).",
        possible=ENTROPY)),
    "ptx_loss": ("update", _m("loss/ptx_avg",
        "next-token loss of the policy on SFT text (only when ptx_coef > 0)",
        "mean cross-entropy of the policy on a minibatch of SFT texts (shifted labels, padding "
        "ignored); added to the policy loss as ptx_coef * ptx_loss",
        "close to the SFT model's own loss on its corpus, rising a little as PPO moves the policy.",
        "rising steadily: PPO is pulling the policy away from fluent text (raise ptx_coef or "
        "kl_coef).")),
    "first_ratio": ("update", _m("policy/first_ratio",
        "mean probability ratio of the first minibatch of the first epoch (before any update)",
        "ratio_mean of the update's first minibatch: masked mean of "
        "exp(log pi(y_t) - log pi_old(y_t))",
        "1 up to float rounding: within 1.2e-7 of 1 at every step of the 60 (float32); within "
        "2.3e-4 on a bf16 GPU run (the doctor allows eps / 8 in a 16-bit dtype).",
        "not 1: the old log-probs are not the sampling policy's (the reference's used as old ones, "
        "dropout on, a temperature mismatch); the run doctor's first_ratio_not_one.",
        possible=NON_NEGATIVE)),
    "eos_in_mask": ("update", _m("policy/eos_in_mask",
        "share of the sampled EOS tokens (each response's first) that the update's loss mask keeps",
        "mean over responses that stopped at EOS of m_t at their first EOS (1.0 if none stopped)",
        "1 at every step (the mask is built up to and including the first EOS; counted exactly).",
        "below 1: the mask hides EOS (pad == EOS with a 'not padding' mask), the stop decision is "
        "never trained; the run doctor's eos_masked.",
        possible=SHARE)),
    # ------------------------------------------------------------------ per minibatch
    "epoch": ("minibatch", _m("",
        "index of the PPO epoch (pass over the experience batch) this minibatch belongs to",
        "0 .. ppo_epochs - 1",
        "",
        "",
        possible=NON_NEGATIVE)),
    "minibatch": ("minibatch", _m("",
        "index of the minibatch within its epoch",
        "0 .. rollout_batch_size / mini_batch_size - 1",
        "",
        "",
        possible=NON_NEGATIVE)),
    "ratio_mean": ("minibatch", _m("",
        "mean probability ratio pi_new / pi_old over real tokens",
        "masked mean of rho_t = exp(log pi(y_t) - log pi_old(y_t))",
        "1 at the first minibatch of the first epoch (nothing has changed yet; up to float "
        "rounding), then within ~0.01 of 1.",
        "not 1 at the very first minibatch: the old log-probs do not come from the policy that "
        "sampled (e.g. the reference's log-probs used as old ones, a bug in a widely copied "
        "script), or dropout is on. Far from 1 later: too large updates.",
        possible=NON_NEGATIVE)),
    "ratio_max": ("minibatch", _m("",
        "largest probability ratio pi_new / pi_old in the minibatch",
        "max over real tokens of rho_t",
        "1 at the first minibatch, below ~1.5-2 afterwards.",
        "huge (10 and more): a token whose probability exploded; the clip stops its gradient, but "
        "the update is unstable.",
        possible=NON_NEGATIVE)),
    # ------------------------------------------------------------------ evaluation
    "eval_score": ("eval", _m("eval/scores",
        "mean reward-model score on held-out prompts (fixed sampling seed)",
        "as `score`, on n_eval_prompts prompts of data/prompts_test.jsonl, one sample each",
        "close to `score` of the same step (2.8-3.05 at steps 10-60).",
        "well below `score`: the policy fits the training prompts only.")),
    "eval_hidden_score": ("eval", _m("eval/hidden_scores",
        "mean hidden ground-truth score on held-out prompts",
        "as `hidden_score`, on the held-out prompts",
        "0.87-1.01 at steps 10-60 (with kl_coef 0.05: 0.73-1.01, ending at 0.73).",
        "falling across evaluations while eval_score rises: over-optimisation (with kl_coef 0: "
        "0.02, -0.80, -2.42, -2.84 at steps 10-40 while eval_score rises from 3.15 to 3.65).")),
    "eval_kl": ("eval", _m("eval/kl",
        "mean sequence KL to the reference on held-out prompts",
        "mean over prompts of sum_t (log pi(y_t) - log ref(y_t)) on fresh samples (k1)",
        "1.9-2.9 nats at steps 10-60 (beta = 0.2; 4.5-6.5 with beta = 0.05).",
        "as `kl`: growing without bound means nothing holds the policy near the reference (with "
        "kl_coef 0: 15, 31, 56, 65 nats at steps 10-40).")),
    "eval_response_length": ("eval", _m("eval/mean_length",
        "mean response length on held-out prompts",
        "mean over prompts of sum_t m_t",
        "21.4-24.8 tokens at steps 10-60.",
        "as `response_length`.",
        possible=NON_NEGATIVE)),
    # ------------------------------------------------------------------ timing
    "time_rollout": ("timing", _m("time/rollout",
        "seconds of the rollout phase: generate, score, reference and value passes, GAE",
        "wall-clock seconds (time.perf_counter) of the rollout (`iteration.rollout`)",
        "0.35-1.7 s per step on one CPU thread (it grows with response_length and with the "
        "machine's load).",
        "growing much faster than response_length: the machine is busy, or generation lost its "
        "KV cache.",
        possible=NON_NEGATIVE)),
    "time_update": ("timing", _m("time/update",
        "seconds of the update epochs",
        "wall-clock seconds of PPOTrainer.update (ppo_epochs x minibatches of policy and value "
        "forward/backward/step)",
        "1.2-4 s per step on one CPU thread (about 75% of a step).",
        "",
        possible=NON_NEGATIVE)),
    "time_step": ("timing", _m("time/step",
        "seconds of the whole PPO iteration (rollout + update)",
        "time_rollout + time_update (evaluation and checkpoints are not included)",
        "1.5-5.8 s per step on one CPU thread (load average 2-4); several times that on a busy "
        "machine.",
        "",
        possible=NON_NEGATIVE)),
    "step": ("timing", _m("",
        "PPO iterations done so far (the x axis)",
        "PPOTrainer.step_count after this step (1 for the first step)",
        "",
        "",
        possible=STEPS)),
}
