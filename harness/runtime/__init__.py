"""Runners: the serial runner (one process, for training, tests and debugging). The
actor/learner runner over a transport reuses the same agent and env components."""

from harness.runtime.run import Run, RunResult, build_run, evaluate, train

__all__ = ["Run", "RunResult", "build_run", "evaluate", "train"]
