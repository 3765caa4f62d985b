"""The run doctor: reads a run's metrics and names the known RLHF failure signatures it shows.

    from rlhf_helpers.doctor import diagnose, format_findings
    print(format_findings(diagnose("runs/ppo-tiny")))  # or a PPOTrainer, or a list of metric dicts

Where each part lives:

    findings.py     Finding, SEVERITIES: what a rule reports
    facts.py        RunFacts and `run_facts`, the one way they are built (a trainer, run.json)
    thresholds.py   Thresholds, each with its source, and the runs each was checked on
    registry.py     `@rule(name, severity, reads=..., fires=..., teaches=...)` and RULES
    rules.py        the rules modules, in the order their rules run
    rules_*.py      the rules, by what they diagnose: signal, update, progress, responses, reward
    checkpoints.py  the run folder's checkpoints against their SHA-256 manifests (a rule too)
    rows.py         the rows the rules read and the helpers they share
    reading.py      reading files safely (regular files, numbers a float holds)
    sources.py      which file a run folder is read from (this course's, TRL's)
    diagnosis.py    `diagnose` and the Diagnosis it returns
    report.py       the findings as text (`format_findings`) and on the curves (`mark_findings`)

The doctor sits on the engine (`ppo`: checkpoint digests, the metrics glossary) and never the other
way round; `stages` (the command line, the training command's end) and the course use it.
"""

from __future__ import annotations

from rlhf_helpers.doctor.diagnosis import DIAGNOSIS_FILE, Diagnosis, diagnose
from rlhf_helpers.doctor.facts import RunFacts, compute_record
from rlhf_helpers.doctor.findings import SEVERITIES, Finding
from rlhf_helpers.doctor.report import MARK_COLORS, format_findings, mark_findings
from rlhf_helpers.doctor.rules import RULES, Rule
from rlhf_helpers.doctor.sources import TRL_NAMES, load_history
from rlhf_helpers.doctor.thresholds import Thresholds

__all__ = ["DIAGNOSIS_FILE", "MARK_COLORS", "RULES", "SEVERITIES", "TRL_NAMES", "Diagnosis",
           "Finding", "Rule", "RunFacts", "Thresholds", "compute_record", "diagnose",
           "format_findings", "load_history", "mark_findings"]
