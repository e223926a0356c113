"""The runtime: training, evaluation and the runs they make, in one process or with an actor
farm over a transport. What a plugin may use of it is exported here (``__all__``); the modules
behind it are split by job:

- ``state``: :class:`Run` (what lifecycle hooks get), :class:`RunResult`, :class:`EvalResult`;
- ``build``: config resolution, checks, envs, agents, trackers, checkpoint loading;
- ``stepper``: env stepping and episode statistics (:class:`EnvStepper`);
- ``collectors``: where experience comes from (:class:`Collector`; serial, offline);
- ``farm``: the actor farm (``FarmCollector``, remote actors);
- ``inference``: central acting for the farm (``run.inference``): a policy server batching
  the actors' observations, exchanged through shared memory;
- ``run``: the train loop (and its choice of collector), evaluation, checkpoints.
"""

from harness.runtime.build import build_run, load_agent, make_agent, make_envs
from harness.runtime.collectors import Collector
from harness.runtime.farm import preload_modules
from harness.runtime.run import evaluate, train
from harness.runtime.spaces import env_info, space_info
from harness.runtime.state import EvalResult, Run, RunResult
from harness.runtime.stepper import EnvStepper, Episode

__all__ = [
    "Collector",
    "EnvStepper",
    "Episode",
    "EvalResult",
    "Run",
    "RunResult",
    "build_run",
    "env_info",
    "evaluate",
    "load_agent",
    "make_agent",
    "make_envs",
    "preload_modules",
    "space_info",
    "train",
]
