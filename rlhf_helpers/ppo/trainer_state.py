"""What trainer_state.pt of a checkpoint holds: the trainer's optimisers, KL controller, step,
metrics history and RNG states (the weights are saved apart, `checkpoint.save_model_weights`).

    path = folder / TRAINER_STATE_FILE
    torch.save(trainer_state_dict(trainer), path)
    restore_trainer_state(trainer, load_trainer_state(path))   # read with the safe unpickler
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

TRAINER_STATE_FILE = "trainer_state.pt"


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
                       if "WeightsUnpickler error:" in line), str(error).splitlines()[0])
        reason = reason.split(". ")[0]
        raise ValueError(f"{path} was refused by the safe loader (weights_only=True): {reason}. A "
                         "checkpoint of this course holds only tensors, numbers, strings, lists "
                         "and dicts; this file holds something else, which could run code when "
                         "loaded, so it is not loaded") from None
    missing = [key for key in TRAINER_STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ValueError(f"{path} is not a PPO trainer state: it lacks {missing}")
    return state


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
