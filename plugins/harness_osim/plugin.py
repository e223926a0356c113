"""Registers the OpenSim competition envs (``Prosthetics-v0``, ``L2M2019-v0``), their
curriculum (declared in the env records: harness.curriculum applies it) and their evaluation
protocols (``harness eval RUN --protocol round1 | round2 | official``).

Each env is the competition's own env (``prosthetics.py``, ``l2m.py``: the official rules and
reward) inside :class:`CompetitionWrapper`, which adds what the packs choose in ``[env]``: a
reward shaping, frame skip, the official score reported beside the shaped return (episode
metrics ``score``, ``fell``, ``sim_steps``, ``sim_error``, ``stage``), an ended episode instead
of a crash when the simulator fails, and a per-step deadline after which a hung simulator's
process is killed (a farm actor is then replaced by the farm).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import functools
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym
import numpy as np

from harness import hookimpl
from harness.curriculum import CurriculumSpec
from harness.errors import ConfigError
from harness.registry import EnvSpec, EvalProtocol

log = logging.getLogger(__name__)

DEPENDS_ON = ("harness_gymnasium",)
"""First-party plugins this module imports (docs/plugins.md, "What a plugin may import"): the
lean vector env of harness_gymnasium (``LeanSyncVectorEnv``) steps the competition envs."""

IDS = {"Prosthetics-v0": "prosthetics", "L2M2019-v0": "l2m"}


@dataclass
class OsimConfig:
    """Options shared by the OpenSim competition envs ([env] section)."""

    accuracy: float = 5e-5
    """Integrator accuracy of OpenSim's Manager (the competitions used 5e-5)."""
    observation: str = "relative"
    """'official' (the competition's flat vector) or 'relative' (pelvis-relative features in
    the heading frame with target-velocity features; see the env modules)."""
    time_limit: int | None = None
    """Episode length in simulator steps; unset: the round's (the official protocol)."""
    frame_skip: int = 1
    """Simulator steps per agent step, repeating the action (PARL used 4); rewards are summed."""
    shaping: str = "official"
    """Reward the learner sees: 'official' or a published shaping (harness_osim.shaping)."""
    shaping_coef: dict[str, float] = field(default_factory=dict)
    """Coefficients of the shaping (defaults: the published ones; see harness_osim.shaping)."""
    step_deadline: float = 0.0
    """Seconds one simulator step may take before its process is killed (a hung simulator);
    0 disables. Meant for farm actors, which the farm replaces; a serial run would stop."""
    curriculum: list[dict[str, Any]] = field(default_factory=list)
    """Stages: [env] option changes per stage (stage 0 first), e.g. [{shaping_coef =
    {target_speed = 1.25}}, {shaping_coef = {target_speed = 2.0}}]."""
    curriculum_metric: str = "score"
    """Episode metric (as logged: charts/NAME) that advances the curriculum: 'score' (the
    official score), 'fell', or 'episodic_return'."""
    curriculum_thresholds: list[float] = field(default_factory=list)
    """Advance from stage k when a logged window mean of the metric reaches thresholds[k]."""
    curriculum_stage: int = 0
    """The current stage (set by the curriculum; resumed runs go on from it)."""


@dataclass
class ProstheticsConfig(OsimConfig):
    """Options of Prosthetics-v0 (NeurIPS 2018 AI for Prosthetics) ([env] section)."""

    round: int = 1
    """Competition round: 1 (300 steps, run at 3 m/s) or 2 (1000 steps, follow a changing
    target velocity)."""
    poisson_lambda: float = 300.0
    """Round 2: mean steps between target-velocity changes."""


@dataclass
class L2MConfig(OsimConfig):
    """Options of L2M2019-v0 (NeurIPS 2019 Learn to Move) ([env] section)."""

    difficulty: int = 3
    """0: constant 1.4 m/s; 1: forward sinks; 2: round 1 (sinks within +-90 deg); 3: round 2
    (any direction, two targets)."""
    init_pose: list[float] | None = None
    """Initial pose (12 values as osim-rl's INIT_POSE); unset: standing."""
    round: int | None = None
    """Official round (overrides difficulty): 1 is difficulty 2, 2 is difficulty 3."""


L2M_ROUNDS = {1: 2, 2: 3}
"""Learn to Move round -> difficulty."""


RULE_OPTIONS = {
    "prosthetics": ("round", "poisson_lambda", "time_limit"),
    "l2m": ("difficulty", "init_pose", "time_limit"),  # (and round, as its difficulty)
}


def _build_base(family: str, options: OsimConfig) -> Any:
    kwargs: dict[str, Any] = {
        "accuracy": options.accuracy,
        "observation": options.observation,
        "time_limit": options.time_limit,
    }
    if family == "prosthetics":
        from harness_osim.prosthetics import ProstheticsEnv

        assert isinstance(options, ProstheticsConfig)
        return ProstheticsEnv(round=options.round, poisson_lambda=options.poisson_lambda, **kwargs)
    from harness_osim.l2m import L2M2019Env

    assert isinstance(options, L2MConfig)
    return L2M2019Env(difficulty=_difficulty(options), init_pose=options.init_pose, **kwargs)


def _difficulty(options: L2MConfig) -> int:
    if options.round is None:
        return options.difficulty
    if options.round not in L2M_ROUNDS:
        raise ConfigError(
            f"[env] round = {options.round} is not a Learn to Move round (1 or 2; or set "
            f"[env] difficulty 0-3)."
        )
    return L2M_ROUNDS[options.round]


class CompetitionWrapper(gym.Wrapper[Any, Any, Any, Any]):
    """Shaping, frame skip, episode metrics, simulator-failure handling and the step deadline
    around a competition env (see the module docstring)."""

    def __init__(self, env: Any, family: str, options: OsimConfig) -> None:
        super().__init__(env)
        from harness_osim.shaping import make_shaping

        if options.frame_skip < 1:
            raise ConfigError(f"[env] frame_skip = {options.frame_skip} must be >= 1.")
        if options.step_deadline < 0:
            raise ConfigError(f"[env] step_deadline = {options.step_deadline} must be >= 0.")
        self.family = family
        self.options = options
        self.shaping = make_shaping(family, options.shaping, options.shaping_coef)
        self._pending: dict[str, Any] = {}
        self._new_episode()

    def _new_episode(self) -> None:
        self.score = 0.0
        self.sim_steps = 0

    # -- run-time changes (a curriculum) -------------------------------------------------------
    def configure(self, **changes: Any) -> None:
        """New [env] options, taking effect at the next reset (see ``Run.update_env``)."""
        names = {f.name for f in fields(self.options)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"[env] has no option {', '.join(map(repr, unknown))}.")
        if "accuracy" in changes or "observation" in changes:
            raise ConfigError("[env] accuracy and observation cannot change during a run.")
        self._pending.update(changes)

    def _apply_pending(self) -> None:
        if not self._pending:
            return
        from dataclasses import replace

        from harness_osim.shaping import make_shaping

        changes, self._pending = self._pending, {}
        self.options = replace(self.options, **changes)
        rules = {k: v for k, v in changes.items() if k in RULE_OPTIONS[self.family]}
        if self.family == "l2m" and "round" in changes:
            assert isinstance(self.options, L2MConfig)
            rules["difficulty"] = _difficulty(self.options)
        if rules:
            base: Any = self.env.unwrapped
            base.configure(**rules)
        if "shaping" in changes or "shaping_coef" in changes:
            self.shaping = make_shaping(
                self.family, self.options.shaping, self.options.shaping_coef
            )

    # -- gymnasium API -------------------------------------------------------------------------
    def reset(self, **kwargs: Any) -> Any:
        self._apply_pending()
        obs, info = self.env.reset(**kwargs)
        self._new_episode()
        self.shaping.reset(self.env.unwrapped)
        return obs, info

    def step(self, action: Any) -> Any:
        env = self.env.unwrapped
        a = np.clip(np.asarray(action, dtype=np.float64), 0.0, 1.0)
        shaped = 0.0
        deadline = self.options.step_deadline
        for _ in range(self.options.frame_skip):
            if deadline > 0:  # a C-level watchdog: works while OpenSim holds the GIL
                faulthandler.dump_traceback_later(deadline, exit=True, file=sys.stderr)
            try:
                obs, official, terminated, truncated, info = self.env.step(a)
            finally:
                if deadline > 0:
                    faulthandler.cancel_dump_traceback_later()
            self.sim_steps += 1
            self.score += float(official)
            if "sim_error" in info:
                _log_sim_error(str(info["sim_error"]))
            else:
                shaped += self.shaping(env, float(official), a)
            if terminated or truncated:
                break
        if terminated or truncated:
            info = dict(info)
            info["episode_metrics"] = {
                "score": self.score,
                "fell": float(terminated),
                "sim_steps": float(self.sim_steps),
                "sim_error": float("sim_error" in info),
                "stage": float(self.options.curriculum_stage),
            }
        return obs, shaped, terminated, truncated, info


_last_logged = [0.0, 0]  # time of the last sim-error log line, errors since


def _log_sim_error(reason: str) -> None:
    """An episode ended by a simulator failure: logged with its reason (at most one line per
    10 s per process; the count of the others is in the next line)."""
    now = time.monotonic()
    _last_logged[1] += 1
    if now - _last_logged[0] >= 10.0:
        log.warning(
            "simulator failure ended an episode (%d since the last report): %s",
            _last_logged[1],
            reason,
        )
        _last_logged[0], _last_logged[1] = now, 0


RENDER_MODES = ("rgb_array",)
"""What ``make_env(render_mode=...)`` accepts: frames drawn by :mod:`harness_osim.render`."""
MAX_RENDER_FPS = 50.0
"""Frames are one per agent step; played in real time up to this rate (a 0.01 s step with
frame_skip 1 plays at half speed: 100 fps is past what GIF players honour)."""


def make_one(env_id: str, options: OsimConfig, render_mode: str | None = None) -> Any:
    """One wrapped competition env (what each slot of the vector env holds); with
    ``render_mode="rgb_array"`` its ``render()`` draws the current state and the step that
    ends an episode hands over the drawing of its last state (``info["final_frame"]``)."""
    family = IDS[env_id]
    base = _build_base(family, options)
    base.render_mode = render_mode
    wrapper = CompetitionWrapper(base, family, options)
    if render_mode is None:
        return wrapper
    from harness_gymnasium.render import FinalFrame

    step = base.sim.step_size * options.frame_skip
    wrapper.metadata = {**base.metadata, "render_fps": min(MAX_RENDER_FPS, 1.0 / step)}
    # the frame of the state an episode ended in, before SAME_STEP autoreset replaces it
    return FinalFrame(wrapper)


def _check_render_mode(env_id: str, render_mode: str | None) -> None:
    if render_mode is None:
        return
    if render_mode not in RENDER_MODES:
        raise ConfigError(
            f"{env_id} cannot render with render_mode={render_mode!r}: the OpenSim envs draw "
            f"frames only as {', '.join(map(repr, RENDER_MODES))} (there is no window to show "
            f"them in)."
        )
    from harness_osim.render import require_pillow

    require_pillow()


def make_env(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    vector: str = "sync",
    options: OsimConfig | None = None,
    render_mode: str | None = None,
) -> Any:
    """A vector env of ``num_envs`` competition envs with SAME_STEP autoreset; with
    ``render_mode="rgb_array"``, ``render()`` returns one drawing per env (``(360, 640, 3)``
    uint8, :mod:`harness_osim.render`)."""
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    from harness_gymnasium.vector import LeanSyncVectorEnv

    _check_render_mode(env_id, render_mode)
    if options is None:
        options = ProstheticsConfig() if IDS[env_id] == "prosthetics" else L2MConfig()
    fns = [functools.partial(make_one, env_id, options, render_mode)] * num_envs
    if vector == "sync":
        envs: Any = LeanSyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    elif vector == "async":
        envs = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    else:
        raise ConfigError(f"[run] vector = {vector!r} must be 'sync' or 'async'.")
    if seed is not None:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
    return envs


# -- evaluation protocols (harness eval --protocol) ----------------------------------------
PROTOCOL_EPISODES = 10
"""Episodes a round's protocol evaluates (``--episodes`` overrides): harness's choice, the
count every official-protocol table of docs/competitions.md was measured with."""

ROUND_RULES = {
    "prosthetics": {1: "300 steps at 3 m/s", 2: "1000 steps, a changing target velocity"},
    "l2m": {
        1: "difficulty 2: velocity sinks within +-90 deg",
        2: "difficulty 3: velocity sinks in any direction, two targets",
    },
}
"""What each round of a family evaluates on (the protocol's description)."""


def protocols(family: str, title: str, env_id: str) -> Mapping[str, EvalProtocol]:
    """``EnvSpec.protocols``: ``round1`` and ``round2`` (``env.round = N`` with the round's
    own episode length: ``env.time_limit`` unset) and ``official``, the final round's."""
    found = {
        f"round{n}": EvalProtocol(
            f"round{n}",
            PROTOCOL_EPISODES,
            env_options={"round": n, "time_limit": None},
            description=f"{title}, round {n} ({rules})",
        )
        for n, rules in ROUND_RULES[family].items()
    }
    final = found[f"round{max(ROUND_RULES[family])}"]
    found["official"] = dataclasses.replace(
        final, name="official", description=f"{final.description}; the final round"
    )
    return found


FAMILIES = (
    ("prosthetics", "Prosthetics-v0", ProstheticsConfig, "NeurIPS 2018 AI for Prosthetics"),
    ("l2m", "L2M2019-v0", L2MConfig, "NeurIPS 2019 Learn to Move"),
)


@hookimpl
def harness_register_envs() -> list[EnvSpec]:
    return [
        EnvSpec(
            family,
            make_env=make_env,
            accepts=functools.partial(str.__eq__, env_id),
            config_cls=config_cls,
            known_ids=functools.partial(list, (env_id,)),
            description=f"{title} on OpenSim 4.6 (harness[osim])",
            protocols=functools.partial(protocols, family, title),
            render_modes=RENDER_MODES,
            curriculum=CurriculumSpec(),
        )
        for family, env_id, config_cls, title in FAMILIES
    ]
