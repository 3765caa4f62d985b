"""What trainer_state.pt of a checkpoint holds: the trainer's optimisers, KL controller, step,
metrics history, RNG states and run id (the weights are saved apart,
`checkpoint.save_model_weights`).

    path = folder / TRAINER_STATE_FILE
    torch.save(trainer_state_dict(trainer), path)
    state = load_trainer_state(path)        # safe unpickler; ValueError unless it is one of ours
    state_fit_problem(trainer, state)       # None, or why it does not fit this trainer
    restore_trainer_state(trainer, state)
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

TRAINER_STATE_FILE = "trainer_state.pt"
#: The trainer state's key naming the run it belongs to (`run_identity`); absent in a checkpoint
#: saved before runs had an id.
RUN_ID_KEY = "run_id"


#: What `trainer_state_dict` writes; a trainer_state.pt lacking one is not a checkpoint of ours.
TRAINER_STATE_KEYS = ("step", "policy_optimizer", "value_optimizer", "kl_controller",
                      "history", "torch_rng")


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
                       if "WeightsUnpickler error:" in line), "").split(". ")[0]
        if not reason:  # no archive of torch's at all: bytes written over the file
            raise ValueError(f"{path} is not a readable trainer state (not an archive of "
                             "torch.save: overwritten, or not written by this course)") from None
        raise ValueError(f"{path} was refused by the safe loader (weights_only=True): {reason}. A "
                         "checkpoint of this course holds only tensors, numbers, strings, lists "
                         "and dicts; this file holds something else, which could run code when "
                         "loaded, so it is not loaded") from None
    except OSError:
        raise  # missing or unreadable: the caller names it
    except Exception as error:  # a cut or garbled archive: RuntimeError, EOFError...
        raise ValueError(f"{path} is not a readable trainer state ({type(error).__name__}: "
                         "truncated, overwritten, or not written by this course)") from None
    missing = [key for key in TRAINER_STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ValueError(f"{path} is not a PPO trainer state: it lacks {missing}")
    problem = _shape_problem(state)
    if problem is not None:
        raise ValueError(f"{path} is not a PPO trainer state of this course: {problem}")
    return state


def _shape_problem(state: dict[str, Any]) -> str | None:
    """What in a state read back safely is not what `trainer_state_dict` writes (a forged file can
    hold any tensors, numbers, strings, lists and dicts), or None."""
    step, run_id = state["step"], state.get(RUN_ID_KEY)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"its step is {step!r:.40}, not an int >= 0"
    if run_id is not None and not isinstance(run_id, str):
        return f"its {RUN_ID_KEY} is {run_id!r:.40}, not a string"
    kinds = {"policy_optimizer": dict, "value_optimizer": dict, "kl_controller": dict,
             "history": list, "torch_rng": torch.Tensor}
    for key, kind in kinds.items():
        if not isinstance(state[key], kind):
            return f"its {key} is a {type(state[key]).__name__}, not a {kind.__name__}"
    if not all(isinstance(row, dict) for row in state["history"]):
        return "its history holds something other than rows of metrics"
    return None


def trainer_state_dict(trainer: Any) -> dict[str, Any]:
    """A PPOTrainer's optimisers, KL controller, step, metrics history and RNG states (weights are
    saved apart), and under fp16 the loss scalers (plain floats and ints: `weights_only` loading
    reads them)."""
    state: dict[str, Any] = {
        "step": trainer.step_count,
        **trainer.policy_opt.state_dict(),
        **trainer.value_opt.state_dict(),
        "kl_controller": dict(vars(trainer.kl_controller)),
        "history": list(trainer.history),
        "torch_rng": torch.random.get_rng_state(),
        "config": trainer.config.to_dict(),
        RUN_ID_KEY: trainer.run_id,
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
    trainer.run_id = state.get(RUN_ID_KEY)  # the run this trainer now continues
    torch.random.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def state_fit_problem(trainer: Any, state: dict[str, Any]) -> str | None:
    """What in `state` (read by `load_trainer_state`) does not fit `trainer`, found before anything
    of it is applied: an optimiser state of other parameter groups, parameter counts or shapes, a KL
    controller of other fields; None when it fits."""
    for opt in (trainer.policy_opt, trainer.value_opt):
        saved = state[f"{opt.name}_optimizer"]
        groups, moments = saved.get("param_groups"), saved.get("state")
        params = [p for group in opt.optimizer.param_groups for p in group["params"]]
        if (not isinstance(groups, list) or not isinstance(moments, dict)
                or [len(g.get("params", ())) if isinstance(g, dict) else -1 for g in groups]
                != [len(g["params"]) for g in opt.optimizer.param_groups]):
            return (f"its {opt.name} optimiser state is not one of {len(params)} parameters in "
                    f"{len(opt.optimizer.param_groups)} group(s), as this trainer's")
        for index, entry in moments.items():
            fits = isinstance(index, int) and 0 <= index < len(params) and isinstance(entry, dict)
            shapes = [tuple(v.shape) for k, v in entry.items()
                      if k.startswith("exp_avg") and isinstance(v, torch.Tensor)] if fits else []
            if not fits or any(shape != tuple(params[index].shape) for shape in shapes):
                return (f"its {opt.name} optimiser state does not fit this trainer's parameters "
                        f"(entry {index!r:.20}: other shapes)")
    unknown = sorted(set(state["kl_controller"]) - set(vars(trainer.kl_controller)))
    if unknown:
        return (f"its KL controller has fields {unknown[:3]} that this trainer's "
                f"{type(trainer.kl_controller).__name__} lacks")
    return None


class CheckpointSettingsWarning(UserWarning):
    """A loaded checkpoint's learning rates or KL controller differ from trainer.config: the
    checkpoint's stay in force (a resumed run goes on as it was), and trainer.config says so."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def checkpoint_settings(trainer: Any, state: dict[str, Any]) -> dict[str, Any]:
    """{config field: the checkpoint's value} for each setting that `state` (read by
    `load_trainer_state`) puts in force and that differs from trainer.config: the optimisers'
    learning rates (policy_lr, value_lr) and the KL controller's settings (a fixed controller's
    kl_coef; an adaptive one's target_kl and kl_horizon: its kl_coef is only where beta starts)."""
    config, found = trainer.config, {}
    for opt, field in ((trainer.policy_opt, "policy_lr"), (trainer.value_opt, "value_lr")):
        lrs = {g.get("lr") for g in state[f"{opt.name}_optimizer"]["param_groups"]
               if isinstance(g, dict)}
        lr = lrs.pop() if len(lrs) == 1 else None
        if _number(lr) and lr != getattr(config, field):
            found[field] = lr
    kl = state["kl_controller"]
    fields = ({"kl_coef": "value"} if config.target_kl is None
              else {"target_kl": "target", "kl_horizon": "horizon"})
    for field, key in fields.items():
        value = kl.get(key)
        if _number(value) and value != getattr(config, field):
            found[field] = int(value) if field == "kl_horizon" and value == int(value) else value
    return found


def settings_warning(checkpoint: Path, config: Any, changed: dict[str, Any]) -> str:
    """The warning of `load_checkpoint` when `changed` (`checkpoint_settings`) is not empty."""
    said = ", ".join(f"{field} {value!r} (trainer.config had {getattr(config, field)!r})"
                     for field, value in changed.items())
    return (f"checkpoint {checkpoint} was trained with {said}: the trainer goes on with the "
            "checkpoint's values, as a resumed run must, and trainer.config now holds them. To "
            "train on with other values, set them after loading (the optimisers' param_groups "
            "'lr', trainer.kl_controller) and in trainer.config")
