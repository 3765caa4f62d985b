"""The same PPO run on a cluster: verl and OpenRLHF settings from a profile's PPOConfig (`export`),
and what each knob means there (`knobs`)."""
