"""Write the generated docs from the code: docs/metrics.md (every metric's meaning, formula, healthy range) and the
generated blocks of docs/cluster.md (the verl / OpenRLHF settings of the gpu profile).

    python tools/write_docs.py             # rewrite both
    python tools/write_docs.py --check     # exit 1 naming each page that differs from what the code writes
    python tools/write_docs.py --docs DIR  # read and write DIR/metrics.md and DIR/cluster.md instead

The package computes the text (`ppo.metric_docs.metrics_markdown`, `cluster.export.render_page`); only this
script writes files, so importing the package never touches the checkout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rlhf_helpers.cluster.export import render_page
from rlhf_helpers.ppo.metric_docs import metrics_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: page name -> the page's text from its current text (metrics.md is generated whole; cluster.md by blocks)
PAGES: dict[str, Callable[[str], str]] = {"metrics.md": lambda _old: metrics_markdown(), "cluster.md": render_page}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the code writes")
    parser.add_argument("--docs", default=str(DOCS), help="folder of the pages (default: the checkout's docs/)")
    args = parser.parse_args(argv)
    stale = []
    for name, generate in PAGES.items():
        path = Path(args.docs) / name
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        new = generate(old)
        if new == old:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        for path in stale:
            print(f"{path} is out of date: run `python tools/write_docs.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
