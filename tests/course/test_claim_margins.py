"""tools/claim_margins.py's table, on made-up logs, and docs/claim_margins.md against the notebooks:
every claim the notebooks state has its row there, so a new or reworded claim is measured under the
numeric variants before it lands."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
from tool_scripts import load_tool

ROOT = Path(__file__).resolve().parents[2]
margins = load_tool("claim_margins")


def _log(folder: Path, rows: list[tuple[str, bool, float | None, float | None]]) -> None:
    folder.mkdir(parents=True)
    lines = [json.dumps({"notebook": "05_x", "index": i, "checked": True, "claim": claim,
                         "holds": holds, "sides": [], "slack": slack, "relative": relative})
             for i, (claim, holds, slack, relative) in enumerate(rows)]
    (folder / margins.LOG_NAME).write_text("\n".join(lines) + "\n")


def test_the_table_puts_failing_claims_first_then_moving_ones_by_margin(tmp_path, capsys):
    _log(tmp_path / "native", [("static", True, 0.01, 0.01), ("wide", True, 0.9, 0.9),
                               ("thin", True, 0.2, 0.1), ("flips", True, 0.3, 0.3),
                               ("a count", True, None, None)])
    _log(tmp_path / "other", [("static", True, 0.01, 0.01), ("wide", True, 0.5, 0.5),
                              ("thin", True, 0.25, 0.12), ("flips", False, -0.1, -0.1),
                              ("a count", True, None, None)])
    results = margins.load_results(tmp_path)
    order = [row["claim"] for row in margins.claim_table(results)]
    # failing first; then moving claims by their smallest relative margin; then the unmoved ones
    assert order == ["flips", "thin", "wide", "static", "a count"]
    text = margins.report(results, {})
    flips = next(line for line in text.splitlines() if "| flips |" in line)
    assert "FAILS -0.100" in flips and "| -0.1 | 0.4 | -0.2 |" in flips  # slack, spread, ratio
    assert "| static | +0.010 | +0.010 | +0.01 | 0 | - |" in text
    assert "failing in at least one variant: 1" in text
    assert margins.main(["--out", str(tmp_path), "--report-only"]) == 1  # a failing claim: exit 1
    capsys.readouterr()


def _stated_claims() -> set[tuple[str, str]]:
    """(notebook, claim text) of every check_claims call in the notebooks' claim-check cells."""
    stated = set()
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if "claim-check" not in cell.get("metadata", {}).get("tags", []):
                continue
            for call in ast.walk(ast.parse(cell.source)):
                if (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "check_claims"
                        and call.args and isinstance(call.args[0], ast.Dict)):
                    stated |= {(path.stem[:2], key.value) for key in call.args[0].keys
                               if isinstance(key, ast.Constant)}
    return stated


def test_every_claim_of_the_notebooks_has_its_row_in_docs_claim_margins():
    doc = (ROOT / "docs" / "claim_margins.md").read_text()
    rows = set(re.findall(r"^\| (\d\d) \| (.+?) \| ", doc, re.MULTILINE))
    rows = {(nb, claim.replace("\\|", "|")) for nb, claim in rows}
    missing = sorted(_stated_claims() - rows)
    assert not missing, ("claims stated in the notebooks but not measured in "
                         f"docs/claim_margins.md (run tools/claim_margins.py): {missing}")
    assert "| FAILS " not in doc and "| not run " not in doc  # every claim held in every variant
