"""Atomic checkpoints of the shared model (all adapters and heads) and of the trainer state.

    output_dir/
      latest                      name of the newest complete checkpoint (replaced atomically)
      step-000010/
        adapters/policy/          peft `save_pretrained` output, one sub-folder per named adapter
        adapters/value/
        adapters/reward/
        heads.safetensors         value_head.* and score_head.* (plain heads need their own save)
        trainer_state.pt          optimisers, KL controller, step, metrics history, RNG states
                                  (read back with torch's safe unpickler: `load_trainer_state`)

A checkpoint is written into a hidden temporary folder, every file and folder is fsync-ed, and only
then is the folder renamed to its final name and `latest` replaced (both renames are atomic on POSIX).
A crash at any moment leaves `latest` pointing at the previous complete checkpoint.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from rlhf_helpers.ppo.adapters import CHECKPOINT_ADAPTERS_DIR as ADAPTERS_DIR
from rlhf_helpers.ppo.adapters import CHECKPOINT_HEADS_FILE as HEADS_FILE
from rlhf_helpers.ppo.shared_model import ADAPTERS, SharedLoRAModel
from rlhf_helpers.runtime.artifacts import remove_dead_temporary_folders

LATEST_FILE = "latest"
#: Names of checkpoint folders (what `latest` may point at).
CHECKPOINT_NAME = re.compile(r"^step-\d{6,}$")
TRAINER_STATE_FILE = "trainer_state.pt"
#: Temporary folders of `save_checkpoint`: .tmp-step-NNNNNN-<pid> and .old-step-NNNNNN-<pid>.
TEMPORARY_CHECKPOINT = re.compile(r"^\.(?:tmp|old)-(step-\d+)-(\d+)$")
#: Complete checkpoints kept in output_dir (older ones are deleted after a save).
DEFAULT_KEEP = 2


def _fsync_path(path: Path) -> None:
    """Flush a file or a folder entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            _fsync_path(Path(folder) / name)
        _fsync_path(Path(folder))


def save_model_weights(model: SharedLoRAModel, directory: str | Path) -> None:
    """Write every adapter (one peft sub-folder each) and both heads into `directory` (not atomic)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.peft.save_pretrained(str(directory / ADAPTERS_DIR), selected_adapters=list(ADAPTERS))
    heads = {f"value_head.{k}": v.detach().cpu().contiguous() for k, v in model.value_head.linear.state_dict().items()}
    heads.update({f"score_head.{k}": v.detach().cpu().contiguous()
                  for k, v in model.score_head.linear.state_dict().items()})
    save_file(heads, str(directory / HEADS_FILE))


def load_model_weights(model: SharedLoRAModel, directory: str | Path) -> None:
    """Load every adapter and both heads written by `save_model_weights` into `model`."""
    directory = Path(directory)
    for adapter in ADAPTERS:
        weights = directory / ADAPTERS_DIR / adapter / "adapter_model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"checkpoint {directory} lacks the {adapter!r} adapter ({weights})")
        state = load_file(str(weights), device=str(model.device))
        result = set_peft_model_state_dict(model.peft, state, adapter_name=adapter)
        missing = [k for k in result.missing_keys if f".{adapter}." in k and "lora_" in k]
        if missing:
            raise ValueError(f"checkpoint adapter {adapter!r} does not fit this model: missing {missing[:3]}")
    heads = load_file(str(directory / HEADS_FILE), device=str(model.device))
    for name, head in (("value_head", model.value_head), ("score_head", model.score_head)):
        part = {k.split(".", 1)[1]: v for k, v in heads.items() if k.startswith(name + ".")}
        head.linear.load_state_dict(part)


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The step-NNNNNN folders of output_dir, oldest first."""
    return sorted(p for p in Path(output_dir).glob("step-*") if p.is_dir() and CHECKPOINT_NAME.match(p.name))


def resolve_latest(output_dir: str | Path) -> tuple[Path | None, str | None]:
    """(the checkpoint output_dir/latest names, None), or (None, what is wrong with the pointer): missing,
    empty, unreadable, naming something other than a step-NNNNNN folder of output_dir (a path elsewhere
    is refused), or naming a folder that does not exist."""
    pointer = Path(output_dir) / LATEST_FILE
    if not pointer.is_file():
        return None, f"{pointer} is missing"
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        return None, f"{pointer} is unreadable ({type(error).__name__})"
    if not name:
        return None, f"{pointer} is empty"
    if not CHECKPOINT_NAME.match(name):
        return None, f"{pointer} names {name!r}, not a step-NNNNNN checkpoint folder of {output_dir}"
    path = Path(output_dir) / name
    if not path.is_dir():
        return None, f"{pointer} names {name}, which does not exist"
    return path, None


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in output_dir, or None if there is none (or `latest` is broken:
    `resolve_latest` says how)."""
    return resolve_latest(output_dir)[0]


def checkpoint_problem(path: str | Path) -> str | None:
    """What is wrong with the checkpoint folder `path`, naming the file, or None when every file of it
    reads back: the trainer state (safe loader, every key), each adapter's config and weights, the heads.
    Run before a resume builds anything, so a truncated file is an error message, not a traceback."""
    path = Path(path)
    try:
        load_trainer_state(path / TRAINER_STATE_FILE)
    except FileNotFoundError:
        return f"{path / TRAINER_STATE_FILE} is missing"
    except ValueError as error:  # the safe loader's refusal, or not a trainer state
        return str(error)
    except Exception as error:  # a truncated or garbled zip archive: torch raises RuntimeError/EOFError
        return f"{path / TRAINER_STATE_FILE} is damaged ({type(error).__name__}: truncated or overwritten)"
    files = [path / ADAPTERS_DIR / a / name for a in ADAPTERS for name in ("adapter_config.json",
                                                                           "adapter_model.safetensors")]
    for file in [*files, path / HEADS_FILE]:
        if not file.is_file():
            return f"{file} is missing"
        try:
            if file.suffix == ".json":
                json.loads(file.read_text(encoding="utf-8"))
            else:
                load_file(str(file))  # reads the header and every tensor: a truncated file fails
        except Exception as error:  # safetensors raises its own SafetensorError
            return f"{file} is damaged ({type(error).__name__}: truncated or overwritten)"
    return None


def _write_pointer(output_dir: Path, name: str) -> None:
    tmp = output_dir / f".{LATEST_FILE}.tmp-{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(name + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, output_dir / LATEST_FILE)
    _fsync_path(output_dir)


class CheckpointSaveError(OSError):
    """A checkpoint (or the file pointing at it) could not be written: the message says why (a full disk
    is named as such) and which earlier checkpoint is kept, unchanged."""


#: Free bytes under which a failed write is reported as a full disk.
FULL_DISK_BYTES = 64 * 2**20


def disk_problem(error: BaseException, folder: Path) -> str:
    """'the disk is full (N MiB free)' when it is, else the error itself."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or (free is not None and free < FULL_DISK_BYTES):
        return f"the disk is full ({(free or 0) / 2**20:.0f} MiB free)"
    return f"{type(error).__name__}: {error}"


def _kept(output_dir: Path) -> str:
    kept = latest_checkpoint(output_dir)
    return f"the previous checkpoint {kept} is kept" if kept else "no earlier checkpoint exists"


def save_checkpoint(trainer: Any, output_dir: str | Path, keep: int = DEFAULT_KEEP) -> Path:
    """Atomically write the trainer's model weights and state as output_dir/step-NNNNNN; returns its path."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # temporary folders of saves that a killed run never finished (their process is gone)
    remove_dead_temporary_folders(output_dir, TEMPORARY_CHECKPOINT)
    name = checkpoint_name(trainer.step_count)
    final = output_dir / name
    tmp = output_dir / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        save_model_weights(trainer.model, tmp)
        torch.save(trainer_state_dict(trainer), tmp / TRAINER_STATE_FILE)
        _fsync_tree(tmp)
        if final.exists():  # the same step saved again: move the old copy aside first
            old = output_dir / f".old-{name}-{os.getpid()}"
            os.rename(final, old)
            try:
                os.rename(tmp, final)
            except OSError:
                os.rename(old, final)  # the previous copy back in place
                raise
            shutil.rmtree(old)
        else:
            os.rename(tmp, final)
        _fsync_path(output_dir)
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        why = disk_problem(error, output_dir)
        raise CheckpointSaveError(f"could not write checkpoint {name} into {output_dir}: {why}; "
                                  f"{_kept(output_dir)} (nothing of the failed save is left)") from error
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        _write_pointer(output_dir, name)
    except OSError as error:
        raise CheckpointSaveError(f"could not update {output_dir / LATEST_FILE}: {disk_problem(error, output_dir)}; "
                                  f"{_kept(output_dir)}") from error
    for stale in checkpoints(output_dir)[:-keep]:
        if stale != final:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def load_checkpoint(trainer: Any, path: str | Path) -> Path:
    """Restore weights and trainer state from a checkpoint folder, or from output_dir's latest one."""
    path = Path(path)
    if (path / LATEST_FILE).is_file():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"{path / LATEST_FILE} names a checkpoint that does not exist")
        path = found
    if not (path / TRAINER_STATE_FILE).is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (expected {TRAINER_STATE_FILE} or a {LATEST_FILE} file)")
    state = load_trainer_state(path / TRAINER_STATE_FILE)  # refused before any weight is touched
    load_model_weights(trainer.model, path)
    restore_trainer_state(trainer, state)
    return path


#: What `trainer_state_dict` writes; a trainer_state.pt without one of them is not a checkpoint of ours.
TRAINER_STATE_KEYS = ("step", "policy_optimizer", "value_optimizer", "kl_controller", "history", "torch_rng")


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """trainer_state.pt read with torch's safe unpickler (`weights_only=True`).

    The safe unpickler rebuilds only tensors, numbers, strings, None, lists, tuples and dicts, which
    is all `PPOTrainer.state_dict` holds (RNG states are uint8 tensors). A full unpickler would call
    whatever function a crafted file names, so a file holding anything else is refused (ValueError)
    and nothing in it runs.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message is long advice about weights_only=False; keep only its reason
        reason = next((line.split("error:", 1)[1].strip() for line in str(error).splitlines()
                       if "WeightsUnpickler error:" in line), str(error).splitlines()[0])
        reason = reason.split(". ")[0]
        raise ValueError(f"{path} was refused by the safe loader (weights_only=True): {reason}. A "
                         "checkpoint of this course holds only tensors, numbers, strings, lists and "
                         "dicts; this file holds something else, which could run code when loaded, so "
                         "it is not loaded") from None
    missing = [key for key in TRAINER_STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ValueError(f"{path} is not a PPO trainer state: it lacks {missing}")
    return state


def trainer_state_dict(trainer: Any) -> dict[str, Any]:
    """A PPOTrainer's optimisers, KL controller, step, metrics history and RNG states (weights are saved apart),
    and under fp16 the loss scalers (plain floats and ints: `weights_only` loading reads them)."""
    state: dict[str, Any] = {
        "step": trainer.step_count,
        **trainer.policy_opt.state_dict(),
        **trainer.value_opt.state_dict(),
        "kl_controller": dict(vars(trainer.kl_controller)),
        "history": list(trainer.history),
        "torch_rng": torch.random.get_rng_state(),
        "config": trainer.config.to_dict(),
    }
    if trainer.policy_opt.scaler.is_enabled():
        state["overflow_skips"] = {"policy": trainer.policy_opt.overflow_skips,
                                   "value": trainer.value_opt.overflow_skips}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore_trainer_state(trainer: Any, state: dict[str, Any]) -> None:
    """Inverse of `trainer_state_dict`."""
    trainer.step_count = int(state["step"])
    trainer.policy_opt.load_state_dict(state)
    trainer.value_opt.load_state_dict(state)
    for key, value in state["kl_controller"].items():
        setattr(trainer.kl_controller, key, value)
    trainer.history = list(state["history"])
    torch.random.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
