"""Ctrl-C while a command is still starting (the training command imports torch and transformers for
seconds): one line and exit 130, not a traceback; and where launchers put a process's rank.

    quiet_early_interrupt()   # first thing in a command, before torch and transformers load
    ...                       # the heavy imports
    restore_interrupt()       # once `main` handles Ctrl-C itself (its line names the checkpoint)

Imports only the standard library, so it is in place a few milliseconds after the process starts.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

#: Exit status of a run ended by Ctrl-C (SIGINT): 128 + 2, as a shell reports a process the signal
#: ended.
EXIT_INTERRUPTED = 130
#: The line of a Ctrl-C that came before the command could do anything.
EARLY_LINE = "PPO interrupted (Ctrl-C) before training started: nothing was written"
#: Where launchers put a process's global rank (torchrun/accelerate, MPICH, Open MPI, MVAPICH), as
#: accelerate reads it.
RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")


def is_rank_zero() -> bool:
    """False in a process a launcher started with a global rank other than 0."""
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def _interrupted_early(signum: int, frame: FrameType | None) -> None:
    """Print the line (rank 0 only: a launcher passes Ctrl-C to every process) and end the process
    at once: an exception would unwind through half-finished imports, and nothing is open that needs
    closing."""
    if is_rank_zero():
        print(EARLY_LINE, file=sys.stderr, flush=True)
    os._exit(EXIT_INTERRUPTED)


def quiet_early_interrupt() -> None:
    """Make Ctrl-C end the process with EARLY_LINE and exit 130 until `restore_interrupt`."""
    signal.signal(signal.SIGINT, _interrupted_early)


def restore_interrupt() -> None:
    """Ctrl-C raises KeyboardInterrupt again (Python's default), when `quiet_early_interrupt` had
    replaced it; a handler someone else installed (a notebook's, a test runner's) is left alone."""
    if signal.getsignal(signal.SIGINT) is _interrupted_early:
        signal.signal(signal.SIGINT, signal.default_int_handler)
