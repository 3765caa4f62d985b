"""Notebooks are stored clean (no outputs, valid nbformat), carry the standard header, and the
generated ones match their sources in notebooks/src/."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from tool_scripts import load_tool

from rlhf_helpers.course.notebook import colab_badge, colab_setup_source
from rlhf_helpers.course.profile_choice import MEANING
from rlhf_helpers.course.tool_files import RECORD_SUFFIX

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


builder = load_tool("build_notebooks")


def _names(folder: Path) -> list[str]:
    """The names in `folder`, the build's hidden records of what it wrote (.NN.ipynb.sha256) left
    out."""
    return sorted(p.name for p in folder.iterdir()
                  if not (p.name.startswith(".") and p.name.endswith(f".ipynb{RECORD_SUFFIX}")))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_valid_and_stored_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_the_standard_header(path: Path):
    cells = nbformat.read(path, as_version=4).cells
    assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), "title first"
    assert colab_badge(path.name) in cells[0].source
    assert cells[1].cell_type == "code" and cells[1].source == colab_setup_source(), \
        "cell 2 must be rlhf_helpers.course.notebook.colab_setup_source() verbatim"
    assert cells[2].cell_type == "code" and "show_environment()" in cells[2].source


@pytest.mark.parametrize("source", builder.sources(), ids=[p.stem for p in builder.sources()])
def test_generated_notebook_matches_its_source(source: Path):
    stored = ROOT / "notebooks" / source.with_suffix(".ipynb").name
    assert stored.exists(), f"{stored.name} missing: run `python tools/build_notebooks.py`"
    assert stored.read_text(encoding="utf-8") == builder.render(builder.build_notebook(source)), (
        f"{stored.name} differs from notebooks/src/{source.name}: "
        "run `python tools/build_notebooks.py`")


def _cells(text: str, name: str = "07_x.ipynb") -> list[tuple[str, str, dict]]:
    return [(cell.cell_type, cell.source, dict(cell.metadata))
            for cell in builder.read_cells(text, name)]


def test_builder_reads_cells_badge_setup_and_drops_the_preamble():
    text = (
        "# Source of notebooks/07_x.ipynb; rebuild with ...\n#\n# more preamble\n\n"
        "# %% [markdown]\n# # Title\n#\n# {{colab_badge}}\n\n"
        '# %% tags=["colab-setup"]\n\n'
        "# %%\nx = 1  # code\n\n\n"
        "def f():\n    return 2\n\n\n"
        '# %% tags=["claim-check"]\ny = 3\n\n'
        "# %% [markdown]\n# {{colab_badge}} once more; `x`\n"
    )
    assert _cells(text) == [
        ("markdown", "# Title\n\n" + colab_badge("07_x.ipynb"), {}),
        ("code", colab_setup_source(), {}),
        # jupytext's lines_to_next_cell dropped
        ("code", "x = 1  # code\n\n\ndef f():\n    return 2", {}),
        ("code", "y = 3", {"tags": ["claim-check"], "jupyter": {"source_hidden": True}}),
        ("markdown", colab_badge("07_x.ipynb") + " once more; `x`", {}),
    ]
    # JupyterLab (jupytext) saves the preamble back behind a `# %%` marker: still dropped, same
    # cells.
    assert _cells("# %%\n" + text) == _cells(text)
    # without a preamble nothing is dropped
    assert _cells(text[text.index("# %% [markdown]"):]) == _cells(text)


def test_build_notebook_has_stable_ids_and_no_jupytext_metadata(tmp_path):
    source = tmp_path / "07_x.py"
    source.write_text(
        '# Source\n\n# %% [markdown]\n# # T\n\n# %% tags=["colab-setup"]\n\n# %%\nx = 1\n\n\n'
        "# %%\ny = 2\n", encoding="utf-8")
    nb = builder.build_notebook(source)
    assert builder.render(nb) == builder.render(builder.build_notebook(source))
    assert [cell.id for cell in nb.cells] == [
        hashlib.sha1(f"07_x.ipynb:{index}".encode()).hexdigest()[:8] for index in range(4)
    ]
    assert (nb.metadata
            == {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                           "language_info": {"name": "python"}})
    assert [cell.metadata for cell in nb.cells] == [{}, {}, {}, {}]


@pytest.mark.parametrize(("text", "message"), [
    ("# %% [markdown]\n# # T\n# %%\nx = 1\n",
     r"a\.ipynb: needs exactly one .*colab-setup.*found 0"),
    ('# %% tags=["colab-setup"]\n# %% tags=["colab-setup"]\n',
     r"a\.ipynb: needs exactly one .*found 2"),
    ("# %% [setup]\n# %%\nx\n", r"a\.ipynb: needs exactly one .*found 0"),  # the old marker
    ('# %% tags=["colab-setup"]\nx = 1\n',
     r"a\.ipynb: the colab-setup cell must be an empty code cell"),
    ('# %% [markdown] tags=["colab-setup"]\n# hi\n',
     r"a\.ipynb: the colab-setup cell must be an empty code cell"),
    ('# %% tags=["colab-setup"]\n# %% [raw]\nx\n', r"a\.ipynb: unsupported raw cell"),
    ('# %% tags=["colab-setup"]\n# %% [foo]\nx\n', r"a\.ipynb: unknown cell marker '# %% \[foo\]'"),
    ('# %% tags=["colab-setup"]\n# %% hidden=true\nx\n',
     r"a\.ipynb: unsupported cell metadata \['hidden'\]"),
])
def test_builder_rejects_malformed_sources_naming_the_notebook(text, message):
    with pytest.raises(ValueError, match=message):
        builder.read_cells(text, "a.ipynb")


#: a source that builds: the header's cells and one code cell
GOOD_SOURCE = '# %% [markdown]\n# # T\n\n# %% tags=["colab-setup"]\n\n# %%\nx = 1\n'


def _folders(tmp_path: Path, monkeypatch, **sources: str) -> tuple[Path, Path]:
    """(a source folder holding `sources` by stem, an empty notebook folder) under tmp_path, made
    the builder's own (`main` builds them; `build_all` takes them as arguments)."""
    source_dir, notebook_dir = tmp_path / "src", tmp_path / "notebooks"
    source_dir.mkdir()
    notebook_dir.mkdir()
    for stem, text in sources.items():
        (source_dir / f"{stem}.py").write_text(text, encoding="utf-8")
    monkeypatch.setattr(builder, "SOURCE_DIR", source_dir)
    monkeypatch.setattr(builder, "NOTEBOOK_DIR", notebook_dir)
    return source_dir, notebook_dir


def test_a_misspelt_cell_tag_is_refused_naming_the_cell_and_the_known_tags(tmp_path, capsys,
                                                                            monkeypatch):
    """Before: `tags=["solutoin"]` was kept in the notebook without a word."""
    _, notebook_dir = _folders(
        tmp_path, monkeypatch,
        **{"01_a": GOOD_SOURCE,
           "02_b": GOOD_SOURCE + '\n# %% tags=["solutoin"]\ny = 2  # the answer\n'})
    assert builder.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["build_notebooks: error: 02_b.ipynb: cell 4 ('y = 2  # the answer') has the "
                   "unknown tag 'solutoin'; the known tags are claim-check, colab-setup (no "
                   "notebook was written)"]
    assert list(notebook_dir.iterdir()) == []  # not even the good one
    assert set(builder.KNOWN_TAGS) == {builder.SETUP_TAG, builder.CLAIM_TAG}


def test_a_notebook_path_that_is_a_link_is_refused_and_nothing_written(tmp_path, capsys,
                                                                       monkeypatch):
    """Before: the build wrote the notebook through a link at notebooks/NN.ipynb, into whatever
    file it pointed to."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch,
                                        **{"01_a": GOOD_SOURCE, "02_b": GOOD_SOURCE})
    elsewhere = tmp_path / "thesis.tex"
    elsewhere.write_text("a user's file", encoding="utf-8")
    (notebook_dir / "02_b.ipynb").symlink_to(elsewhere)
    assert builder.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"build_notebooks: error: {notebook_dir / '02_b.ipynb'} is a link (to "
                   f"{elsewhere}), not a notebook file: remove the link (no notebook was written)"]
    assert elsewhere.read_text(encoding="utf-8") == "a user's file"
    assert sorted(p.name for p in notebook_dir.iterdir()) == ["02_b.ipynb"]  # 01 not written
    (notebook_dir / "02_b.ipynb").unlink()
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert builder.build_all(source_dir, notebook_dir, check=True) == 0
    assert _names(notebook_dir) == ["01_a.ipynb", "02_b.ipynb"]
    # a link put there after the check is replaced, not written through
    (notebook_dir / "01_a.ipynb").unlink()
    (notebook_dir / "01_a.ipynb").symlink_to(elsewhere)
    builder.write_new(notebook_dir / "01_a.ipynb", "{}")
    assert elsewhere.read_text(encoding="utf-8") == "a user's file"
    assert not (notebook_dir / "01_a.ipynb").is_symlink()
    assert (notebook_dir / "01_a.ipynb").read_text(encoding="utf-8") == "{}"


def test_a_notebook_hard_linked_to_a_users_file_is_replaced_and_the_users_file_kept(
        tmp_path, monkeypatch):
    """Before: the build opened the notebook with O_TRUNC and wrote into the file, so the other
    name of a hard link (a user's backup) got the built notebook too."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch, **{"01_a": GOOD_SOURCE})
    backup = tmp_path / "my_backup.ipynb"
    backup.write_text("my own edits", encoding="utf-8")
    os.link(backup, notebook_dir / "01_a.ipynb")
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert backup.read_text(encoding="utf-8") == "my own edits"
    assert builder.build_all(source_dir, notebook_dir, check=True) == 0
    # no temporary left; the user's file, no notebook a build wrote, was also kept as a copy
    assert [name for name in _names(notebook_dir)
            if name != "01_a.ipynb" and ".ipynb.bak-" not in name] == []
    assert (notebook_dir / "01_a.ipynb").stat().st_mode & 0o777 == 0o644


def _saved_in_jupyter(path: Path, **cell: object) -> str:
    """Change the built notebook at `path` as a learner's save in JupyterLab would (`cell`'s keys
    set on its last cell, the kernel's language_info); returns the text saved."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["cells"][-1].update(cell)
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.12.3"}
    text = json.dumps(nb, indent=1)
    path.write_text(text, encoding="utf-8")
    return text


def test_a_learners_work_in_a_notebook_is_kept_as_a_copy_before_a_build_replaces_it(
        tmp_path, monkeypatch, capsys):
    """Before: a notebook a learner had run and edited was replaced without a word (notebooks/ is
    where `make lab` opens them), their solutions and outputs lost."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch, **{"01_a": GOOD_SOURCE})
    assert builder.build_all(source_dir, notebook_dir) == 0
    built = (notebook_dir / "01_a.ipynb").read_text(encoding="utf-8")
    theirs = _saved_in_jupyter(notebook_dir / "01_a.ipynb", source="x = 1  # my solution",
                               execution_count=1, outputs=[{"output_type": "stream",
                                                            "name": "stdout", "text": "1\n"}])
    capsys.readouterr()
    assert builder.build_all(source_dir, notebook_dir) == 0
    copies = [p for p in notebook_dir.iterdir() if p.name.startswith("01_a.ipynb.bak-")]
    assert len(copies) == 1 and copies[0].read_text(encoding="utf-8") == theirs
    assert (f"kept 01_a.ipynb as {copies[0].name}: it held metadata a kernel or an editor wrote"
            in capsys.readouterr().out)
    assert (notebook_dir / "01_a.ipynb").read_text(encoding="utf-8") == built
    # run, without the kernel's metadata: outputs; the second copy gets a name of its own
    nb = json.loads(built)
    nb["cells"][-1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    (notebook_dir / "01_a.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    monkeypatch.setattr(builder.time, "strftime", lambda fmt: "20261207-120000")
    for _ in range(2):
        (notebook_dir / "01_a.ipynb").write_text(json.dumps(nb), encoding="utf-8")
        assert builder.build_all(source_dir, notebook_dir) == 0
        assert "it held outputs" in capsys.readouterr().out
    assert sorted(p.name for p in notebook_dir.iterdir() if "-120000" in p.name) == [
        "01_a.ipynb.bak-20261207-120000", "01_a.ipynb.bak-20261207-120000-1"]


def test_a_notebook_as_a_build_wrote_it_is_replaced_without_a_copy(tmp_path, monkeypatch, capsys):
    """A notebook of an older source (the contributor's edit-build loop), or of this one, is a
    build's: replaced, no copy kept."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch, **{"01_a": GOOD_SOURCE})
    assert builder.build_all(source_dir, notebook_dir) == 0
    (source_dir / "01_a.py").write_text(GOOD_SOURCE + "\n# %%\ny = 2\n", encoding="utf-8")
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert _names(notebook_dir) == ["01_a.ipynb"]
    assert "kept" not in capsys.readouterr().out
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):  # the stored ones are builds'
        assert builder.person_made(path) is None, path


def _text_edited(path: Path) -> str:
    """Add a line to the last cell's text of the notebook at `path`, its metadata left as built
    (as a text editor or an nbformat script saves it); returns the text saved."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    source = nb["cells"][-1]["source"]  # stored as a list of lines
    nb["cells"][-1]["source"] = ["# MY SOLUTION: hours of work\n", *source]
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


def _kept(notebook_dir: Path) -> list[Path]:
    return sorted(notebook_dir.glob("01_a.ipynb.bak-*"))


def test_a_learners_edit_to_a_cells_text_is_kept_as_a_copy_with_one_line(tmp_path, monkeypatch,
                                                                         capsys):
    """Before: an edit to a cell's text (the metadata as built) was replaced without a copy or a
    word: only metadata, outputs, cell ids and cell-metadata keys were compared."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch, **{"01_a": GOOD_SOURCE})
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert builder.build_all(source_dir, notebook_dir) == 0  # as built: no copy
    assert _kept(notebook_dir) == [] and "kept" not in capsys.readouterr().out
    theirs = _text_edited(notebook_dir / "01_a.ipynb")
    assert builder.person_made(notebook_dir / "01_a.ipynb") is None  # the old rule saw nothing
    assert builder.build_all(source_dir, notebook_dir) == 0
    copies, out = _kept(notebook_dir), capsys.readouterr().out.splitlines()
    assert len(copies) == 1 and copies[0].read_text(encoding="utf-8") == theirs
    assert [line for line in out if line.startswith("kept")] == [
        f"kept 01_a.ipynb as {copies[0].name}: it held edited cells, which no build writes "
        "(notebooks/*.ipynb are built from notebooks/src/)"]
    assert "MY SOLUTION" not in (notebook_dir / "01_a.ipynb").read_text(encoding="utf-8")
    # with no record of the build (a copy of the folder without its hidden files) and no git
    copies[0].unlink()
    _text_edited(notebook_dir / "01_a.ipynb")
    (notebook_dir / ".01_a.ipynb.sha256").unlink()
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert len(_kept(notebook_dir)) == 1 and "kept 01_a.ipynb" in capsys.readouterr().out


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t",
                    "-c", "commit.gpgsign=false", *args], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_in_a_fresh_clone_the_committed_notebooks_are_replaced_without_a_copy(tmp_path,
                                                                              monkeypatch, capsys):
    """A clone has no records: a notebook as committed is a build's (a contributor's edited source
    rebuilds it without a copy), a learner's edit to it is not."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch, **{"01_a": GOOD_SOURCE})
    assert builder.build_all(source_dir, notebook_dir) == 0
    (notebook_dir / ".01_a.ipynb.sha256").unlink(missing_ok=True)  # a clone has none
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "notebooks/01_a.ipynb")
    _git(tmp_path, "commit", "-q", "-m", "built")
    (source_dir / "01_a.py").write_text(GOOD_SOURCE + "\n# %%\ny = 2\n", encoding="utf-8")
    capsys.readouterr()
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert _kept(notebook_dir) == [] and "kept" not in capsys.readouterr().out
    _git(tmp_path, "checkout", "-q", "--", "notebooks/01_a.ipynb")  # the committed one again
    (notebook_dir / ".01_a.ipynb.sha256").unlink(missing_ok=True)
    _text_edited(notebook_dir / "01_a.ipynb")
    assert builder.build_all(source_dir, notebook_dir) == 0
    assert len(_kept(notebook_dir)) == 1 and "it held edited cells" in capsys.readouterr().out


def test_a_folder_at_a_notebooks_path_is_refused_in_one_line_and_nothing_written(
        tmp_path, capsys, monkeypatch):
    """Before: an IsADirectoryError traceback, after the notebooks before it were written."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch,
                                        **{"01_a": GOOD_SOURCE, "02_b": GOOD_SOURCE})
    (notebook_dir / "02_b.ipynb").mkdir()
    for check in (False, True):
        assert builder.build_all(source_dir, notebook_dir, check=check) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"build_notebooks: error: {notebook_dir / '02_b.ipynb'} is a folder, not a "
                       "notebook file: move it away (no notebook was written)"]
        assert sorted(p.name for p in notebook_dir.iterdir()) == ["02_b.ipynb"]  # 01 not written


def test_a_named_pipe_at_a_notebook_or_a_source_is_refused_not_waited_on(
        tmp_path, capsys, monkeypatch):
    """Before: a read of the pipe blocked for ever (--check at a notebook's path, any build at a
    source's). Each call here would hang without the check, so the refusal is the assertion."""
    source_dir, notebook_dir = _folders(tmp_path, monkeypatch,
                                        **{"01_a": GOOD_SOURCE, "02_b": GOOD_SOURCE})
    os.mkfifo(notebook_dir / "02_b.ipynb")
    for check in (False, True):
        assert builder.build_all(source_dir, notebook_dir, check=check) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"build_notebooks: error: {notebook_dir / '02_b.ipynb'} is not a regular "
                       "file (a named pipe or a device?): move it away (no notebook was written)"]
    (notebook_dir / "02_b.ipynb").unlink()
    (source_dir / "02_b.py").unlink()
    os.mkfifo(source_dir / "02_b.py")
    assert builder.build_all(source_dir, notebook_dir) == 2
    assert "02_b.py is not a regular file" in capsys.readouterr().err
    assert sorted(p.name for p in notebook_dir.iterdir()) == []  # 01 not written either

def test_setup_cell_does_nothing_outside_colab(monkeypatch):
    monkeypatch.setenv("RLHF_PROFILE", "tiny")  # restored after, even if the code sets it
    monkeypatch.delenv("RLHF_PROFILE")
    namespace: dict = {}
    modules_before = set(sys.modules)
    exec(colab_setup_source(), namespace)  # must not clone, pip install or pick a profile here
    assert "install_course" not in namespace and "REPO" not in namespace
    assert "subprocess" not in set(sys.modules) - modules_before
    assert "RLHF_PROFILE" not in os.environ


def test_setup_cell_is_a_short_colab_form_calling_install_course_with_the_badge_ref(
        tmp_path, monkeypatch, capsys):
    """A Colab form (code hidden there) of a few lines. With a `google.colab` module present and the
    clone already there, it imports `install_course` from the clone and calls it with the badge's
    ref and the upgrades, then prints what changed (install_course itself is run for real, against a
    local clone, by tests/course/test_colab_stack.py)."""
    import types

    from rlhf_helpers.course import colab_setup
    from rlhf_helpers.course.notebook import (
        BADGE_REF,
        COLAB_CLONE_DIR,
        COLAB_UPGRADES,
        INSTALL_REF,
        repo_url,
    )

    source = colab_setup_source()
    lines = source.splitlines()
    assert lines[0].startswith("#@title ") and '{ display-mode: "form" }' in lines[0]
    assert len([line for line in lines if line.strip()]) <= 16, source
    # the form's one drop-down, auto first (Colab shows the assigned value as the default)
    assert 'PROFILE = "auto"  #@param ["auto", "tiny", "gpu"]' in lines
    assert INSTALL_REF == BADGE_REF and "--upgrade" not in source
    calls = []

    def fake_install(repo, ref, clone, upgrade=()):
        calls.append((repo, ref, clone, upgrade))
        return {"datasets": ("4.0.0", "5.2.0")}

    clone = tmp_path / "clone"
    clone.mkdir()  # already cloned: no git
    monkeypatch.setattr(colab_setup, "install_course", fake_install)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("RLHF_PROFILE", "tiny")  # restored after, even if the code sets it
    monkeypatch.delenv("RLHF_PROFILE")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # a GPU runtime: auto is gpu
    exec(source.replace(COLAB_CLONE_DIR, str(clone)), {})
    assert calls == [(repo_url(), BADGE_REF, str(clone), tuple(COLAB_UPGRADES))]
    assert sys.path[0] == str(clone)
    assert os.environ["RLHF_PROFILE"] == "gpu"
    assert capsys.readouterr().out == "datasets: 4.0.0 -> 5.2.0\n" + MEANING["gpu"] + "\n"


@pytest.mark.parametrize("choice, cuda, expected", [
    ("auto", True, "gpu"), ("auto", False, "tiny"), ("tiny", True, "tiny"), ("gpu", False, "gpu")])
def test_the_profile_choice_sets_the_profile_and_says_what_it_means(choice, cuda, expected,
                                                                     monkeypatch, capsys):
    from rlhf_helpers.course.profile_choice import choose_profile
    from rlhf_helpers.runtime.profiles import resolve_profile_name

    monkeypatch.setenv("RLHF_PROFILE", "tiny")  # restored after, even if the code sets it
    monkeypatch.delenv("RLHF_PROFILE")
    monkeypatch.setattr("torch.cuda.is_available", lambda: cuda)
    assert choose_profile(choice) == expected == os.environ["RLHF_PROFILE"]
    assert resolve_profile_name(None) == expected
    assert capsys.readouterr().out == MEANING[expected] + "\n"


def test_the_profile_choice_keeps_a_profile_already_set_and_refuses_an_unknown_one(monkeypatch,
                                                                                 capsys):
    from rlhf_helpers.course.profile_choice import choose_profile

    monkeypatch.setenv("RLHF_PROFILE", "tiny")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert choose_profile("auto") == "tiny" == os.environ["RLHF_PROFILE"]
    assert "already set" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"choice must be one of \('auto', 'tiny', 'gpu'\)"):
        choose_profile("cpu")


def test_show_environment_prints_versions_profile_and_device(capsys, monkeypatch):
    from importlib.metadata import version

    from rlhf_helpers.course.notebook import VERSION_PACKAGES, show_environment

    monkeypatch.setenv("RLHF_PROFILE", "tiny")
    env = show_environment()
    out = capsys.readouterr().out
    assert list(env.versions) == ["python", *VERSION_PACKAGES]
    assert env.versions["torch"] == version("torch")
    assert (env.profile, env.device, env.colab) == ("tiny", "cpu", False)
    assert f"torch         {version('torch')}" in out.replace("\t", " ")
    assert "profile: tiny   device: cpu   (local)" in out


def test_package_versions_marks_missing_packages():
    from rlhf_helpers.course.notebook import package_versions

    assert (package_versions(("surely-not-installed-pkg",))["surely-not-installed-pkg"]
            == "not installed")


@pytest.fixture
def scratch_builder(tmp_path, monkeypatch):
    """The builder pointed at a copy of three course sources in a temporary folder (the checkout is
    untouched)."""
    src, out = tmp_path / "src", tmp_path / "notebooks"
    src.mkdir()
    out.mkdir()
    for source in builder.sources()[:3]:
        (src / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(builder, "SOURCE_DIR", src)
    monkeypatch.setattr(builder, "NOTEBOOK_DIR", out)
    return src, out


def test_a_source_with_a_byte_order_mark_builds_the_same_notebook(scratch_builder):
    src, out = scratch_builder
    assert builder.main([]) == 0
    clean = {p.name: p.read_text() for p in out.iterdir()}
    first = sorted(src.iterdir())[0]
    first.write_bytes(b"\xef\xbb\xbf" + first.read_bytes())  # what some Windows editors save
    assert builder.main([]) == 0
    assert {p.name: p.read_text() for p in out.iterdir()} == clean
    assert "\ufeff" not in "".join(clean.values())


def test_a_bad_source_writes_no_notebook_and_names_the_file(scratch_builder, capsys):
    src, out = scratch_builder
    sources = sorted(src.iterdir())
    # a byte that is not UTF-8 on line 3 of the last source; the first two are fine
    lines = sources[-1].read_bytes().split(b"\n")
    lines[2] += b" \xff"
    sources[-1].write_bytes(b"\n".join(lines))
    assert builder.main([]) == 2
    err = capsys.readouterr().err
    assert (f"{sources[-1].name}, line 3: not valid UTF-8" in err
            and "no notebook was written" in err)
    assert list(out.iterdir()) == []  # not even the notebooks of the good sources before it
    # a malformed source (a second colab-setup cell) after two good ones: the same
    sources[-1].write_bytes(sources[0].read_bytes().replace(b'# %% tags=["colab-setup"]',
                                                             b'# %% tags=["colab-setup"]\n\n# %% '
                                                             b'tags=["colab-setup"]'))
    assert builder.main([]) == 2
    assert "needs exactly one" in capsys.readouterr().err and list(out.iterdir()) == []
