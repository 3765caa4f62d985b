"""Old import paths of modules that moved: `import rlhf_helpers.ppo.diagnosis` (or `from
rlhf_helpers.ppo.diagnosis import diagnose`) still works, and gives the module that took its place,
the same object under both names.

`MOVED` is the table, one row per moved module; a move adds its row (tests/package/test_moved.py
imports every old name). The finder is installed by the package's `__init__` and imports nothing
until an old name is imported: importing the package never loads a moved module, so no row can
make an import circle.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

#: old module name -> the module that took its place
MOVED: dict[str, str] = {
    "rlhf_helpers.ppo.diagnosis": "rlhf_helpers.doctor",
    "rlhf_helpers.ppo.diagnosis_checkpoints": "rlhf_helpers.doctor.checkpoints",
    "rlhf_helpers.ppo.diagnosis_progress": "rlhf_helpers.doctor.rules_progress",
    "rlhf_helpers.ppo.diagnosis_reading": "rlhf_helpers.doctor.reading",
    "rlhf_helpers.ppo.diagnosis_rows": "rlhf_helpers.doctor.rows",
    "rlhf_helpers.ppo.diagnosis_rules": "rlhf_helpers.doctor.rules",
    "rlhf_helpers.ppo.diagnosis_sources": "rlhf_helpers.doctor.sources",
    "rlhf_helpers.ppo.diagnosis_types": "rlhf_helpers.doctor.thresholds",
    "rlhf_helpers.ppo.curves_page": "rlhf_helpers.stages.run_files.curves_page",
    "rlhf_helpers.stages.curves_page": "rlhf_helpers.stages.run_files.curves_page",
    "rlhf_helpers.ppo.shared_model": "rlhf_helpers.ppo.model.shared_model",
    "rlhf_helpers.ppo.adapters": "rlhf_helpers.ppo.model.adapters",
    "rlhf_helpers.ppo.shared_adapters": "rlhf_helpers.ppo.model.shared_adapters",
    "rlhf_helpers.ppo.fused_lora": "rlhf_helpers.ppo.model.fused_lora",
    "rlhf_helpers.ppo.packed_gpt2": "rlhf_helpers.ppo.model.packed_gpt2",
    "rlhf_helpers.ppo.gpt2_decoder": "rlhf_helpers.ppo.model.gpt2_decoder",
    "rlhf_helpers.ppo.fast_decoder": "rlhf_helpers.ppo.model.fast_decoder",
    "rlhf_helpers.ppo.value_head": "rlhf_helpers.ppo.model.value_head",
    "rlhf_helpers.ppo.sampling": "rlhf_helpers.ppo.model.sampling",
    "rlhf_helpers.ppo.samples": "rlhf_helpers.ppo.model.samples",
    "rlhf_helpers.ppo.build": "rlhf_helpers.ppo.model.build",
    "rlhf_helpers.ppo.memory_estimate": "rlhf_helpers.ppo.model.memory_estimate",
    "rlhf_helpers.ppo.checkpoint": "rlhf_helpers.ppo.checkpoints.save_load",
    "rlhf_helpers.ppo.checkpoint_digest": "rlhf_helpers.ppo.checkpoints.digest",
    "rlhf_helpers.ppo.checkpoint_folder": "rlhf_helpers.ppo.checkpoints.folder",
    "rlhf_helpers.ppo.trainer_state": "rlhf_helpers.ppo.checkpoints.trainer_state",
    "rlhf_helpers.ppo.run_identity": "rlhf_helpers.ppo.checkpoints.run_identity",
    "rlhf_helpers.ppo.run_claim": "rlhf_helpers.ppo.checkpoints.ownership",
    "rlhf_helpers.ppo.run_folder": "rlhf_helpers.stages.run_files.run_folder",
    "rlhf_helpers.ppo.tracking": "rlhf_helpers.stages.run_files.tracking",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module that took its place (imported then, not before)."""

    def __init__(self, new_name: str) -> None:
        self.new_name = new_name
        self.new_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new_name)
        self.new_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the old name's spec on the module: it keeps its own (reload, pickle)
        module.__spec__ = self.new_spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of `MOVED`, and nothing else."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new_name), is_package=False)


def install() -> None:
    """Put the finder first on `sys.meta_path` (once): an old name always means the new module,
    even where a stale copy of the old file is left."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
