"""Scripts of the TRL-baseline benchmark; run_trl_ppo.py runs inside the trl==1.10.0 venv."""
