"""The shared-LoRA PPO engine: one base model, policy / value / reward adapters, base as reference.

Import from the submodules (this package imports nothing itself):

    from rlhf_helpers.runtime.ppo_config import PPOConfig
    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.ppo.checkpoints.save_load import save_checkpoint, load_checkpoint
    from rlhf_helpers.ppo.model.build import build_shared_model  # SFT base + adapters, a profile's

The engine knows neither the review world nor the pipeline's stages: the caller passes the reward
adapter's folder (`rlhf_helpers.stages.reward`) and, if it has one, a hidden scorer.
Command line: `python -m rlhf_helpers.stages.train_ppo --profile tiny` (also under
`accelerate launch`).
"""
