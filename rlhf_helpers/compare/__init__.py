"""Notebook 07's comparison: PPO, TRL's GRPO, RLOO and DPO, and best-of-n in one setting, judged
alike.

    from rlhf_helpers.compare import CompareConfig, run_method
    config = CompareConfig.from_profile(profile)
    run = run_method("grpo", config, profile, reward_dir, eval_prompts)   # a MethodRun
    run.curve   # evaluations over the training budget: hidden score, learned reward, KL, seconds

Every method trains a LoRA policy on the same SFT model for the same training budget: PPO, GRPO and
RLOO from the same prompts against the same learned reward adapter, DPO on the preference pairs that
adapter learned from. All are judged by the same function
(`rlhf_helpers.ppo.evaluation.evaluate_policy`) on the same held-out prompts.

Modules: `config` (CompareConfig), `clock` (training budget, peak memory), `learned_reward` (the
reward adapter as a TRL reward function), `trl_methods` (GRPO and RLOO through TRL), `dpo_method`
(DPO through TRL), `result` (MethodRun, the win rate, the evaluation schedule), `methods` (PPO,
best-of-n and the dispatcher).
"""

from __future__ import annotations

from rlhf_helpers.compare.config import METHODS, CompareConfig
from rlhf_helpers.compare.methods import MethodRun, run_best_of_n, run_method

__all__ = ["METHODS", "CompareConfig", "MethodRun", "run_best_of_n", "run_method"]
