"""PeakMemory sees a temporary allocation that is freed again before it is read."""

from __future__ import annotations

import sys

import pytest

from rlhf_helpers.runtime.memory import PeakMemory, current_rss_mb, lifetime_peak_rss_mb

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self/status")


@linux_only
def test_rise_counts_a_freed_allocation():
    size_mb = 200
    peak = PeakMemory()
    block = bytearray(size_mb * 2**20)  # zero-filled: the pages are touched, so they are resident
    del block  # freed before the reading: only a true peak measurement still sees it
    rise = peak.rise_mb()
    # the block itself, give or take the interpreter's own few MB of churn in between
    assert size_mb - 8 <= rise <= size_mb + 64, (rise, peak.how)


@linux_only
def test_a_reset_peak_forgets_what_came_before():
    block = bytearray(300 * 2**20)
    del block  # the lifetime peak now holds these 300 MB
    peak = PeakMemory()
    if not peak.resettable:
        pytest.skip("this kernel cannot reset the high-water mark (clear_refs)")
    assert peak.rise_mb() < 100, peak.rise_mb()  # the earlier 300 MB is not counted
    # Linux's ru_maxrss reads the same high-water mark, so it was reset too
    assert lifetime_peak_rss_mb() < current_rss_mb() + 100
