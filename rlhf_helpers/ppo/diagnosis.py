"""The run doctor: reads a run's metric history and names the known RLHF failure signatures it shows.

    from rlhf_helpers.ppo.diagnosis import diagnose, format_findings
    findings = diagnose(trainer)                 # a live PPOTrainer (its history and its settings)
    findings = diagnose("runs/ppo-tiny")         # a run folder: metrics.jsonl + run.json, or TRL's trainer_state.json
    findings = diagnose(history, facts=RunFacts(max_new_tokens=40))   # a list of per-step metric dicts
    print(format_findings(findings))
    python -m rlhf_helpers.stages.diagnose runs/ppo-tiny                # the same from a shell

Each finding names its rule, the steps where it holds, the evidence in numbers, what it usually means,
what to check first and where the course teaches it; they come sorted by severity ("error", "warning",
"info"). The rules and their thresholds are in `diagnosis_rules`; every threshold says where it comes
from (docs/metrics.md's healthy ranges, measured tiny-profile runs, or plain arithmetic).

TRL's GRPOTrainer and RLOOTrainer log other names; `TRL_NAMES` maps those that mean the same quantity
(reward, reward_std, frac_reward_zero_std, kl, entropy, completions/mean_length, completions/clipped_ratio,
clip_ratio/region_mean), so a TRL run folder is read too. The rules whose metric TRL does not log
(first_ratio, explained_variance, hidden scores) stay silent on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlhf_helpers.core.tolerances import dtype_name
from rlhf_helpers.ppo.diagnosis_rules import RULES
from rlhf_helpers.ppo.diagnosis_types import Finding, RunFacts, Thresholds, rule_docs
from rlhf_helpers.runtime.data import load_jsonl

__all__ = ["Finding", "RunFacts", "Thresholds", "TRL_NAMES", "Diagnosis", "diagnose", "format_findings",
           "mark_findings", "load_history", "compute_record", "DIAGNOSIS_FILE"]

DIAGNOSIS_FILE = "diagnosis.json"  #: what the training command writes into its run folder
SEVERITIES = ("error", "warning", "info")

#: TRL log name -> this course's metric name, for the quantities that mean the same (TRL 1.x GRPO / RLOO)
TRL_NAMES: dict[str, str] = {
    "reward": "score",  # mean reward of the batch's completions
    "reward_std": "score_std",  # spread of the rewards (TRL: the mean of the per-group std)
    "frac_reward_zero_std": "zero_std_fraction",  # share of prompt groups whose rewards are all equal
    "kl": "kl_per_token",  # TRL's k3 per-token KL to the reference (ours, `kl`, is k1 per sequence)
    "entropy": "entropy",  # mean per-token entropy of the policy
    "completions/mean_length": "response_length",  # mean completion length in tokens
    "clip_ratio/region_mean": "clipfrac",  # share of tokens whose ratio left the clip band
}


@dataclass(frozen=True)
class Diagnosis:
    """What `diagnose` found, with the facts it used: what diagnosis.json holds."""

    findings: list[Finding]  #: sorted by severity, then in the order of the rules (diagnosis_rules.RULES)
    steps: int  #: steps read
    facts: RunFacts  #: the run's settings the rules used
    thresholds: Thresholds = field(default_factory=Thresholds)  #: the thresholds the rules used

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "findings": [f.to_json() for f in self.findings],
                "facts": asdict(self.facts), "thresholds": asdict(self.thresholds)}


def _trl_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One TRL log entry in this course's names (entries without a reward, e.g. the final summary, give {})."""
    if "reward" not in row:
        return {}
    out = {ours: row[theirs] for theirs, ours in TRL_NAMES.items() if theirs in row}
    if "completions/clipped_ratio" in row:  # share of completions cut at the length limit (no EOS)
        out["eos_fraction"] = 1.0 - float(row["completions/clipped_ratio"])
    out["step"] = row.get("step")
    return out


def load_history(source: str | Path) -> tuple[list[dict[str, Any]], RunFacts]:
    """The metric history of a run folder or a metrics.jsonl, and the settings run.json records.

    A folder of this course's training command holds metrics.jsonl and run.json; a TRL output folder holds
    trainer_state.json (at its top, or in its newest checkpoint-N folder), read through TRL_NAMES."""
    path = Path(source)
    if path.is_dir():
        if (path / "metrics.jsonl").is_file():
            return load_history(path / "metrics.jsonl")
        top = path / "trainer_state.json"
        saved = sorted((p for p in path.glob("checkpoint-*/trainer_state.json")
                        if p.parent.name.removeprefix("checkpoint-").isdigit()),
                       key=lambda p: int(p.parent.name.removeprefix("checkpoint-")))
        state = top if top.is_file() else (saved[-1] if saved else None)
        if state is None:
            raise ValueError(f"source {path} holds no metrics.jsonl (this course's runs) and no trainer_state.json "
                             f"(TRL's): pass a run folder")
        return _load_trl(state)
    if not path.is_file():
        raise ValueError(f"source must be a run folder or a metrics.jsonl, got {str(path)!r} (no such file)")
    if path.name == "trainer_state.json":
        return _load_trl(path)
    return load_jsonl(path), _facts_of_run_json(path.parent / "run.json")


def _read_json(path: Path) -> Any:
    """The JSON in `path`; ValueError naming the file when it is not UTF-8 JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not UTF-8 JSON ({err})") from None


def _load_trl(state_file: Path) -> tuple[list[dict[str, Any]], RunFacts]:
    state = _read_json(state_file)
    log = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(log, list):
        raise ValueError(f"{state_file}: not a TRL trainer_state.json (expected an object with a log_history "
                         f"list, got {type(log).__name__} {log!r:.60})")
    rows = [r for r in (_trl_row(entry) for entry in log if isinstance(entry, dict)) if r]
    return rows, RunFacts(source="trl")


def _checked(run_file: Path, section: dict[str, Any], key: str, kinds: tuple[type, ...], low: float) -> Any:
    """section[key] when it is None or a number of `kinds` >= low (never a bool); else ValueError naming it."""
    value = section.get(key)
    if value is None or (isinstance(value, kinds) and not isinstance(value, bool) and value >= low):
        return value
    kind = "an int" if kinds == (int,) else "a number"
    raise ValueError(f"{run_file}: {key} must be {kind} >= {low:g}, got {type(value).__name__} {value!r}")


def _facts_of_run_json(run_file: Path) -> RunFacts:
    if (run_file.exists() or run_file.is_symlink()) and not run_file.is_file():  # never read as "none recorded"
        raise ValueError(f"{run_file} is not a readable file (a folder, a broken link or a pipe), so the run's "
                         "settings are unknown; move it away to diagnose the metrics alone")
    if not run_file.is_file():
        return RunFacts()
    record = _read_json(run_file)
    config = record.get("ppo_config", {}) if isinstance(record, dict) else None
    profile = record.get("profile", {}) if isinstance(record, dict) else None
    if not isinstance(config, dict) or not isinstance(profile, dict):
        raise ValueError(f"{run_file}: not a run record (an object whose ppo_config and profile are objects)")
    settings = {"max_new_tokens": _checked(run_file, config, "max_new_tokens", (int,), 1),
                "score_clip": _checked(run_file, config, "score_clip", (int, float), 0),
                "value_warmup_steps": _checked(run_file, config, "value_warmup_steps", (int,), 0) or 0}
    compute = record.get("compute")  # what the run computed in; older records hold the profile's dtype only
    if compute is not None and not isinstance(compute, dict):
        raise ValueError(f"{run_file}: compute must be an object ({{\"dtype\": ..., \"loss_scaling\": ...}}), got "
                         f"{type(compute).__name__} {compute!r:.40}")
    dtype = compute.get("dtype") if compute is not None else profile.get("dtype")
    scaling = compute.get("loss_scaling", False) if compute is not None else False
    if not isinstance(dtype, str):  # None too: a record that does not say how the run computed
        raise ValueError(f"{run_file}: dtype must be a dtype name, got {type(dtype).__name__} {dtype!r:.40}")
    if not isinstance(scaling, bool):
        raise ValueError(f"{run_file}: loss_scaling must be true or false, got {type(scaling).__name__} "
                         f"{scaling!r:.40}")
    try:
        facts = RunFacts(dtype=dtype, loss_scaling=scaling)
    except ValueError as error:  # "bf16", "torch.bfloat16" are read; an unknown name is refused, never float32
        raise ValueError(f"{run_file}: {error}") from None
    return dataclasses.replace(facts, **settings)


def compute_record(trainer: Any) -> dict[str, Any]:
    """{"dtype", "loss_scaling"}: the dtype a trainer's forward passes compute in (its model's `compute_dtype`:
    the frozen base's, bf16 or fp16 over float32 masters on a GPU) and whether a loss scaler runs (fp16).
    run.json records it; the doctor's float tolerances follow it. ValueError for a model that does not say."""
    dtype = getattr(trainer.model, "compute_dtype", None)
    if dtype is None:  # never guessed: a float32 guess would judge a bf16 run by float32's tolerances
        raise ValueError(f"trainer.model ({type(trainer.model).__name__}) has no compute_dtype: pass "
                         "facts=RunFacts(dtype=...) to diagnose")
    scaler = getattr(getattr(trainer, "policy_opt", None), "scaler", None)
    return {"dtype": dtype_name(dtype), "loss_scaling": bool(scaler is not None and scaler.is_enabled())}


def _facts_of_trainer(trainer: Any) -> RunFacts:
    config = trainer.config
    compute = compute_record(trainer)
    return RunFacts(max_new_tokens=config.max_new_tokens, score_clip=config.score_clip,
                    value_warmup_steps=config.value_warmup_steps, dtype=compute["dtype"],
                    loss_scaling=compute["loss_scaling"])


def diagnose(source: Any, *, facts: RunFacts | None = None,
             thresholds: Thresholds | None = None) -> Diagnosis:
    """Run every rule on a run's history.

    `source`: a list of per-step metric dicts (`PPOTrainer.history`, metrics.jsonl's rows), a live
    `PPOTrainer` (anything with `history` and `config`), or the path of a run folder or metrics.jsonl.
    `facts`: the run's settings (max_new_tokens, score_clip, warm-up, the dtype it computed in); read from the
    trainer or run.json when not given. A bare list (or a folder without run.json) without `facts` is judged as a
    float32 run, the strictest tolerances: pass the run's facts (e.g. `diagnose(trainer).facts`) for a 16-bit one.
    `thresholds`: the rules' thresholds (defaults: `Thresholds()`)."""
    thresholds = thresholds or Thresholds()
    if isinstance(source, (str, Path)):
        history, found = load_history(source)
    elif hasattr(source, "history") and hasattr(source, "config"):
        history, found = list(source.history), _facts_of_trainer(source)
    elif isinstance(source, Sequence) and all(isinstance(row, Mapping) for row in source):
        history, found = [dict(row) for row in source], RunFacts()
    else:
        raise ValueError("source must be a list of metric dicts, a PPOTrainer, or a run folder / metrics.jsonl "
                         f"path, got {type(source).__name__}")
    facts = facts or found
    _check_values(history, source)
    rows = [{**row, "step": _step(row, index)} for index, row in enumerate(history)]
    findings = [finding for rule in RULES if (finding := rule(rows, facts, thresholds)) is not None]
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))  # stable: within a severity, in RULES order
    return Diagnosis(findings=findings, steps=len(rows), facts=facts, thresholds=thresholds)


def _check_values(history: Sequence[Mapping[str, Any]], source: Any) -> None:
    """ValueError naming the row and metric of the first value that is not a number (or None): the rules read
    numbers, and a string or a list would silently read as "not logged"."""
    where = f"{source}: " if isinstance(source, (str, Path)) else ""
    for index, row in enumerate(history):
        for key, value in row.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{where}row {index + 1}: {key} must be a number, got {type(value).__name__} "
                                 f"{value!r:.40}")


def _step(row: Mapping[str, Any], index: int) -> int:
    value = row.get("step")
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else index + 1


def format_findings(diagnosis: Diagnosis, min_severity: str = "info") -> str:
    """The findings as text, one block each (what `train_ppo` prints at the end of a run)."""
    if min_severity not in SEVERITIES:
        raise ValueError(f"min_severity must be one of {SEVERITIES}, got {min_severity!r}")
    shown = [f for f in diagnosis.findings if SEVERITIES.index(f.severity) <= SEVERITIES.index(min_severity)]
    if not shown:
        return f"run doctor: {diagnosis.steps} steps read, no finding" + (
            "" if min_severity == "info" else f" at {min_severity} or above")
    lines = [f"run doctor: {diagnosis.steps} steps read, {len(shown)} finding(s)"]
    for finding in shown:
        lines.append(finding.text())
    return "\n".join(lines)


#: marker colour of a finding's steps on the curves, by severity (info findings are listed, not marked)
MARK_COLORS = {"error": "crimson", "warning": "darkorange"}


def mark_findings(fig: Any, history: Sequence[Mapping[str, Any]], diagnosis: Diagnosis, keys: Sequence[str],
                  columns: int = 3) -> Any:
    """Show the doctor's findings on a `metrics.plot_curves` figure of `history` drawn with `keys` and `columns`:
    crosses at the steps of each error (red) or warning (orange) on the panels of the metrics its rule reads,
    and every finding listed under the title. Returns the figure."""
    reads = {rule: metrics for rule, (metrics, _) in rule_docs().items()}
    for finding in diagnosis.findings:
        if finding.severity not in MARK_COLORS:
            continue
        for index, key in enumerate(keys):
            if key not in reads.get(finding.rule, ()):
                continue
            points = [(row["step"], row[key]) for row in history if int(row.get("step", 0)) in finding.steps
                      and isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]
            fig.add_scatter(x=[x for x, _ in points], y=[y for _, y in points], mode="markers", showlegend=False,
                            marker={"symbol": "x", "size": 9, "color": MARK_COLORS[finding.severity]},
                            hovertemplate=f"step %{{x}}: {finding.rule} ({finding.severity})<extra></extra>",
                            row=index // columns + 1, col=index % columns + 1)
    # one line per finding, so a long list never runs past the figure's width
    listed = [f"{f.severity} {f.rule} ({f.where()})" for f in diagnosis.findings] or ["no finding"]
    lines = "".join(f"<br><sup>run doctor: {line}</sup>" for line in listed)
    top = fig.layout.margin.t or 80
    fig.update_layout(title_text=f"{fig.layout.title.text or ''}{lines}", margin_t=top + 18 * len(listed))
    return fig
