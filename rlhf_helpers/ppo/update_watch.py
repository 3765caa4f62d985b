"""A caller's update loop (`update_fn`) watched: the gradient its optimisers stepped on, whether the
policy trained, and whether it changed a frozen weight.

    with UpdateWatch(policy_opt, value_opt, model) as watch:
        losses = update_fn(model, batch, policy_opt, value_opt, ...)
        watch.check_policy_trained(step)               # PieceError if it never stepped the policy
    watch.grad_norms("policy")                         # [||g|| at each policy_opt.step()], in order

When the loop fails, is refused or is interrupted, the trainer puts its adapters and optimiser
states back (`step_undo`, the same rule as for the library's update); a change to a frozen weight
cannot be put back, so it is named whatever else went wrong.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhf_helpers.ppo.piece_checks import PieceError


class FrozenWeightsChanged(PieceError):
    """update_fn changed a weight no optimiser trains (the base, the reward adapter or head)."""

class UpdateWatch:
    """Hooks on both optimisers' `step` while a block runs, and a copy of what they update."""

    def __init__(
        self, policy_opt: torch.optim.Optimizer, value_opt: torch.optim.Optimizer,
        model: torch.nn.Module | None = None
    ) -> None:
        self.optimizers = {"policy": policy_opt, "value": value_opt}
        self.params = {
            key: [p for group in opt.param_groups for p in group["params"]]
            for key, opt in self.optimizers.items()
        }
        trained = {id(p) for params in self.params.values() for p in params}
        #: the model's weights no optimiser updates (the base, the reward adapter and head), by name
        self.frozen = [
            (n, p) for n, p in (model.named_parameters() if model is not None else ())
            if id(p) not in trained
        ]
        self._fingerprint: tuple[list[int], torch.Tensor | None] = ([], None)
        #: the gradients' 2-norm at each step() that found some, as tensors (read once, at the end)
        self.norms: dict[str, list[torch.Tensor]] = {"policy": [], "value": []}
        self.steps = {"policy": 0, "value": 0}  #: step() calls, with or without a gradient
        #: the adapters' weights when the block began (did the policy move?)
        self._saved: dict[str, list[torch.Tensor]] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> UpdateWatch:
        for key, optimizer in self.optimizers.items():
            self._saved[key] = [p.detach().clone() for p in self.params[key]]
            self._handles.append(optimizer.register_step_pre_hook(self._before_step(key)))
        self._fingerprint = self._frozen_fingerprint()
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        for handle in self._handles:
            handle.remove()
        # a failed, refused or interrupted update: the trainer puts the adapters back (`step_undo`)
        if exc_type is not None and not isinstance(exc, FrozenWeightsChanged):
            try:  # a change to the base cannot be put back: say so, whatever else went wrong
                self.check_frozen_unchanged()
            except FrozenWeightsChanged as frozen:
                if not isinstance(exc, Exception):  # Ctrl-C stays Ctrl-C, the change named on it
                    exc.add_note(str(frozen))
                    return False
                raise FrozenWeightsChanged(f"{exc}; and {frozen}") from exc
        return False

    def _before_step(self, key: str) -> Any:
        def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.steps[key] += 1
            grads = [p.grad for p in self.params[key] if p.grad is not None]
            if grads:  # no .item(): the norms are read once, after the loop
                self.norms[key].append(
                    torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))

        return hook

    def check_policy_trained(self, step: int) -> None:
        """PieceError naming update_fn when the policy adapter's weights did not move and policy_opt
        never stepped on a gradient: the run would go on without training. A step on a zero gradient
        is not refused (one minibatch may have none); its norm, 0, is logged as policy_grad_norm."""
        if self.norms["policy"]:
            return
        moved = any(
            not torch.equal(param, saved)
            for param, saved in zip(self.params["policy"], self._saved["policy"], strict=True)
        )
        if not moved:  # an optimiser of the loop's own that moved the weights is its choice
            raise PieceError(
                f"update_fn left the policy adapter's weights unchanged at PPO step {step}: it "
                f"called policy_opt.step() {self.steps['policy']} time(s), never with a gradient, "
                "so the run would not train. On each minibatch call policy_opt.zero_grad(), "
                "loss.backward(), then policy_opt.step()"
            )

    def _frozen_fingerprint(self) -> tuple[list[int], torch.Tensor | None]:
        """The frozen weights' in-place write counters, and per tensor the float64 sum of its values
        and their 2-norm: `.data` and `.numpy()` writes bypass the counters, so the content is
        summed too. The cost is one read of the frozen weights per update (no copy of them is kept);
        an edit that keeps both sums of a tensor (a permutation of its values) goes unseen."""
        if not self.frozen:
            return [], None
        with torch.no_grad():
            sums = [
                torch.stack([p.sum(dtype=torch.float64),
                             torch.linalg.vector_norm(p, dtype=torch.float64)])
                for _, p in self.frozen
            ]
        return [p._version for _, p in self.frozen], torch.stack(sums)

    def check_frozen_unchanged(self) -> None:
        """PieceError naming update_fn when it changed a frozen weight: the reference policy and the
        reward model would no longer be the ones the run started from. Such a change cannot be put
        back (no copy of the base is kept); the adapters' weights are, by the trainer
        (`step_undo`)."""
        versions, sums = self._fingerprint
        if sums is None:
            return
        now_versions, now_sums = self._frozen_fingerprint()
        exact = torch.isclose(sums, now_sums, rtol=0.0, atol=0.0, equal_nan=True)  # (n, 2)
        same = exact.all(dim=1).tolist()
        changed = [
            name
            for (name, _), before, after, kept in zip(self.frozen, versions, now_versions, same,
                                                      strict=True)
            if before != after or not kept
        ]
        if changed:
            more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            listed = ", ".join(changed[:5]) + more
            raise FrozenWeightsChanged(
                f"update_fn changed frozen weights: {listed}. Only the policy and value adapters "
                "(the optimisers' parameters) may change; the base and the reward model are shared "
                "by the reference and the reward. The change cannot be undone here: rebuild the "
                "model before training again"
            )

    def grad_norms(self, key: str) -> list[float]:
        """The gradient norm at each step() with a gradient of the "policy" or "value" optimiser."""
        return torch.stack(self.norms[key]).tolist() if self.norms[key] else []
