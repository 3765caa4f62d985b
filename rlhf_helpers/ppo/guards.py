"""A PPO run's NaN/inf stop: weights checked after each optimiser step, one vote for all processes.

    with guard(accelerator, step):              # every process runs the block, then all agree:
        batch = collect_experience(...)         # a NaN/inf on any one stops all, naming the step
    check_finite_parameters("policy", params, step)

Under `accelerate launch` each process checks its own rollouts and losses. A process that met a NaN
must not simply leave: the others would wait forever in the next gradient all-reduce. So every
process ends each block between two collective operations with a vote (one gathered flag); when a
process voted "stop", all of them raise NonFiniteStop, with that process's message, and none of
them steps or saves afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from rlhf_helpers.core.checks import NonFiniteError, check_no_nan


class NonFiniteStop(NonFiniteError):
    """A NaN or inf met during a PPO run (rewards, losses, weights): the run stops before it can
    spread into the weights. The message names what was not finite and the PPO step."""


def check_all_finite(what: str, x: torch.Tensor, step: int | None = None) -> None:
    """Raise NonFiniteStop naming `what` (and the PPO step) if x holds a NaN or an inf."""
    with non_finite_stops_run(step):
        check_no_nan(what, x)


@contextmanager
def non_finite_stops_run(step: int | None = None) -> Iterator[None]:
    """Turn the maths core's NonFiniteError (NaN/inf logits...) into NonFiniteStop at `step`."""
    try:
        yield
    except NonFiniteStop:
        raise
    except NonFiniteError as error:
        where = f" at PPO step {step}" if step is not None else ""
        raise NonFiniteStop(f"{error}{where}; stopping the run (the last checkpoint written before "
                             "this step is intact)") from error


def check_finite_parameters(what: str, params: Sequence[torch.Tensor],
                            step: int | None = None) -> None:
    """NonFiniteStop if a parameter holds a NaN or an inf (one device sync for all of them).

    max_i |p_i| per tensor (the inf-norm: NaN and inf propagate, a finite weight stays finite,
    however large, where a 2-norm could overflow), then one check over those numbers.
    """
    if not params:
        return
    with torch.no_grad():
        norms = torch._foreach_norm([p.detach() for p in params], math.inf)
        largest = torch.stack(norms)  # (n_params,)
    if not bool(torch.isfinite(largest).all()):
        where = f" at PPO step {step}" if step is not None else ""
        bad = int((~torch.isfinite(largest)).sum())
        raise NonFiniteStop(f"{what} weights: {bad} tensor(s) hold NaN/inf after an optimiser "
                             f"step{where}; stopping the run (nothing is saved after this; the "
                             "last checkpoint written before this step is intact)")


@torch.no_grad()
def check_outputs_finite(model: Any, batch: Any, temperature: float, step: int) -> None:
    """NonFiniteStop unless `model`'s policy log-probs and values are finite on `batch`'s real
    tokens (an experience batch): weights can all be finite and still overflow in the next forward.
    Runs inside the caller's guard (no vote of its own)."""
    seq, attn, P = batch.sequences, batch.attention_mask, batch.context_length
    real = batch.mask.bool()  # (B, R)
    try:
        with non_finite_stops_run(step):
            logp = model.policy_logprobs(seq, attn, P, temperature=temperature)  # (B, R)
            values = model.values(seq, attn, P).float()  # (B, R)
        check_all_finite("policy log-probs", torch.where(real, logp.float(), 0.0), step)
        check_all_finite("values", torch.where(real, values, 0.0), step)
    except NonFiniteStop as error:
        raise NonFiniteStop(f"the weights after the update of PPO step {step} fail on their own "
                             f"batch (checked before saving them): {error}") from None


class PeerProcessFailed(RuntimeError):
    """Another process of a multi-process run met an unexpected error: this one stops with it.

    The process that met the error re-raises it (its traceback is the one to read); the others raise
    this, whose message names that process and its error, so the launcher's log holds one traceback.
    """


def describe(error: BaseException) -> str:
    """What a process tells the others in the vote: a NaN stop's message, else "type: message"."""
    return str(error) if isinstance(error, NonFiniteError) else f"{type(error).__name__}: {error}"


def agree_to_stop(accelerator: Any, error: Exception | None) -> None:
    """The collective decision: raise on every process if any process brings an error (else return).

    One gathered flag per call; the messages are gathered only when some process wants to stop, so
    a process that saw nothing can report what another one saw. A NaN/inf anywhere stops every
    process with NonFiniteStop. Any other error wins over it: the process that met it raises its own
    error, the others PeerProcessFailed. Identity on one process.
    """
    if accelerator is None or accelerator.num_processes == 1:
        if error is not None:
            raise error
        return
    # accelerate: only for a training run, which may be multi-process
    from accelerate.utils import gather_object

    device = accelerator.device
    flag = torch.tensor([0 if error is None else 1], device=device)
    flags = accelerator.gather(flag)  # (num_processes,)
    bad = [rank for rank, flag in enumerate(flags.tolist()) if flag]
    if not bad:
        return
    # one (is it a NaN stop?, message) per process, in rank order; None where it saw nothing
    report = None if error is None else (isinstance(error, NonFiniteError), describe(error))
    reports = gather_object([report])
    where = f"of {accelerator.num_processes}"
    failed = [rank for rank in bad if not reports[rank][0]]
    if failed:
        if error is not None and not isinstance(error, NonFiniteError):
            error.stopped_its_peers = True  # type: ignore[attr-defined]  # see stopped_its_peers()
            raise error
        raise PeerProcessFailed(f"process {failed[0]} {where} failed ({reports[failed[0]][1]}); "
                                f"this process stops with it: read process {failed[0]}'s traceback")
    if error is not None:
        raise NonFiniteStop(
            f"{error} [process {accelerator.process_index} {where}; every process stops]")
    raise NonFiniteStop(f"{reports[bad[0]][1]} [process {bad[0]} {where}; every process stops]")


def stopped_its_peers(error: BaseException) -> bool:
    """True for an error that a vote reported to the other processes: they raised PeerProcessFailed
    and are printing their line, so the process that met it can meet them at a barrier before it
    exits."""
    return bool(getattr(error, "stopped_its_peers", False))


@contextmanager
def collective_stop(accelerator: Any) -> Iterator[None]:
    """Run the block on every process, then vote: an error on any process stops all of them.

    Put one around each stretch of local work that ends in a collective operation (gradient
    all-reduce, metric reduction) or in a checkpoint save. A NaN/inf stops every process with the
    same NonFiniteStop; any other error is re-raised where it happened and ends the others with
    PeerProcessFailed, instead of a second traceback from a peer that left the collective.
    """
    error: Exception | None = None
    try:
        yield
    except Exception as caught:
        error = caught  # a NonFiniteStop, the maths core's own check, or a bug: the vote decides
    agree_to_stop(accelerator, error)


@contextmanager
def guard(accelerator: Any, step: int | None,
          optimizers: Sequence[torch.optim.Optimizer] = ()) -> Iterator[None]:
    """The one wrapper of a PPO run's work: the maths core's NonFiniteError becomes NonFiniteStop at
    `step` (`non_finite_stops_run`), then every process votes (`collective_stop`), so a NaN/inf or
    an error on any process stops all of them at the same point. Identity, apart from the NaN
    message, on one process. `optimizers`: if the block raises, their gradients are dropped: never
    stepped on, they must not add to the next minibatch's if the trainer is used again."""
    try:
        with collective_stop(accelerator), non_finite_stops_run(step):
            yield
    except BaseException:
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        raise
