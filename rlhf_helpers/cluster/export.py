"""The same PPO run for a cluster: verl Hydra overrides and an OpenRLHF command line.

    from rlhf_helpers.cluster.export import verl_overrides, verl_yaml, openrlhf_args
    verl_overrides("gpu")              # ["algorithm.adv_estimator=gae", "algorithm.gamma=1.0", ...]
    print(verl_yaml("gpu", n_gpus=4))  # the same as a YAML file (python -m verl.trainer.main_ppo)
    openrlhf_args(config, n_gpus=4)    # ["--rollout.batch_size", "256", ...] for train_ppo_ray
    python -m rlhf_helpers.cluster.export --profile gpu --format openrlhf
    python tools/write_docs.py         # rewrite the examples in docs/cluster.md

The course's batch sizes are per process (`accelerate launch` runs one copy per GPU); verl and
OpenRLHF take global ones, so `n_gpus` multiplies them. Model and data paths are placeholders
(MODEL_PATH, ...) unless `paths` names them (`cluster.run_inputs` reads and checks the run, the
GPUs and the paths). `cluster.knobs` says what each setting means there and what does not carry
over (`not_carried` lists the ones this config sets, per framework: verl has no score clip);
docs/cluster.md is the page.
"""

from __future__ import annotations

# ruff: noqa: E402 - as a command, Ctrl-C is one line from here on: the imports below come after
if __name__ == "__main__":
    from rlhf_helpers.runtime.interrupt import quiet_early_interrupt

    quiet_early_interrupt("python -m rlhf_helpers.cluster.export")

import os
import re
import shlex
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from rlhf_helpers.cluster.knobs import DROPPED, FRAMEWORKS
from rlhf_helpers.cluster.option_names import option_name, unnamed_options
from rlhf_helpers.cluster.run_inputs import (
    MAX_GPUS_PER_NODE,
    as_config,
    check_gpus,
    per_token_target_kl,
    run_paths,
)
from rlhf_helpers.core.advantage_estimators import ADVANTAGE_ESTIMATORS
from rlhf_helpers.runtime.interrupt import one_line_interrupt
from rlhf_helpers.runtime.one_line_parser import OneLineParser
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import PROFILE_ENV, Profile, get_profile

#: The releases this export was written against and tests/cluster/test_cluster_export.py checks
#: (PyPI versions); OpenRLHF >= 0.10.2 has the dotted flags (--actor.eps_clip, --algo.kl.init_coef).
VERL_VERSION = "0.9.1"
OPENRLHF_VERSION = "0.11.2"
#: Sent where the course switches a clip off and the framework cannot: no score or value gets near
#: it.
NO_CLIP = 1.0e6
#: verl's dual-clip constant c that never acts: above e^20, the cap verl puts on the ratio.
DUAL_CLIP_OFF = 1.0e9
#: The advantage estimator the course's engine runs: its entry (`core.advantage_estimators`) has
#: the frameworks' names for it
ENGINE_ADVANTAGE = "gae"
VERL_ENTRY = ("python", "-m", "verl.trainer.main_ppo")
OPENRLHF_ENTRY = ("python", "-m", "openrlhf.cli.train_ppo_ray")


def verl_settings(run: str | Profile | PPOConfig, n_gpus: int = 1,
                  mean_response_tokens: float | None = None,
                  paths: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Dotted verl key -> value (Python types) for the same run on `n_gpus` GPUs of one node."""
    c, n, p = as_config(run), check_gpus(n_gpus), run_paths(paths)
    a, cr, m = "actor_rollout_ref.actor.", "critic.", "actor_rollout_ref.model."
    target = per_token_target_kl(c, mean_response_tokens)
    s: dict[str, Any] = {
        "data.train_batch_size": c.rollout_batch_size * n, "actor_rollout_ref.rollout.n": 1,
        a + "ppo_mini_batch_size": c.mini_batch_size * n,
        cr + "ppo_mini_batch_size": c.mini_batch_size * n,
        a + "ppo_micro_batch_size_per_gpu": c.mini_batch_size,
        cr + "ppo_micro_batch_size_per_gpu": c.mini_batch_size,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": c.mini_batch_size,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": c.mini_batch_size,
        a + "ppo_epochs": c.ppo_epochs, cr + "ppo_epochs": c.ppo_epochs, a + "shuffle": True,
        cr + "shuffle": True, "data.max_prompt_length": c.max_prompt_length,
        "data.truncation": "left", "data.max_response_length": c.max_new_tokens,
        "actor_rollout_ref.rollout.temperature": float(c.temperature),
        "algorithm.adv_estimator": ADVANTAGE_ESTIMATORS[ENGINE_ADVANTAGE].verl,
        "algorithm.gamma": float(c.gamma),
        "algorithm.lam": float(c.lam), a + "clip_ratio": float(c.clip_eps),
        a + "clip_ratio_low": float(c.clip_eps), a + "clip_ratio_high": float(c.clip_eps),
        a + "clip_ratio_c": DUAL_CLIP_OFF,
        cr + "cliprange_value": NO_CLIP if c.value_clip is None else float(c.value_clip),
        a + "entropy_coeff": float(c.entropy_coef), a + "optim.clip_grad": float(c.max_grad_norm),
        cr + "optim.clip_grad": float(c.max_grad_norm),
        a + "optim.lr": float(c.policy_lr), cr + "optim.lr": float(c.value_lr),
        a + "optim.weight_decay": 0.0, cr + "optim.weight_decay": 0.0,
        a + "optim.lr_scheduler_type": "constant", cr + "optim.lr_scheduler_type": "constant",
        "trainer.critic_warmup": c.value_warmup_steps + 1 if c.value_warmup_steps else 0,
        "algorithm.use_kl_in_reward": True, a + "use_kl_loss": False,
        "algorithm.kl_ctrl.kl_coef": float(c.kl_coef),
        "algorithm.kl_penalty": option_name(c, "kl_kind", "verl"),
        "algorithm.kl_ctrl.type": "fixed" if target is None else "adaptive",
    }
    if target is not None:
        s.update({"algorithm.kl_ctrl.target_kl": target, "algorithm.kl_ctrl.horizon": c.kl_horizon})
    for prefix in (m, "critic.model."):
        s.update({prefix + "lora_rank": c.lora.r, prefix + "lora_alpha": c.lora.alpha,
                  prefix + "target_modules": list(c.lora.target_modules)})
    s.update({"trainer.total_training_steps": c.total_steps, "data.seed": c.seed,
              "actor_rollout_ref.rollout.seed": c.seed, a + "data_loader_seed": c.seed,
              cr + "data_loader_seed": c.seed})
    rm = "reward.reward_model."
    s.update({  # plumbing (knobs.PLUMBING)
        m + "path": p["model"], "critic.model.path": p["model"], rm + "enable": True,
        rm + "model_path": p["reward_model"], rm + "rollout.name": "vllm",
        rm + "rollout.tensor_model_parallel_size": 1, "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "data.train_files": p["train_prompts"], "data.val_files": p["val_prompts"],
        "trainer.n_gpus_per_node": n, "trainer.nnodes": 1, "trainer.logger": ["console"],
    })
    return s


def _number(value: float | int) -> str:
    """A number without an exponent ("0.00005", "1000000.0"): floats read as floats by YAML 1.1,
    Hydra's override grammar and argparse (which takes "-1e-05" for an option name)."""
    if isinstance(value, int):
        return str(value)
    text = format(Decimal(repr(float(value))), "f")
    return text if "." in text else text + ".0"


_PLAIN = re.compile(r"^[A-Za-z_/~][A-Za-z0-9_./~-]*$")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return _number(value)
    text = str(value)
    if (_PLAIN.match(text)
        and text.lower() not in {"true", "false", "null", "yes", "no", "on", "off"}):
        return text
    return "'" + text.replace("'", "''") + "'"


def _value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ",".join(_scalar(v) for v in value) + "]"
    return _scalar(value)


def verl_overrides(run: str | Profile | PPOConfig, n_gpus: int = 1,
                   mean_response_tokens: float | None = None,
                   paths: Mapping[str, str] | None = None) -> list[str]:
    """`key=value` Hydra overrides for `python -m verl.trainer.main_ppo` (one argument each)."""
    return [f"{key}={_value(value)}" for key, value in
            verl_settings(run, n_gpus, mean_response_tokens, paths).items()]


def verl_yaml(run: str | Profile | PPOConfig, n_gpus: int = 1,
              mean_response_tokens: float | None = None,
              paths: Mapping[str, str] | None = None) -> str:
    """The same settings as nested YAML (the keys of `verl_settings`, grouped by their dotted
    path)."""
    tree: dict[str, Any] = {}
    for key, value in verl_settings(run, n_gpus, mean_response_tokens, paths).items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    lines: list[str] = []

    def emit(node: dict[str, Any], indent: int) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                lines.append(" " * indent + f"{key}:")
                emit(value, indent + 2)
            else:
                shown = ("[" + ", ".join(_scalar(v) for v in value) + "]" if isinstance(value, list)
                         else _scalar(value))
                lines.append(" " * indent + f"{key}: {shown}")

    emit(tree, 0)
    return "\n".join(lines) + "\n"


def verl_command(run: str | Profile | PPOConfig, n_gpus: int = 1,
                 mean_response_tokens: float | None = None,
                 paths: Mapping[str, str] | None = None) -> str:
    """`verl_overrides` as a shell command, one override a line (quoted where the shell needs
    it)."""
    overrides = verl_overrides(run, n_gpus, mean_response_tokens, paths)
    return " \\\n  ".join([" ".join(VERL_ENTRY), *(shlex.quote(o) for o in overrides)])


def openrlhf_flags(run: str | Profile | PPOConfig, n_gpus: int = 1,
                   mean_response_tokens: float | None = None,
                   paths: Mapping[str, str] | None = None) -> list[tuple[str, tuple[Any, ...]]]:
    """(flag, values) pairs for train_ppo_ray, in the order of knobs.KNOBS; () for a switch."""
    c, n, p = as_config(run), check_gpus(n_gpus), run_paths(paths)
    target = per_token_target_kl(c, mean_response_tokens)
    score_clip = NO_CLIP if c.score_clip is None else float(c.score_clip)
    f: list[tuple[str, tuple[Any, ...]]] = [
        ("--rollout.batch_size", (c.rollout_batch_size * n,)),
        ("--rollout.n_samples_per_prompt", (1,)), ("--train.batch_size", (c.mini_batch_size * n,)),
        ("--train.micro_batch_size", (c.mini_batch_size,)),
        ("--rollout.micro_batch_size", (c.mini_batch_size,)),
        ("--train.max_epochs", (c.ppo_epochs,)),
        ("--data.max_len", (c.max_prompt_length + c.max_new_tokens,)),
        ("--rollout.max_new_tokens", (c.max_new_tokens,)),
        ("--rollout.temperature", (float(c.temperature),)),
        ("--algo.advantage.estimator", (ADVANTAGE_ESTIMATORS[ENGINE_ADVANTAGE].openrlhf,)),
        ("--algo.advantage.gamma", (float(c.gamma),)),
        ("--algo.advantage.lambd", (float(c.lam),)), ("--actor.eps_clip", (float(c.clip_eps),)),
        ("--critic.value_clip", (NO_CLIP if c.value_clip is None else float(c.value_clip),)),
        ("--actor.entropy_coef", (float(c.entropy_coef),)),
        ("--actor.max_norm", (float(c.max_grad_norm),)),
        ("--critic.max_norm", (float(c.max_grad_norm),)),
        ("--actor.adam.lr", (float(c.policy_lr),)), ("--critic.adam.lr", (float(c.value_lr),)),
    ]
    for role in ("actor", "critic"):
        f += [(f"--{role}.adam.betas", (0.9, 0.999)), (f"--{role}.lr_scheduler", ("constant",)),
              (f"--{role}.lr_warmup_ratio", (0.0,))]
    f += [("--critic.freezing_steps", (c.value_warmup_steps - 1,)),
          ("--algo.kl.init_coef", (float(c.kl_coef),)),
          ("--algo.kl.estimator", (option_name(c, "kl_kind", "openrlhf"),))]
    if target is not None:
        f += [("--algo.kl.target", (target,)), ("--algo.kl.horizon", (c.kl_horizon,))]
    f += [("--reward.clip_range", (-score_clip, score_clip)), ("--ds.lora.rank", (c.lora.r,)),
          ("--ds.lora.alpha", (c.lora.alpha,)), ("--ds.lora.dropout", (0.0,)),
          ("--ds.lora.target_modules", tuple(c.lora.target_modules)),
          ("--data.max_samples", (c.total_steps * c.rollout_batch_size * n,)),
          ("--train.num_episodes", (1,)), ("--train.seed", (c.seed,))]
    f += [("--actor.model_name_or_path", (p["model"],)),
          ("--critic.model_name_or_path", (p["model"],)),  # plumbing
          ("--reward.model_name_or_path", (p["reward_model"],)),
          ("--data.prompt_dataset", (p["train_prompts"],)), ("--data.input_key", ("prompt",))]
    for role in ("actor", "critic", "ref", "reward"):
        f += [(f"--{role}.num_nodes", (1,)), (f"--{role}.num_gpus_per_node", (n,))]
    f += [("--train.colocate_all", ()), ("--vllm.num_engines", (n,)),
          ("--vllm.tensor_parallel_size", (1,)), ("--vllm.gpu_memory_utilization", (0.5,)),
          ("--vllm.enable_sleep", ()), ("--ds.enable_sleep", ())]
    return f


def openrlhf_args(run: str | Profile | PPOConfig, n_gpus: int = 1,
                  mean_response_tokens: float | None = None,
                  paths: Mapping[str, str] | None = None) -> list[str]:
    """The argument list of `python -m openrlhf.cli.train_ppo_ray` for the same run on `n_gpus`
    GPUs."""
    out: list[str] = []
    for flag, values in openrlhf_flags(run, n_gpus, mean_response_tokens, paths):
        out += [flag, *(_number(v) if isinstance(v, int | float) else str(v) for v in values)]
    return out


def openrlhf_command(run: str | Profile | PPOConfig, n_gpus: int = 1,
                     mean_response_tokens: float | None = None,
                     paths: Mapping[str, str] | None = None) -> str:
    """`openrlhf_args` as a shell command, one flag a line."""
    lines = [" ".join(OPENRLHF_ENTRY)]
    for flag, values in openrlhf_flags(run, n_gpus, mean_response_tokens, paths):
        shown = [_number(v) if isinstance(v, int | float) else shlex.quote(str(v)) for v in values]
        lines.append("  " + " ".join([flag, *shown]))
    return " \\\n".join(lines)


def not_carried(run: str | Profile | PPOConfig, framework: str | None = None) -> list[str]:
    """The settings of this run that `framework`'s export ("verl" or "openrlhf") cannot carry, one
    line each (`knobs.DROPPED`, and a registered value such as a KL estimator that the framework
    has no name for); None: those that neither can carry. Empty for the course's profiles."""
    if framework is not None and framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS} or None, got {framework!r}")
    c = as_config(run)
    wanted = set(FRAMEWORKS) if framework is None else {framework}
    return [f"{name}={getattr(c, name)}: {dropped.advice}" for name, dropped in DROPPED.items()
            if wanted <= set(dropped.frameworks)
            and getattr(c, name) != dropped.same] + unnamed_options(c, wanted)


def auto_note(name: str | None, resolved: str) -> str | None:
    """The line that says what the profile "auto" (from --profile, else $RLHF_PROFILE) resolved to
    on this machine, or None when no "auto" was asked for. "auto" picks by this machine's GPU, while
    the export is for a cluster: the line keeps a CPU from turning a cluster command into the tiny
    run without a word."""
    source = "--profile" if name is not None else f"${PROFILE_ENV}"
    if (name if name is not None else os.environ.get(PROFILE_ENV, "")).strip().lower() != "auto":
        return None
    if resolved == "tiny":
        return (f"note: {source} auto resolved to tiny: this machine has no CUDA GPU, so this is "
                "the tiny profile's run (the shipped tiny model's settings); pass --profile gpu "
                "for the gpu profile's")
    return f"note: {source} auto resolved to gpu: this machine has a CUDA GPU"


@one_line_interrupt("python -m rlhf_helpers.cluster.export", "nothing was written")
def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m rlhf_helpers.cluster.export",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, choices=("tiny", "gpu", "auto"),
                        help="default: $RLHF_PROFILE or tiny")
    parser.add_argument("--gpus", type=int, default=1,
                        help=f"GPUs of the one node, 1 to {MAX_GPUS_PER_NODE} "
                             "(batches are scaled by it)")
    parser.add_argument("--format", choices=("verl", "verl-yaml", "openrlhf"), default="verl")
    args = parser.parse_args(argv)
    writers = {"verl": verl_command, "verl-yaml": verl_yaml, "openrlhf": openrlhf_command}
    try:  # a bad setting ($RLHF_PROFILE_OVERRIDES, --gpus) is one line and exit 2
        if not 1 <= args.gpus <= MAX_GPUS_PER_NODE:
            raise ValueError(f"--gpus must be an int in [1, {MAX_GPUS_PER_NODE}] (the GPUs of one "
                             f"node), got {args.gpus}")
        run = get_profile(args.profile)
        text = writers[args.format](run, args.gpus)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    note = auto_note(args.profile, run.name)
    if note is not None:
        print(note, file=sys.stderr)
    for line in not_carried(run, "openrlhf" if args.format == "openrlhf" else "verl"):
        print(f"not carried over: {line}", file=sys.stderr)
    print(text, end="" if args.format == "verl-yaml" else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
