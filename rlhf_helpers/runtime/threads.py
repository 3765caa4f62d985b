"""The number of torch threads the course's commands compute with on a CPU (their `--threads` flag).

    use_threads(None)   # the default, DEFAULT_THREADS
    use_threads(2)      # what `--threads 2` asks for

One thread unless told otherwise. The tiny profile's matrices are small (128 wide), so a second
thread gains little on a quiet machine, and on a shared one it loses a lot: OpenMP threads wait for
each other at every operation, so when another process holds one of the cores, every operation
waits for the thread stuck behind it (benchmarks/measure_threads.py; figures in
benchmarks/README.md). The notebooks set one thread in their first cell for the same reason.
"""

from __future__ import annotations

import torch

#: torch threads of the training and reward commands when `--threads` is not given
DEFAULT_THREADS = 1


def use_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count to `threads` (None: DEFAULT_THREADS); returns it.
    ValueError unless it is a whole number >= 1."""
    threads = DEFAULT_THREADS if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads must be a whole number >= 1, got {threads!r}")
    torch.set_num_threads(threads)
    return threads
