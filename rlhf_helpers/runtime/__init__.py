"""What every stage runs on: profiles (sizes by device), precision, the LoRA spec, model and data
loading, the artefact cache protocol and memory measurement. Imports only the maths core."""
