"""Which run a checkpoint belongs to, and whether its adapters have the shape of the loading model.

    run_id = new_run_id()                     # "20261207-101500-3f9a2c1e": once, when a run starts
    recorded_run_id(Path("runs/ppo-tiny"))    # run.json's "run_id", or None
    foreign_checkpoint_problem(checkpoint, state, run_id)   # "checkpoint ... belongs to run ..."
    lora_fit_problem(checkpoint, {"policy": (8, 16, ("c_attn",))}, "the run's --lora-r ...")

A run gets its id when it starts; run.json records it, and so does every checkpoint's trainer state
(`trainer_state.RUN_ID_KEY`), so a checkpoint copied in from another run is refused by name instead
of being resumed as this run's (its history would replace the run's metrics). A run.json or a
checkpoint saved before runs had ids records none: it is not compared (it resumes as before), and
the run continued from it gets a new id.

A checkpoint's adapters are compared with the model's LoRA shape (rank, alpha, wrapped modules) from
their adapter_config.json, so another rank is one line before any weight is read (before the model
is even built, in the training command), not a `size mismatch` traceback.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf_helpers.ppo.checkpoints.trainer_state import RUN_ID_KEY
from rlhf_helpers.ppo.model.adapters import CHECKPOINT_ADAPTERS_DIR as ADAPTERS_DIR

RUN_FILE = "run.json"
#: run.json holds a profile and a config (a few KiB): a larger file is not read for its id
MAX_RUN_FILE_BYTES = 1 << 20
#: (rank, alpha, wrapped module names) of a LoRA adapter
LoRAShape = tuple[int, int, Sequence[str]]


def new_run_id() -> str:
    """A new run's id: its start time and 8 random hex digits (two runs never share one)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def _read_json(path: Path) -> Any:
    """The JSON value of a small regular file at `path` (never through a link), or None."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_RUN_FILE_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None


def recorded_run_id(folder: str | Path) -> str | None:
    """The run id folder/run.json records; None when it records none (no file, an older version's
    run.json, or not one of ours)."""
    record = _read_json(Path(folder) / RUN_FILE)
    run_id = record.get(RUN_ID_KEY) if isinstance(record, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def run_id_to_continue(record: Mapping[str, Any] | None) -> str:
    """The id of a run continued from run.json's `record` (None: a new run): the recorded one, or
    a new id when the record has none (written by an older version)."""
    run_id = record.get(RUN_ID_KEY) if record is not None else None
    return run_id if isinstance(run_id, str) and run_id else new_run_id()


def foreign_checkpoint_problem(checkpoint: Path, state: Mapping[str, Any],
                               run_id: str | None) -> str | None:
    """'checkpoint X belongs to run A, not to run B (...run.json)' when the checkpoint's trainer
    state (`state`) names another run than `run_id` (run.json's); None when they agree or either
    records no id (saved by an older version)."""
    saved = state.get(RUN_ID_KEY)
    if not saved or not run_id or saved == run_id:
        return None
    return (f"checkpoint {checkpoint} belongs to run {saved}, not to run {run_id} "
            f"({checkpoint.parent / RUN_FILE}): it was copied in from another run, whose weights "
            "and history are not this run's; put the run's own checkpoint back, or train that "
            "run in a folder of its own")


def checkpoint_lora_shape(checkpoint: Path, adapter: str) -> LoRAShape | None:
    """(rank, alpha, wrapped modules) of one adapter of a checkpoint, from its
    adapter_config.json; None when it cannot be read (the digests or the loader then say why)."""
    config = _read_json(checkpoint / ADAPTERS_DIR / adapter / "adapter_config.json")
    if not isinstance(config, dict):
        return None
    rank, alpha, targets = config.get("r"), config.get("lora_alpha"), config.get("target_modules")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        return None
    return rank, alpha, targets


def _said(shape: LoRAShape) -> str:
    return f"r={shape[0]}, alpha={shape[1]} on {', '.join(sorted(shape[2]))}"


def lora_fit_problem(checkpoint: Path, expected: Mapping[str, LoRAShape],
                     whose: str) -> str | None:
    """What differs between the checkpoint's adapters and the LoRA shapes `expected` ({adapter:
    (rank, alpha, modules)}; `whose` names where they come from), or None when every one fits."""
    for adapter, wanted in expected.items():
        found = checkpoint_lora_shape(checkpoint, adapter)
        if found is None:
            continue
        if (found[0], found[1], sorted(found[2])) != (wanted[0], wanted[1], sorted(wanted[2])):
            return (f"checkpoint {checkpoint} holds a {adapter} adapter of LoRA {_said(found)}, "
                    f"{whose} is {_said(wanted)}: a checkpoint of another LoRA shape does not fit "
                    "this model")
    return None
