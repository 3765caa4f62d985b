"""The PPO loop: an outer loop over experience batches, an inner loop of epochs over shuffled minibatches.

    trainer = PPOTrainer(config, shared, tokenizer, prompts)
    metrics = trainer.step()          # one iteration: rollouts, then config.ppo_epochs of updates
    history = trainer.train()         # config.total_steps iterations, progress bar, checkpoints
    trainer.close()                   # frees config.output_dir for another run (so does the process's end)

`update` is the whole optimisation of one iteration in one loop (as cleanrl writes it): for each epoch, a shuffle;
for each minibatch, the policy's forward -> loss -> backward -> step, then the value's. The maths are functions
passed in (`pieces`: reward shaping, advantages, policy loss, value loss, even the update loop; the library's
by default), so a learner's own GAE, loss or loop can drive the training.

The policy adapter and the value adapter (with its head) have one `optim.AdapterOptimizer` each (Adam, gradient
all-reduce, clip, fp16 loss scaling, NaN checks of the new weights). Under `accelerate launch` each process samples
its own prompts and gradients are averaged across processes before every optimiser step (plain data parallelism).
Every stretch of work that ends in a collective operation runs inside `self.guard()`: a NaN/inf (or an error) on one
process stops every process at the same point, so none waits forever in an all-reduce. Before a checkpoint is
written the updated policy and critic must give finite outputs on their latest batch.

Precision: the frozen base may be bf16 or fp16 (never updated); the trained weights (LoRA matrices, value head)
are float32 masters, with a loss scaler per optimiser on an fp16 base (`optim`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlhf_helpers.core.checks import check_no_nan
from rlhf_helpers.core.gae import compute_gae
from rlhf_helpers.core.kl import AdaptiveKLController, FixedKLController
from rlhf_helpers.core.losses import lm_loss, policy_loss, value_loss
from rlhf_helpers.core.masked import masked_mean
from rlhf_helpers.core.printed import format_number
from rlhf_helpers.ppo.checkpoint import CheckpointSaveError, save_checkpoint
from rlhf_helpers.ppo.evaluation import ScoreFn, evaluate_policy
from rlhf_helpers.ppo.experience import Experience, eos_kept_share, rollout, rollout_metrics
from rlhf_helpers.ppo.guards import NonFiniteStop, check_outputs_finite, guard
from rlhf_helpers.ppo.minibatch import trim_minibatch
from rlhf_helpers.ppo.optim import AdapterOptimizer
from rlhf_helpers.ppo.pieces import (
    AdvantageFn,
    PolicyLossFn,
    ShapeRewardsFn,
    UpdateFn,
    ValueLossFn,
    check_piece,
    check_update_fn_settings,
    mean_update_stats,
    resolve_pieces,
    run_update_fn,
)
from rlhf_helpers.ppo.samples import RewardFn, tokenize_prompts
from rlhf_helpers.ppo.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.locks import FileLock, hold_run_folder
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.precision import needs_grad_scaler


def check_trainer_arguments(config: PPOConfig, model: SharedLoRAModel, prompts: Sequence[str],
                            ptx_texts: Sequence[str] | None, **pieces: Any) -> None:
    """ValueError naming the argument a trainer cannot start with."""
    if not isinstance(config, PPOConfig):
        raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a non-empty list of strings")
    if getattr(model, "lora", config.lora) != config.lora:
        raise ValueError(f"model's LoRA spec {model.lora} differs from config.lora {config.lora}: build the "
                         "model from the config (`build_shared_model`, or SharedLoRAModel(..., lora=config.lora))")
    if config.ptx_coef > 0 and not ptx_texts:
        raise ValueError("ptx_texts must be given when config.ptx_coef > 0")
    for name, fn in pieces.items():
        check_piece(name, fn)


class PPOTrainer:
    """PPO with one shared base model: `step()` runs one iteration and returns its metrics."""

    def __init__(
        self,
        config: PPOConfig,
        model: SharedLoRAModel,
        tokenizer: Any,
        prompts: Sequence[str],
        reward_fn: RewardFn | None = None,
        hidden_score_fn: ScoreFn | None = None,
        ptx_texts: Sequence[str] | None = None,
        accelerator: Any = None,
        *,
        shape_rewards_fn: ShapeRewardsFn | None = None,
        advantage_fn: AdvantageFn | None = compute_gae,
        policy_loss_fn: PolicyLossFn | None = policy_loss,
        value_loss_fn: ValueLossFn | None = value_loss,
        update_fn: UpdateFn | None = None,
    ) -> None:
        check_trainer_arguments(config, model, prompts, ptx_texts, shape_rewards_fn=shape_rewards_fn,
                                advantage_fn=advantage_fn, policy_loss_fn=policy_loss_fn,
                                value_loss_fn=value_loss_fn, update_fn=update_fn)
        if update_fn is not None:
            check_update_fn_settings(config, model, accelerator)
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.prompts = list(prompts)
        self.reward_fn = reward_fn
        self.hidden_score_fn = hidden_score_fn
        self.ptx_texts = list(ptx_texts) if ptx_texts else []
        self.accelerator = accelerator
        #: the maths of PPO as the caller gave them (`pieces`); None: the library's
        self.shape_rewards_fn, self.advantage_fn = shape_rewards_fn, advantage_fn or compute_gae
        self.policy_loss_fn, self.value_loss_fn = policy_loss_fn or policy_loss, value_loss_fn or value_loss
        #: the same, as the iteration calls them: the library's as they are, a caller's checked
        self.pieces = resolve_pieces(config.kl_kind, config.score_clip, shape_rewards_fn, advantage_fn,
                                     policy_loss_fn, value_loss_fn)
        #: the whole update loop of an iteration (`pieces.UpdateFn`); None: `update`'s own
        self.update_fn = update_fn
        self.process_index = accelerator.process_index if accelerator is not None else 0
        self.num_processes = accelerator.num_processes if accelerator is not None else 1
        fp16 = needs_grad_scaler(model)  # an fp16 base: loss scaling per optimiser
        #: Adam, loss scaler and overflow count of the policy adapter
        self.policy_opt = AdapterOptimizer("policy", model.policy_parameters(), config.policy_lr,
                                           config.max_grad_norm, fp16, model.device.type, accelerator)
        #: the same for the value adapter and its head
        self.value_opt = AdapterOptimizer("value", model.value_parameters(), config.value_lr,
                                          config.max_grad_norm, fp16, model.device.type, accelerator)
        #: fixed beta, or the adaptive controller when config.target_kl is set
        self.kl_controller = (FixedKLController(config.kl_coef) if config.target_kl is None
                              else AdaptiveKLController(config.kl_coef, config.target_kl, config.kl_horizon))
        self.step_count = 0  #: PPO iterations done so far
        self.history: list[dict[str, float]] = []  #: metrics of every iteration so far
        self.last_batch: Experience | None = None  #: the experience batch of the latest step
        #: per-minibatch stats of the latest update, in order: epoch, minibatch, ratio_mean, clipfrac...
        self.last_update_stats: list[dict[str, float]] = []
        self.last_checkpoint: str | None = None  #: folder of the newest checkpoint this trainer wrote
        self.output_lock: FileLock | None = None  #: the lock on config.output_dir, from `train` to `close`

    # ------------------------------------------------------------------ randomness
    def _step_seed(self) -> int:
        """Seed of this step's randomness: a function of (seed, step, process) only, so the same seed
        gives the same curve whatever the caller did with the global RNG, and a resumed run draws the
        same prompts, samples and shuffles without a saved data-loader state."""
        return (self.config.seed * 1_000_003 + self.step_count) * 64 + self.process_index

    def _step_generator(self) -> torch.Generator:
        """Prompt order and minibatch shuffles of this step."""
        return torch.Generator().manual_seed(self._step_seed())

    def guard(self, step: int | None = None, drop_gradients: bool = False) -> Any:
        """The one wrapper of every stretch of work that ends in a collective operation: a NaN/inf met in it
        stops the run (NonFiniteStop naming the step), on every process at once (`guards.guard`).
        `drop_gradients`: if it raises, the gradients back-propagated in it are dropped, never stepped on."""
        optimizers = (self.policy_opt.optimizer, self.value_opt.optimizer) if drop_gradients else ()
        return guard(self.accelerator, self.step_count if step is None else step, optimizers)

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
        with torch.random.fork_rng(devices=devices), self.guard():
            torch.manual_seed(self._step_seed())  # sampling draws from the step's seed only
            batch = rollout(self.model, self.tokenizer, self.sample_prompts(generator), config,
                            self.kl_controller.value, self.reward_fn, self.pieces)
        rollout_seconds = time.perf_counter() - start
        start = time.perf_counter()
        update_stats = self.update(batch, generator)
        update_seconds = time.perf_counter() - start
        self.last_batch = batch
        metrics = rollout_metrics(batch, self.kl_controller.value, self.hidden_score_fn, config.score_clip)
        metrics.update(update_stats)
        # the share of sampled EOS tokens the update's mask trained on
        metrics["eos_in_mask"] = eos_kept_share(batch, self.model.eos_token_id)
        metrics["time_rollout"] = rollout_seconds
        metrics["time_update"] = update_seconds
        metrics["time_step"] = rollout_seconds + update_seconds
        metrics = self._reduce(metrics)
        self.kl_controller.update(metrics["kl"], config.rollout_batch_size * self.num_processes)
        self.step_count += 1
        metrics["step"] = float(self.step_count)
        self.history.append(metrics)
        return metrics

    def _reduce(self, metrics: dict[str, float]) -> dict[str, float]:
        """Mean of each metric over processes (identity on one process)."""
        if self.num_processes == 1:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], device=self.model.device, dtype=torch.float64)
        values = self.accelerator.reduce(values, reduction="mean")
        return dict(zip(keys, values.tolist(), strict=True))

    def ptx_loss(self, generator: torch.Generator) -> torch.Tensor:
        """Next-token loss of the policy on a minibatch of SFT texts (keeps it close to the pretraining data)."""
        picks = torch.randint(len(self.ptx_texts), (self.config.mini_batch_size,), generator=generator)
        texts = [self.ptx_texts[i] for i in picks.tolist()]
        max_len = self.config.max_prompt_length + self.config.max_new_tokens
        ids, attn = tokenize_prompts(self.tokenizer, texts, max_len, self.model.device)  # (b, L)
        labels = ids.masked_fill(attn == 0, -100)  # (b, L): no loss on padding
        # left padding: a row's first token would be predicted from a pad position, which reads nothing
        labels[:, 1:] = labels[:, 1:].masked_fill(attn[:, :-1] == 0, -100)
        logits = self.model.policy_logits(ids, attn)  # (b, L, V)
        return lm_loss(logits, labels, ignore_index=-100)

    def update(self, batch: Experience, generator: torch.Generator) -> dict[str, float]:
        """config.ppo_epochs passes over the batch in shuffled minibatches. On each: the policy step
        (L = L_clip - c_ent * H + c_ptx * L_lm), then the value step (c_vf * L_V). Returns the mean stats.

        Both losses are computed, checked (`piece_checks`) and back-propagated before either adapter
        steps, so a refused loss piece leaves every weight as it was. The two adapters share no trainable
        parameter and neither loss reads the other's output, so this order changes no number. Each
        minibatch is cut to the columns holding a real token of one of its rows (`trim_minibatch`)."""
        if self.update_fn is not None:  # the caller's loop; the run's policy loss, its stats recorded
            with self.guard():
                self.last_update_stats = run_update_fn(self.update_fn, self.policy_loss_fn, self.model, batch,
                                                       self.policy_opt.optimizer, self.value_opt.optimizer,
                                                       self.config, generator, self.step_count)
            return mean_update_stats(self.last_update_stats)
        config, model, step, pieces = self.config, self.model, self.step_count, self.pieces
        train_policy = step >= config.value_warmup_steps  # value warm-up: the critic learns the returns first
        self.last_update_stats = []
        for epoch in range(config.ppo_epochs):
            size = batch.sequences.shape[0]  # B
            order = torch.randperm(size, generator=generator).to(batch.sequences.device)  # (B,)
            for index, first in enumerate(range(0, size, config.mini_batch_size)):
                mb = trim_minibatch(batch, order[first : first + config.mini_batch_size])
                # both losses are checked before either adapter steps: a refused piece changes no weight
                # (the guard votes on every process before the gradient all-reduces)
                with self.guard(drop_gradients=True):
                    # policy: forward -> loss (the piece's result checked) -> backward
                    logprobs, entropy = model.policy_logprobs(  # (b, r), (b, r); no entropy backward unless used
                        mb.sequences, mb.attention_mask, mb.context_length, with_entropy=True,
                        entropy_grad=config.entropy_coef > 0, temperature=config.temperature)
                    pg_loss, pg_stats = pieces.policy_loss(logprobs.float(), mb.old_logprobs, mb.advantages,
                                                           mb.mask, config.clip_eps)
                    mean_entropy = masked_mean(entropy.float(), mb.mask)
                    # L = L_clip - c_ent * H (+ c_ptx * L_lm on a minibatch of SFT texts)
                    loss = pg_loss - config.entropy_coef * mean_entropy
                    ptx = self.ptx_loss(generator) if config.ptx_coef > 0 else None
                    loss = loss + config.ptx_coef * ptx if ptx is not None else loss
                    check_no_nan("policy loss", loss.detach())
                    if train_policy:
                        self.policy_opt.backward(loss, piece=pieces.policy_loss_name)  # a caller's: checked
                    # value: forward -> loss -> backward (it reads no policy weight: the order changes no number)
                    new_values = model.values(mb.sequences, mb.attention_mask, mb.context_length).float()  # (b, r)
                    v_loss, v_stats = pieces.value_loss(new_values, mb.values, mb.returns, mb.mask,
                                                        config.value_clip)
                    check_no_nan("value loss", v_loss.detach())
                    self.value_opt.backward(config.vf_coef * v_loss, piece=pieces.value_loss_name)
                policy_norm = self.policy_opt.sync_and_step(step) if train_policy else 0.0
                value_norm = self.value_opt.sync_and_step(step)
                self.last_update_stats.append({
                    "epoch": float(epoch), "minibatch": float(index), "ratio_mean": float(pg_stats["ratio_mean"]),
                    "ratio_max": float(pg_stats["ratio_max"]), "policy_loss": float(pg_loss.detach()),
                    "clipfrac": float(pg_stats["clipfrac"]), "approx_kl": float(pg_stats["approx_kl"]),
                    "value_loss": float(v_loss.detach()), "vf_clipfrac": float(v_stats.get("vf_clipfrac", 0.0)),
                    "policy_grad_norm": policy_norm, "value_grad_norm": value_norm,
                    "entropy_update": float(mean_entropy.detach()),
                    **({"ptx_loss": float(ptx.detach())} if ptx is not None else {})})
        return mean_update_stats(self.last_update_stats)

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
        `check_weights_usable`, in a folder locked until `close()` (another live run there: FolderInUse). A
        NaN/inf stops the run with NonFiniteStop (on every process at once); the last checkpoint stays intact.
        """
        config = self.config
        target = self.step_count + steps if steps is not None else config.total_steps
        is_main = self.process_index == 0
        if config.output_dir and is_main:  # one live run per folder: FolderInUse if another process writes there
            if self.output_lock is not None and self.output_lock.path.parent != Path(config.output_dir):
                self.close()
            self.output_lock = self.output_lock or hold_run_folder(config.output_dir)
        bar = tqdm(total=max(target - self.step_count, 0), desc="PPO",
                   disable=not (config.progress_bar and is_main))
        start_step = self.step_count
        try:
            while self.step_count < target:
                metrics = self.step()
                if eval_prompts is not None and config.eval_every and self.step_count % config.eval_every == 0:
                    with self.guard(self.step_count - 1):
                        metrics.update(self.evaluate(eval_prompts[: config.n_eval_prompts]))
                save = bool(config.output_dir) and (
                    self.step_count >= target or (config.save_every > 0 and self.step_count % config.save_every == 0))
                if save:  # before the step is logged: a step whose weights cannot be saved is not reported
                    with self.guard(self.step_count - 1):
                        self.check_weights_usable()
                bar.update(1)
                bar.set_postfix(score=format_number(metrics["score"]), kl=format_number(metrics["kl"]),
                                hidden=format_number(metrics.get("hidden_score", math.nan)))
                if save and is_main:  # saved before it is logged: a step whose save failed is not reported
                    self.last_checkpoint = str(save_checkpoint(self, config.output_dir))
                if callback is not None:
                    callback(metrics)
        except CheckpointSaveError:
            bar.close()
            raise
        except NonFiniteStop as error:
            bar.close()
            kept = (f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint
                    else "no checkpoint was written before it")
            raise NonFiniteStop(f"{error}. Nothing was saved after the bad value; {kept}. Lower the "
                                 "learning rates, or set score_clip / max_grad_norm.") from None
        bar.close()
        if config.output_dir and is_main and self.step_count == start_step:  # no step ran: save as it is
            self.last_checkpoint = str(save_checkpoint(self, config.output_dir))
        return self.history

    def close(self) -> None:
        """Release config.output_dir's lock (taken by `train`; the end of the process releases it too)."""
        if self.output_lock is not None:
            self.output_lock.release()
        self.output_lock = None

    def check_weights_usable(self) -> None:
        """NonFiniteStop unless the current policy and critic give finite outputs on the latest batch
        (`guards.check_outputs_finite`). Run before every checkpoint: finite weights can still be broken
        (a step with a learning rate of 1e12 leaves weights near 1e12, and the next forward overflows),
        and such weights must not become the "last good" checkpoint that a resumed run starts from."""
        if self.last_batch is not None:  # the step whose update made these weights
            check_outputs_finite(self.model, self.last_batch, self.config.temperature, self.step_count - 1)
