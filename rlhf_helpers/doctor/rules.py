"""Every rule of the run doctor, in the order `diagnose` runs them.

A rules module registers each rule it writes (`registry.rule`) when it is imported; this module
imports them in RULE_MODULES' order, so `RULES` is complete and in run order once it is imported.
The order is the one findings of one severity are listed in. A new rule goes into the module of
what it diagnoses, where it is registered: nothing here changes unless a new module is added.
"""

from __future__ import annotations

import importlib

from rlhf_helpers.doctor.findings import SEVERITIES
from rlhf_helpers.doctor.registry import RULES, Rule

__all__ = ["RULES", "RULE_MODULES", "Rule", "documented", "rule_reads"]

#: the modules that write the rules (in rlhf_helpers.doctor), in the order their rules run; a
#: tuple, not import statements, because an import sorter would put them in alphabetical order
RULE_MODULES = ("rules_signal", "rules_update", "rules_progress", "checkpoints",
                "rules_responses", "rules_reward")

for _module in RULE_MODULES:
    importlib.import_module(f"rlhf_helpers.doctor.{_module}")


def documented() -> list[Rule]:
    """The rules as docs/metrics.md lists them: by severity (errors first), then in run order."""
    return sorted(RULES, key=lambda known: SEVERITIES.index(known.severity))


def rule_reads() -> dict[str, tuple[str, ...]]:
    """rule name -> the metrics it reads (its findings are marked on their curves)."""
    return {known.name: known.reads for known in RULES}
