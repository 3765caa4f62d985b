"""Notebook 08's check: a learner's whole PPO iteration against the library's, on the same batch and
seed.

    expected = run_iteration(library_iteration, model, tokenizer, prompts, config, seeds=(3, 4), lrs=(2.0, 0.05))
    got = run_iteration(ppo_iteration, model, tokenizer, prompts, config, seeds=(3, 4), lrs=(2.0, 0.05))
    problem = first_difference(got, expected, config, rounding_rtol(model, config))  # None, or where, in words

An iteration is
`iteration(model, tokenizer, prompts, policy_opt, value_opt, config, generator) -> (rollout,
[(policy loss, value loss) of every
minibatch])`, the rollout holding the experience under `Experience`'s names. `run_iteration` runs
one from given weights with plain SGD (the notebook says why), records what it made and puts the
weights back. `first_difference` names the first thing that differs, in the order the iteration
makes it: the experience (tokens, log-probs, values, scores, rewards, returns, advantages), then
each minibatch's losses, then the gradient norm of each optimiser step and the weights' updates,
with the likely cause. The check code uses plain torch only: the library's maths are hidden from the
learner while it runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhf_helpers.core.tolerances import close_tolerance
from rlhf_helpers.ppo.experience import Experience
from rlhf_helpers.ppo.iteration import collect_experience
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
            "score_clip": None,
            "missing_eos_penalty": None, "target_kl": None, "whiten_advantages": True}


def library_iteration(model: Any, tokenizer: Any, prompts: Sequence[str],
                      policy_opt: torch.optim.Optimizer,
                      value_opt: torch.optim.Optimizer, config: PPOConfig,
                      generator: torch.Generator) -> tuple[Experience, list[tuple[float, float]]]:
    """One PPO iteration by the library: `collect_experience`, then `PPOTrainer.update` with these
    optimisers."""
    batch = collect_experience(model, tokenizer, prompts, config, kl_coef=config.kl_coef)
    trainer = PPOTrainer(config, model, tokenizer, prompts)
    trainer.policy_opt.optimizer, trainer.value_opt.optimizer = policy_opt, value_opt
    trainer.update(batch, generator)
    return batch, [(row["policy_loss"], row["value_loss"]) for row in trainer.last_update_stats]


def left_out_settings(config: PPOConfig) -> list[str]:
    """The settings of `config` the notebook's iteration does not implement (LEFT_OUT), e.g.
    'entropy_coef=0.01'."""
    return [f"{name}={getattr(config, name)!r}" for name,
            off in LEFT_OUT.items() if getattr(config, name) != off]


def rounding_rtol(model: Any, config: PPOConfig) -> float:
    """Relative tolerance between two computations of one iteration that differ only in the order of
    their float32 operations (a KV-cached sampling loop against one forward, a GAE loop against a
    matrix product, a trimmed minibatch): K u, with u = 2^-24 and K the roundings on the longest
    path to one log-prob. Each rounding errs by at most u relative to the numbers it combines; K of
    them in a row, all erring the same way, give K u (Higham, "Accuracy and Stability of Numerical
    Algorithms", section 3.1): a worst case, so no CPU's summation order exceeds it. Per layer the
    path passes two layer norms (sums of `hidden` terms), a query, key or value (`hidden`), a score
    (`hidden / heads`), the softmax and the weighted values (`context` each), the output projection
    (`hidden`), the MLP's two products (`hidden`, `inner`); then the final norm, the LM head and the
    log-sum-exp over the vocabulary. A 16-bit base: at least the course's 16-bit tolerance."""
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


def run_iteration(iteration: Callable[..., Any], model: Any, tokenizer: Any, prompts: Sequence[str],
                  config: PPOConfig, seeds: tuple[int, int],
                  lrs: tuple[float, float]) -> IterationRecord:
    """Run `iteration` once from the model's current weights, sampling with seeds[0] (the caller's
    RNG kept) and shuffling with seeds[1], with RecordingSGD at lrs (policy, value); record it, then
    restore the weights."""
    params = {"policy": model.policy_parameters(), "value": model.value_parameters()}
    start = {role: [p.detach().clone() for p in ps] for role, ps in params.items()}
    opts = {role: RecordingSGD(params[role], lr) for role,
            lr in zip(("policy", "value"), lrs, strict=True)}
    devices = [model.device] if model.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seeds[0])
            rollout, losses = iteration(model, tokenizer, list(prompts), opts["policy"],
                                        opts["value"], config,
                                        torch.Generator().manual_seed(seeds[1]))
        updates = {role: [(p.detach() - w).cpu() for p, w in zip(ps, start[role], strict=True)]
                   for role, ps in params.items()}
    finally:
        with torch.no_grad():
            for role, ps in params.items():
                for param, weight in zip(ps, start[role], strict=True):
                    param.copy_(weight)
    return IterationRecord(
        rollout=rollout, sequences=rollout.sequences.detach().cpu(),
        mask=rollout.mask.detach().cpu(),
        experience={name: getattr(rollout, name).detach().float().cpu() for name in EXPERIENCE},
        losses=torch.tensor(minibatch_losses(losses, "your iteration"), dtype=torch.float64),
        step_norms={role: opt.step_norms for role, opt in opts.items()}, updates=updates,
        weight_sizes={role: [float(w.abs().max()) for w in ws] for role, ws in start.items()},
        shuffle_seed=seeds[1])


def _far(got: torch.Tensor, expected: torch.Tensor, rtol: float,
         scale: float | None = None) -> torch.Tensor:
    """Where got differs from expected by more than rtol times `scale` (default: expected's largest
    entry): every rounding is relative to the numbers it combines, which are at most that large. NaN
    differs."""
    if scale is None:
        scale = float(expected.abs().max()) if expected.numel() else 0.0
    return ~((got.double() - expected.double()).abs() <= rtol * max(scale, 1e-12))


def _where(mask: torch.Tensor, i: int, t: int) -> str:
    n = int(mask[i].sum())
    return (f"row {i}, token {t}: "
            + ["the last real token", "a real token before the last"][int(t < n - 1)]
            + f" of a row with {n} real tokens")


def _whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the real tokens (unbiased variance), 0 at padding: plain
    torch."""
    real = x[mask.bool()]
    return (x - real.mean()) * torch.rsqrt(real.var() + 1e-8) * mask


_CAUSES = {
    "old_logprobs": "log pi_old: the policy's log-probs of the sampled tokens at the sampling "
                    "temperature, model.policy_logprobs(sequences, attention_mask, P, "
                    "temperature=config.temperature)",
    "ref_logprobs": "log pi_ref: the reference (every adapter off) at the same temperature as the "
                    "policy, model.ref_logprobs(sequences, attention_mask, P, "
                    "temperature=config.temperature)",
    "values": "the critic's values model.values(sequences, attention_mask, P) at the real tokens",
    "scores": "the reward model's score of each response, model.reward_scores(sequences, "
              "attention_mask)",
    "returns": "the returns are the raw GAE advantages plus the values, before whitening: delta_t "
               "= r_t + config.gamma V_{t+1} - V_t with V = 0 after the last real token, A_t = "
               "delta_t + config.gamma config.lam A_{t+1}",
}


def _experience_hint(name: str, got: torch.Tensor, record: IterationRecord, i: int, t: int) -> str:
    """The likely cause of a difference in one experience tensor at row i, token t (real tokens
    only)."""
    exp, mask = record.experience, record.mask
    if name == "rewards":
        if t == int(mask[i].sum()) - 1:
            return ("the last real token carries -kl_coef k1 plus the response's score; its column "
                    "is mask.sum(1) - 1 (the last column is padding for every shorter response)")
        return ("r_t = -config.kl_coef (log pi_old(y_t) - log pi_ref(y_t)) on every real token: "
                "check the sign")
    if (name == "returns"
        and not bool(_far(got, exp["advantages"] + exp["values"], 1e-4)[mask.bool()].any())):
        return (
            "they equal the whitened advantages plus the values: take the returns before whitening")
    if name == "advantages":
        raw = (exp["returns"] - exp["values"]) * mask  # (B, R)
        for candidate, cause in (
                (raw, "they are not whitened: whiten them over the batch's real tokens"),
                (_whiten(raw, torch.ones_like(mask)) * mask,
                 "they are whitened over the padding too: take the mean and the variance over "
                 "the real tokens only")):
            if not bool(_far(got, candidate, 1e-4)[mask.bool()].any()):
                return cause
        return ("your returns match, so the GAE is right and the whitening differs: (A - mean) / "
                "sqrt(var + 1e-8) "
                "with the mean and the unbiased variance over the real tokens, 0 at padding")
    return _CAUSES[name]


def experience_difference(rollout: Any, record: IterationRecord, rtol: float) -> str | None:
    """The first experience tensor of `rollout` that differs from `record`'s, where, and the likely
    cause."""
    for name, tensor in (("sequences", rollout.sequences), ("mask", rollout.mask)):
        mine = getattr(record, name)
        if (tuple(tensor.shape) != tuple(mine.shape)
            or not torch.equal(tensor.detach().cpu().to(mine.dtype), mine)):
            return (f"your {name} differ from the sampled batch's: sample first, with the call "
                    "given (at config.temperature), keep the samples' mask, and draw no random "
                    "numbers before it")
    real = record.mask.bool()  # (B, R)
    for name in EXPERIENCE:
        got, expected = getattr(rollout, name).detach().float().cpu(), record.experience[name]
        if got.shape != expected.shape:
            return f"your {name} have shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        on_real = expected[real] if got.dim() == 2 else expected
        far = _far(got, expected, rtol,
                   float(on_real.abs().max())) & (real if got.dim() == 2 else True)
        if bool(far.any()):
            i, t = (int(k)
                    for k in far.nonzero()[0]) if got.dim() == 2 else (int(far.nonzero()[0]), 0)
            at = _where(record.mask, i, t) if got.dim() == 2 else f"row {i}"
            return (
                f"your {name} differ first at {at}: got "
                f"{float(got[i, t] if got.dim() == 2 else got[i]):.5f}, expected "
                f"{float(expected[i, t] if got.dim() == 2 else expected[i]):.5f}. Likely cause: "
                + _experience_hint(name, got, record, i, t))
    return None


def _first_policy_loss_hint(got: float, record: IterationRecord, config: PPOConfig,
                            rtol: float) -> str:
    """Minibatch 0 runs on unchanged weights, so its ratios are 1 and its loss is -mean(A) over its
    real tokens: test the two mistakes that change that (plain torch: the library's losses are
    hidden during the check)."""
    rows = torch.randperm(len(record.mask),
                          generator=torch.Generator().manual_seed(record.shuffle_seed))
    rows = rows[: config.mini_batch_size]
    m, adv = record.mask[rows], record.experience["advantages"][rows]  # (b, R)
    log_rho = torch.where(m.bool(),
                          record.experience["old_logprobs"][rows] - record.experience[
                              "ref_logprobs"][rows], 0.0)  # (b, R): the ratio against the reference
    rho, eps = torch.exp(log_rho), config.clip_eps
    against_ref = float(
        -(torch.min(rho * adv, rho.clamp(1 - eps, 1 + eps) * adv) * m).sum() / m.sum())
    scale = float(adv.abs().max())
    if abs(got - against_ref) <= rtol * scale:
        return ("your ratio is taken against the reference's log-probs: the old log-probs are "
                "those stored at sampling (rollout.old_logprobs), never the reference's")
    if abs(got) <= rtol * scale:  # whitened advantages have mean 0, so their loss is 0 at ratio 1
        return ("your loss is 0, as it is when a minibatch's advantages are whitened again: whiten "
                "them once, over the whole batch (make_experience did), and use them as stored")
    return ("on unchanged weights every ratio is 1 and the loss is minus the mean advantage over "
            "the minibatch's real tokens: take the rows of torch.randperm(B, generator=generator), "
            "the log-probs at "
            "config.temperature and the advantages as stored, in a masked mean over real tokens")


def _step_hint(role: str, got: IterationRecord, expected: IterationRecord, before: int,
               config: PPOConfig, rtol: float) -> str | None:
    """The first of the `role` optimiser's steps before `before` whose gradient norm differs, and
    why."""
    mine, theirs = got.step_norms[role], expected.step_norms[role]
    if len(mine) != len(theirs) and len(mine) < before:
        return (f"you stepped {role}_opt {len(mine)} times, expected {len(theirs)}: once per "
                "minibatch, "
                f"{config.ppo_epochs} epochs of {len(theirs) // config.ppo_epochs} minibatches")
    scale = max(theirs) if theirs else 0.0
    for j in range(min(before, len(theirs))):
        g, e = mine[j], theirs[j]
        if abs(g - e) <= (j + 1) * rtol * scale:  # one budget per step taken so far
            continue
        head = (f"the {role} step of minibatch {j} applied a gradient of norm {g:.5f}, the "
                f"library's {e:.5f}: ")
        clip = config.max_grad_norm
        # no coefficient (PPOConfig's default); CleanRL's and SB3's 0.5 written in
        for weight in (1.0, 0.5):
            if role == "value" and abs(g * config.vf_coef / weight - e) <= rtol * scale:
                return (head + f"your value loss enters the backward pass with weight {weight:g}: "
                        "scale it by config.vf_coef, whatever its value")
        if g > clip * (1 + rtol):
            return (head + f"clip the gradient norm of the {role} adapter's own parameters "
                           f"(model.{role}_parameters()) "
                    f"to config.max_grad_norm ({clip:.4g}) before {role}_opt.step()")
        if e >= clip * (1 - rtol) and g < e:
            return (head + "each adapter's gradient is clipped on its own: one clip over both "
                    "adapters scales each by the norm of both")
        return (head + f"the gradient of your {role} loss differs although the loss matched: a "
                ".detach() on one branch of the objective (it halves the in-band gradient of the "
                "clipped loss), or gradients left "
                "from an earlier minibatch (zero the gradients before each backward pass)")
    return None


def _loss_hint(role: str, k: int, got: IterationRecord, expected: IterationRecord,
               config: PPOConfig, rtol: float) -> str:
    per_epoch = -(-len(expected.mask) // config.mini_batch_size)
    epoch, index = divmod(k, per_epoch)
    if k == 0 and role == "policy":
        return _first_policy_loss_hint(float(got.losses[0, 0]), expected, config, rtol)
    if k == 0:
        return ("on unchanged weights V is the rollout's values: 1/2 x the mean over real tokens "
                "of max((V - G)^2, (V_clip - G)^2), with the returns G as stored")
    step = _step_hint(role, got, expected, k, config, rtol)
    if step is not None:
        return step
    if index == 0 and epoch > 0:
        return ("every epoch needs a fresh shuffle: torch.randperm(B, generator=generator) inside "
                "the epoch loop")
    if role == "policy":
        return ("with the weights moved the ratios leave the clip band: the loss is minus the "
                "masked mean of min(rho A, clip(rho, 1 - config.clip_eps, 1 + config.clip_eps) A), "
                "rho against rollout.old_logprobs")
    return ("with the value weights moved the value clip acts: V_clip = V_old + clip(V - V_old, "
            "-config.value_clip, config.value_clip) around the rollout's values, and the larger of "
            "the two squared errors")


def first_difference(got: IterationRecord, expected: IterationRecord, config: PPOConfig,
                     rtol: float) -> str | None:
    """The first difference between a learner's iteration (`got`) and the library's (`expected`), in
    the order the iteration makes things (experience, losses, steps and updates), with the likely
    cause; None if none.

    `rtol` is one forward pass's rounding budget (`rounding_rtol`): the experience gets one; what
    follows k optimiser steps gets k + 1, since each step moves the two runs' weights apart by its
    own rounding."""
    problem = experience_difference(got.rollout, expected, rtol)
    if problem is not None:
        return problem
    if got.losses.shape != expected.losses.shape:
        return (f"you returned {len(got.losses)} (policy loss, value loss) pairs, expected "
                f"{len(expected.losses)}: one per minibatch, {config.ppo_epochs} epochs of "
                f"{len(expected.losses) // config.ppo_epochs}")
    per_epoch = -(-len(expected.mask) // config.mini_batch_size)
    for k in range(len(expected.losses)):
        for column, role in enumerate(("policy", "value")):
            g, e = float(got.losses[k, column]), float(expected.losses[k, column])
            scale = float(expected.losses[:, column].abs().max())  # the column's largest loss
            # minibatch k runs on weights that k steps have moved: a rounding budget for each of
            # them
            if not bool(
                    _far(got.losses[k, column], expected.losses[k, column], (k + 1) * rtol, scale)):
                continue
            epoch, index = divmod(k, per_epoch)
            return (f"your {role} losses match up to minibatch {k} (epoch {epoch}, #{index}) and "
                    f"differ there: got {g:.6f}, expected {e:.6f}. Likely cause: "
                    + _loss_hint(role, k, got, expected, config, rtol))
    for role in ("policy", "value"):
        step = _step_hint(role, got, expected, len(expected.losses) + 1, config, rtol)
        if step is not None:
            return f"every loss matches, but {step}"
        for mine, theirs, size in zip(got.updates[role], expected.updates[role],
                                      expected.weight_sizes[role], strict=True):
            # an update is w_after - w_before in float32 (adapters train in float32): each run's is
            # off by up to one unit in the last place of w, 2 u |w|, so two runs by 4 u |w| (u: the
            # unit roundoff); this floor decides for a matrix whose own change is tiny (LoRA A while
            # B is still near 0)
            floor = 4 * FLOAT32_UNIT_ROUNDOFF * (size + float(theirs.abs().max()))
            budget = (len(expected.losses)
                      + 1) * rtol * max(float(theirs.abs().max()), 1e-12) + floor
            if bool(((mine.double() - theirs.double()).abs() > budget).any()):
                return (f"every loss matches, but the {role} adapter's weights after the update "
                        f"differ: the last minibatch's {role} step (backward, clip, "
                        f"{role}_opt.step()) moved them differently")
    return None


class PassedCode:
    """The function objects a check passed with: a pass belongs to them, not to their names (a
    function redefined after its check is another function, checked again before it is used)."""

    def __init__(self) -> None:
        self.functions: dict[str, Any] = {}  #: name -> the function object that passed

    def record(self, **functions: Any) -> None:
        """Record that the check passed with these functions (unwrapped from the check's in-place
        guard)."""
        self.functions = {name: inspect.unwrap(fn) for name, fn in functions.items()}

    def holds_for(self, **functions: Any) -> bool:
        """True when the check passed with exactly these function objects."""
        return bool(self.functions) and self.functions.keys() == functions.keys() and all(
            self.functions[name] is inspect.unwrap(fn) for name, fn in functions.items())
