"""Atomic checkpoints of the shared model (all adapters and heads) and of the trainer state.

    output_dir/
      latest                      name of the newest complete checkpoint (replaced atomically)
      step-000010/
        adapters/policy/          peft `save_pretrained` output, one sub-folder per named adapter
        adapters/value/
        adapters/reward/
        heads.safetensors         value_head.* and score_head.* (plain heads need their own save)
        trainer_state.pt          optimisers, KL controller, step, metrics history, RNG states,
                                  the run's id (`trainer_state.py`; read back with torch's safe
                                  unpickler)
        manifest.json             the SHA-256 and size of every other file, written last
                                  (`checkpoint_digest.py`)

A checkpoint is written into a hidden temporary folder, every file and folder is fsync-ed, and only
then is the folder renamed to its final name and `latest` replaced (both renames are atomic on
POSIX; a step saved again is swapped in by `runtime/folder_swap.replace_folder`). A crash at any
moment leaves `latest` pointing at a complete checkpoint (one a killed save left aside is put back
by the next save or read of `latest`), and the DEFAULT_KEEP newest complete checkpoints stay, so a
damaged latest one leaves an earlier one to resume from. `load_checkpoint` verifies the digests
before it loads anything (`verify_checkpoint`), and that the checkpoint fits the trainer
(`run_identity`: its run, its LoRA shape). The keep rule deletes only complete checkpoints of the
saving run (`cleanup.remove_old_checkpoints`): a stray `step-*` folder, another run's copy and
one it cannot attribute are left alone. A save never writes over another owner's folder, nor over a
checkpoint the trainer did not write or load, nor over anything named like a checkpoint that is
none (`ownership`: the checks train() makes).
"""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from rlhf_helpers.ppo.checkpoints.cleanup import remove_old_checkpoints, sweep_dead_saves
from rlhf_helpers.ppo.checkpoints.digest import (
    MANIFEST_FILE,
    MANIFEST_STATE_KEY,
    manifest_digest,
    verify_checkpoint,
    write_manifest,
)
from rlhf_helpers.ppo.checkpoints.folder import (
    CHECKPOINT_NAME,
    LATEST_FILE,
    TEMPORARY_CHECKPOINT,
    CheckpointSaveError,
    checkpoint_name,
    checkpoints,  # noqa: F401 (imported from here, and from the old path ppo.checkpoint)
    latest_checkpoint,
)
from rlhf_helpers.ppo.checkpoints.ownership import check_save, claim_for_save
from rlhf_helpers.ppo.checkpoints.run_identity import (
    LoRAShape,
    foreign_checkpoint_problem,
    lora_fit_problem,
    new_run_id,
    recorded_run_id,
)
from rlhf_helpers.ppo.checkpoints.trainer_state import (
    TRAINER_STATE_FILE,
    CheckpointSettingsWarning,
    checkpoint_settings,
    load_trainer_state,
    restore_trainer_state,
    settings_warning,
    state_fit_problem,
    trainer_state_dict,
)
from rlhf_helpers.ppo.model.adapters import CHECKPOINT_ADAPTERS_DIR as ADAPTERS_DIR
from rlhf_helpers.ppo.model.adapters import CHECKPOINT_HEADS_FILE as HEADS_FILE
from rlhf_helpers.ppo.model.shared_model import ADAPTERS, SharedLoRAModel
from rlhf_helpers.runtime.folder_swap import replace_folder, restore_dead_asides

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
    """Write every adapter (a peft sub-folder each) and both heads into `directory` (not atomic)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.peft.save_pretrained(str(directory / ADAPTERS_DIR), selected_adapters=list(ADAPTERS))
    heads = {f"value_head.{k}": v.detach().cpu().contiguous()
             for k, v in model.value_head.linear.state_dict().items()}
    heads.update({f"score_head.{k}": v.detach().cpu().contiguous()
                  for k, v in model.score_head.linear.state_dict().items()})
    save_file(heads, str(directory / HEADS_FILE))


def load_model_weights(model: SharedLoRAModel, directory: str | Path) -> None:
    """Load every adapter and both heads written by `save_model_weights` into `model`."""
    directory = Path(directory)
    for adapter in ADAPTERS:
        weights = directory / ADAPTERS_DIR / adapter / "adapter_model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(
                f"checkpoint {directory} lacks the {adapter!r} adapter ({weights})")
        state = load_file(str(weights), device=str(model.device))
        result = set_peft_model_state_dict(model.peft, state, adapter_name=adapter)
        missing = [k for k in result.missing_keys if f".{adapter}." in k and "lora_" in k]
        if missing:
            raise ValueError(
                f"checkpoint adapter {adapter!r} does not fit this model: missing {missing[:3]}")
    heads = load_file(str(directory / HEADS_FILE), device=str(model.device))
    for name, head in (("value_head", model.value_head), ("score_head", model.score_head)):
        part = {k.split(".", 1)[1]: v for k, v in heads.items() if k.startswith(name + ".")}
        head.linear.load_state_dict(part)


def _write_pointer(output_dir: Path, name: str) -> None:
    tmp = output_dir / f".{LATEST_FILE}.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)  # O_EXCL: a link left at this name is never written through
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w") as handle:
        handle.write(name + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, output_dir / LATEST_FILE)
    _fsync_path(output_dir)


class CheckpointDamagedError(ValueError):
    """A checkpoint whose files do not match the SHA-256 digests its save recorded: the message
    names the checkpoint and each file."""


class CheckpointMismatchError(ValueError):
    """A checkpoint that is intact but not for this trainer: another run's (by its run id), another
    LoRA shape, a trainer state of other optimisers. The message names both sides; nothing of the
    checkpoint is applied."""


#: Free bytes under which a failed write is reported as a full disk.
FULL_DISK_BYTES = 64 * 2**20


def disk_problem(error: BaseException, folder: Path) -> str:
    """'the disk is full (N MiB free)' when it is, else the error itself."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    no_space = isinstance(error, OSError) and error.errno == errno.ENOSPC
    if no_space or (free is not None and free < FULL_DISK_BYTES):
        return f"the disk is full ({(free or 0) / 2**20:.0f} MiB free)"
    return f"{type(error).__name__}: {error}"


def _kept(output_dir: Path) -> str:
    kept = latest_checkpoint(output_dir)
    return f"the previous checkpoint {kept} is kept" if kept else "no earlier checkpoint exists"


def save_checkpoint(trainer: Any, output_dir: str | Path, keep: int = DEFAULT_KEEP, *,
                    create_folder: bool = True) -> Path:
    """Atomically write the trainer's weights, state as output_dir/step-NNNNNN; return its path
    (then `trainer.last_checkpoint`). The trainer state names the trainer's run (`trainer.run_id`,
    given a new id if it has none). `create_folder=False` (a run's loop, whose folder it made and
    locked): a folder that is gone is an error, never made again.

    The folder's owner is checked as train() checks it (`run_claim.claim_for_save`), unless the
    trainer holds it already (its train() locked it): FolderInUse while another live process holds
    it, FolderHeldByAnotherTrainer while another trainer object of this process does,
    FolderOfAnotherRun when it holds another run's checkpoints; the lock is held for the save. And
    no save replaces a checkpoint the trainer did not write or load (`run_claim.check_save`:
    CheckpointWouldBeReplaced when the folder holds a newer step, or another trainer's of this
    step)."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    output_dir = Path(output_dir)
    name = checkpoint_name(trainer.step_count)
    if create_folder:
        output_dir.mkdir(parents=True, exist_ok=True)
    elif not output_dir.is_dir():
        raise CheckpointSaveError(f"could not write checkpoint {name}: the run folder "
                                  f"{output_dir} is gone (removed or renamed)")
    lock = claim_for_save(trainer, output_dir)  # None: its train() holds the folder
    try:
        return _write_checkpoint(trainer, output_dir, name, keep)
    finally:
        if lock is not None:
            lock.release()


def _write_checkpoint(trainer: Any, output_dir: Path, name: str, keep: int) -> Path:
    """`save_checkpoint`'s writing, in a folder claimed for it."""
    check_save(trainer, output_dir)
    if trainer.run_id is None:
        trainer.run_id = new_run_id()
    sweep_dead_saves(output_dir)  # what killed saves left: put back, or removed
    final = output_dir / name
    tmp = output_dir / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        save_model_weights(trainer.model, tmp)
        # the state records the manifest: a checkpoint that lost it is not taken for an older one
        torch.save({**trainer_state_dict(trainer), MANIFEST_STATE_KEY: MANIFEST_FILE},
                   tmp / TRAINER_STATE_FILE)
        write_manifest(tmp)  # last: it lists every file above
        _fsync_tree(tmp)
        # the same step saved again: its old copy is moved aside, and put back on any error
        replace_folder(tmp, final, output_dir / f".old-{name}-{os.getpid()}")
        _fsync_path(output_dir)
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        why = disk_problem(error, output_dir)
        raise CheckpointSaveError(f"could not write checkpoint {name} into {output_dir}: {why}; "
                                  f"{_kept(output_dir)} (nothing of the failed save is "
                                  "left)") from error
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        _write_pointer(output_dir, name)
    except OSError as error:
        raise CheckpointSaveError(
            f"could not update {output_dir / LATEST_FILE}: {disk_problem(error, output_dir)}; "
            f"{_kept(output_dir)}") from error
    remove_old_checkpoints(trainer, output_dir, keep, final)
    # which checkpoint the trainer is: a later save may replace this one, and no other (check_save)
    trainer.last_checkpoint, trainer.last_checkpoint_digest = str(final), manifest_digest(final)
    return final


def model_lora_shapes(model: SharedLoRAModel) -> dict[str, LoRAShape]:
    """{adapter: (rank, alpha, wrapped modules)} of the model's adapters."""
    return {name: (config.r, config.lora_alpha, sorted(config.target_modules))
            for name, config in model.peft.peft_config.items() if name in ADAPTERS}


def load_checkpoint(trainer: Any, path: str | Path) -> Path:
    """Restore weights and trainer state from a checkpoint folder, or from output_dir's latest one,
    once its files match the SHA-256 digests of its save (CheckpointDamagedError naming each file
    that does not) and it fits the trainer (CheckpointMismatchError: another run's checkpoint than
    its folder's run.json names, other LoRA shapes, other optimisers). Nothing is applied before
    every check passed. The trainer then continues the checkpoint's run (`run_id`), and
    `last_checkpoint` names it (`last_checkpoint_digest`: which bytes it held). The checkpoint's
    learning rates and KL controller stay in force, as a resumed run's must: where they differ
    from trainer.config, a CheckpointSettingsWarning names each value and trainer.config is
    updated to them."""
    path = Path(path)
    if CHECKPOINT_NAME.match(path.name) and not path.exists():  # a killed save left it aside?
        restore_dead_asides(path.parent, TEMPORARY_CHECKPOINT)
    if (path / LATEST_FILE).is_file():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"{path / LATEST_FILE} names a checkpoint that does not exist")
        path = found
    if not (path / TRAINER_STATE_FILE).is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path} (expected {TRAINER_STATE_FILE} or a {LATEST_FILE} file)")
    problems = verify_checkpoint(path)  # before anything is read into the trainer
    if problems:
        raise CheckpointDamagedError(f"checkpoint {path} is damaged: {'; '.join(problems)}")
    state = load_trainer_state(path / TRAINER_STATE_FILE)  # refused before any weight is touched
    unfit = state_fit_problem(trainer, state)
    problem = (foreign_checkpoint_problem(path, state, recorded_run_id(path.parent))
               or lora_fit_problem(path, model_lora_shapes(trainer.model), "this model's")
               or (unfit and f"checkpoint {path} does not fit this trainer: {unfit}"))
    changed = checkpoint_settings(trainer, state)  # its learning rates and KL settings win
    try:
        config = trainer.config.replace(**changed)
    except ValueError as error:
        problem = problem or f"checkpoint {path} holds settings no PPOConfig takes: {error}"
    if problem:
        raise CheckpointMismatchError(problem)
    load_model_weights(trainer.model, path)
    restore_trainer_state(trainer, state)
    trainer.last_checkpoint, trainer.last_checkpoint_digest = str(path), manifest_digest(path)
    if changed:  # trainer.config tells what is in force, and the caller hears of the change
        warnings.warn(settings_warning(path, trainer.config, changed), CheckpointSettingsWarning,
                      stacklevel=2)
        trainer.config = config
    return path
