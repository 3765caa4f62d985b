"""run_course writes an executed copy only when it is still the tool's own at the end of the run:
a person's save made while the notebook ran (minutes) is kept, never overwritten."""

from __future__ import annotations

import json

import pytest

from rlhf_helpers.course.run_course import CopyKept, execute_notebook
from rlhf_helpers.course.tool_files import write_recorded


def test_a_copy_saved_by_a_person_while_its_notebook_ran_is_kept(tmp_path):
    out = tmp_path / "out" / "01_a.ipynb"
    write_recorded(out, b"{}")  # an earlier run's copy: the tool's own
    # the notebook's one cell stands for a person saving the copy while the run goes on
    source = f"open({str(out)!r}, 'w').write('MY NOTES')"
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": "c1",
                           "metadata": {}, "outputs": [], "source": source}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "01_a.ipynb"
    path.write_text(json.dumps(notebook))
    with pytest.raises(CopyKept, match="was changed after a tool of the course wrote it"):
        execute_notebook(path, out=out, timeout=60)
    assert out.read_text() == "MY NOTES"
