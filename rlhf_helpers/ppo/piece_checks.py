"""The trainer's side of each call of a replaceable piece of PPO's maths (`pieces`): a piece may not
change the trainer's tensors in place and must return what its contract says; an error raised
inside it names it.

    out = call_piece("advantage_fn", advantage_fn, rewards, values, mask, gamma, lam)
    advantages, returns = tensor_pair("advantage_fn", out, ("advantages", "returns"), like=rewards)
    loss, stats = loss_and_stats("policy_loss_fn", out, wants_grad=logprobs.requires_grad)

Every check reads what the tensors already carry (the in-place write counter `_version` torch keeps
on each tensor, shape, dtype, layout, device, `requires_grad`): no device sync and no extra pass, so
they run on every call. The trainer hands each piece copies of its tensors (`pieces`), so an edit
that bypasses `_version` (`.data`, `.numpy()`) reaches nothing of the trainer's; the `_version`
check still names the usual in-place mistake. Finiteness stays with the run's NaN stop (`guards`). A
piece is refused before any optimiser step uses what it returned, so a refusal leaves the weights as
they were.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from rlhf_helpers.core.checks import NonFiniteError
from rlhf_helpers.ppo.learner_guard import global_modes_kept, modes_changed_message
from rlhf_helpers.ppo.piece_contracts import PIECES


class PieceError(ValueError):
    """A piece given to PPOTrainer (`shape_rewards_fn`, `advantage_fn`, `policy_loss_fn`,
    `value_loss_fn`, `update_fn`) raised an error, changed a tensor it was given in place, or
    returned what the trainer cannot use. The message names the piece; an error raised inside it is
    the `__cause__`."""


def describe(value: Any) -> str:
    """What a piece returned, in words: type, and for a tensor its shape, dtype and gradient."""
    if isinstance(value, torch.Tensor):
        grad = "requires grad" if value.requires_grad else "no grad"
        layout = ("" if value.layout == torch.strided
                  else f"{str(value.layout).removeprefix('torch.')} ")
        return f"a {layout}tensor of shape {tuple(value.shape)}, dtype {value.dtype}, {grad}"
    if isinstance(value, (tuple, list)):
        more = "; ..." if len(value) > 3 else ""
        inner = "; ".join(describe(item) for item in value[:3]) + more
        return f"a {type(value).__name__} of {len(value)} ({inner})"
    if value is None:
        return "None"
    if isinstance(value, int) and abs(value) >= 2**64:  # digits to flood a message (or fail str())
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, (int, float)):
        return f"{'an' if isinstance(value, int) else 'a'} {type(value).__name__} ({value!r})"
    return f"a {type(value).__name__}"


def _watched(name: str, args: tuple[Any, ...]) -> Iterator[tuple[str, torch.Tensor]]:
    """(label, tensor) of each tensor argument and tensor field of a dataclass one (the batch)."""
    labels = PIECES[name].parameters if name in PIECES else ()
    for index, arg in enumerate(args):
        label = labels[index] if index < len(labels) else f"argument {index + 1}"
        if isinstance(arg, torch.Tensor):
            yield label, arg
        elif dataclasses.is_dataclass(arg) and not isinstance(arg, type):
            for field in dataclasses.fields(arg):
                value = getattr(arg, field.name)
                if isinstance(value, torch.Tensor):
                    yield f"{label}.{field.name}", value


def call_piece(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args). PieceError naming the piece when it raised (the original error is the cause; a NaN
    stop and another piece's refusal pass through as they are), when it changed one of its tensors
    in place, or when it left one of torch's global modes changed (autograd off, a float64 default
    dtype: put back, then named, since every later step would run in it)."""
    watched = [(label, tensor, tensor._version) for label, tensor in _watched(name, args)]
    try:
        with global_modes_kept() as modes_changed:
            out = fn(*args)
    except (PieceError, NonFiniteError):
        raise
    except Exception as error:
        raise PieceError(f"{name} raised {type(error).__name__}: {error}") from error
    if modes_changed:
        raise PieceError(modes_changed_message(name, modes_changed))
    changed = [label for label, tensor, version in watched if tensor._version != version]
    if changed:
        raise PieceError(
            f"{name} changed its argument {changed[0]} in place: that tensor is the trainer's, and "
            "the run would go on with the changed numbers. Work on a new tensor (x = x.clone(), or "
            "x = x * m instead of x *= m)"
        )
    return out


def check_token_tensor(name: str, what: str, tensor: Any, like: torch.Tensor,
                       expected: str) -> None:
    """PieceError unless `tensor` is a dense tensor of `like`'s shape and dtype on its device."""
    ok = (
        isinstance(tensor, torch.Tensor)
        and tensor.layout == torch.strided  # a sparse result fails later, in another piece's name
        and tensor.shape == like.shape
        and tensor.dtype == like.dtype  # the run's precision: a bf16 result rounds all later ones
        and tensor.device == like.device
    )
    if not ok:
        where = (f" on {tensor.device}"
                 if isinstance(tensor, torch.Tensor) and tensor.device != like.device else "")
        raise PieceError(
            f"{name} returned {what} as {describe(tensor)}{where}; expected {expected}")


def tensor_pair(name: str, out: Any, names: tuple[str, str],
                like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A piece's (a, b) result checked: two floating tensors of `like`'s shape (advantage_fn's)."""
    expected = (
        f"({names[0]}, {names[1]}): two floating tensors of shape {tuple(like.shape)}, dtype "
        f"{like.dtype}, on {like.device}"
    )
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise PieceError(f"{name} must return {expected}; it returned {describe(out)}")
    for what, tensor in zip(names, out, strict=True):
        check_token_tensor(name, what, tensor, like, expected)
    return out[0], out[1]


def rewards_result(name: str, out: Any,
                   like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A shaping function's result checked: rewards, or (rewards, kl) -> (rewards, kl or None)."""
    if isinstance(out, torch.Tensor):
        check_token_tensor(
            name, "rewards", out, like,
            f"floating rewards of shape {tuple(like.shape)}, dtype {like.dtype}"
        )
        return out, None
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return tensor_pair(name, out, ("rewards", "kl"), like)
    raise PieceError(
        f"{name} must return rewards, or (rewards, kl): floating tensors of shape "
        f"{tuple(like.shape)}, dtype {like.dtype}; "
        f"it returned {describe(out)}"
    )


def loss_and_stats(name: str, out: Any, wants_grad: bool) -> tuple[torch.Tensor, Mapping[str, Any]]:
    """A loss function's result checked: a floating one-number tensor, or (that loss, a dict of stat
    name -> number). `wants_grad`: its inputs carry a gradient, so the loss must too (it is
    back-propagated)."""
    expected = "a floating scalar tensor, or (loss, stats) with stats a dict of stat name -> number"
    if isinstance(out, tuple) and len(out) != 2:
        raise PieceError(f"{name} must return {expected}; it returned {describe(out)}")
    loss, stats = out if isinstance(out, tuple) else (out, {})
    if not isinstance(loss, torch.Tensor):
        hint = (
            " (a number carries no gradient: keep the loss a tensor, not .item() or float())"
            if isinstance(loss, (int, float))
            else ""
        )
        raise PieceError(
            f"{name} returned a loss that is {describe(loss)}; expected {expected}{hint}")
    if loss.numel() != 1 or not loss.is_floating_point():
        raise PieceError(
            f"{name} returned a loss that is {describe(loss)}; expected {expected} (reduce the "
            "per-token terms to one number, e.g. a masked mean)"
        )
    if wants_grad and not loss.requires_grad:
        raise PieceError(
            f"{name} returned a loss that does not require grad: {describe(loss)}. It has no "
            "gradient path to the weights: was it detached, rebuilt from a number (.item(), "
            "float(), torch.tensor(...)), or computed under torch.no_grad()?"
        )
    if not isinstance(stats, Mapping):
        raise PieceError(
            f"{name} returned (loss, stats) with stats {describe(stats)}; expected a dict of stat "
            "name -> number (or return the loss alone)"
        )
    for key, value in stats.items():
        if not _is_stat(value):
            raise PieceError(
                f"{name} returned the stat {key!r} as {describe(value)}; expected a finite real "
                "number or a one-element real tensor (the trainer logs float() of it)"
            )
    return loss, stats


def _is_stat(value: Any) -> bool:
    """A number the trainer can log: a finite int/float (float() of 10**400 overflows), or a
    one-element real tensor (read later with the other stats: its value is not checked here, which
    would sync the device)."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.layout == torch.strided and not value.is_complex()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def check_no_gradient_yet(name: str, params: list[torch.Tensor], adapter: str) -> None:
    """Before the trainer's `backward()` of the loss `name` returned: PieceError when the adapter
    already holds a gradient (every step ends with the gradients set to None), that is, when the
    piece ran backward() itself: the trainer's backward would then add a second gradient (or fail on
    a graph already freed)."""
    if any(param.grad is not None for param in params):
        raise PieceError(f"{name} ran backward() itself: the {adapter} adapter already holds a "
                         "gradient. Return the loss without calling backward(): the trainer "
                         "back-propagates it (a second backward would double the gradient)")


def check_reaches_adapter(name: str, loss: torch.Tensor, params: list[torch.Tensor],
                          adapter: str) -> None:
    """After `loss.backward()`: PieceError naming the piece when no parameter of the adapter got a
    gradient (the loss is a fresh tensor that requires grad, say): its training would stop silently,
    logged as a zero gradient norm. Run before any optimiser step; the gradients were None before
    the backward."""
    if loss.requires_grad and params and all(param.grad is None for param in params):
        inputs = "log-probs" if adapter == "policy" else "values"
        raise PieceError(
            f"{name} returned a loss whose backward() reached none of the {adapter} adapter's "
            f"weights: its loss does not depend on the {adapter} adapter's weights. Build it from "
            f"the {inputs} it is given (not from a new tensor made with requires_grad=True)"
        )
