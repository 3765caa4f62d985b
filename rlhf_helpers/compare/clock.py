"""The training budget (CPU seconds on a CPU, wall seconds on a GPU) and the peak memory of a run.

    clock = TrainingClock(device)
    with clock.running():   # counts only inside: model building and evaluations stay outside
        trainer.step()
    clock.seconds
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlhf_helpers.runtime.memory import PeakMemory


class TrainingClock:
    """Seconds spent inside `running()`: this process's CPU time on a CPU (all its threads; a busy
    neighbour on the machine does not inflate it), wall time after a CUDA synchronise on a GPU."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        #: "cpu": process CPU seconds; "wall": wall seconds (CUDA)
        self.kind = "wall" if self.device.type == "cuda" else "cpu"
        self.seconds = 0.0  #: budget spent so far
        self.wall_seconds = 0.0  #: wall seconds spent inside running(), for scale
        self._started: tuple[float, float] | None = None

    def _now(self) -> float:
        if self.kind == "wall":
            torch.cuda.synchronize(self.device)
            return time.perf_counter()
        return time.process_time()

    def start(self) -> None:
        """Start counting (a clock already running is restarted from now)."""
        self._started = (self._now(), time.perf_counter())

    def stop(self) -> None:
        """Stop counting and add the time since `start` (a no-op when not running)."""
        started = self._started
        if started is not None:
            self.seconds += self._now() - started[0]
            self.wall_seconds += time.perf_counter() - started[1]
            self._started = None

    @contextmanager
    def running(self) -> Iterator[None]:
        """Count the time spent inside the block."""
        self.start()
        try:
            yield
        finally:
            self.stop()


def _release_freed_heap() -> None:
    """Hand freed C heap back to the OS (glibc malloc_trim), so that a run's RSS peak is not hidden
    by memory an earlier run freed but the allocator kept resident; a no-op off glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemoryMeter:
    """Peak memory a run adds: CUDA max_memory_allocated above the start on a GPU; on a CPU the rise
    of the process's resident memory (`memory.PeakMemory`, after handing freed heap back)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            self.how = "CUDA max_memory_allocated above the start"
        else:
            _release_freed_heap()
            self._rss = PeakMemory()
            self.how = f"resident memory above the start ({self._rss.how})"

    def rise_mb(self) -> float:
        """Highest memory since construction minus the memory at construction, MB."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return (torch.cuda.max_memory_allocated(self.device) - self._start) / 2**20
        return self._rss.rise_mb()
