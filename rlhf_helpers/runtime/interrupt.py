"""Ctrl-C in a command: one line on stderr and exit 130, never a traceback; and where launchers put
a process's rank.

    if __name__ == "__main__":                  # first thing in a command's module
        quiet_early_interrupt(PROG)             # "PROG: interrupted (Ctrl-C) before it started..."
    ...                                         # the heavy imports (torch, transformers: seconds)

    @one_line_interrupt(PROG, "nothing was written")   # main's own Ctrl-C, the same one line
    def main(argv=None): ...

`quiet_early_interrupt` covers the imports, `one_line_interrupt` the command's work (it hands Ctrl-C
back to Python first: `restore_interrupt`). The training command handles Ctrl-C in its `main`
itself, its line naming the checkpoint to resume from. `deferred_interrupt` holds a Ctrl-C back over
a few steps that must not be split (the two renames of `folder_swap.replace_folder`).

Imports only the standard library, so it is in place a few milliseconds after the process starts.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import ParamSpec, TypeVar

#: Exit status of a run ended by Ctrl-C (SIGINT): 128 + 2, as a shell reports a process the signal
#: ended.
EXIT_INTERRUPTED = 130
#: The line of a Ctrl-C that came before the command could do anything.
EARLY_LINE = "PPO interrupted (Ctrl-C) before training started: nothing was written"
#: Where launchers put a process's global rank (torchrun/accelerate, MPICH, Open MPI, MVAPICH), as
#: accelerate reads it.
RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")

_early_line = EARLY_LINE  #: what `_interrupted_early` prints
Params = ParamSpec("Params")
Result = TypeVar("Result")


def is_rank_zero() -> bool:
    """False in a process a launcher started with a global rank other than 0."""
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def _interrupted_early(signum: int, frame: FrameType | None) -> None:
    """Print the line (rank 0 only: a launcher passes Ctrl-C to every process) and end the process
    at once: an exception would unwind through half-finished imports, and nothing is open that needs
    closing."""
    if is_rank_zero():
        print(_early_line, file=sys.stderr, flush=True)
    os._exit(EXIT_INTERRUPTED)


def quiet_early_interrupt(prog: str | None = None) -> None:
    """Make Ctrl-C end the process with one line and exit 130 until `restore_interrupt`: that `prog`
    was interrupted before it started (None: the training command's EARLY_LINE)."""
    global _early_line
    _early_line = (EARLY_LINE if prog is None
                   else interrupted_line(prog, "before it started, so nothing was written"))
    signal.signal(signal.SIGINT, _interrupted_early)


def restore_interrupt() -> None:
    """Ctrl-C raises KeyboardInterrupt again (Python's default), when `quiet_early_interrupt` had
    replaced it; a handler someone else installed (a notebook's, a test runner's) is left alone."""
    if signal.getsignal(signal.SIGINT) is _interrupted_early:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) while the block runs: one that comes meanwhile is delivered when
    the block ends (exception or not), to the handler that was in force before (KeyboardInterrupt,
    as a rule). Only the main thread may set handlers: in another thread, or when SIGINT is ignored
    or handled outside Python, the block runs as it is."""
    previous = signal.getsignal(signal.SIGINT)
    if (threading.current_thread() is not threading.main_thread()
            or not (callable(previous) or previous == signal.SIG_DFL)):
        yield
        return
    received: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:  # now, to the previous handler: KeyboardInterrupt, or the end of the process
            signal.raise_signal(signal.SIGINT)


def interrupted_line(prog: str, left: str = "") -> str:
    """The one line of a command ended by Ctrl-C: "PROG: interrupted (Ctrl-C); LEFT"."""
    return f"{prog}: interrupted (Ctrl-C)" + (f"; {left}" if left else "")


def raised_by_ctrl_c(error: BaseException) -> bool:
    """Whether `error` was raised from a Ctrl-C (`raise ... from` a KeyboardInterrupt: a step's
    undo that could not finish). A command then ends as on Ctrl-C: the process ends, so what the
    undo could not put back in memory goes with it, and nothing on disk depends on it."""
    return isinstance(error.__cause__, KeyboardInterrupt)


def one_line_interrupt(prog: str, left: str = "") -> Callable[[Callable[Params, Result]],
                                                               Callable[Params, Result]]:
    """Decorate a command's `main`: Ctrl-C while it runs prints `interrupted_line(prog, left)` on
    stderr (rank 0 only) and exits 130 (SystemExit), instead of a KeyboardInterrupt traceback; so
    does an error raised from the Ctrl-C (`raise ... from` it: a step's undo that failed).
    `left` says what the command leaves behind ("nothing was written")."""

    def decorate(main: Callable[Params, Result]) -> Callable[Params, Result]:
        @functools.wraps(main)
        def run(*args: Params.args, **kwargs: Params.kwargs) -> Result:
            restore_interrupt()  # from here Ctrl-C raises KeyboardInterrupt, caught below
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                if is_rank_zero():
                    print(interrupted_line(prog, left), file=sys.stderr, flush=True)
                raise SystemExit(EXIT_INTERRUPTED) from None
            except Exception as error:
                if not raised_by_ctrl_c(error):
                    raise
                if is_rank_zero():
                    print(interrupted_line(prog, left), file=sys.stderr, flush=True)
                raise SystemExit(EXIT_INTERRUPTED) from None

        return run

    return decorate
