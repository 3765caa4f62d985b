"""The run doctor's check of a run folder's checkpoints: each step-NNNNNN folder is verified against
the SHA-256 manifest its save wrote (`checkpoint_digest.verify_checkpoint`), so a checkpoint whose
bytes changed after the save (4 KiB of an adapter zeroed, a file gone) is an error naming it, its
files and the newest intact checkpoint.

    found, notes = checkpoint_finding(Path("runs/ppo-tiny"))  # None and [] if all are intact

The rule `damaged_checkpoint`, registered here, runs on this course's run folders only (`diagnose`
given a folder or its metrics.jsonl), never on a list of metrics or TRL's folders.

A checkpoint saved before manifests existed has its files read back instead: intact, it gets a note
that it could not be verified by digest, never an error. A checkpoint that a save killed while
replacing it left aside (.old-step-NNNNNN-<pid>) gets a note too: the doctor moves nothing, the
next save or resume puts it back.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlhf_helpers.doctor.findings import Finding
from rlhf_helpers.doctor.registry import finding, rule
from rlhf_helpers.ppo.checkpoint_digest import verify_checkpoint
from rlhf_helpers.runtime.folder_swap import is_stranded_aside

RULE = "damaged_checkpoint"
#: a checkpoint folder's name: ASCII digits (str.isdigit and \d take '²' and other scripts' digits)
CHECKPOINT = re.compile(r"step-([0-9]{6,})")
#: a checkpoint moved aside while a save replaced it (`checkpoint.save_checkpoint`)
ASIDE = re.compile(r"\.old-(step-[0-9]{6,})-[0-9]+")
#: problems shown per checkpoint (a lost adapter folder alone gives several)
SHOWN = 3


@rule(RULE, "error", reads=(), on_folder=True,
      fires=lambda t: "a step-NNNNNN checkpoint of the run folder whose files do not match their "
                      "SHA-256 in its manifest.json (or are missing); the evidence names the "
                      "newest intact checkpoint. A checkpoint saved without a manifest is read "
                      "back, a note at most",
      teaches="rlhf_helpers/ppo/checkpoint_digest.py (the SHA-256 manifest)")
def checkpoint_finding(run_dir: Path) -> tuple[Finding | None, list[str]]:
    """(an error finding naming the damaged checkpoints of `run_dir`, or None; notes on the
    checkpoints saved without a manifest). Only step-NNNNNN folders are read; a run without
    checkpoints gives (None, [])."""
    found = sorted(
        (int(match.group(1)), path)
        for path in run_dir.glob("step-*")
        if (match := CHECKPOINT.fullmatch(path.name)) and path.is_dir()
    )
    damaged: list[tuple[int, Path, list[str]]] = []
    intact: list[Path] = []
    notes: list[str] = []
    for step, folder in found:
        problems = verify_checkpoint(folder)
        if problems:
            damaged.append((step, folder, problems))
            continue
        intact.append(folder)
        if not (folder / "manifest.json").exists():
            notes.append(
                f"{folder.name} was saved without a manifest (an older run): its files were read "
                "back, not verified by SHA-256"
            )
    for aside in sorted(run_dir.glob(".old-step-*")):
        if (match := ASIDE.fullmatch(aside.name)) and is_stranded_aside(aside):
            notes.append(f"{match.group(1)} is at {aside.name}, where a save that was killed "
                         "while replacing it left it: the next save or resume puts it back")
    if not damaged:
        return None, notes
    newest = (f"newest intact checkpoint: {intact[-1].name}" if intact
              else "no intact checkpoint in this run folder")
    evidence = "; ".join(
        f"{folder.name}: "
        + "; ".join(problems[:SHOWN])
        + (f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else "")
        for _, folder, problems in damaged
    )
    return finding(
        RULE, [step for step, _, _ in damaged], f"{evidence} ({newest})",
        title="a checkpoint's files changed after its save",
        meaning="the disk, a copy or a person changed the checkpoint's bytes after the save: "
                "resuming from it or exporting it would load damaged weights (a resume refuses it)",
        check_first=(
            f"resume or export from {intact[-1].name}, the newest intact checkpoint (a resume "
            "refuses a damaged one); the disk and whatever copied the files"
            if intact
            else "the disk and whatever copied the files; copy the checkpoints again from their "
                 "source, or train again"
        ),
    ), notes
