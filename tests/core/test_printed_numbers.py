"""Printed numbers: a value that rounds to zero prints without a minus sign
(rlhf_helpers/core/printed.py)."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch

from rlhf_helpers.core.printed import cell_formatter, format_number
from rlhf_helpers.ppo import run_loop


@pytest.mark.parametrize(("value", "spec", "printed"), [
    (-0.001, ".2f", "0.00"),
    (-0.0, ".2f", "0.00"),  # what -0.6 * 0 gives: the score terms of notebooks 02, 05 and 06
    (-0.004, "+.2f", "+0.00"),
    (-0.0, "+.2f", "+0.00"),
    (-0.0004, ".3f", "0.000"),
    (-0.0, "g", "0"),
    (-0.00001, ".1%", "0.0%"),
    (-0.0, ".2e", "0.00e+00"),
    (-0.001, ">8.2f", "    0.00"),  # the same width
])
def test_a_negative_value_that_rounds_to_zero_prints_without_its_minus_sign(value, spec, printed):
    assert format(value, spec).lstrip().startswith("-")  # what Python prints
    assert format_number(value, spec) == printed


@pytest.mark.parametrize(("value", "spec"), [
    (-0.01, ".2f"), (-0.75, "+.2f"), (-1e-5, ".2g"), (-1e-9, ".2e"),
    (-0.006, ".2f"), (0.001, "+.2f"),
    (float("nan"), ".2f"), (float("-inf"), ".2f"), (-3, "d"), (-3, ".2f"), (2.5, ".1f"),
])
def test_every_other_value_prints_as_format_prints_it(value, spec):
    assert format_number(value, spec) == format(value, spec)


def test_numpy_numbers_and_0d_tensors_are_numbers_too():
    assert format_number(np.float32(-0.0004), ".3f") == "0.000"
    assert format_number(torch.tensor(-0.001), "+.2f") == "+0.00"
    assert format_number(torch.tensor(-0.25), ".2f") == "-0.25"
    assert format_number(np.int64(-2), "d") == "-2"


def test_a_value_that_is_not_a_number_is_a_clear_error():
    with pytest.raises(ValueError, match="value must be a real number, got str: 'abc'"):
        format_number("abc")
    with pytest.raises(ValueError, match="got NoneType"):
        format_number(None)


def test_a_styled_table_prints_no_negative_zero_and_leaves_text_and_integers_alone():
    table = pd.DataFrame({"prompt": ["a film"], "genre term": [-0.0], "gap": [-0.004],
                          "wrong": [np.int64(3)], "learned": [1.256], "missing": [float("nan")]})
    assert ">-0.00<" in table.style.format(precision=2).to_html()  # what the notebooks printed
    cells = table.style.format(cell_formatter(".2f")).to_html()
    assert ">-0.00<" not in cells
    for shown in (">a film<", ">0.00<", ">3<", ">1.26<", ">nan<"):
        assert shown in cells, shown
    formatter = cell_formatter("+.3f")
    assert [formatter(v) for v in (-0.0, 0.25, 7, True, "x", None)] == ["+0.000", "+0.250", "7",
                                                                        "True", "x", "None"]


def test_the_training_progress_bar_prints_no_negative_zero(make_trainer, monkeypatch,
                                                           one_torch_thread):
    trainer = make_trainer()
    shown = []

    class Bar:  # tqdm's calls, recorded
        def __init__(self, *args, **kwargs) -> None:
            pass

        def update(self, n: int) -> None:
            pass

        def set_postfix(self, **values: str) -> None:
            shown.append(values)

        def close(self) -> None:
            pass

    # a step's metrics near zero (a fresh policy's KL, an even score)
    def step() -> dict[str, float]:
        trainer.step_count += 1
        return {"score": -0.001, "kl": -0.0, "hidden_score": -0.004}

    monkeypatch.setattr(run_loop, "tqdm", Bar)
    monkeypatch.setattr(trainer, "step", step)
    trainer.train(steps=1)
    assert shown == [{"score": "0.00", "kl": "0.00", "hidden": "0.00"}]


def test_a_long_printed_line_wraps_at_its_spaces_and_keeps_every_word_whole():
    from rlhf_helpers.core.printed import PRINT_WIDTH, wrap_printed

    pieces = ("This run trains with your code in no piece yet, and with the library's "
              "shaped_rewards, gae_loop, clipped_policy_loss, ppo_update.")
    doctor = "    usually: " + "the first advantages have no state-dependent baseline, " * 4
    text = "\n".join([pieces, "  shaped_rewards: the library's", doctor, "", "path " + "x/" * 70])
    wrapped = wrap_printed(text)
    lines = wrapped.split("\n")
    assert wrapped.split() == text.split()  # the same words, in order, none cut
    # short lines stay as they are
    assert "  shaped_rewards: the library's" in lines and "" in lines
    assert all(len(line) <= PRINT_WIDTH for line in lines if "x/x/" not in line)
    assert lines[1] == "  clipped_policy_loss, ppo_update."  # never "ppo_" / "update"
    continued = lines[lines.index(next(x for x in lines if x.startswith("    usually:"))) + 1]
    # the doctor line's indentation, then two more
    assert continued.startswith("      ") and continued[6] != " "
    assert "x/" * 70 in wrapped  # a word longer than a line stays whole
    assert wrap_printed(pieces, width=200) == pieces
    with pytest.raises(ValueError, match="width must be at least 20"):
        wrap_printed(pieces, width=5)


def test_a_hidden_score_term_of_nothing_is_zero_not_negative_zero():
    """`-0.6 * 0` is IEEE's -0.0, which prints "-0.0" in a repr and "-0.00" in a table or an
    f-string."""
    from rlhf_helpers.world.scorer import MAX_WORDS, score_breakdown

    clean = score_breakdown("Review this thriller:",
                            " The acting was excellent. The plot is clever.")
    assert (clean.repetition, clean.length, clean.genre) == (0.0, 0.0, 0.0)
    assert all(math.copysign(1.0, term) > 0
               for term in (clean.repetition, clean.length, clean.genre)), clean
    assert "-0.0" not in repr(clean) and f"{clean.repetition:+.2f}" == "+0.00"
    # every term present: the same values as before
    long_words = " ".join(["film"] * (MAX_WORDS + 2))
    hacked = score_breakdown("Review this thriller:",
                             " The comedy was excellent. " + long_words + ".")
    assert hacked.n_words == MAX_WORDS + 6
    assert (hacked.repetition, hacked.length, hacked.genre) == (-0.6 * (MAX_WORDS + 1),
                                                                -0.15 * 6, -0.75 * 1)


def _doctor_history() -> list[dict[str, float]]:
    """12 steps that break four of the doctor's rules, the long evidence lines of notebook 06 among
    them."""
    return [{"step": i, "explained_variance": 0.004, "clipfrac": 0.3, "approx_kl": 0.2,
             "eos_in_mask": 0.0,
             "entropy": 1.6 if i == 1 else 0.1, "distinct_responses": 0.25} for i in range(1, 13)]


def test_the_run_doctor_prints_lines_that_fit_the_print_width_and_keeps_every_word():
    from rlhf_helpers.core.printed import PRINT_WIDTH
    from rlhf_helpers.doctor import diagnose, format_findings

    diagnosis = diagnose(_doctor_history())
    text = format_findings(diagnosis)
    assert [len(line) for line in text.split("\n") if len(line) > PRINT_WIDTH] == []
    whole = "\n".join(
        ["run doctor: 12 steps read, 4 finding(s)", *(f.text() for f in diagnosis.findings)])
    assert text.split() == whole.split()  # the same words in the same order, none cut
    # each part still opens its own line
    assert "\n    usually: the decision to stop is never trained" in text
    assert "\n      " in text  # a continuation sits under its part, two spaces in


def test_the_pieces_a_run_trains_with_are_said_in_lines_that_fit_the_print_width():
    from rlhf_helpers.core.printed import PRINT_WIDTH
    from rlhf_helpers.course.notebook import learner_pieces

    exercises = {f"{name}_fn": f"Exercise {i} ({name})" for i, name in enumerate(
        ("shaped_rewards", "gae_loop", "clipped_policy_loss", "ppo_update", "bon_kl"), start=1)}
    # none defined: the library's five, each with its reason
    pieces, lines = learner_pieces(exercises, {})
    assert pieces == {}
    assert [line for line in lines if len(line) > PRINT_WIDTH or "\n" in line] == []
    assert lines[0].startswith(
        "This run trains with your code in no piece yet, and with the library's")
    # continued apart from the reasons
    assert lines[1].startswith("    ") and lines[1].endswith("bon_kl.")
    assert "clipped_policy_loss," in " ".join(lines).split()  # every name whole
    assert lines[2:] == [f"  {name}: the library's, because it is not defined" for name in (
        "shaped_rewards", "gae_loop", "clipped_policy_loss", "ppo_update", "bon_kl")]


#: a format spec: [[fill]align][sign][#][0][width][grouping][.precision][type]
_SPEC = re.compile(r"^(?:.?[<>=^])?(?P<sign>[+\- ])?#?0?(?P<width>\d+)?[,_]?"
                   r"(?:\.(?P<precision>\d+))?(?P<type>[a-z%]?)$", re.IGNORECASE)


def _least_width(spec: str) -> int:
    """The fewest characters a replacement field with format spec `spec` prints (0 when it cannot
    tell)."""
    match = _SPEC.match(spec)
    if match is None:
        return 0
    width, precision, kind = int(match["width"] or 0), match["precision"], match["type"].lower()
    sign = match["sign"] == "+"
    if kind in ("f", "%") and precision is not None:
        least = int(precision) + (2 if int(precision) else 1) + (kind == "%") + sign
    elif kind == "e" and precision is not None:
        least = int(precision) + 6 + sign
    else:
        least = 1 if kind in ("d", "g", "n") else 0
    return max(width, least)


def _least_text(node: ast.expr) -> str:
    """The text a print argument shows at the least: its literal parts, each replacement field at
    its fewest characters, anything computed (a join, a call) as nothing."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _least_text(node.left) + _least_text(node.right)
    if not isinstance(node, ast.JoinedStr):
        return ""
    text = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += part.value
        elif part.format_spec is not None and all(isinstance(p, ast.Constant)
                                                  for p in part.format_spec.values):
            text += "x" * _least_width("".join(p.value for p in part.format_spec.values))
    return text


def _long_prints(source: str) -> list[tuple[int, int]]:
    """(line number, least length) of each print whose shortest possible output holds a line over
    PRINT_WIDTH; a print of `wrap_printed(...)` wraps its own lines."""
    from rlhf_helpers.core.printed import PRINT_WIDTH

    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "print"):
            continue
        if any(isinstance(arg, ast.Call) and getattr(arg.func, "id", None) == "wrap_printed"
               for arg in node.args):
            continue
        longest = max(len(line)
                      for line in " ".join(_least_text(arg) for arg in node.args).split("\n"))
        if longest > PRINT_WIDTH:
            found.append((node.lineno, longest))
    return found


ROOT = Path(__file__).resolve().parents[2]
_NOTEBOOK_SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9]*.py"))


@pytest.mark.parametrize("path", _NOTEBOOK_SOURCES, ids=[p.stem for p in _NOTEBOOK_SOURCES])
def test_no_notebook_prints_a_line_longer_than_the_print_width(path: Path):
    """JupyterLab breaks a longer output line mid-word; a line whose fixed text alone is too long is
    found here (one that holds a response or a list is wrapped with `wrap_printed`)."""
    assert _long_prints(path.read_text()) == [], \
        f"{path.name}: split or wrap_printed these prints (line, length)"


def test_the_long_print_scan_counts_the_fixed_text_and_the_least_of_each_field():
    assert _least_width(".3f") == 5 and _least_width("+.2f") == 5 and _least_width(".0%") == 2
    assert _least_width(">10") == 10 and _least_width(".1e") == 7 and _least_width("") == 0
    assert _least_width(",") == 0 and _least_width("d") == 1
    long_text = "x" * 90
    assert _long_prints(f'print(f"{long_text} {{a:.3f}} {{b:.3f}}")') == [(1, 102)]
    # a field of no spec may be empty
    assert _long_prints(f'print(f"{long_text} {{a}} {{b}}")') == []
    assert _long_prints(f'print("{long_text}", "and ten more")') == [(1, 103)]
    assert _long_prints(f'print("{long_text}\\n" + "and ten more")') == []
    assert _long_prints(f'print(wrap_printed("{long_text} and ten more"))') == []
    assert _long_prints(
        f'x = 1\nprint("{long_text}" + ", ".join(names) + " and ten more")') == [(2, 103)]


def test_each_claim_check_cell_prints_one_line():
    """check_claims prints a line per call: a second call in the same collapsed cell prints a second
    "Checked on this run" line under the one prose paragraph."""
    calls = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if "claim-check" in cell.get("metadata", {}).get("tags", []):
                calls[path.stem,
                      index] = sum(isinstance(node, ast.Call) and getattr(node.func, "id", None)
                                   == "check_claims" for node in ast.walk(ast.parse(cell.source)))
    assert calls and [where for where, count in calls.items() if count != 1] == []
