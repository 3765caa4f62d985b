"""The run doctor: reads a run's metric history and names the known RLHF failure signatures it
shows.

    from rlhf_helpers.doctor import diagnose, format_findings
    findings = diagnose(trainer)          # a live PPOTrainer (its history and its settings)
    findings = diagnose("runs/ppo-tiny")  # a run folder: metrics.jsonl + run.json, or TRL's files
    findings = diagnose(history, facts=RunFacts(max_new_tokens=40))  # a list of metric dicts
    print(format_findings(findings))
    python -m rlhf_helpers.stages.diagnose runs/ppo-tiny    # the same from a shell

Each finding names its rule, the steps where it holds, the evidence in numbers, what it usually
means, what to check first and where the course teaches it; they come sorted by severity ("error",
"warning", "info"), then in the order the rules run (`rules.RULES`). Each rule is written, with its
documentation and the metrics it reads, in the rules module of what it diagnoses; its thresholds
are `thresholds.Thresholds`, each saying where it comes from (docs/metrics.md's healthy ranges,
measured tiny-profile runs, or plain arithmetic).

TRL's GRPOTrainer and RLOOTrainer log other names; `TRL_NAMES` maps those that mean the same
quantity (reward, reward_std, frac_reward_zero_std, kl, entropy, completions/mean_length,
completions/clipped_ratio, clip_ratio/region_mean), so a TRL run folder is read too. The rules whose
metric TRL does not log (first_ratio, explained_variance, hidden scores) stay silent on it.

A run folder or a metrics.jsonl is read by `sources` (which file, TRL's names, run.json's settings)
through `reading`: regular files only (a pipe is never opened), numbers a float holds, a last
metrics line cut mid-write skipped with a note; the verdict names the file it read. The run's
settings (`facts.RunFacts`) come from the trainer or run.json, built the same way
(`facts.run_facts`). A run folder's step-NNNNNN checkpoints are verified against their SHA-256
manifests (`checkpoints`): a damaged one is an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlhf_helpers.doctor.facts import RunFacts, facts_of_trainer
from rlhf_helpers.doctor.findings import SEVERITIES, Finding
from rlhf_helpers.doctor.reading import metric_rows
from rlhf_helpers.doctor.rows import Rows
from rlhf_helpers.doctor.rules import RULES
from rlhf_helpers.doctor.sources import load_run
from rlhf_helpers.doctor.thresholds import Thresholds

DIAGNOSIS_FILE = "diagnosis.json"  #: what the training command writes into its run folder


@dataclass(frozen=True)
class Diagnosis:
    """What `diagnose` found, with the facts it used: what diagnosis.json holds."""

    #: sorted by severity, then in the order the rules run (rules.RULES)
    findings: list[Finding]
    steps: int  #: distinct steps read
    facts: RunFacts  #: the run's settings the rules used
    thresholds: Thresholds = field(default_factory=Thresholds)  #: the thresholds the rules used
    #: the file the history was read from (None: a list or a live trainer)
    source_file: str | None = None
    #: what the reading skipped or chose, and why (a cut last line, repeated steps)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """diagnosis.json's content, the same whether the history came from a trainer or its files:
        strict JSON, a non-finite number (a score_clip of inf) written as its name ("inf").
        `read_json` adds where it was read."""
        return _strict({"steps": self.steps, "findings": [f.to_json() for f in self.findings],
                        "facts": asdict(self.facts), "thresholds": asdict(self.thresholds)})

    def read_json(self) -> dict[str, Any]:
        """`to_json` with the file read (`source_file`, null for a list or a trainer) and the notes
        on the reading: what `python -m rlhf_helpers.stages.diagnose --json` prints."""
        return {"source_file": self.source_file, "notes": list(self.notes), **self.to_json()}


def _strict(value: Any) -> Any:
    """`value` with every non-finite float replaced by its name ("inf", "-inf", "nan"): JSON has no
    such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def _trainer_history(trainer: Any) -> list[Any]:
    """A trainer's history as a list; TypeError when it is not a sequence of metric dicts."""
    history = trainer.history
    if not (isinstance(history, Sequence) and all(isinstance(row, Mapping) for row in history)):
        raise TypeError(
            f"source.history must be a list of metric dicts, got {type(history).__name__}")
    return list(history)


def diagnose(source: Any, *, facts: RunFacts | None = None,
             thresholds: Thresholds | None = None) -> Diagnosis:
    """Run every rule on a run's history.

    `source`: a list of per-step metric dicts (`PPOTrainer.history`, metrics.jsonl's rows), a live
    `PPOTrainer` (anything with `history` and `config`), or the path of a run folder or
    metrics.jsonl. `facts`: the run's settings (max_new_tokens, score_clip, warm-up, the dtype it
    computed in); read from the trainer or run.json when not given. A bare list (or a folder without
    run.json) without `facts` is judged as a float32 run, the strictest tolerances: pass the run's
    facts (e.g. `diagnose(trainer).facts`) for a 16-bit one. `thresholds`: the rules' thresholds
    (defaults: `Thresholds()`). TypeError for a `facts` or `thresholds` of another type, and for a
    trainer-like `source` without a model whose `facts` are not given. A run folder's (or its
    metrics.jsonl's folder's) checkpoints are verified: a damaged one is a finding.

    Values may be any real numbers (numpy's too) or None; one beyond a float's range reads as +-inf.
    A step logged more than once counts once, read from its last row (`Diagnosis.notes` says how
    many)."""
    if facts is not None and not isinstance(facts, RunFacts):
        raise TypeError(
            f"facts must be a RunFacts or None, got {type(facts).__name__} {facts!r:.40}")
    if thresholds is not None and not isinstance(thresholds, Thresholds):
        raise TypeError(f"thresholds must be a Thresholds or None, got {type(thresholds).__name__} "
                        f"{thresholds!r:.40}")
    thresholds = thresholds or Thresholds()
    source_file, notes, folder = None, [], None
    if isinstance(source, (str, Path)):
        read = load_run(source)
        history, found = read.history, read.facts
        source_file, notes = str(read.file), list(read.notes)
        # this course's run folder: the rules on its files (the checkpoints) run too
        folder = read.file.parent if found.source != "trl" else None
    elif hasattr(source, "history") and hasattr(source, "config"):
        history, found = _trainer_history(source), facts or facts_of_trainer(source)
    elif isinstance(source, Sequence) and all(isinstance(row, Mapping) for row in source):
        history, found = list(source), RunFacts()
    else:
        raise ValueError("source must be a list of metric dicts, a PPOTrainer, or a run folder / "
                         f"metrics.jsonl path, got {type(source).__name__}")
    facts = facts or found
    on_folder = _folder_findings(folder, notes) if folder is not None else {}
    rows, repeated = metric_rows(history, f"{source}: " if isinstance(source, (str, Path)) else "")
    if repeated:
        notes.append(f"{repeated} step(s) logged more than once (a resumed run logs again the "
                     "steps after its last checkpoint): the last row of each step is read")
    findings = _run_rules(rows, facts, thresholds, on_folder)
    return Diagnosis(findings=findings, steps=len(rows), facts=facts, thresholds=thresholds,
                     source_file=source_file, notes=tuple(notes))


def _folder_findings(folder: Path, notes: list[str]) -> dict[str, Finding | None]:
    """rule name -> what each rule on a run folder's files found there; their notes go to
    `notes`."""
    found: dict[str, Finding | None] = {}
    for known in RULES:
        if known.on_folder:
            found[known.name], checked = known.check(folder)
            notes += checked
    return found


def _run_rules(rows: Rows, facts: RunFacts, thresholds: Thresholds,
               on_folder: dict[str, Finding | None]) -> list[Finding]:
    """Every rule's finding, in RULES' order (a folder rule's from `on_folder`: None without a run
    folder), sorted by severity; the sort is stable, so within a severity they stay in that
    order."""
    findings = []
    for known in RULES:
        found = (on_folder.get(known.name) if known.on_folder
                 else known.check(rows, facts, thresholds))
        findings += [found] if found is not None else []
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return findings
