"""The PPO trainer: its state (model, optimisers, KL controller, history) and one iteration, `step`.

    trainer = PPOTrainer(config, shared, tokenizer, prompts)
    metrics = trainer.step()          # one iteration: rollouts, then config.ppo_epochs of updates
    history = trainer.train()         # config.total_steps iterations, progress bar, checkpoints
    trainer.close()                   # frees config.output_dir (so does the process's end)

`step` runs `iteration.rollout` then `iteration.update` (the iteration in one file, as cleanrl
writes it) and turns them into the step's metrics; `train` is `run_loop.train_loop`. The maths are
functions passed in (`pieces`: reward shaping, advantages, policy loss, value loss, even the update
loop; the library's by default), so a learner's own GAE, loss or loop can drive the training.

The policy adapter and the value adapter (with its head) have one `optim.AdapterOptimizer` each
(Adam, gradient all-reduce, clip, fp16 loss scaling, NaN checks of the new weights). Under
`accelerate launch` each process samples its own prompts and gradients are averaged across processes
before every optimiser step (plain data parallelism). Every stretch of work that ends in a
collective operation runs inside `self.guard()`: a NaN/inf (or an error) on one process stops every
process at the same point, so none waits forever in an all-reduce. Before a checkpoint is written
the updated policy and critic must give finite outputs on their latest batch.

Precision: the frozen base may be bf16 or fp16 (never updated); the trained weights (LoRA matrices,
value head) are float32 masters, with a loss scaler per optimiser on an fp16 base (`optim`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlhf_helpers.core.kl import AdaptiveKLController, FixedKLController
from rlhf_helpers.core.losses import lm_loss, policy_loss, value_loss
from rlhf_helpers.ppo.evaluation import ScoreFn, evaluate_policy
from rlhf_helpers.ppo.experience import Experience, eos_kept_share, rollout_metrics
from rlhf_helpers.ppo.guards import guard
from rlhf_helpers.ppo.iteration import rollout, update
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
from rlhf_helpers.ppo.run_loop import check_weights_usable, train_loop
from rlhf_helpers.ppo.samples import RewardFn, tokenize_prompts
from rlhf_helpers.ppo.shared_model import SharedLoRAModel
from rlhf_helpers.ppo.step_undo import undone_on_error
from rlhf_helpers.runtime.locks import FileLock
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.precision import needs_grad_scaler


def check_trainer_arguments(config: PPOConfig, model: SharedLoRAModel, prompts: Sequence[str],
                            ptx_texts: Sequence[str] | None, accelerator: Any,
                            **pieces: Any) -> None:
    """ValueError naming the argument a trainer cannot start with (an `update_fn`: the settings it
    cannot run under, `check_update_fn_settings`)."""
    if not isinstance(config, PPOConfig):
        raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a non-empty list of strings")
    if getattr(model, "lora", config.lora) != config.lora:
        raise ValueError(f"model's LoRA spec {model.lora} differs from config.lora {config.lora}: "
                         "build the model from the config (`build_shared_model`, or "
                         "SharedLoRAModel(..., lora=config.lora))")
    if config.ptx_coef > 0 and not ptx_texts:
        raise ValueError("ptx_texts must be given when config.ptx_coef > 0")
    for name, fn in pieces.items():
        check_piece(name, fn)
    if pieces.get("update_fn") is not None:
        check_update_fn_settings(config, model, accelerator)
        if pieces.get("value_loss_fn") not in (None, value_loss):
            raise ValueError("value_loss_fn would never run: an update_fn computes its own value "
                             "loss. Leave one of them out")


def kl_controller(config: PPOConfig) -> FixedKLController | AdaptiveKLController:
    """beta's controller: fixed at config.kl_coef, or adaptive towards config.target_kl when set."""
    if config.target_kl is None:
        return FixedKLController(config.kl_coef)
    return AdaptiveKLController(config.kl_coef, config.target_kl, config.kl_horizon)


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
        advantage_fn: AdvantageFn | None = None,
        policy_loss_fn: PolicyLossFn | None = None,
        value_loss_fn: ValueLossFn | None = None,
        update_fn: UpdateFn | None = None,  # runs under fewer settings: see `pieces.UpdateFn`
    ) -> None:
        check_trainer_arguments(config, model, prompts, ptx_texts, accelerator,
                                shape_rewards_fn=shape_rewards_fn, advantage_fn=advantage_fn,
                                policy_loss_fn=policy_loss_fn, value_loss_fn=value_loss_fn,
                                update_fn=update_fn)
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.prompts = list(prompts)
        self.reward_fn = reward_fn
        self.hidden_score_fn = hidden_score_fn
        self.ptx_texts = list(ptx_texts) if ptx_texts else []
        self.accelerator = accelerator
        #: the policy loss an `update_fn` is handed (None given: the library's)
        self.policy_loss_fn = policy_loss_fn or policy_loss
        #: PPO's maths as the iteration calls them: the library's as they are, a caller's checked
        self.pieces = resolve_pieces(config.kl_kind, config.score_clip, shape_rewards_fn,
                                     advantage_fn, policy_loss_fn, value_loss_fn)
        #: the whole update loop of an iteration (`pieces.UpdateFn`); None: `update`'s own
        self.update_fn = update_fn
        self.process_index = accelerator.process_index if accelerator is not None else 0
        self.num_processes = accelerator.num_processes if accelerator is not None else 1
        fp16 = needs_grad_scaler(model)  # an fp16 base: loss scaling per optimiser
        #: Adam, loss scaler and overflow count of the policy adapter
        self.policy_opt = AdapterOptimizer("policy", model.policy_parameters(), config.policy_lr,
                                           config.max_grad_norm, fp16,
                                           model.device.type, accelerator)
        #: the same for the value adapter and its head
        self.value_opt = AdapterOptimizer("value", model.value_parameters(), config.value_lr,
                                          config.max_grad_norm, fp16,
                                          model.device.type, accelerator)
        self.kl_controller = kl_controller(config)  #: beta: fixed, or adaptive with target_kl
        self.step_count = 0  #: PPO iterations done so far
        self.history: list[dict[str, float]] = []  #: metrics of every iteration so far
        self.last_batch: Experience | None = None  #: the experience batch of the latest step
        #: per-minibatch stats of the latest update, in order (epoch, minibatch, ratio_mean...)
        self.last_update_stats: list[dict[str, float]] = []
        #: folder of the newest checkpoint this trainer wrote or loaded
        self.last_checkpoint: str | None = None
        #: SHA-256 of that checkpoint's manifest.json: the only step folder a save may replace
        self.last_checkpoint_digest: str | None = None
        #: the lock on config.output_dir, from `train` to `close`
        self.output_lock: FileLock | None = None
        #: the run this trainer's checkpoints belong to (`run_identity`): set by its first save, or
        #: by the checkpoint it loaded
        self.run_id: str | None = None

    @property
    def own_pieces(self) -> dict[str, Any]:
        """The caller's own pieces by argument name, as given, the update loop included (the
        library's left out): what trains this run besides the library."""
        update = {"update_fn": self.update_fn} if self.update_fn is not None else {}
        return {**self.pieces.given, **update}

    # ------------------------------------------------------------------ randomness
    def _step_seed(self) -> int:
        """Seed of this step's randomness: a function of (seed, step, process) only, so the same
        seed gives the same curve whatever the caller did with the global RNG, and a resumed run
        draws the same prompts, samples and shuffles without a saved data-loader state."""
        return (self.config.seed * 1_000_003 + self.step_count) * 64 + self.process_index

    def _step_generator(self) -> torch.Generator:
        """Prompt order and minibatch shuffles of this step."""
        return torch.Generator().manual_seed(self._step_seed())

    def guard(self, step: int | None = None, drop_gradients: bool = False) -> Any:
        """The one wrapper of every stretch of work that ends in a collective operation: a NaN/inf
        met in it stops the run (NonFiniteStop naming the step), on every process at once
        (`guards.guard`). `drop_gradients`: if it raises, the gradients back-propagated in it are
        dropped, never stepped on."""
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
        """Rollouts, then the update epochs; returns the metrics (and appends them to `history`).

        All or nothing: a step that does not finish (Ctrl-C, a NaN stop, a refused piece, your own
        `update_fn` failing) leaves every adapter weight, optimiser state, the KL controller, the
        step count and the history as they were before it (`step_undo`), then re-raises; the next
        `step()` runs it again from the start."""
        with undone_on_error(self, f"PPO step {self.step_count}"):
            return self._step()

    def _step(self) -> dict[str, float]:
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
        metrics = rollout_metrics(batch, self.kl_controller.value, self.hidden_score_fn,
                                  config.score_clip)
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

    def _reduce(self, metrics: dict[str, float]) -> dict[str, float]:
        """Mean of each metric over processes (identity on one process)."""
        if self.num_processes == 1:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], device=self.model.device,
                              dtype=torch.float64)
        values = self.accelerator.reduce(values, reduction="mean")
        return dict(zip(keys, values.tolist(), strict=True))

    def ptx_loss(self, generator: torch.Generator) -> torch.Tensor:
        """Next-token loss of the policy on a minibatch of SFT texts (keeps it near that data)."""
        picks = torch.randint(len(self.ptx_texts), (self.config.mini_batch_size,),
                              generator=generator)
        texts = [self.ptx_texts[i] for i in picks.tolist()]
        max_len = self.config.max_prompt_length + self.config.max_new_tokens
        ids, attn = tokenize_prompts(self.tokenizer, texts, max_len, self.model.device)  # (b, L)
        labels = ids.masked_fill(attn == 0, -100)  # (b, L): no loss on padding
        # left padding: a row's first token would be predicted from a pad, which reads nothing
        labels[:, 1:] = labels[:, 1:].masked_fill(attn[:, :-1] == 0, -100)
        logits = self.model.policy_logits(ids, attn)  # (b, L, V)
        return lm_loss(logits, labels, ignore_index=-100)

    def update(self, batch: Experience, generator: torch.Generator) -> dict[str, float]:
        """The update epochs on `batch` (`iteration.update`, or the caller's `update_fn`); returns
        the mean of the minibatches' stats, and the share of EOS tokens its mask keeps, and keeps
        the rows in `last_update_stats`. An update that does not finish is undone whole, whoever
        wrote the loop (`step_undo`)."""
        with undone_on_error(self, "this update"):
            if self.update_fn is None:
                update(self, batch, generator)  # its rows go to last_update_stats as they are made
            else:  # the caller's loop; the run's policy loss, its stats recorded
                with self.guard():
                    self.last_update_stats = run_update_fn(
                        self.update_fn, self.policy_loss_fn, self.model, batch,
                        self.policy_opt.optimizer, self.value_opt.optimizer, self.config,
                        generator, self.step_count)
        # the share of sampled EOS tokens that the mask this update trained on kept
        eos_in_mask = eos_kept_share(batch, self.model.eos_token_id)
        return {**mean_update_stats(self.last_update_stats), "eos_in_mask": eos_in_mask}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, prompts: Sequence[str], seed: int = 12345,
                 batch_size: int | None = None) -> dict[str, float]:
        """Mean reward score, hidden score and sequence KL of one fresh sample per prompt (fixed
        seed, the caller's RNG untouched; no value pass, no GAE): `evaluation.evaluate_policy` with
        this run's sampling settings, in batches of `batch_size` (default
        config.eval_batch_size)."""
        config = self.config
        return evaluate_policy(
            self.model, self.tokenizer, prompts, max_prompt_length=config.max_prompt_length,
            max_new_tokens=config.max_new_tokens, temperature=config.temperature,
            batch_size=config.eval_batch_size if batch_size is None else batch_size,
            seed=seed, reward_fn=self.reward_fn, hidden_score_fn=self.hidden_score_fn)

    # ------------------------------------------------------------------ the run
    def train(self, steps: int | None = None, eval_prompts: Sequence[str] | None = None,
              callback: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
        """Run until `steps` more iterations (default: up to config.total_steps) are done, with a
        progress bar, evaluations and checkpoints (`run_loop.train_loop`); returns the history.

        Interrupted (Ctrl-C) inside an iteration, that iteration is undone whole (`step`): call
        `train()` again and it runs it afresh, giving the numbers of an uninterrupted run.
        Interrupted after it, in its evaluation, checkpoint or `callback`, the iteration stays
        applied (it is in `history`; `trainer.last_checkpoint` names the newest checkpoint
        written) and `callback` does not get its metrics."""
        return train_loop(self, steps, eval_prompts, callback)

    def close(self) -> None:
        """Release config.output_dir's lock (taken by `train`; the end of the process releases it
        too)."""
        if self.output_lock is not None:
            self.output_lock.release()
        self.output_lock = None

    def check_weights_usable(self) -> None:
        """NonFiniteStop unless the current policy and critic give finite outputs on the latest
        batch (`run_loop.check_weights_usable`)."""
        check_weights_usable(self)
