"""What every stage runs on: profiles (sizes by device) and the PPO config they hold, precision, the
LoRA spec, model and data loading, the artefact cache protocol and memory measurement. Imports only
the maths core."""
