"""rlhf_helpers: the tested reference code behind the RLHF-with-PPO course."""

__version__ = "0.1.0"
