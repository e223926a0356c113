"""harness_optuna: see plugin.py."""
