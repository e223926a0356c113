"""Offline RL data for harness: Minari datasets on local disk (``harness collect`` records one
from a trained run; the offline algorithms of harness_algos read them)."""
