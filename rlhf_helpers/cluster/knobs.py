"""The knob-by-knob map from this course's PPO to verl and OpenRLHF (data; `cluster.export` writes
the values).

    from rlhf_helpers.cluster.knobs import KNOBS, NOT_CARRIED, mapping_table
    KNOBS[0].verl          # ("data.train_batch_size",): the verl key(s) a course knob sets
    print(mapping_table()) # the markdown table of docs/cluster.md

Every note was checked against the source of the pinned releases (`export.VERL_VERSION`,
`OPENRLHF_VERSION`): verl's trainer/config YAMLs, trainer/ppo/core_algos.py,
trainer/ppo/v1/trainer_base.py and workers/; OpenRLHF's cli/train_ppo_ray.py, trainer/ and models/.
tests/cluster/test_cluster_export.py checks every key against verl's composed config and every flag
against OpenRLHF's argparse definitions.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhf_helpers.core.kl_estimators import KL_ESTIMATORS


def _kl_names() -> str:
    """What the course's KL estimators are called in verl (and in OpenRLHF where it differs),
    read from their registry."""
    mapped = [e for e in KL_ESTIMATORS.values() if e.verl]
    text = f"{'/'.join(e.name for e in mapped)} are verl's {'/'.join(str(e.verl) for e in mapped)}"
    renamed = [e for e in KL_ESTIMATORS.values() if e.openrlhf not in (None, e.name)]
    return text + "".join(f", {e.name} is OpenRLHF's {e.openrlhf}" for e in renamed)


@dataclass(frozen=True)
class Knob:
    """One setting of the course and where the same setting lives in verl and in OpenRLHF."""

    course: str  #: PPOConfig field, or "(...)" for a fixed behaviour of the course's engine
    meaning: str  #: what it does in the course
    verl: tuple[str, ...]  #: dotted Hydra keys the export sets ((): none)
    openrlhf: tuple[str, ...]  #: train_ppo_ray flags the export sets or relies on ((): none)
    note: str  #: semantics or units that differ, in one line


_ACTOR = "actor_rollout_ref.actor."
_MODEL = "actor_rollout_ref.model."

KNOBS: tuple[Knob, ...] = (
    Knob("rollout_batch_size", "prompts sampled per PPO iteration, per process",
         ("data.train_batch_size",), ("--rollout.batch_size",),
         "both count prompts over all GPUs: the export sends ours × GPUs"),
    Knob("(1 response per prompt)", "responses sampled per prompt",
         ("actor_rollout_ref.rollout.n",), ("--rollout.n_samples_per_prompt",),
         "GAE needs no group of responses; with n > 1 both multiply " "their batches by n"),
    Knob("mini_batch_size", "sequences per gradient step, per process",
         (_ACTOR + "ppo_mini_batch_size", "critic.ppo_mini_batch_size"), ("--train.batch_size",),
         "verl counts prompts (it multiplies by rollout.n), OpenRLHF sequences; both over all "
         "GPUs: ours × GPUs"),
    Knob("(no micro-batches)", "sequences in one forward/backward pass on one GPU",
         (_ACTOR + "ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu",
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
         ("--train.micro_batch_size", "--rollout.micro_batch_size"),
         "per GPU in both; set to our per-process minibatch (one pass, as here); a smaller one "
         "only accumulates gradients and saves memory"),
    Knob("ppo_epochs", "passes over each experience batch",
         (_ACTOR + "ppo_epochs", "critic.ppo_epochs"), ("--train.max_epochs",), "OpenRLHF's "
         "max_epochs loops over one rollout batch's replay buffer, not over the prompt set"),
    Knob("(reshuffled every epoch)", "minibatch order", (_ACTOR + "shuffle", "critic.shuffle"), (),
         "verl's default is false; OpenRLHF's replay-buffer loader shuffles unless ring attention, "
         "tensor parallelism or dynamic batching is on"),
    Knob("max_prompt_length", "prompt tokens kept, cut from the left",
         ("data.max_prompt_length", "data.truncation"), ("--data.max_len",),
         "verl: truncation=left cuts as we do (its default raises); OpenRLHF has no "
         "prompt limit, only max_len = prompt + response tokens"),
    Knob("max_new_tokens", "response length limit, EOS included", ("data.max_response_length",),
         ("--rollout.max_new_tokens",),
         "verl's rollout.response_length follows data.max_response_length"),
    Knob("temperature", "sampling temperature; training log-probs use logits / T too",
         ("actor_rollout_ref.rollout.temperature",), ("--rollout.temperature",),
         "both divide the training logits by T as well (verl hands it to the actor update, "
         "OpenRLHF's actor reads it)"),
    Knob("(GAE)", "advantage estimator", ("algorithm.adv_estimator",),
         ("--algo.advantage.estimator",),
         "gae in both; it is what makes each of them build a critic"),
    Knob("gamma", "GAE discount", ("algorithm.gamma",), ("--algo.advantage.gamma",),
         "same recursion over response tokens"),
    Knob("lam", "GAE lambda", ("algorithm.lam",), ("--algo.advantage.lambd",),
         "spelled lambd in OpenRLHF; both default to 1.0"),
    Knob("whiten_advantages", "advantages shifted to mean 0 and scaled to std 1 over the batch", (),
         (), "both always do it for GAE (verl: masked_whiten in compute_gae_advantage_return; "
         "OpenRLHF: --algo.advantage.no_std_norm keeps only the shift): False has no equivalent"),
    Knob("(raw scores)", "reward-model scores are not normalised", (),
         ("--reward.normalize_enable",), "left off: it rescales scores by a mean/std stored in the "
                                         "reward model; verl has no such switch"),
    Knob("clip_eps", "PPO ratio clip epsilon",
         (_ACTOR + "clip_ratio", _ACTOR + "clip_ratio_low", _ACTOR + "clip_ratio_high"),
         ("--actor.eps_clip",), "verl's clip_ratio_low/high default to 0.2 and win over "
         "clip_ratio, so all three are set; OpenRLHF copies eps_clip to both sides"),
    Knob("(no dual clip)", "plain clipped surrogate", (_ACTOR + "clip_ratio_c",),
         ("--actor.dual_clip",), "verl always dual-clips negative advantages at c = 3: c = 1e9 "
         "(over its ratio cap e^20) turns it off; OpenRLHF's stays unset"),
    Knob("value_clip", "value clip range around the old values", ("critic.cliprange_value",),
         ("--critic.value_clip",), "same loss 0.5·mean max((V-R)², (V_old + clip(V-V_old, ±ε) - "
         "R)²); None is sent as 1e6 (neither can switch it off; both default to 0.5)"),
    Knob("entropy_coef", "weight of the entropy bonus", (_ACTOR + "entropy_coeff",),
         ("--actor.entropy_coef",), "loss - coef·token-mean entropy in all three; OpenRLHF at 0 "
                                    "computes the entropy for its logs only"),
    Knob("max_grad_norm", "gradient-norm clip of each optimiser step",
         (_ACTOR + "optim.clip_grad", "critic.optim.clip_grad"),
         ("--actor.max_norm",
          "--critic.max_norm"), "verl 0.9's engines read optim.clip_grad; the actor's and critic's "
                                "grad_clip fields are not read"),
    Knob("policy_lr", "learning rate of the policy", (_ACTOR + "optim.lr",), ("--actor.adam.lr",),
         "of LoRA weights here and in both exports (full-model rates are far lower)"),
    Knob("value_lr", "learning rate of the critic", ("critic.optim.lr",), ("--critic.adam.lr",),
         "of the value adapter and head here; with LoRA both freeze the critic's head (peft, no "
         "modules_to_save), so only its LoRA weights learn"),
    Knob("(Adam, constant LR)", "torch Adam, betas (0.9, 0.999), no weight decay, no schedule",
         (_ACTOR + "optim.weight_decay", "critic.optim.weight_decay",
          _ACTOR + "optim.lr_scheduler_type", "critic.optim.lr_scheduler_type"),
         ("--actor.adam.betas", "--critic.adam.betas", "--actor.lr_scheduler",
          "--critic.lr_scheduler", "--actor.lr_warmup_ratio", "--critic.lr_warmup_ratio"),
         "verl's AdamW decays weights by 0.01; OpenRLHF's betas are (0.9, 0.95), cosine decay, 3% "
         "warm-up"),
    Knob("value_warmup_steps", "first iterations that train only the critic",
         ("trainer.critic_warmup",), ("--critic.freezing_steps",),
         "verl updates the actor when critic_warmup <= step (from 1): k + 1; "
         "OpenRLHF when step (from 0) > freezing_steps: k - 1"),
    Knob("(KL in the reward)", "the penalty is part of the per-token reward, not a loss",
         ("algorithm.use_kl_in_reward", _ACTOR + "use_kl_loss"), ("--algo.kl.use_loss",),
         "Ziegler et al.'s PPO-RLHF penalty, not GRPO's KL loss; verl's use_kl_in_reward defaults "
         "to false"),
    Knob("kl_coef", "beta of the per-token KL penalty", ("algorithm.kl_ctrl.kl_coef",),
         ("--algo.kl.init_coef",), "per token in all three: r_t = score·[t = last] - β·kl_t; "
                                   "OpenRLHF builds no reference model at 0"),
    Knob("kl_kind", "per-token KL estimator", ("algorithm.kl_penalty",), ("--algo.kl.estimator",),
         f"{_kl_names()}; OpenRLHF clamps every estimate to ±10, verl clamps k3 to ±10"),
    Knob("target_kl", "target of the adaptive KL controller (None: fixed beta)",
         ("algorithm.kl_ctrl.type", "algorithm.kl_ctrl.target_kl"), ("--algo.kl.target",),
         "ours is a k1 KL per sequence, theirs the estimator's mean per token: the export divides "
         "by the mean response length"),
    Knob("kl_horizon", "horizon of the adaptive controller", ("algorithm.kl_ctrl.horizon",),
         ("--algo.kl.horizon",),
         "in sequences in all three; neither caps the gain n / horizon at 1 as the course does"),
    Knob("score_clip", "clip of reward-model scores (None: off)", (), ("--reward.clip_range",),
         "OpenRLHF clips at ±10 by default: the export sends ±score_clip, or ±1e6 when off; verl "
         "does not clip"),
    Knob("lora.r", "LoRA rank of the policy and value adapters",
         (_MODEL + "lora_rank", "critic.model.lora_rank"),
         ("--ds.lora.rank",), "LoRA on actor and critic in both; OpenRLHF's one flag serves both"),
    Knob("lora.alpha", "LoRA scale numerator (update × alpha / r)",
         (_MODEL + "lora_alpha", "critic.model.lora_alpha"),
         ("--ds.lora.alpha",), "the same alpha / r scale in all three"),
    Knob("(LoRA dropout 0)", "two forwards of one input must agree in the PPO ratio", (),
         ("--ds.lora.dropout",),
         "verl's FSDP engine builds peft's LoraConfig without dropout (peft's default 0)"),
    Knob("lora.target_modules", "modules LoRA wraps",
         (_MODEL + "target_modules", "critic.model.target_modules"),
         ("--ds.lora.target_modules",), "names of the model's modules; both default to all-linear"),
    Knob("total_steps", "PPO iterations", ("trainer.total_training_steps",),
         ("--data.max_samples", "--train.num_episodes"),
         "OpenRLHF has no step count: it runs one episode over "
         "steps × prompts-per-iteration prompts, so the prompt set must hold that many"),
    Knob("seed", "seed of sampling, prompt order and shuffles",
         ("data.seed", "actor_rollout_ref.rollout.seed", _ACTOR + "data_loader_seed",
          "critic.data_loader_seed"),
         ("--train.seed",), "the same number drives other generators: no run is bit-identical "
                            "across the three"),
)

#: PPOConfig fields with no counterpart in either framework (or only bookkeeping), and why.
NOT_CARRIED: dict[str, str] = {
    "vf_coef": "the value loss has its own optimiser here and a separate critic there; neither "
               "framework has "
               "the weight, and under Adam a constant factor on a loss changes almost nothing",
    "ptx_coef": "neither verl's PPO trainer nor OpenRLHF 0.11's train_ppo_ray has an LM loss on "
                "SFT text",
    "missing_eos_penalty": "added to the score of cut-off responses here; OpenRLHF's "
                           "--reward.stop_properly_penalty_coef scales (>= 0) or replaces (< 0) "
                           "their reward, verl has nothing: put it in the reward function",
    "output_dir": "run bookkeeping: verl trainer.default_local_dir, OpenRLHF --ckpt.output_dir",
    "save_every": "run bookkeeping: verl trainer.save_freq, OpenRLHF --ckpt.save_steps",
    "eval_every": "run bookkeeping: verl trainer.test_freq, OpenRLHF --eval.steps (their "
                  "evaluation "
                  "is on a validation set with a reward function, not the course's hidden score)",
    "n_eval_prompts": "the size of the validation set there",
    "eval_batch_size": "the validation batch there (verl data.val_batch_size)",
    "progress_bar": "display only",
}

#: The frameworks the export writes for, by the names `export.not_carried` takes.
FRAMEWORKS = ("verl", "openrlhf")


@dataclass(frozen=True)
class Dropped:
    """A PPOConfig field that a framework has no setting for. At `same` the framework already does
    what the course does; any other value is lost in the export, and `export.not_carried` names it
    with `advice`."""

    same: object  #: the value the framework behaves as (what it does without a setting)
    advice: str  #: why it is lost there, and what to do instead, in a few words
    frameworks: tuple[str, ...] = FRAMEWORKS  #: the frameworks that lack it


#: Every PPOConfig field that verl or OpenRLHF (or both) cannot be given: the export names each one
#: whose value is not `same` ("not carried over"). tests/cluster/test_cluster_export.py changes
#: every field in turn and checks that the export either writes the change or names it here.
DROPPED: dict[str, Dropped] = {
    "whiten_advantages": Dropped(True, "both frameworks always whiten GAE advantages"),
    "ptx_coef": Dropped(0.0, "neither has an LM loss on SFT text in PPO"),
    "missing_eos_penalty": Dropped(None, "add it in the reward function"),
    "vf_coef": Dropped(1.0, "their critics have their own optimiser and no loss weight"),
    "score_clip": Dropped(None, "verl does not clip reward-model scores: clip them in the reward "
                                "function (OpenRLHF's export carries it as --reward.clip_range)",
                          ("verl",)),
}
#: Run bookkeeping (where checkpoints go, how often, evaluations, the progress bar): no setting of
#: the training itself, so the export writes none of them and names none (NOT_CARRIED says where
#: each lives there).
BOOKKEEPING = ("output_dir", "save_every", "eval_every", "n_eval_prompts", "eval_batch_size",
               "progress_bar")

#: Keys and flags the export adds that are not course knobs: where models and data are, and
#: placement.
PLUMBING: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.model.path", "the SFT model (the course's base with no adapter)"),
    ("critic.model.path", "the SFT model too: our value adapter starts from the SFT base"),
    ("reward.reward_model.enable", "score responses with a model, not a rule-based function"),
    ("reward.reward_model.model_path", "the merged reward model (see above)"),
    ("reward.reward_model.rollout.name", "the reward model is served by an inference engine"),
    ("reward.reward_model.rollout.tensor_model_parallel_size",
     "1: a small model, one GPU (default 2)"),
    ("actor_rollout_ref.rollout.name", "vllm (or sglang) generates the rollouts"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size",
     "1: a small model, one GPU (default 2)"),
    ("data.train_files", "parquet or JSON-lines file(s) of prompts as chat messages"),
    ("data.val_files", "the same for validation prompts"),
    ("trainer.n_gpus_per_node", "GPUs on the one node"),
    ("trainer.nnodes", "1 node"),
    ("trainer.logger", "console only (the default adds wandb)"),
    ("--actor.model_name_or_path", "the SFT model; the reference is loaded from it too"),
    ("--critic.model_name_or_path",
     "the SFT model: without it the critic starts from the reward model"),
    ("--reward.model_name_or_path", "the merged reward model (see above)"),
    ("--data.prompt_dataset", "a JSON-lines file or HF dataset of prompts"),
    ("--data.input_key", "prompt: the field name of data/prompts_train.jsonl"),
    ("--actor.num_nodes", "1 node for every role"),
    ("--actor.num_gpus_per_node", "GPUs of each role (all roles share them)"),
    ("--critic.num_nodes", ""), ("--critic.num_gpus_per_node", ""), ("--ref.num_nodes", ""),
    ("--ref.num_gpus_per_node", ""), ("--reward.num_nodes", ""), ("--reward.num_gpus_per_node", ""),
    ("--train.colocate_all", "every model and the vLLM engines on the same GPUs"),
    ("--vllm.num_engines", "one vLLM engine per GPU"),
    ("--vllm.tensor_parallel_size", "1: a small model"),
    ("--vllm.gpu_memory_utilization",
     "0.5: leave room for training on the same GPU (default 0.95)"),
    ("--vllm.enable_sleep", "vLLM frees its memory while the models train"),
    ("--ds.enable_sleep", "DeepSpeed frees its memory while vLLM generates"),
)


def _cell(names: tuple[str, ...]) -> str:
    return "<br>".join(f"`{name}`" for name in names) if names else "—"


def mapping_table() -> str:
    """The markdown table of KNOBS: course name | meaning | verl key | OpenRLHF flag | note."""
    rows = ["| course | meaning | verl key | OpenRLHF flag | note |", "|---|---|---|---|---|"]
    for knob in KNOBS:
        rows.append(f"| `{knob.course}` | {knob.meaning} | {_cell(knob.verl)} | "
                    f"{_cell(knob.openrlhf)} | {knob.note} |")
    return "\n".join(rows)


def not_carried_table() -> str:
    """The markdown table of NOT_CARRIED: course field | why it is not carried over."""
    rows = ["| course | why it is not carried over |", "|---|---|"]
    rows += [f"| `{name}` | {why} |" for name, why in NOT_CARRIED.items()]
    return "\n".join(rows)


def plumbing_table() -> str:
    """The markdown table of PLUMBING: key or flag | what it is for."""
    rows = ["| verl key / OpenRLHF flag | what it is for |", "|---|---|"]
    rows += [f"| `{name}` | {why or 'as above'} |" for name, why in PLUMBING]
    return "\n".join(rows)
