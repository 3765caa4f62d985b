"""Notebook 08's check, first half: run one PPO iteration from given weights and record it.

    record = run_iteration(library_iteration, model, tok, prompts, config, (3, 4), (2.0, 0.05))
    rtol = rounding_rtol(model, config)   # the rounding budget of one forward pass

`run_iteration` runs an iteration with plain SGD (`RecordingSGD`, which records the gradient norm
of every step) and keeps its experience, losses, steps and weight updates in an `IterationRecord`;
`course.capstone` compares two records. `run_experience` runs a learner's `make_experience` on the
check's batch. Each runs as a fresh attempt from one recorded state, on fresh copies of the model
and the config (`course.capstone_state`: pass the set-up's `ModelSnapshot` as `start`), so no
earlier attempt reaches it and the caller's model is never run. The code uses plain torch only: the
library's maths are hidden from the learner while the check runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhf_helpers.core.tolerances import close_tolerance
from rlhf_helpers.course.capstone_state import ModelSnapshot, attempt_name, fresh_attempt
from rlhf_helpers.ppo.experience import Experience
from rlhf_helpers.ppo.iteration import collect_experience
from rlhf_helpers.ppo.model.samples import sample_responses
from rlhf_helpers.ppo.pieces import minibatch_losses
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: unit roundoff of float32: one rounding moves a result by at most this much, relatively
FLOAT32_UNIT_ROUNDOFF = 2.0**-24
#: the experience tensors compared, in the order an iteration makes them
EXPERIENCE = ("old_logprobs", "ref_logprobs", "values", "scores", "rewards",
              "returns", "advantages")
#: settings the notebook's iteration leaves out, and the value that switches each off
LEFT_OUT = {"entropy_coef": 0.0, "ptx_coef": 0.0, "value_warmup_steps": 0, "kl_kind": "k1",
            "score_clip": None, "missing_eos_penalty": None, "target_kl": None,
            "whiten_advantages": True}


def library_iteration(model: Any, tokenizer: Any, prompts: Sequence[str],
                      policy_opt: torch.optim.Optimizer,
                      value_opt: torch.optim.Optimizer, config: PPOConfig,
                      generator: torch.Generator, stats: list[dict[str, float]] | None = None
                      ) -> tuple[Experience, list[tuple[float, float]]]:
    """One PPO iteration by the library: `collect_experience`, then `PPOTrainer.update` with these
    optimisers. `stats`, when given, gets the update's row of statistics for every minibatch
    (`approx_kl` among them)."""
    batch = collect_experience(model, tokenizer, prompts, config, kl_coef=config.kl_coef)
    trainer = PPOTrainer(config, model, tokenizer, prompts)
    trainer.policy_opt.optimizer, trainer.value_opt.optimizer = policy_opt, value_opt
    trainer.update(batch, generator)
    if stats is not None:
        stats.extend(trainer.last_update_stats)
    return batch, [(row["policy_loss"], row["value_loss"]) for row in trainer.last_update_stats]


def left_out_settings(config: PPOConfig) -> list[str]:
    """The settings of `config` the notebook's iteration does not implement (LEFT_OUT), e.g.
    'entropy_coef=0.01'."""
    return [f"{name}={getattr(config, name)!r}"
            for name, off in LEFT_OUT.items() if getattr(config, name) != off]


def rounding_rtol(model: Any, config: PPOConfig) -> float:
    """The check's rounding budget: a relative tolerance for two computations of one iteration that
    differ only in the order of their float32 operations (a KV-cached sampling loop against one
    forward, a GAE loop against a matrix product, a trimmed minibatch), relative to the largest
    entry of each compared tensor.

    It is K u, with u = 2^-24 and K the roundings on the longest path to one log-prob. Each float32
    operation returns its exact result times (1 + d), |d| <= u; an inner product of n terms, summed
    in any order, is then off by at most about n u times the sum of its terms' sizes (Higham,
    "Accuracy and Stability of Numerical Algorithms", section 3.1), which cancellation can make
    large against the result, and the layers multiply such errors by factors this count does not
    model (a layer norm divides by a standard deviation, a softmax exponentiates). So K u is a
    budget set from the model's shape, not a bound and not a fit to one machine: notebook 08
    measures that the worked solution uses a small fraction of it and that a subtle bug (a biased
    variance in the whitening) exceeds it several times over. Per layer the path passes two layer
    norms (sums of `hidden` terms), a query, key or value (`hidden`), a score (`hidden / heads`),
    the softmax and the weighted values (`context` each), the output projection (`hidden`), the
    MLP's two products (`hidden`, `inner`); then the final norm, the LM head and the log-sum-exp
    over the vocabulary.
    A 16-bit base: at least the course's 16-bit tolerance."""
    cfg = model.lm.config.get_text_config()
    hidden, layers, heads = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    inner = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * hidden
    context = config.max_prompt_length + config.max_new_tokens
    per_layer = 2 * hidden + hidden + hidden // heads + 2 * context + hidden + hidden + inner
    roundings = layers * per_layer + 2 * hidden + cfg.vocab_size
    rtol = roundings * FLOAT32_UNIT_ROUNDOFF
    return close_tolerance(model.compute_dtype, atol=rtol, rtol=rtol)["rtol"]


class RecordingSGD(torch.optim.SGD):
    """Plain SGD that records the norm of the gradient each `step()` applies (after any
    clipping)."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        super().__init__(params, lr=lr)
        self.step_norms: list[float] = []  #: the gradient norm of every step, in order

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        grads = [p.grad.detach().flatten() for group in self.param_groups for p in group["params"]
                 if p.grad is not None]
        self.step_norms.append(float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0)
        return super().step(closure)


@dataclass
class IterationRecord:
    """What one iteration made from given weights: its experience, its losses, its steps and its
    updates."""

    #: what the iteration returned as its experience (an `Experience`, or a learner's rollout)
    rollout: Any
    sequences: torch.Tensor  #: (B, P + R) the sampled batch
    mask: torch.Tensor  #: (B, R) 1 on real response tokens
    experience: dict[str, torch.Tensor]  #: EXPERIENCE's tensors, (B, R) each (scores (B,))
    losses: torch.Tensor  #: (n, 2) float64: (policy loss, value loss) of every minibatch
    #: "policy" / "value": the gradient norm of each optimiser step
    step_norms: dict[str, list[float]]
    updates: dict[str, list[torch.Tensor]]  #: "policy" / "value": each parameter's change
    #: "policy" / "value": each parameter's largest |w| before the update
    weight_sizes: dict[str, list[float]]
    shuffle_seed: int  #: the seed of the generator the iteration shuffled with
    config: PPOConfig  #: the settings it ran with
    #: the model it ran on, back at the weights it started from (a hint recomputes a forward pass)
    model: Any = None


def run_iteration(iteration: Callable[..., Any], model: Any, tokenizer: Any, prompts: Sequence[str],
                  config: PPOConfig, seeds: tuple[int, int], lrs: tuple[float, float],
                  start: ModelSnapshot | None = None) -> IterationRecord:
    """Run `iteration` once as a fresh attempt from `start` (default: `model` as it is now) and
    record it: on a fresh copy of `start`'s model and of `config` (`capstone_state`; `model` itself
    is never run), sampling seeded with seeds[0] and shuffling with seeds[1] (the caller's random
    states kept), with new RecordingSGD optimisers at lrs (policy, value). AssertionError when the
    iteration changed a weight outside the two adapters, left one of torch's global modes changed
    or patched the model's classes or torch (each put back). The record's model is `start`'s
    pristine copy, at the weights the iteration started from."""
    start = start if start is not None else ModelSnapshot(model)
    with fresh_attempt(start, config, seeds[0], attempt_name(iteration), trains=True) as (
            fresh, its_config):
        params = {"policy": fresh.policy_parameters(), "value": fresh.value_parameters()}
        before = {role: [p.detach().clone() for p in ps] for role, ps in params.items()}
        opts = {role: RecordingSGD(params[role], lr)
                for role, lr in zip(("policy", "value"), lrs, strict=True)}
        rollout, losses = iteration(fresh, tokenizer, list(prompts), opts["policy"],
                                    opts["value"], its_config,
                                    torch.Generator().manual_seed(seeds[1]))
        updates = {role: [(p.detach() - w).cpu() for p, w in zip(ps, before[role], strict=True)]
                   for role, ps in params.items()}
    return IterationRecord(
        rollout=rollout, sequences=rollout.sequences.detach().cpu(),
        mask=rollout.mask.detach().cpu(),
        experience={name: getattr(rollout, name).detach().float().cpu() for name in EXPERIENCE},
        losses=torch.tensor(minibatch_losses(losses, "your iteration"), dtype=torch.float64),
        step_norms={role: opt.step_norms for role, opt in opts.items()}, updates=updates,
        weight_sizes={role: [float(w.abs().max()) for w in ws] for role, ws in before.items()},
        shuffle_seed=seeds[1], config=config, model=start.model)


def run_experience(make_experience: Callable[..., Any], model: Any, tokenizer: Any,
                   prompts: Sequence[str], config: PPOConfig, seed: int,
                   start: ModelSnapshot | None = None) -> Any:
    """Sample the check's batch (seeded with `seed`, at config.temperature, as `run_iteration`'s
    iteration samples it) and return what a learner's `make_experience(model, samples, config)`
    makes of it, as a fresh attempt from `start` (default: `model` as it is now) on fresh copies of
    its model and of `config`. AssertionError when it changed any weight (it should only read
    them), left a global mode changed or patched the model's classes or torch (each put back)."""
    start = start if start is not None else ModelSnapshot(model)
    with fresh_attempt(start, config, seed, attempt_name(make_experience)) as (fresh, its_config):
        samples = sample_responses(fresh, tokenizer, list(prompts), its_config.max_prompt_length,
                                   its_config.max_new_tokens, temperature=its_config.temperature)
        return make_experience(fresh, samples, its_config)
