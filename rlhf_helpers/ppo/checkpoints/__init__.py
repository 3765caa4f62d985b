"""A run's checkpoints: save and load (`save_load`), their SHA-256 manifests
(`digest`), the folder's step-NNNNNN layout and `latest` (`folder`), the trainer state, the run's
identity, who may write a run folder (`ownership`, the one owner of its lock), and what a save
deletes there (`cleanup`: its run's old checkpoints, killed saves' leftovers).
"""
