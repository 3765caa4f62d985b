"""The run doctor: reads a run's metric history and names the known RLHF failure signatures it
shows.

    from rlhf_helpers.ppo.diagnosis import diagnose, format_findings
    findings = diagnose(trainer)          # a live PPOTrainer (its history and its settings)
    findings = diagnose("runs/ppo-tiny")  # a run folder: metrics.jsonl + run.json, or TRL's files
    findings = diagnose(history, facts=RunFacts(max_new_tokens=40))  # a list of metric dicts
    print(format_findings(findings))
    python -m rlhf_helpers.stages.diagnose runs/ppo-tiny    # the same from a shell

Each finding names its rule, the steps where it holds, the evidence in numbers, what it usually
means, what to check first and where the course teaches it; they come sorted by severity ("error",
"warning", "info"). The rules and their thresholds are in `diagnosis_rules`; every threshold says
where it comes from (docs/metrics.md's healthy ranges, measured tiny-profile runs, or plain
arithmetic).

TRL's GRPOTrainer and RLOOTrainer log other names; `TRL_NAMES` maps those that mean the same
quantity (reward, reward_std, frac_reward_zero_std, kl, entropy, completions/mean_length,
completions/clipped_ratio, clip_ratio/region_mean), so a TRL run folder is read too. The rules whose
metric TRL does not log (first_ratio, explained_variance, hidden scores) stay silent on it.

A run folder or a metrics.jsonl is read by `diagnosis_sources` (which file, TRL's names, run.json's
settings) through `diagnosis_reading`: regular files only (a pipe is never opened), numbers a float
holds, a last metrics line cut mid-write skipped with a note; the verdict names the file it read. A
run folder's step-NNNNNN checkpoints are verified against their SHA-256 manifests
(`diagnosis_checkpoints`): a damaged one is an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlhf_helpers.core.printed import wrap_printed
from rlhf_helpers.core.tolerances import dtype_name
from rlhf_helpers.ppo.diagnosis_checkpoints import checkpoint_finding
from rlhf_helpers.ppo.diagnosis_reading import metric_rows
from rlhf_helpers.ppo.diagnosis_rules import RULES
from rlhf_helpers.ppo.diagnosis_sources import TRL_NAMES, load_history, load_run
from rlhf_helpers.ppo.diagnosis_types import Finding, RunFacts, Thresholds, rule_reads

__all__ = ["Finding", "RunFacts", "Thresholds", "TRL_NAMES", "Diagnosis", "diagnose",
           "format_findings", "mark_findings", "load_history", "compute_record", "DIAGNOSIS_FILE"]

DIAGNOSIS_FILE = "diagnosis.json"  #: what the training command writes into its run folder
SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Diagnosis:
    """What `diagnose` found, with the facts it used: what diagnosis.json holds."""

    #: sorted by severity, then in the order of the rules (diagnosis_rules.RULES)
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



def compute_record(trainer: Any) -> dict[str, Any]:
    """{"dtype", "loss_scaling"}: the dtype a trainer's forward passes compute in (its model's
    `compute_dtype`: the frozen base's, bf16 or fp16 over float32 masters on a GPU) and whether a
    loss scaler runs (fp16). run.json records it; the doctor's float tolerances follow it.
    ValueError for a model that does not say."""
    dtype = getattr(trainer.model, "compute_dtype", None)
    # never guessed: a float32 guess would judge a bf16 run by float32's tolerances
    if dtype is None:
        raise ValueError(f"trainer.model ({type(trainer.model).__name__}) has no compute_dtype: "
                         "pass facts=RunFacts(dtype=...) to diagnose")
    scaler = getattr(getattr(trainer, "policy_opt", None), "scaler", None)
    return {"dtype": dtype_name(dtype),
            "loss_scaling": bool(scaler is not None and scaler.is_enabled())}


def _trainer_history(trainer: Any) -> list[Any]:
    """A trainer's history as a list; TypeError when it is not a sequence of metric dicts."""
    history = trainer.history
    if not (isinstance(history, Sequence) and all(isinstance(row, Mapping) for row in history)):
        raise TypeError(
            f"source.history must be a list of metric dicts, got {type(history).__name__}")
    return list(history)


def _facts_of_trainer(trainer: Any) -> RunFacts:
    """The settings of a trainer (its config and its model's compute dtype); TypeError naming what
    it lacks."""
    config = trainer.config
    missing = [name
               for name in ("max_new_tokens", "score_clip", "value_warmup_steps", "total_steps")
               if not hasattr(config, name)]
    if missing or not hasattr(trainer, "model"):
        lacks = (f"a config without {', '.join(missing)}" if missing
                 else "no model (its compute dtype)")
        raise TypeError(f"source looks like a PPOTrainer (history and config) but has {lacks}: "
                        "pass a PPOTrainer, or its history with facts=RunFacts(...)")
    compute = compute_record(trainer)
    return RunFacts(max_new_tokens=config.max_new_tokens, score_clip=config.score_clip,
                    value_warmup_steps=config.value_warmup_steps, total_steps=config.total_steps,
                    dtype=compute["dtype"], loss_scaling=compute["loss_scaling"])


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
    source_file, notes, damaged = None, [], None
    if isinstance(source, (str, Path)):
        read = load_run(source)
        history, found = read.history, read.facts
        source_file, notes = str(read.file), list(read.notes)
        # this course's run folder: its step-NNNNNN checkpoints are verified too
        if found.source != "trl":
            damaged, checked = checkpoint_finding(read.file.parent)
            notes += checked
    elif hasattr(source, "history") and hasattr(source, "config"):
        history, found = _trainer_history(source), facts or _facts_of_trainer(source)
    elif isinstance(source, Sequence) and all(isinstance(row, Mapping) for row in source):
        history, found = list(source), RunFacts()
    else:
        raise ValueError("source must be a list of metric dicts, a PPOTrainer, or a run folder / "
                         f"metrics.jsonl path, got {type(source).__name__}")
    facts = facts or found
    rows, repeated = metric_rows(history, f"{source}: " if isinstance(source, (str, Path)) else "")
    if repeated:
        notes.append(f"{repeated} step(s) logged more than once (a resumed run logs again the "
                     "steps after its last checkpoint): the last row of each step is read")
    findings = [finding for rule in RULES if (finding := rule(rows, facts, thresholds)) is not None]
    findings += [damaged] if damaged is not None else []
    # stable: within a severity, in RULES order
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    return Diagnosis(findings=findings, steps=len(rows), facts=facts, thresholds=thresholds,
                     source_file=source_file, notes=tuple(notes))


def format_findings(diagnosis: Diagnosis, min_severity: str = "info") -> str:
    """The findings as text, one block each (what `train_ppo` prints at the end of a run), each
    finding's lines wrapped at their spaces within `PRINT_WIDTH`. The first line and the notes stay
    whole: they name a file, and a path cannot be wrapped."""
    if min_severity not in SEVERITIES:
        raise ValueError(f"min_severity must be one of {SEVERITIES}, got {min_severity!r}")
    shown = [f for f in diagnosis.findings
             if SEVERITIES.index(f.severity) <= SEVERITIES.index(min_severity)]
    where = f" from {diagnosis.source_file}" if diagnosis.source_file else ""
    read = f"{diagnosis.steps} steps read" + where
    notes = [f"    note: {note}" for note in diagnosis.notes]
    if not shown:
        return "\n".join([f"run doctor: {read}, no finding" + (
            "" if min_severity == "info" else f" at {min_severity} or above"), *notes])
    lines = [f"run doctor: {read}, {len(shown)} finding(s)", *notes]
    for finding in shown:
        lines.append(wrap_printed(finding.text()))
    return "\n".join(lines)


#: marker colour of a finding's steps on the curves, by severity (info findings are listed, not
#: marked)
MARK_COLORS = {"error": "crimson", "warning": "darkorange"}


def mark_findings(fig: Any, history: Sequence[Mapping[str, Any]], diagnosis: Diagnosis,
                  keys: Sequence[str], columns: int = 3) -> Any:
    """Show the doctor's findings on a `metrics.plot_curves` figure of `history` drawn with `keys`
    and `columns`: crosses at the steps of each error (red) or warning (orange) on the panels of the
    metrics its rule reads, and every finding listed under the title. Returns the figure."""
    reads = rule_reads()
    for finding in diagnosis.findings:
        if finding.severity not in MARK_COLORS:
            continue
        steps = set(finding.steps)  # a set: a finding may hold every step of a long run
        for index, key in enumerate(keys):
            if key not in reads.get(finding.rule, ()):
                continue
            points = [(row["step"], row[key]) for row in history if int(row.get("step", 0)) in steps
                      and isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
            fig.add_scatter(
                x=[x for x, _ in points], y=[y for _, y in points], mode="markers",
                showlegend=False,
                marker={"symbol": "x", "size": 9, "color": MARK_COLORS[finding.severity]},
                hovertemplate=f"step %{{x}}: {finding.rule} ({finding.severity})<extra></extra>",
                row=index // columns + 1, col=index % columns + 1)
    # one line per finding, so a long list never runs past the figure's width
    listed = [f"{f.severity} {f.rule} ({f.where()})" for f in diagnosis.findings] or ["no finding"]
    lines = "".join(f"<br><sup>run doctor: {line}</sup>" for line in listed)
    top = fig.layout.margin.t or 80
    fig.update_layout(title_text=f"{fig.layout.title.text or ''}{lines}",
                      margin_t=top + 18 * len(listed))
    return fig
