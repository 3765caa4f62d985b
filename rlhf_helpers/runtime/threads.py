"""The number of torch threads the course's commands compute with on a CPU (their `--threads` flag).

    use_threads(None)   # the default, DEFAULT_THREADS
    use_threads(2)      # what `--threads 2` asks for
    threads_problem(100000)   # "--threads must be at most 2, ...": checked before any build

One thread unless told otherwise. The tiny profile's matrices are small (128 wide), so a second
thread gains little on a quiet machine, and on a shared one it loses a lot: OpenMP threads wait for
each other at every operation, so when another process holds one of the cores, every operation
waits for the thread stuck behind it (benchmarks/measure_threads.py; figures in
benchmarks/README.md). The notebooks set one thread in their first cell for the same reason.

The most is one thread per CPU this process may run on (`max_threads`). A thread beyond them always
waits for a core, which is the loaded case above (2.6-3.7x slower with one thread too many), so no
larger count is ever faster; and a count far beyond them (100000) starts more threads than the
system lets one process have, and the next thread pool to start (the tokenizer's) panics and the
process dies (a segmentation fault, not an error).
"""

from __future__ import annotations

import os

import torch

#: torch threads of the training and reward commands when `--threads` is not given
DEFAULT_THREADS = 1


def max_threads() -> int:
    """The CPUs this process may run on (its CPU affinity where the system reports one, else
    os.cpu_count()): the most threads `--threads` takes."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def threads_problem(threads: object) -> str | None:
    """Why `threads` cannot be a thread count (the `--threads` flag's own words), or None: a whole
    number from 1 to `max_threads()`."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        return f"--threads must be a whole number >= 1, got {threads!r}"
    limit = max_threads()
    if threads > limit:
        return (f"--threads must be at most {limit}, the CPUs this process may use, got {threads}: "
                "a thread beyond them only waits for a core (benchmarks/README.md)")
    return None


def use_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count to `threads` (None: DEFAULT_THREADS); returns it.
    ValueError unless it is a whole number from 1 to `max_threads()`."""
    threads = DEFAULT_THREADS if threads is None else threads
    problem = threads_problem(threads)
    if problem is not None:
        raise ValueError(problem)
    torch.set_num_threads(threads)
    return threads
