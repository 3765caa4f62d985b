"""One optimiser per trained adapter: gradient all-reduce, fp16 loss scale, clip, step, NaN checks.

    policy = AdapterOptimizer("policy", model.policy_parameters(), lr=1e-4, max_grad_norm=1.0,
                              fp16=needs_grad_scaler(model), device_type="cuda", accelerator=None)
    norm = policy.backward_and_step(loss, step=7)   # d(S L), average, unscale, clip, step, check
    policy.backward(loss); norm = policy.sync_and_step(step=7)    # the same in two calls

Each adapter (the policy's, the value's with its head) has its own Adam and, on an fp16 base, its
own `torch.amp.GradScaler`: the two losses have their own gradients and their own overflows. The
loss is multiplied by the scale S before backward, the gradients are divided by S (`unscale_`)
before the norm clip, and a step whose gradients overflowed is skipped and S halved. Such an
overflow is expected now and then under fp16 and is not a NaN stop; a gradient that stays non-finite
until S falls below `precision.MIN_LOSS_SCALE` is. With bf16 or float32 the scaler is a disabled
pass-through.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhf_helpers.ppo.guards import check_all_finite, check_finite_parameters, guard
from rlhf_helpers.ppo.piece_checks import check_no_gradient_yet, check_reaches_adapter
from rlhf_helpers.runtime.precision import MIN_LOSS_SCALE, make_grad_scaler


class AdapterOptimizer:
    """Adam over one adapter's parameters, with its loss scaler and its count of fp16 overflows."""

    def __init__(self, name: str, params: list[torch.nn.Parameter], lr: float, max_grad_norm: float,
                 fp16: bool, device_type: str, accelerator: Any = None) -> None:
        self.name = name  #: "policy" or "value": named in NaN messages and checkpoint keys
        self.params = params  #: the trained tensors (LoRA matrices, value head)
        self.max_grad_norm = max_grad_norm  #: clip of the gradient's 2-norm before each step
        #: gradients are averaged over its processes (None: one process)
        self.accelerator = accelerator
        # foreach: one batched kernel per Adam operation over all tensors (same numbers as the
        # per-tensor loop, which is torch's default on the CPU)
        self.optimizer: torch.optim.Optimizer = torch.optim.Adam(params, lr=lr, foreach=True)
        #: loss scaler (a pass-through unless fp16)
        self.scaler = make_grad_scaler(device_type, fp16)
        self.overflow_skips = 0  #: steps skipped because their fp16 gradients overflowed

    @property
    def num_processes(self) -> int:
        return self.accelerator.num_processes if self.accelerator is not None else 1

    def backward_and_step(self, loss: torch.Tensor, step: int) -> float:
        """Backpropagate `loss` (scaled), then `sync_and_step`; returns the pre-clip grad norm."""
        self.backward(loss)
        return self.sync_and_step(step)

    def backward(self, loss: torch.Tensor, piece: str | None = None) -> None:
        """Back-propagate `loss` (scaled) into the gradients, without stepping: the caller steps
        with `sync_and_step` once nothing else can refuse the minibatch. `piece`: the loss function
        that made `loss`, refused (PieceError) when no gradient reached this adapter
        (`piece_checks.check_reaches_adapter`)."""
        if piece is not None:
            check_no_gradient_yet(piece, self.params, self.name)
        self.scaler.scale(loss).backward()  # d(S L) (S = 1 without fp16)
        if piece is not None:
            check_reaches_adapter(piece, loss, self.params, self.name)

    def sync_and_step(self, step: int) -> float:
        """Average gradients across processes, unscale them, clip their norm, step, check the new
        weights; returns the pre-clip norm (0.0 for a step skipped on overflow).

        The (scaled) gradients are averaged before `unscale_`, so every process sees the same
        overflow and keeps the same loss scale.
        """
        if self.num_processes > 1:
            for param in self.params:
                if param.grad is not None:
                    param.grad = self.accelerator.reduce(param.grad, reduction="mean")
        # every process holds the same averaged gradients and weights, but the stop is voted anyway:
        # the next collective operation must never meet a process that has left
        with guard(self.accelerator, step):
            self.scaler.unscale_(self.optimizer)  # g = g_scaled / S (a no-op without fp16)
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            if not bool(torch.isfinite(norm)):
                self.optimizer.zero_grad(set_to_none=True)  # never step on a NaN/inf gradient
                if not self._fp16_overflow():
                    check_all_finite("gradient norm", norm, step)
                return 0.0
            self.scaler.step(self.optimizer)  # optimizer.step(), the gradients being finite
            # S doubles after GRAD_SCALER_GROWTH_INTERVAL finite steps in a row
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            check_finite_parameters(self.name, self.params, step)
        return float(norm)

    def _fp16_overflow(self) -> bool:
        """After a non-finite gradient norm: True if it counts as an fp16 overflow (the step is
        skipped, the scale S halved), False if it is a real NaN stop (no scaler, or S already below
        MIN_LOSS_SCALE: the unscaled gradient itself is not finite)."""
        if not self.scaler.is_enabled() or self.scaler.get_scale() < MIN_LOSS_SCALE:
            return False
        self.scaler.step(self.optimizer)  # skips: unscale_ recorded the inf/NaN
        self.scaler.update()  # S <- S / 2
        self.overflow_skips += 1
        return True

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """{NAME_optimizer: ...} and, under fp16, {NAME_scaler: ...}: the trainer state's keys."""
        state: dict[str, Any] = {f"{self.name}_optimizer": self.optimizer.state_dict()}
        if self.scaler.is_enabled():
            state[f"{self.name}_scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of `state_dict` (a float32/bf16 checkpoint resumed in fp16 gets a new scaler)."""
        self.optimizer.load_state_dict(state[f"{self.name}_optimizer"])
        if state.get(f"{self.name}_scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state[f"{self.name}_scaler"])
        self.overflow_skips = int(state.get("overflow_skips", {}).get(self.name, 0))
