"""The maths core: masked statistics, log-probs, GAE, KL estimators and penalties, the PPO / value /
reward-model losses, group advantages, token masks and input checks. Imports torch and nothing else
of the package; `from rlhf_helpers import compute_gae, ...` re-exports its public functions. The
registries of the options' values (`registry`, `kl_estimators`, `advantage_estimators`) import no
torch, so the torch-free config and cluster export read the same names."""
