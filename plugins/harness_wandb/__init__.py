"""harness_wandb: see plugin.py."""
