"""The PPO loop: an outer loop over experience batches, an inner loop of epochs over shuffled minibatches.

    trainer = PPOTrainer(config, shared, tokenizer, prompts)
    metrics = trainer.step()          # one iteration: rollouts, then config.ppo_epochs of updates
    history = trainer.train()         # config.total_steps iterations, progress bar, checkpoints

The policy adapter and the value adapter (with its head) have one Adam optimiser each, built from
parameters chosen by adapter name. Each loss is computed and back-propagated with its own adapter
active, so no adapter switch happens between a forward and its backward.
Under `accelerate launch` each process samples its own prompts and gradients are averaged across
processes before every optimiser step (plain data parallelism). A NaN/inf seen by one process stops
every process at the same point (`finite_guard.collective_stop`), so none waits forever in an
all-reduce; weights are checked after every optimiser step, and before a checkpoint is written the
updated policy and critic must give finite outputs on their latest batch.

Precision: the frozen base may be bf16 or fp16 (it is never updated); the trained weights (LoRA
matrices, value head) are float32 masters. When the base is float16 (a T4: `precision.compute_dtype`),
each optimiser gets a `torch.amp.GradScaler`: the loss is multiplied by the scale S before backward,
the gradients are divided by S (`unscale_`) before the norm clip, and a step whose gradients
overflowed is skipped and S halved (`scaler.step`, `scaler.update`). Such an overflow is expected
now and then under fp16 and is not a NaN stop; a non-finite loss or weight still is, and so is a
gradient that stays non-finite until S falls below `precision.MIN_LOSS_SCALE`. With bf16 or float32
the scalers are disabled pass-throughs: the same numbers as without them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhf_helpers.kl import AdaptiveKLController, FixedKLController
from rlhf_helpers.losses import lm_loss, policy_loss, value_loss
from rlhf_helpers.masked import masked_mean
from rlhf_helpers.ppo.config import PPOConfig
from rlhf_helpers.ppo.evaluation import ScoreFn, evaluate_policy
from rlhf_helpers.ppo.experience import (
    Experience,
    NonFiniteError,
    RewardFn,
    check_all_finite,
    collect_experience,
    explained_variance,
    non_finite_stops_run,
    tokenize_prompts,
)
from rlhf_helpers.ppo.finite_guard import check_finite_parameters, collective_stop
from rlhf_helpers.ppo.shared_model import SharedLoRAModel
from rlhf_helpers.precision import MIN_LOSS_SCALE, make_grad_scaler, needs_grad_scaler


def default_hidden_score_fn(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """The review world's hidden ground-truth scorer."""
    from rlhf_helpers.world.scorer import hidden_scores

    return hidden_scores(list(prompts), list(responses))


def make_kl_controller(config: PPOConfig) -> FixedKLController | AdaptiveKLController:
    """Fixed beta, or the adaptive controller when config.target_kl is set."""
    if config.target_kl is None:
        return FixedKLController(config.kl_coef)
    return AdaptiveKLController(config.kl_coef, config.target_kl, config.kl_horizon)


@dataclass
class Minibatch:
    """The rows of one minibatch, cut to the columns where at least one of them has a real token."""

    sequences: torch.Tensor  #: (b, p + r) prompt then response ids
    attention_mask: torch.Tensor  #: (b, p + r) 1 on real tokens
    context_length: int  #: p, prompt width after the cut
    mask: torch.Tensor  #: (b, r) 1 on real response tokens
    old_logprobs: torch.Tensor  #: (b, r) log-probs of the policy that sampled
    old_values: torch.Tensor  #: (b, r) values of the rollout
    advantages: torch.Tensor  #: (b, r)
    returns: torch.Tensor  #: (b, r)


def trim_minibatch(batch: Experience, rows: torch.Tensor) -> Minibatch:
    """The experience rows `rows`, without the columns that are padding in every one of them.

    A minibatch's longest prompt and longest response are often shorter than the whole batch's.
    Dropping all-padding columns changes no real token's output: the ones on the left are masked
    keys (position ids are counted over real tokens), the ones on the right come after every real
    token in causal attention, and every per-token quantity there has mask 0.
    """
    attn = batch.attention_mask[rows]  # (b, P + R)
    P = batch.context_length
    real = attn.bool().any(dim=0)  # (P + R,)
    first = min(int(real.int().argmax()), P - 1)  # keep the last prompt column: it predicts token 0
    last = max(attn.shape[1] - 1 - int(real.flip(0).int().argmax()), P)  # at least one response column
    r = last + 1 - P
    return Minibatch(
        sequences=batch.sequences[rows, first : last + 1], attention_mask=attn[:, first : last + 1],
        context_length=P - first, mask=batch.mask[rows, :r], old_logprobs=batch.old_logprobs[rows, :r],
        old_values=batch.values[rows, :r], advantages=batch.advantages[rows, :r],
        returns=batch.returns[rows, :r])


class PPOTrainer:
    """PPO with one shared base model: `step()` runs one iteration and returns its metrics."""

    def __init__(
        self,
        config: PPOConfig,
        model: SharedLoRAModel,
        tokenizer: Any,
        prompts: Sequence[str],
        reward_fn: RewardFn | None = None,
        hidden_score_fn: ScoreFn | None = default_hidden_score_fn,
        ptx_texts: Sequence[str] | None = None,
        accelerator: Any = None,
    ) -> None:
        if not isinstance(config, PPOConfig):
            raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts must be a non-empty list of strings")
        if config.ptx_coef > 0 and not ptx_texts:
            raise ValueError("ptx_texts must be given when config.ptx_coef > 0")
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.prompts = list(prompts)
        self.reward_fn = reward_fn
        self.hidden_score_fn = hidden_score_fn
        self.ptx_texts = list(ptx_texts) if ptx_texts else []
        self.accelerator = accelerator
        self.process_index = accelerator.process_index if accelerator is not None else 0
        self.num_processes = accelerator.num_processes if accelerator is not None else 1
        # foreach: one batched kernel per Adam operation over all tensors (same numbers as the
        # per-tensor loop, which is torch's default on the CPU)
        self.policy_optimizer = torch.optim.Adam(model.policy_parameters(), lr=config.policy_lr, foreach=True)
        self.value_optimizer = torch.optim.Adam(model.value_parameters(), lr=config.value_lr, foreach=True)
        # fp16 base: loss scaling per optimiser (each has its own gradients and overflows); else pass-throughs
        use_scaler = needs_grad_scaler(model)
        self.policy_scaler = make_grad_scaler(model.device.type, use_scaler)  #: loss scaler of the policy steps
        self.value_scaler = make_grad_scaler(model.device.type, use_scaler)  #: loss scaler of the critic steps
        #: optimiser steps skipped because their fp16 gradients overflowed, by "policy" / "value"
        self.overflow_skips = {"policy": 0, "value": 0}
        self.kl_controller = make_kl_controller(config)
        self.step_count = 0  #: PPO iterations done so far
        self.history: list[dict[str, float]] = []  #: metrics of every iteration so far
        self.last_batch: Experience | None = None  #: the experience batch of the latest step
        #: per-minibatch stats of the latest update, in order: epoch, minibatch, ratio_mean, clipfrac...
        self.last_update_stats: list[dict[str, float]] = []
        self.last_checkpoint: str | None = None  #: folder of the newest checkpoint this trainer wrote

    # ------------------------------------------------------------------ randomness
    def _step_seed(self) -> int:
        """Seed of this step's randomness: a function of (seed, step, process) only, so the same seed
        gives the same curve whatever the caller did with the global RNG, and a resumed run draws the
        same prompts, samples and shuffles without a saved data-loader state."""
        return (self.config.seed * 1_000_003 + self.step_count) * 64 + self.process_index

    def _step_generator(self) -> torch.Generator:
        """Prompt order and minibatch shuffles of this step."""
        return torch.Generator().manual_seed(self._step_seed())

    def sample_prompts(self, generator: torch.Generator) -> list[str]:
        n = self.config.rollout_batch_size
        if n <= len(self.prompts):
            order = torch.randperm(len(self.prompts), generator=generator)[:n]
        else:
            order = torch.randint(len(self.prompts), (n,), generator=generator)
        return [self.prompts[i] for i in order.tolist()]

    # ------------------------------------------------------------------ one iteration
    def step(self) -> dict[str, float]:
        """Rollouts, then the update epochs; returns this iteration's metrics (and appends them to history)."""
        config = self.config
        generator = self._step_generator()
        start = time.perf_counter()
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), collective_stop(self.accelerator), \
                non_finite_stops_run(self.step_count):
            torch.manual_seed(self._step_seed())  # sampling draws from the step's seed only
            batch = collect_experience(self.model, self.tokenizer, self.sample_prompts(generator), config,
                                       kl_coef=self.kl_controller.value, reward_fn=self.reward_fn,
                                       step=self.step_count)
        rollout_seconds = time.perf_counter() - start
        start = time.perf_counter()
        update_stats = self.update(batch, generator)
        update_seconds = time.perf_counter() - start
        self.last_batch = batch
        metrics = self._rollout_metrics(batch)
        metrics.update(update_stats)
        metrics["time_rollout"] = rollout_seconds
        metrics["time_update"] = update_seconds
        metrics["time_step"] = rollout_seconds + update_seconds
        metrics = self._reduce(metrics)
        self.kl_controller.update(metrics["kl"], config.rollout_batch_size * self.num_processes)
        self.step_count += 1
        metrics["step"] = float(self.step_count)
        self.history.append(metrics)
        return metrics

    def _rollout_metrics(self, batch: Experience) -> dict[str, float]:
        mask = batch.mask
        seq_kl = ((batch.old_logprobs - batch.ref_logprobs) * mask).sum(dim=1)  # (B,) k1 sequence KL
        metrics = {
            "score": float(batch.scores.mean()),
            "kl": float(seq_kl.mean()),
            "kl_coef": float(self.kl_controller.value),
            "entropy": float(masked_mean(batch.entropy, mask)),
            "response_length": float(mask.sum(dim=1).mean()),
            "eos_fraction": float(batch.ended_with_eos.float().mean()),
            "explained_variance": explained_variance(batch.values, batch.returns, mask),
            "return_mean": float(masked_mean(batch.returns, mask)),
            "value_mean": float(masked_mean(batch.values, mask)),
        }
        if self.hidden_score_fn is not None:
            hidden = self.hidden_score_fn(batch.prompts, batch.responses)
            metrics["hidden_score"] = sum(hidden) / len(hidden)
        return metrics

    def _reduce(self, metrics: dict[str, float]) -> dict[str, float]:
        """Mean of each metric over processes (identity on one process)."""
        if self.num_processes == 1:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], device=self.model.device, dtype=torch.float64)
        values = self.accelerator.reduce(values, reduction="mean")
        return dict(zip(keys, values.tolist(), strict=True))

    def _sync_and_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                       params: list[torch.nn.Parameter], what: str) -> float:
        """Average gradients across processes, unscale them, clip their norm, step, check the new
        weights (`what` names them); returns the pre-clip norm (0.0 for a step skipped on overflow).

        The (scaled) gradients are averaged before `unscale_`, so every process sees the same
        overflow and keeps the same loss scale.
        """
        if self.num_processes > 1:
            for param in params:
                if param.grad is not None:
                    param.grad = self.accelerator.reduce(param.grad, reduction="mean")
        # every process holds the same averaged gradients and weights, but the stop is voted anyway:
        # the next collective operation must never meet a process that has left
        with collective_stop(self.accelerator):
            scaler.unscale_(optimizer)  # g = g_scaled / S (a no-op without fp16)
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
            if not bool(torch.isfinite(norm)):
                optimizer.zero_grad(set_to_none=True)  # never step on a NaN/inf gradient
                if not self._fp16_overflow(scaler, optimizer, what):
                    check_all_finite("gradient norm", norm, self.step_count)
                return 0.0
            scaler.step(optimizer)  # optimizer.step(), the gradients being finite
            scaler.update()  # S doubles after GRAD_SCALER_GROWTH_INTERVAL finite steps in a row
            optimizer.zero_grad(set_to_none=True)
            check_finite_parameters(what, params, self.step_count)
        return float(norm)

    def _fp16_overflow(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, what: str) -> bool:
        """After a non-finite gradient norm: True if it counts as an fp16 overflow (the step is
        skipped, the scale S halved), False if it is a real NaN stop (no scaler, or S already below
        MIN_LOSS_SCALE: the unscaled gradient itself is not finite)."""
        if not scaler.is_enabled() or scaler.get_scale() < MIN_LOSS_SCALE:
            return False
        scaler.step(optimizer)  # skips: unscale_ recorded the inf/NaN
        scaler.update()  # S <- S / 2
        self.overflow_skips[what] += 1
        return True

    def _ptx_loss(self, generator: torch.Generator) -> torch.Tensor:
        """Next-token loss of the policy on a minibatch of SFT texts (keeps it close to the pretraining data)."""
        picks = torch.randint(len(self.ptx_texts), (self.config.mini_batch_size,), generator=generator)
        texts = [self.ptx_texts[i] for i in picks.tolist()]
        max_len = self.config.max_prompt_length + self.config.max_new_tokens
        ids, attn = tokenize_prompts(self.tokenizer, texts, max_len, self.model.device)  # (b, L)
        labels = ids.masked_fill(attn == 0, -100)  # (b, L): no loss on padding
        logits = self.model.policy_logits(ids, attn)  # (b, L, V)
        return lm_loss(logits, labels, ignore_index=-100)

    def update(self, batch: Experience, generator: torch.Generator) -> dict[str, float]:
        """config.ppo_epochs passes of shuffled minibatches: clip loss (+ entropy bonus, + ptx) on the
        policy adapter, clipped value loss on the value adapter and head. Returns mean stats.

        The two adapters share no trainable parameter and neither loss reads the other's output, so
        all policy steps run first and then all value steps, over the same minibatches in the same
        order: the same updates as alternating them, with two adapter switches instead of two per
        minibatch. Each minibatch is cut to the columns holding a real token of one of its rows.
        """
        config = self.config
        B = len(batch)
        self.last_update_stats = []
        train_policy = self.step_count >= config.value_warmup_steps
        with collective_stop(self.accelerator):
            check_all_finite("advantages", batch.advantages, self.step_count)
            check_all_finite("returns", batch.returns, self.step_count)
        minibatches: list[tuple[int, int, torch.Tensor]] = []  # (epoch, index, rows)
        policy_stats: list[dict[str, float]] = []
        for epoch in range(config.ppo_epochs):
            order = torch.randperm(B, generator=generator)  # drawn before this epoch's ptx picks
            for first in range(0, B, config.mini_batch_size):
                rows = order[first : first + config.mini_batch_size].to(batch.sequences.device)
                minibatches.append((epoch, first // config.mini_batch_size, rows))
                policy_stats.append(self._policy_step(trim_minibatch(batch, rows), generator, train_policy))
        value_stats = [self._value_step(trim_minibatch(batch, rows)) for _, _, rows in minibatches]

        sums: dict[str, float] = {}
        for (epoch, index, _), policy, value in zip(minibatches, policy_stats, value_stats, strict=True):
            stats = {
                "policy_loss": policy["policy_loss"], "clipfrac": policy["clipfrac"],
                "approx_kl": policy["approx_kl"], "value_loss": value["value_loss"],
                "vf_clipfrac": value["vf_clipfrac"], "policy_grad_norm": policy["policy_grad_norm"],
                "value_grad_norm": value["value_grad_norm"], "entropy_update": policy["entropy_update"],
            }
            if "ptx_loss" in policy:
                sums["ptx_loss"] = sums.get("ptx_loss", 0.0) + policy["ptx_loss"]
            for key, number in stats.items():
                sums[key] = sums.get(key, 0.0) + number
            self.last_update_stats.append({
                "epoch": float(epoch), "minibatch": float(index),
                "ratio_mean": policy["ratio_mean"], "ratio_max": policy["ratio_max"], **stats})
        return {key: number / len(minibatches) for key, number in sums.items()}

    def _policy_step(self, mb: Minibatch, generator: torch.Generator, train_policy: bool) -> dict[str, float]:
        """One policy-adapter step on a minibatch: L = L_clip - c_ent * H + c_ptx * L_lm."""
        config = self.config
        stats: dict[str, float] = {}
        # all processes agree before the gradient all-reduce; a "must be finite" ValueError of the
        # maths core anywhere in the block counts as a NaN stop too
        with collective_stop(self.accelerator), non_finite_stops_run(self.step_count):
            # without an entropy bonus the entropy is only reported: no backward through it
            logp, entropy = self.model.policy_logprobs(
                mb.sequences, mb.attention_mask, mb.context_length, with_entropy=True,
                entropy_grad=config.entropy_coef > 0, temperature=config.temperature)  # (b, r), (b, r)
            pg_loss, pg_stats = policy_loss(logp.float(), mb.old_logprobs, mb.advantages, mb.mask,
                                            clip_eps=config.clip_eps)
            mean_entropy = masked_mean(entropy.float(), mb.mask)
            loss = pg_loss - config.entropy_coef * mean_entropy
            if config.ptx_coef > 0:
                ptx = self._ptx_loss(generator)
                loss = loss + config.ptx_coef * ptx
                stats["ptx_loss"] = float(ptx.detach())
            check_all_finite("policy loss", loss.detach(), self.step_count)
        if train_policy:
            self.policy_scaler.scale(loss).backward()  # d(S L) (S = 1 without fp16)
            norm = self._sync_and_step(self.policy_optimizer, self.policy_scaler,
                                       self.model.policy_parameters(), "policy")
        else:  # value warm-up: the critic learns the returns first, the policy waits
            norm = 0.0
        stats.update({
            "policy_loss": float(pg_loss.detach()), "clipfrac": float(pg_stats["clipfrac"]),
            "approx_kl": float(pg_stats["approx_kl"]), "policy_grad_norm": norm,
            "entropy_update": float(mean_entropy.detach()),
            "ratio_mean": float(pg_stats["ratio_mean"]), "ratio_max": float(pg_stats["ratio_max"]),
        })
        return stats

    def _value_step(self, mb: Minibatch) -> dict[str, float]:
        """One critic step: L_V = mean max((V - R)^2, (clip(V, V_old +- eps_v) - R)^2) / 2."""
        config = self.config
        # all processes agree before the gradient all-reduce (as in _policy_step)
        with collective_stop(self.accelerator), non_finite_stops_run(self.step_count):
            new_values = self.model.values(mb.sequences, mb.attention_mask, mb.context_length).float()  # (b, r)
            check_all_finite("values", new_values.detach() * mb.mask, self.step_count)
            v_loss, v_stats = value_loss(new_values, mb.old_values, mb.returns, mb.mask,
                                         clip_range=config.value_clip)
            check_all_finite("value loss", v_loss.detach(), self.step_count)
        self.value_scaler.scale(config.vf_coef * v_loss).backward()  # d(S c_vf L_V) (S = 1 without fp16)
        norm = self._sync_and_step(self.value_optimizer, self.value_scaler, self.model.value_parameters(),
                                   "value")
        return {"value_loss": float(v_loss.detach()), "vf_clipfrac": float(v_stats.get("vf_clipfrac", 0.0)),
                "value_grad_norm": norm}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, prompts: Sequence[str], seed: int = 12345,
                 batch_size: int | None = None) -> dict[str, float]:
        """Mean reward score, hidden score and sequence KL of one fresh sample per prompt (fixed seed,
        the caller's RNG untouched; no value pass, no GAE): `evaluation.evaluate_policy` with this
        run's sampling settings, in batches of `batch_size` (default config.eval_batch_size)."""
        config = self.config
        return evaluate_policy(self.model, self.tokenizer, prompts, max_prompt_length=config.max_prompt_length,
                               max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                               batch_size=config.eval_batch_size if batch_size is None else batch_size,
                               seed=seed, reward_fn=self.reward_fn, hidden_score_fn=self.hidden_score_fn)

    # ------------------------------------------------------------------ the run
    def train(self, steps: int | None = None, eval_prompts: Sequence[str] | None = None,
              callback: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
        """Run until `steps` more iterations (default: up to config.total_steps) are done.

        Shows a progress bar, evaluates every config.eval_every steps on `eval_prompts`, and writes a
        checkpoint to config.output_dir every config.save_every steps and at the end, each only after
        `check_weights_usable`. A NaN/inf stops the run with NonFiniteError (on every process at
        once); the last checkpoint written stays intact.
        """
        from tqdm.auto import tqdm

        from rlhf_helpers.ppo.checkpoint import save_checkpoint

        config = self.config
        target = self.step_count + steps if steps is not None else config.total_steps
        is_main = self.process_index == 0
        bar = tqdm(total=max(target - self.step_count, 0), desc="PPO",
                   disable=not (config.progress_bar and is_main))
        start_step = self.step_count
        try:
            while self.step_count < target:
                metrics = self.step()
                if eval_prompts is not None and config.eval_every and self.step_count % config.eval_every == 0:
                    with collective_stop(self.accelerator), non_finite_stops_run(self.step_count - 1):
                        metrics.update(self.evaluate(eval_prompts[: config.n_eval_prompts]))
                save = bool(config.output_dir) and (
                    self.step_count >= target or (config.save_every > 0 and self.step_count % config.save_every == 0))
                if save:  # before the step is logged: a step whose weights cannot be saved is not reported
                    with collective_stop(self.accelerator):
                        self.check_weights_usable()
                bar.update(1)
                bar.set_postfix(score=f"{metrics['score']:.2f}", kl=f"{metrics['kl']:.2f}",
                                hidden=f"{metrics.get('hidden_score', math.nan):.2f}")
                if callback is not None:
                    callback(metrics)
                if save and is_main:
                    self.last_checkpoint = str(save_checkpoint(self, config.output_dir))
        except NonFiniteError as error:
            bar.close()
            kept = (f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint
                    else "no checkpoint was written before it")
            raise NonFiniteError(f"{error}. Nothing was saved after the bad value; {kept}. Lower the "
                                 "learning rates, or set score_clip / max_grad_norm.") from None
        bar.close()
        if config.output_dir and is_main and self.step_count == start_step:  # no step ran: save as it is
            self.last_checkpoint = str(save_checkpoint(self, config.output_dir))
        return self.history

    @torch.no_grad()
    def check_weights_usable(self) -> None:
        """NonFiniteError unless the current policy and critic give finite outputs on the latest batch.

        Run before every checkpoint. Weights can all be finite and still be broken: one step with a
        learning rate of 1e12 leaves weights near 1e12, and the next forward overflows to NaN. Such
        weights must not become the "last good" checkpoint that a resumed run starts from.
        """
        batch = self.last_batch
        if batch is None:
            return
        seq, attn, P = batch.sequences, batch.attention_mask, batch.context_length
        real = batch.mask.bool()  # (B, R)
        step = self.step_count - 1  # the step whose update made these weights
        try:
            with non_finite_stops_run(step):
                logp = self.model.policy_logprobs(seq, attn, P, temperature=self.config.temperature)  # (B, R)
                values = self.model.values(seq, attn, P).float()  # (B, R)
            check_all_finite("policy log-probs", torch.where(real, logp.float(), 0.0), step)
            check_all_finite("values", torch.where(real, values, 0.0), step)
        except NonFiniteError as error:
            raise NonFiniteError(f"the weights after the update of PPO step {step} fail on their own batch "
                                 f"(checked before saving them): {error}") from None

    # ------------------------------------------------------------------ state for checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Optimisers, KL controller, step, metrics history and RNG states (weights are saved apart),
        and under fp16 the loss scalers (plain floats and ints: `weights_only` loading reads them)."""
        state: dict[str, Any] = {
            "step": self.step_count,
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "value_optimizer": self.value_optimizer.state_dict(),
            "kl_controller": dict(vars(self.kl_controller)),
            "history": list(self.history),
            "torch_rng": torch.random.get_rng_state(),
            "config": self.config.to_dict(),
        }
        if self.policy_scaler.is_enabled():
            state["policy_scaler"] = self.policy_scaler.state_dict()
            state["value_scaler"] = self.value_scaler.state_dict()
            state["overflow_skips"] = dict(self.overflow_skips)
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict`."""
        self.step_count = int(state["step"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        self.value_optimizer.load_state_dict(state["value_optimizer"])
        for name, scaler in (("policy_scaler", self.policy_scaler), ("value_scaler", self.value_scaler)):
            if state.get(name) and scaler.is_enabled():  # a checkpoint of an fp16 run, resumed in fp16
                scaler.load_state_dict(state[name])
        self.overflow_skips.update(state.get("overflow_skips", {}))
        for key, value in state["kl_controller"].items():
            setattr(self.kl_controller, key, value)
        self.history = list(state["history"])
        torch.random.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
