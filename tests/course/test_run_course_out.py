"""`python -m rlhf_helpers.course.run_course --out DIR` replaces only its own executed copies: a
person's notebook in DIR (edited since a tool wrote it, never written by one, a link) is refused by
name before anything runs, and kept as it is."""

from __future__ import annotations

import json

from rlhf_helpers.course.run_course import main
from rlhf_helpers.course.tool_files import write_recorded

NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _course(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "01_a.ipynb").write_text(json.dumps(NOTEBOOK))
    out = tmp_path / "out"
    out.mkdir()
    return notebooks, out


def test_a_persons_copy_in_out_is_refused_by_name_and_kept(tmp_path, capsys):
    notebooks, out = _course(tmp_path)
    mine = out / "01_a.ipynb"
    mine.write_text("my notes")
    assert main(["--out", str(out), "--notebooks", str(notebooks)]) == 2
    error = capsys.readouterr().err
    assert str(mine) in error and "not written by a tool" in error and error.count("\n") == 1
    assert mine.read_text() == "my notes"


def test_a_copy_edited_after_a_tool_wrote_it_is_refused(tmp_path, capsys):
    notebooks, out = _course(tmp_path)
    copy = out / "01_a.ipynb"
    write_recorded(copy, b"{}")
    copy.write_text("edited")
    assert main(["--out", str(out), "--notebooks", str(notebooks)]) == 2
    assert "changed after a tool" in capsys.readouterr().err
    assert copy.read_text() == "edited"


def test_a_link_in_out_is_refused_and_its_target_kept(tmp_path, capsys):
    notebooks, out = _course(tmp_path)
    target = tmp_path / "precious.ipynb"
    target.write_text("precious")
    (out / "01_a.ipynb").symlink_to(target)
    assert main(["--out", str(out), "--notebooks", str(notebooks)]) == 2
    assert "is a link" in capsys.readouterr().err
    assert target.read_text() == "precious"
