"""Peak resident memory of this process over a stretch of code, for the notebooks' memory figures.

    peak = PeakMemory()      # starts measuring here
    ...                      # e.g. a PPO training loop
    peak.rise_mb()           # highest resident memory since then, minus what was held at the start

On Linux the kernel's high-water mark (VmHWM in /proc/self/status) is reset at the start by writing
"5" to /proc/self/clear_refs (Linux >= 4.0), so the peak belongs to the measured stretch alone.
Where that is not possible (other systems, a restricted /proc), the lifetime peak `ru_maxrss` is
used, which may belong to earlier work and then hides the rise: `how` says which one was used. (On
Linux the reset also resets `ru_maxrss`, which reads the same high-water mark.)

The estimate of GPU memory without a GPU is `rlhf_helpers.ppo.model.memory_estimate`.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    """A "VmRSS"/"VmHWM" line of /proc/self/status in KiB, or None where there is no such file."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])  # "VmHWM:   123456 kB"
    except OSError:
        return None
    return None


def current_rss_mb() -> float | None:
    """Resident memory of this process now, MB (None where /proc is unavailable)."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024.0


def lifetime_peak_rss_mb() -> float:
    """Highest resident memory of this process since it started, MB (ru_maxrss: KiB on Linux, bytes
    on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024.0


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of this process to its current RSS; False where
    unsupported."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    hwm, rss = _status_kib("VmHWM"), _status_kib("VmRSS")
    # the reset sets VmHWM to the current RSS; a kernel without it keeps the old, larger peak
    return hwm is not None and rss is not None and hwm <= rss + 1024


class PeakMemory:
    """Highest resident memory since construction, minus the resident memory at construction."""

    def __init__(self) -> None:
        self.resettable = reset_peak_rss()
        #: which peak is read: the reset kernel high-water mark, or the lifetime ru_maxrss
        self.how = ("kernel high-water mark, reset at the start" if self.resettable
                    else "lifetime ru_maxrss")
        current = current_rss_mb()
        #: resident memory at the start, MB (the lifetime peak where the current RSS is unavailable)
        self.start_mb = current if current is not None else lifetime_peak_rss_mb()

    def peak_mb(self) -> float:
        """Highest resident memory since the start, MB."""
        if self.resettable:
            hwm = _status_kib("VmHWM")
            if hwm is not None:
                return hwm / 1024.0
        return lifetime_peak_rss_mb()

    def rise_mb(self) -> float:
        """How far the peak rose above the memory held at the start, MB (>= 0)."""
        return max(0.0, self.peak_mb() - self.start_mb)
