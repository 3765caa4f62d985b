"""Old import paths of moved modules (`rlhf_helpers._moved.MOVED`): each still imports, as the same
module object as its new path, and importing the package loads none of the moved modules."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import rlhf_helpers
from rlhf_helpers._moved import MOVED

PACKAGE = Path(rlhf_helpers.__file__).parent
#: every old path and the module that took its place, written out here (not read from MOVED), so a
#: row dropped from the table fails
OLD_PATHS = {
    "rlhf_helpers.ppo.diagnosis": "rlhf_helpers.doctor",
    "rlhf_helpers.ppo.diagnosis_checkpoints": "rlhf_helpers.doctor.checkpoints",
    "rlhf_helpers.ppo.diagnosis_progress": "rlhf_helpers.doctor.rules_progress",
    "rlhf_helpers.ppo.diagnosis_reading": "rlhf_helpers.doctor.reading",
    "rlhf_helpers.ppo.diagnosis_rows": "rlhf_helpers.doctor.rows",
    "rlhf_helpers.ppo.diagnosis_rules": "rlhf_helpers.doctor.rules",
    "rlhf_helpers.ppo.diagnosis_sources": "rlhf_helpers.doctor.sources",
    "rlhf_helpers.ppo.diagnosis_types": "rlhf_helpers.doctor.thresholds",
    "rlhf_helpers.ppo.curves_page": "rlhf_helpers.stages.curves_page",
}


def test_the_table_holds_every_old_path():
    assert {old: MOVED[old] for old in OLD_PATHS if old in MOVED} == OLD_PATHS


@pytest.mark.parametrize("old, new", sorted(OLD_PATHS.items()))
def test_an_old_path_is_the_module_that_took_its_place(old, new):
    moved = importlib.import_module(new)
    assert importlib.import_module(old) is moved
    parent, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(parent), name) is moved  # `from parent import name`
    assert moved.__spec__.name == new and moved.__name__ == new  # it keeps its own name and spec
    # the old file is gone: only the table answers for the old name
    assert not (PACKAGE / Path(*old.split(".")[1:])).with_suffix(".py").exists()


def test_the_old_doctor_imports_still_work():
    from rlhf_helpers.ppo.diagnosis import (
        DIAGNOSIS_FILE,
        TRL_NAMES,
        Finding,
        RunFacts,
        Thresholds,
        compute_record,
        diagnose,
        format_findings,
        load_history,
        mark_findings,
    )

    from rlhf_helpers.doctor import diagnose as new_diagnose

    assert diagnose is new_diagnose and DIAGNOSIS_FILE == "diagnosis.json" and TRL_NAMES
    assert all(callable(f) for f in (compute_record, format_findings, load_history, mark_findings))
    assert {f.rule for f in diagnose([{"step": 1, "eos_in_mask": 0.0}], facts=RunFacts(),
                                     thresholds=Thresholds()).findings} == {"eos_masked"}
    assert Finding.__module__ == "rlhf_helpers.doctor.findings"


def test_a_name_not_in_the_table_is_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rlhf_helpers.ppo.diagnosis_nowhere")


def test_importing_the_package_loads_no_moved_module():
    """The finder is lazy: `import rlhf_helpers` (and the engine's package) loads nothing of the
    doctor until an old name is imported, so no row of the table can make an import circle."""
    code = ("import sys, rlhf_helpers, rlhf_helpers.ppo, rlhf_helpers.ppo.metric_docs\n"
            "print(sorted(m for m in sys.modules if m.startswith('rlhf_helpers.doctor')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
