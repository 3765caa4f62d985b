"""A run's checkpoints: save and load (`save_load`), their SHA-256 manifests
(`digest`), the folder's step-NNNNNN layout and `latest` (`folder`), the trainer state, the run's
identity, and who may write a run folder (`ownership`, the one owner of its lock).
"""
