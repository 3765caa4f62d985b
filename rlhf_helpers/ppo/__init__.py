"""The shared-LoRA PPO engine: one base model, policy / value / reward adapters, the base as reference.

Import from the submodules (this package imports nothing heavy itself):

    from rlhf_helpers.ppo.config import PPOConfig
    from rlhf_helpers.ppo.shared_model import SharedLoRAModel
    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.ppo.checkpoint import save_checkpoint, load_checkpoint
    from rlhf_helpers.ppo.reward_training import train_reward_model
    from rlhf_helpers.ppo.build import build_shared_model     # SFT base + adapters from a profile

Command line: `python -m rlhf_helpers.ppo.train --profile tiny` (also under `accelerate launch`).
"""
