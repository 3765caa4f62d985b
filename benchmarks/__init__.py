"""Benchmarks: each `bench_*.py` module has a `main()` that measures and returns a dict of figures.

Run them all with `python -m benchmarks` (or `make bench`); speed goals are ratios measured side by
side in one run, never timed assertions in tests.
"""
