"""Screenshots of the site's notebook pages at desktop and phone width, and what a reader misses.

    python tools/site_screenshots.py [--site build/site] [--out docs/img/site]

Serves the built site (`make site`) on 127.0.0.1 and opens each notebook page in headless Chromium
at 1400 px and at 390 px (the widths tests/notebooks/test_site_browser.py checks). For each it
writes a full-page JPEG, `<out>/desktop/<notebook>.jpg` (drawn at half scale: it shows the layout,
not the text) and `<out>/phone/<notebook>.jpg`, and prints the counts the browser test asserts are
zero: a page cut off or wider than the window, and tests/site_defects.py's formulas, tables, figures
and explorers. The checks are the test's own (imported from it), so the counts mean what the test
means.
"""

from __future__ import annotations

# ruff: noqa: E402 - run as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("tools/site_screenshots.py")

import argparse
import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the browser test and what it imports: site_defects (tests/), the browser fixtures (tests/widgets/)
TESTS = ROOT / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "notebooks"), str(TESTS / "widgets")]

from test_site_browser import CLIPPED, DRAWN, FITTED, MATH, PHONE, VIEWPORT, site_defects  # noqa: E402

from rlhf_helpers.runtime.interrupt import one_line_interrupt  # noqa: E402

#: name -> (window, device scale of the screenshot)
WIDTHS = {"desktop": (VIEWPORT, 0.5), "phone": (PHONE, 0.5)}
JPEG_QUALITY = 45  #: enough to compare layouts


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _scroll_through(page) -> None:
    """Scroll to the bottom a screen at a time (figures draw as they come on screen), then back to
    the top."""
    height = page.evaluate("() => document.documentElement.scrollHeight")
    for y in range(0, height, page.viewport_size["height"]):
        page.evaluate(f"() => window.scrollTo(0, {y})")
        page.wait_for_timeout(100)
    page.evaluate("() => window.scrollTo(0, 0)")
    page.wait_for_timeout(500)


@one_line_interrupt("tools/site_screenshots.py")
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=ROOT / "build" / "site",
                        help="the built site (make site)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "site",
                        help="where the JPEGs go")
    args = parser.parse_args()
    pages = sorted((args.site / "notebooks").glob("*.html"))
    if not pages:
        sys.exit(
            f"no notebook pages under {args.site / 'notebooks'}: build the site first (make site)")
    from playwright.sync_api import sync_playwright

    server, url = _serve(args.site)
    totals = {
        name: {"page cut or too wide": 0, "formulas": 0, "tables": 0, "figures": 0, "explorers": 0}
        for name in WIDTHS}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium")
                                        or "/usr/bin/chromium",
                                        headless=True, args=["--no-sandbox", "--disable-gpu"])
            for name, (viewport, scale) in WIDTHS.items():
                (args.out / name).mkdir(parents=True, exist_ok=True)
                context = browser.new_context(viewport=viewport, device_scale_factor=scale)
                page = context.new_page()
                page.route(lambda u: not u.startswith(url),
                           lambda route: route.abort("blockedbyclient"))
                for path in pages:
                    page.goto(f"{url}notebooks/{path.name}", wait_until="load")
                    page.wait_for_function(f"() => ({MATH})().done", timeout=60_000)
                    _scroll_through(page)
                    page.wait_for_function(
                        f"() => ({DRAWN})().every(Boolean) && ({FITTED})()", timeout=60_000)
                    clipped = page.evaluate(CLIPPED)
                    defects = site_defects(page)
                    counts = totals[name]
                    counts["page cut or too wide"] += len(clipped)
                    for rule, lines in defects.items():
                        counts[rule] += len(lines)
                    shot = args.out / name / f"{path.stem}.jpg"
                    page.screenshot(path=str(shot), full_page=True, type="jpeg",
                                    quality=JPEG_QUALITY)
                    found = sum(map(len, defects.values())) + len(clipped)
                    print(f"{name:8s} {path.stem:22s} {found} defects, "
                          f"{shot.stat().st_size / 1e6:.2f} MB")
                context.close()
            browser.close()
    finally:
        server.shutdown()
    for name, counts in totals.items():
        print(f"{name} ({WIDTHS[name][0]['width']} px): "
              + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
