"""harness_optuna: ``harness tune PACK``, Optuna studies over a pack's ``[tune]`` search space.

Modules: ``plugin`` (the command), ``space`` (the ``[tune]`` section, checked before any
trial), ``study`` (the ask/train/tell loop, resume, parallel workers), ``trial`` (one trial:
in-process ``train`` reporting to Optuna), ``storage`` (storages and pruners), ``report``
(best.toml, the summary table, plots).
"""
