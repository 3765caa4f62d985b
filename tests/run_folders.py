"""Where tests write: never into the checkout (checked once per pytest run, tests/conftest.py), and
never two runs into one folder; only the content-keyed caches in SHARED_CACHE_DIR are shared.

    before = snapshot(ROOT)
    ...                                   # the whole test run
    problems = changes(before, snapshot(ROOT))   # ["added runs/05_full_ppo/latest", ...]

Every file of the checkout is recorded by size and modification time, except in the folders the
Makefile gives to generated files (build/, the virtual environments) and the caches of the tools
themselves (.git, __pycache__, .pytest_cache, .ruff_cache, *.egg-info). A file written again with
the same content still counts: it was written. Anything added, changed or
removed elsewhere (runs/, notebooks/, data/, docs/...) is a test that wrote where it must not.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The content-keyed caches (SFT model, reward adapters) that concurrent notebook runs may share:
#: each is built once, under a lock, and renamed into place
#: (rlhf_helpers.runtime.artifacts.build_cached). `make test-colab` points $RLHF_CACHE_DIR
#: elsewhere, so that stack trains its own.
SHARED_CACHE_DIR = Path(os.environ.get("RLHF_CACHE_DIR") or ROOT / "build" / "test-cache")

#: Folder names never looked into: generated output the Makefile names, virtual environments, tool
#: caches.
SKIPPED_DIRS = {".git", "build", ".venv", ".venv-colab", "__pycache__", ".pytest_cache",
                ".ruff_cache", ".ipynb_checkpoints"}
SKIPPED_SUFFIXES = (".egg-info",)


#: Written on request: the screenshot tests write docs/img/ when a developer sets this variable.
SCREENSHOTS_ENV = "RLHF_WRITE_SCREENSHOTS"


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime in ns)} of every file under `root` outside SKIPPED_DIRS, virtual
    environments (any folder holding a pyvenv.cfg) and, when $RLHF_WRITE_SCREENSHOTS is set,
    docs/img/."""
    files = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(SKIPPED_SUFFIXES)
                   and not (Path(folder) / d / "pyvenv.cfg").is_file()]
        if os.environ.get(SCREENSHOTS_ENV) and Path(folder) == root / "docs":
            dirs[:] = [d for d in dirs if d != "img"]
        for name in names:
            path = Path(folder) / name
            try:
                info = path.stat()
            except FileNotFoundError:  # removed while we walked
                continue
            files[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns)
    return files


def changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """'added x', 'changed x' and 'removed x' lines, sorted by path."""
    lines = [f"added {p}" for p in after.keys() - before.keys()]
    lines += [f"removed {p}" for p in before.keys() - after.keys()]
    lines += [f"changed {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(lines, key=lambda line: line.split(" ", 1)[1])
