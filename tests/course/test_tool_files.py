"""rlhf_helpers.course.tool_files: the course's tools write their files into folders a person also
uses, never through a link, and keep a record that tells their own file from a person's."""

from __future__ import annotations

import os

import pytest

from rlhf_helpers.course import tool_files
from rlhf_helpers.course.tool_files import (
    as_written,
    record_path,
    replace_problem,
    write_recorded,
)

NOTES = "a person's file\n"


def test_a_written_file_is_the_tools_until_someone_changes_it(tmp_path):
    path = tmp_path / "01_a.ipynb"
    assert as_written(path) is None and replace_problem(path) is None  # nothing there
    write_recorded(path, b"built")
    assert path.read_bytes() == b"built" and record_path(path).name == ".01_a.ipynb.sha256"
    assert as_written(path) and replace_problem(path) is None
    path.write_text(NOTES)
    assert as_written(path) is False
    assert replace_problem(path) == f"{path} was changed after a tool of the course wrote it"
    record_path(path).unlink()
    assert "was not written by a tool of the course" in replace_problem(path)


@pytest.mark.skipif(os.name == "nt", reason="symbolic links")
def test_a_link_is_never_the_tools_and_never_written_through(tmp_path):
    theirs = tmp_path / "thesis.ipynb"
    theirs.write_text(NOTES)
    link = tmp_path / "01_a.ipynb"
    link.symlink_to(theirs)
    assert as_written(link) is False and f"{link} is a link" in replace_problem(link)
    write_recorded(link, b"built")  # a link put there after the check: replaced, not followed
    assert not link.is_symlink() and link.read_bytes() == b"built"
    assert theirs.read_text() == NOTES
    # a link at the record's name is no record, and is replaced too
    record_path(link).unlink()
    record_path(link).symlink_to(theirs)
    assert as_written(link) is False
    write_recorded(link, b"again")
    assert as_written(link) and theirs.read_text() == NOTES


def test_a_write_stopped_before_the_file_is_replaced_leaves_a_file_still_the_tools(tmp_path,
                                                                                 monkeypatch):
    path = tmp_path / "01_a.ipynb"
    write_recorded(path, b"old")
    real_replace = os.replace

    def stop_at_the_file(source, target):
        if os.fspath(target) == os.fspath(path):
            raise KeyboardInterrupt
        real_replace(source, target)

    monkeypatch.setattr(tool_files.os, "replace", stop_at_the_file)
    with pytest.raises(KeyboardInterrupt):
        write_recorded(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and as_written(path)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_build_folder_that_is_a_link_is_not_the_tools(tmp_path):
    """The rule that an unrecorded file in build/ is the tools' (written before records) must not
    follow build/ when it is a link to a person's folder: their notebook there is refused."""
    person = tmp_path / "person"
    person.mkdir()
    (person / "02_b.ipynb").write_text('{"my": "notebook"}')
    build = tmp_path / "checkout" / "build"
    build.parent.mkdir()
    build.symlink_to(person)
    problem = replace_problem(build / "02_b.ipynb", unrecorded_under=build)
    assert problem is not None and "was not written by a tool" in problem
    plain = tmp_path / "checkout2" / "build"
    plain.mkdir(parents=True)
    (plain / "02_b.ipynb").write_text("{}")
    assert replace_problem(plain / "02_b.ipynb", unrecorded_under=plain) is None


def test_a_persons_file_at_a_records_name_is_refused_not_overwritten(tmp_path):
    notebook = tmp_path / "01_a.ipynb"
    mine = record_path(notebook)
    mine.write_text("my hidden notes")
    problem = replace_problem(notebook)
    assert problem is not None and "no record a tool of the course wrote" in problem
