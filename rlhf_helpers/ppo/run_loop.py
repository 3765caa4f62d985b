"""The loop around PPO's iterations: progress bar, evaluations, checkpoints and the NaN stop's
message.

    history = train_loop(trainer, steps=10, eval_prompts=test_prompts)  # = trainer.train(...)

Everything here wraps `PPOTrainer.step` (one iteration) from outside: the folder's lock, when to
evaluate and save, the weights' last check before a save, what a NaN stop says about the checkpoints
kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rlhf_helpers.core.printed import format_number
from rlhf_helpers.ppo.checkpoint import CheckpointSaveError, save_checkpoint
from rlhf_helpers.ppo.guards import NonFiniteStop, check_outputs_finite
from rlhf_helpers.ppo.run_claim import claim_run_folder


def train_loop(trainer: Any, steps: int | None = None, eval_prompts: Sequence[str] | None = None,
               callback: Callable[[dict[str, float]], None]
               | None = None) -> list[dict[str, float]]:
    """Run `trainer` until `steps` more iterations (default: up to config.total_steps) are done.

    Shows a progress bar, evaluates every config.eval_every steps on `eval_prompts`, and writes a
    checkpoint to config.output_dir every config.save_every steps and at the end, each only after
    `check_weights_usable`, in a folder locked until `trainer.close()` (another live run there:
    FolderInUse; checkpoints of another run there: FolderOfAnotherRun; a newer checkpoint than the
    trainer's, or one of its step it did not write or load: CheckpointWouldBeReplaced; `run_claim`,
    before a step runs). A folder removed or moved mid-run stops it (RunFolderGone), never made
    again. A NaN/inf stops the run with NonFiniteStop (on every process at once); the last
    checkpoint stays intact.
    """
    config = trainer.config
    target = trainer.step_count + steps if steps is not None else config.total_steps
    is_main = trainer.process_index == 0
    watch = None  # the folder's lock and identity, checked after every step
    # one owner per folder: another live process, or another run's checkpoints, is refused
    if config.output_dir and is_main:
        if (trainer.output_lock is not None
            and trainer.output_lock.path.parent != Path(config.output_dir)):
            trainer.close()
        watch = claim_run_folder(trainer, Path(config.output_dir))
    bar = tqdm(total=max(target - trainer.step_count, 0), desc="PPO",
               disable=not (config.progress_bar and is_main))
    start_step = trainer.step_count
    try:
        while trainer.step_count < target:
            metrics = trainer.step()
            if (eval_prompts is not None and config.eval_every
                and trainer.step_count % config.eval_every == 0):
                with trainer.guard(trainer.step_count - 1):
                    metrics.update(trainer.evaluate(eval_prompts[: config.n_eval_prompts]))
            save = bool(config.output_dir) and (
                trainer.step_count >= target
                or (config.save_every > 0 and trainer.step_count % config.save_every == 0))
            # before the step is logged: a step whose weights cannot be saved is not reported
            if save:
                with trainer.guard(trainer.step_count - 1):
                    check_weights_usable(trainer)
            bar.update(1)
            bar.set_postfix(score=format_number(metrics["score"]), kl=format_number(metrics["kl"]),
                            hidden=format_number(metrics.get("hidden_score", math.nan)))
            if watch is not None:  # moved or removed: stop before anything more is written
                watch.check(trainer)
            # saved before it is logged: a step whose save failed is not reported
            if save and is_main:
                trainer.last_checkpoint = str(save_checkpoint(trainer, config.output_dir,
                                                              create_folder=False))
            if callback is not None:
                callback(metrics)
    except CheckpointSaveError:
        bar.close()
        raise
    except NonFiniteStop as error:
        bar.close()
        kept = (f"the last good checkpoint is {trainer.last_checkpoint}" if trainer.last_checkpoint
                else "no checkpoint was written before it")
        raise NonFiniteStop(f"{error}. Nothing was saved after the bad value; {kept}. Lower the "
                             "learning rates, or set score_clip / max_grad_norm.") from None
    bar.close()
    # no step ran: save as it is
    if watch is not None and trainer.step_count == start_step:
        watch.check(trainer)
        trainer.last_checkpoint = str(save_checkpoint(trainer, config.output_dir,
                                                      create_folder=False))
    return trainer.history


def check_weights_usable(trainer: Any) -> None:
    """NonFiniteStop unless the current policy and critic give finite outputs on the latest batch
    (`guards.check_outputs_finite`). Run before every checkpoint: finite weights can still be broken
    (a step with a learning rate of 1e12 leaves weights near 1e12, and the next forward overflows),
    and such weights must not become the "last good" checkpoint that a resumed run starts from."""
    if trainer.last_batch is not None:  # the step whose update made these weights
        check_outputs_finite(trainer.model, trainer.last_batch, trainer.config.temperature,
                             trainer.step_count - 1)
