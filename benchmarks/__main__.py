"""Run every `benchmarks/bench_*.py` module's `main()` in turn and print its figures.

    python -m benchmarks                 # all of them
    python -m benchmarks gae             # only bench_gae (names without the bench_ prefix)
    python -m benchmarks --fast          # pass fast=True to every main() that accepts it
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys
import time
import traceback
from pathlib import Path


def discover() -> list[str]:
    """Names (without the bench_ prefix) of the benchmark modules next to this file, sorted."""
    folder = Path(__file__).parent
    return sorted(
        info.name.removeprefix("bench_")
        for info in pkgutil.iter_modules([str(folder)])
        if info.name.startswith("bench_")
    )


def print_figures(figures: dict) -> None:
    """A two-column table of a benchmark's returned figures."""
    width = max((len(str(k)) for k in figures), default=0)
    for key, value in figures.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {str(key):<{width}}  {shown}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--fast", action="store_true",
                        help="smoke-run sizes where a benchmark has them")
    args = parser.parse_args(argv)
    available = discover()
    unknown = sorted(set(args.names) - set(available))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; available: {available}")
    failed = []
    for name in args.names or available:
        print(f"\n=== bench_{name} ===", flush=True)
        start = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.bench_{name}")
            kwargs = ({"fast": True}
                      if args.fast and "fast" in inspect.signature(module.main).parameters else {})
            figures = module.main(**kwargs)
        except Exception:  # keep going: one broken benchmark must not hide the others' figures
            traceback.print_exc()
            failed.append(name)
            continue
        print(f"figures ({time.perf_counter() - start:.1f} s):")
        print_figures(figures or {})
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
