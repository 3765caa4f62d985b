"""Every claim of the course under several numeric variants of this machine: does each one hold,
and by how much?

Usage:
    python tools/claim_margins.py --out build/claim-margins    # every variant, every notebook
    python tools/claim_margins.py --out DIR --variants native,aten-default 05 06
    python tools/claim_margins.py --out DIR --report-only --write-doc   # docs/claim_margins.md

CPUs round differently: Intel's AVX-512 kernels and AMD's AVX2 ones add in other orders, and a
training run is chaotic, so a difference in the last bit grows into another trajectory. A learner's
machine is one of these roundings. This tool makes other roundings on the machine it runs on, by
the switches that pick torch's and its libraries' kernels, set before torch loads (VARIANTS), and
runs the shipped notebooks (tiny profile) under each: each variant in its own runs and cache folder,
so it trains its own reward model too, as another machine would (the tiny SFT model is shipped).

Each claim checked appends its measured sides and margin to a log ($RLHF_CLAIM_LOG, read by
rlhf_helpers.course.claims); the notebooks run with claims not strict, so a contradicted claim is
recorded and the notebook goes on. The report is a table of claims x variants with each claim's
relative margin (rlhf_helpers.course.claim_measures), the smallest first, and every claim that fails
in any variant on top. Variants run two at a time (--jobs), each notebook in a fresh kernel on one
torch thread (the notebooks set one thread, as a learner's do); each notebook's time under each
variant is recorded, which is what pinning a kernel family costs.
"""

from __future__ import annotations

# ruff: noqa: E402 - run as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("tools/claim_margins.py")

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlhf_helpers.course.claims import LOG_ENV, NOTEBOOK_ENV, STRICT_ENV  # noqa: E402
from rlhf_helpers.course.run_course import course_notebooks  # noqa: E402
from rlhf_helpers.runtime.interrupt import one_line_interrupt  # noqa: E402

#: Numeric variants: the environment each sets before torch loads. `native` is the machine as it
#: is. ATEN_CPU_CAPABILITY picks torch's own vectorised kernels (softmax, exp, norms, Adam's
#: element-wise maths); MKL_CBWR pins MKL's matrix products to one code path; ONEDNN_MAX_CPU_ISA
#: caps oneDNN's. Each changes a 20-step Adam run's weights in the last bits on an AMD EPYC (AVX2).
VARIANTS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "onednn-sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "all-three": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                  "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
#: A variant that needs AVX-512, added where the CPU has it
AVX512_VARIANT = ("aten-avx512", {"ATEN_CPU_CAPABILITY": "avx512"})
LOG_NAME = "claims.jsonl"
TIMES_NAME = "times.json"
DOC = ROOT / "docs" / "claim_margins.md"


def available_variants() -> dict[str, dict[str, str]]:
    """VARIANTS, plus AVX512_VARIANT when this CPU reports avx512f."""
    variants = dict(VARIANTS)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and " avx512f" in cpuinfo.read_text():
        variants[AVX512_VARIANT[0]] = AVX512_VARIANT[1]
    return variants


def run_variant(name: str, env_changes: dict[str, str], notebooks: list[Path], out: Path,
                timeout: int) -> dict[str, float]:
    """Run `notebooks` in order under one variant; {notebook: seconds (negative if it failed)}."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / LOG_NAME
    # a run of some notebooks keeps the times of the others, as the log keeps their claims
    times: dict[str, float] = (json.loads((folder / TIMES_NAME).read_text())
                               if (folder / TIMES_NAME).is_file() else {})
    for path in notebooks:
        # a rerun of a notebook replaces its earlier lines
        if log.is_file():
            kept = [line for line in log.read_text().splitlines()
                    if json.loads(line)["notebook"] != path.stem]
            log.write_text("".join(line + "\n" for line in kept))
        env = {**os.environ, **env_changes,
               LOG_ENV: str(log), NOTEBOOK_ENV: path.stem,
               "RLHF_RUNS_DIR": str(folder / "runs"), "RLHF_CACHE_DIR": str(folder / "cache"),
               STRICT_ENV: "0", "TQDM_DISABLE": "1"}
        for key in ("RLHF_PROFILE_OVERRIDES", "RLHF_PROFILE"):
            env.pop(key, None)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "rlhf_helpers.course.run_course", "--out",
             str(folder / "executed"), "--timeout", str(timeout), path.stem],
            cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        times[path.stem] = seconds if done.returncode == 0 else -seconds
        line = (done.stdout.strip().splitlines() or [""])[0]
        print(f"[{name}] {line}", flush=True)
        (folder / TIMES_NAME).write_text(json.dumps(times, indent=1))
    return times


def load_results(out: Path) -> dict[str, list[dict]]:
    """{variant: its logged claims} for every variant folder under `out`."""
    results = {}
    for folder in sorted(p for p in out.iterdir() if (p / LOG_NAME).is_file()):
        results[folder.name] = [json.loads(line) for line in
                                (folder / LOG_NAME).read_text().splitlines()]
    return results


def _spread(row: dict) -> float | None:
    """How far the claim's slack moves between variants (max - min); None without a slack."""
    slacks = [v["slack"] for v in row["variants"].values() if v["slack"] is not None]
    return max(slacks) - min(slacks) if slacks else None


def claim_table(results: dict[str, list[dict]]) -> list[dict]:
    """One row per claim checked on the shipped run: notebook, claim, and per variant whether it
    held, its slack and relative margin (None: no ordering comparison). Sorted: claims that fail
    (or did not run) somewhere first; then those whose numbers move between variants (a training
    run's), smallest relative margin first; then those the variants leave unchanged (a formula, a
    recorded file), smallest first."""
    rows: dict[tuple[str, str], dict] = {}
    for variant, logged in results.items():
        for entry in logged:
            if not entry["checked"]:
                continue
            key = (entry["notebook"], entry["claim"])
            row = rows.setdefault(key, {"notebook": entry["notebook"], "claim": entry["claim"],
                                        "variants": {}})
            row["variants"][variant] = {"holds": entry["holds"], "relative": entry["relative"],
                                        "slack": entry["slack"]}

    def order(row: dict) -> tuple:
        held = [v["holds"] for v in row["variants"].values()]
        margins = [v["relative"] for v in row["variants"].values() if v["relative"] is not None]
        moves = bool(_spread(row))
        return (all(held) and len(held) == len(results), not moves,
                min(margins, default=float("inf")), row["notebook"], row["claim"])

    return sorted(rows.values(), key=order)


def _cell(value: dict | None) -> str:
    if value is None:
        return "not run"
    mark = "" if value["holds"] else "FAILS "
    if value["relative"] is None:
        return mark + ("holds" if value["holds"] else "")
    return f"{mark}{value['relative']:+.3f}"


def _spread_cells(row: dict) -> str:
    """'smallest slack | its spread | slack / spread' (the last: how many times the variants'
    spread the claim's margin is; "-" where the variants leave it unchanged)."""
    spread = _spread(row)
    slacks = [v["slack"] for v in row["variants"].values() if v["slack"] is not None]
    if spread is None:
        return "- | - | -"
    least = min(slacks)
    ratio = f"{least / spread:.1f}" if spread > 0 else "-"
    return f"{least:+.3g} | {spread:.3g} | {ratio}"


def report(results: dict[str, list[dict]], times: dict[str, dict[str, float]]) -> str:
    """The Markdown table: claims x variants, failing claims first, then the smallest margins."""
    variants = list(results)
    rows = claim_table(results)
    failing = [r for r in rows if not all(r["variants"].get(v, {}).get("holds") for v in variants)]
    moving = [r for r in rows if _spread(r)]
    lines = [f"Variants: {', '.join(variants)}. Claims checked on the shipped run: {len(rows)}, "
             f"of which {len(moving)} have numbers that move between variants; failing in at least "
             f"one variant: {len(failing)}.", "",
             "| nb | claim | " + " | ".join(variants) + " | least slack | spread | ratio |",
             "|---|---|" + "---|" * (len(variants) + 3)]
    for row in rows:
        claim = row["claim"].replace("|", "\\|")
        lines.append(f"| {row['notebook'][:2]} | {claim} | "
                     + " | ".join(_cell(row["variants"].get(v)) for v in variants)
                     + f" | {_spread_cells(row)} |")
    lines += ["", "Seconds per notebook (negative: it failed; two variants ran at a time, so "
              "compare times only within a column pair that ran together):", "",
              "| notebook | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    names = sorted({n for t in times.values() for n in t})
    for name in names:
        lines.append(f"| {name} | " + " | ".join(
            f"{times.get(v, {}).get(name, float('nan')):.0f}" for v in variants) + " |")
    return "\n".join(lines) + "\n"


DOC_HEAD = """# Claim margins: every claim under several numeric variants

Made by `python tools/claim_margins.py --out build/claim-margins --write-doc` (its docstring says
how). Each cell is a claim's relative margin in one variant: the slack of the comparison that
decides it, divided by the larger of that comparison's two sides; positive where it holds. "holds"
marks a claim with no ordering comparison (a count, a name, an equality) that held. A claim that
fails in any variant is listed first and marked FAILS. The machine, its date and what was found come
first (the tool's --doc-note), then the table.

"""


@one_line_interrupt("tools/claim_margins.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Every claim of the course under several numeric "
                                                 "variants of this machine.")
    parser.add_argument("--out", type=Path, required=True, help="folder for the variants' runs")
    parser.add_argument("--variants", default="", help="comma-separated names (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="variants run at once")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--report-only", action="store_true", help="only read --out")
    parser.add_argument("--write-doc", action="store_true",
                        help=f"write the table to {DOC.relative_to(ROOT)}, under --doc-note")
    parser.add_argument("--doc-note", default="", help="the paragraph above the table")
    parser.add_argument("only", nargs="*", help="notebooks whose names start with these")
    args = parser.parse_args(argv)
    args.out = args.out.absolute()  # the kernels run in scratch folders of their own
    variants = available_variants()
    chosen = [v for v in args.variants.split(",") if v] or list(variants)
    unknown = [v for v in chosen if v not in variants]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; this machine has {list(variants)}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    notebooks = [p for p in course_notebooks()
                 if not args.only or any(p.name.startswith(s) for s in args.only)]
    if not args.report_only:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda v: run_variant(v, variants[v], notebooks, args.out,
                                                args.timeout), chosen))
    results = load_results(args.out)
    times = {v: json.loads((args.out / v / TIMES_NAME).read_text()) for v in results
             if (args.out / v / TIMES_NAME).is_file()}
    text = report(results, times)
    print(text)
    if args.write_doc:
        note = args.doc_note.strip() + "\n\n" if args.doc_note else ""
        DOC.write_text(DOC_HEAD + note + "## Every claim, every variant\n\n" + text)
    failing = [r for r in claim_table(results)
               if not all(r["variants"].get(v, {}).get("holds") for v in results)]
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
