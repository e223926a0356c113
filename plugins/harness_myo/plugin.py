"""Registers the ``myo`` env family: MyoSuite's envs (``myoChallengeDieReorientP1-v0``,
``myoChallengeOslRunFixed-v0``, ... every id MyoSuite registers with gymnasium).

MyoSuite 3 envs are gymnasium-native, so a slot of the vector env is ``gymnasium.make(id)``
inside :class:`~harness_myo.episode.MyoEpisodeWrapper`, which turns MyoSuite's per-step info into
the episode metrics harness logs (``solved_fraction``, ``success``, ...; see that module) and
drops the rest of it. The vector env is harness_gymnasium's ``LeanSyncVectorEnv`` (or
gymnasium's ``AsyncVectorEnv``) with SAME_STEP autoreset, like every env plugin's.

What a pack adds in ``[env]``: ``kwargs`` for MyoSuite's constructor (its reward weights,
goal ranges), ``alive_bonus`` (a shaping: MyoSuite's challenge rewards are mostly negative
distances, so ending an episode early would pay), ``progress`` (potential-based shaping: the
change of named reward terms pays), ``closeness`` (a bounded reward a / (d^2 + a) of named
distances), and a curriculum whose stages merge into
``kwargs`` (:mod:`harness.curriculum`; a stage rebuilds each env with the new kwargs at its next
episode), or a per-env adaptive goal range (``adaptive``, :mod:`harness_myo.adaptive`; training
envs only, evaluations run the full range). The episode metrics include the challenge's
official score, MyoSuite's own ``get_metrics`` (:mod:`harness_myo.episode`), and the challenge
tasks declare their evaluation protocols for ``harness eval --protocol``
(:mod:`harness_myo.challenges`).

Headless: nothing here opens a window or touches OpenGL unless ``[env] render_mode =
"rgb_array"`` asks for frames, and only then is ``MUJOCO_GL`` set (to ``egl``: MuJoCo's
offscreen rendering on this machine works through EGL; ``osmesa`` failed).

MyoSuite is installed without its declared dependencies (it declares ``gymnasium<1.3``; its envs
build, step and pass gymnasium's ``check_env`` on the gymnasium 1.4 harness uses): ``pip install
'harness[myo]'`` brings what it really imports, and ``pip install --no-deps myosuite==3.0.0``
brings MyoSuite itself (tools/dev.sh does both).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness import hookimpl
from harness.curriculum import CurriculumSpec
from harness.errors import ConfigError, MissingExtraError, did_you_mean
from harness.hookspecs import LOGGED_WINDOW
from harness.registry import EnvSpec
from harness_myo.adaptive import AdaptiveRange, resume_point
from harness_myo.challenges import protocols

DEPENDS_ON = ("harness_gymnasium",)
"""First-party plugins this module imports (docs/plugins.md, "What a plugin may import"): the
lean vector env of harness_gymnasium (``LeanSyncVectorEnv``) steps MyoSuite's envs."""

ID_PATTERN = re.compile(r"myo[A-Z]\w*-v\d+")
"""What a MyoSuite id looks like (every one of the 222 ids MyoSuite 3.0.0 registers matches);
``accepts`` goes by this so that it imports nothing (importing MyoSuite takes ~0.3 s)."""

NEEDS_DOWNLOAD = {
    "myoChallengeChaseTagFBVs-v0": "fetches a reference gait clip from the Hugging Face hub at "
    "its first step (a gated data set: it needs huggingface_hub, a network and an accepted "
    "licence)",
    "myoFullBodyDirectional-v0": "fetches reference walking clips from the Hugging Face hub when "
    "it is made (a gated data set: it needs huggingface_hub, a network and an accepted licence)",
}
"""Ids refused at start-up, and why. Measured: every id MyoSuite 3.0.0 registers was made,
reset and stepped 3 times offline (HF_HUB_OFFLINE=1, without huggingface_hub); these two were
the only ones that reached for the hub (ChaseTagFBVs at its first step, after a clean make)."""

_VARIANT = re.compile(r"^myo(Sarc|Fati|Reaf)")
"""MyoSuite's sarcopenia / fatigue / re-afferent variants of a task share its download needs."""

INSTALL_MYOSUITE = (
    "MyoSuite itself goes in after the extra, without its declared dependencies: pip install "
    "--no-deps myosuite==3.0.0 (it declares gymnasium<1.3, and runs on the gymnasium harness "
    "uses)."
)
"""The second install step, which no extra can express (a missing-MyoSuite message ends with
it)."""

RENDER_MODES = ("rgb_array",)
"""``[env] render_mode`` values: frames only; 'human' would open a window."""


@dataclass
class MyoConfig:
    """Options of the MyoSuite env family ([env] section)."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to gymnasium.make for the env (its constructor's options, e.g.
    {frame_skip = 5}; see the env's class in myosuite.envs)."""
    max_episode_steps: int | None = None
    """Override the registered time limit (Die Reorient: 150 steps; OslRun: 1000)."""
    success_steps: int = 5
    """An episode is a success (episode metric ``success``) when the env reports it solved on
    more than this many steps: MyoSuite's own rule (myosuite.utils.path_utils.evaluate_success)."""
    metric_keys: list[str] = field(default_factory=list)
    """Entries of MyoSuite's per-step info (e.g. pos_dist, rot_dist, act_reg for Die Reorient)
    reported as episode metrics: their mean over the episode, logged as charts/NAME."""
    render_mode: str | None = None
    """'rgb_array' to make frames (env.render()) offscreen through EGL, setting MUJOCO_GL=egl
    unless it is set; unset: no rendering and nothing touches OpenGL."""
    alive_bonus: float = 0.0
    """Added to the reward on every step (a reward shaping; the official score does not see
    it). MyoSuite's challenge rewards are mostly negative distances, so without it ending an
    episode early (dropping the die, falling) is what a return-maximising policy learns."""
    forward_weight: float = 0.0
    """Track envs (OslRun): added to the reward on every step, times the model's speed down the
    track in m/s (the pelvis's displacement towards the finish over the step's duration), from
    the first step. MyoSuite's own speed term ("sparse") counts only past the start line, 1 m
    ahead of where the model starts, so a policy that has not yet reached it gets no signal
    for moving forward (a shaping, like MuJoCo locomotion's forward_reward_weight; the official
    score does not see it)."""
    progress: dict[str, float] = field(default_factory=dict)
    """Potential-based progress shaping (IARAI-JKU's Die reward): MyoSuite reward terms
    (``rwd_dict`` keys) and weights, e.g. {pos_dist = 100.0, rot_dist = 100.0}, or vectors of its
    observation dict, counted as minus their length (Relocate's ``reach_err``, palm minus
    object: a negative distance like MyoSuite's own), "NAME[i:j]" as minus the length of
    components i to j-1 and "NAME[i]" as component i ("obj_pos[2]": a height); every step adds
    the change of sum(weight x term) since the previous step (0 on an episode's first step).
    MyoSuite's distance terms are negative distances, so moving towards the goal pays and
    moving away costs the same, and an episode's total is its net approach: no standing
    reward to farm, and none for ending early (the official score does not see it)."""
    closeness: dict[str, dict[str, float]] = field(default_factory=dict)
    """Bounded closeness rewards (PKU-MARL's rotation reward for Die Reorient, 2022, has this
    form): MyoSuite reward terms (``rwd_dict`` keys, distances) or observation-dict error
    vectors or parts of them (as in ``progress``) with a ``weight`` and a ``scale`` a, e.g.
    {rot_dist = {weight = 10.0, scale = 0.07}}; every step adds
    weight x a / (d^2 + a), d being the term's absolute value: the full weight at the goal,
    half at d = sqrt(a), falling off beyond, so the last few degrees pay far more than under
    a linear distance (the official score does not see it)."""
    curriculum: list[dict[str, Any]] = field(default_factory=list)
    """Stages (stage 0 first), each a table of [env] options; a stage's kwargs are merged into
    the current kwargs, so a stage can widen the goal ranges and keep the reward weights, e.g.
    [{kwargs = {goal_rot = [-0.785, 0.785]}}, {kwargs = {goal_rot = [-1.57, 1.57]}}]. A change
    rebuilds each env with the new constructor kwargs at its next episode."""
    curriculum_metric: str = "score"
    """Episode metric (as logged: charts/NAME) that advances the curriculum: 'score' (the
    challenge's official score), 'success', 'solved_fraction', 'episodic_return', ..."""
    curriculum_thresholds: list[float] = field(default_factory=list)
    """Advance from stage k when a logged window mean of the metric reaches thresholds[k]."""
    curriculum_stage: int = 0
    """The current stage (set by the curriculum; resumed runs go on from it)."""
    adaptive: dict[str, Any] = field(default_factory=dict)
    """A per-env adaptive goal range (IARAI-JKU's curriculum, :mod:`harness_myo.adaptive`),
    e.g. {key = "goal_rot", start = 0.1}: each env widens the range's half-width by ``growth``
    (1.1) when the mean ``metric`` (solved_fraction) of its last ``window`` (20) episodes
    reaches ``threshold`` (0.85, x ``threshold_decay`` 0.99 at each widening, not below
    ``threshold_min`` 0.3), up to the env's own range. Training only: evaluations run the
    full range. A resumed run's envs go on from the last logged mean range. Die Reorient:
    goal_rot or goal_pos."""

    def __post_init__(self) -> None:
        steps = self.max_episode_steps
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"max_episode_steps = {steps!r}: expected a positive integer")
        if not isinstance(self.success_steps, int) or self.success_steps < 0:
            raise ValueError(f"success_steps = {self.success_steps!r}: expected an integer >= 0")
        if self.adaptive:
            AdaptiveRange.parse(self.adaptive)
        for key, weight in self.progress.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ValueError(
                    f"progress = {{{key} = {weight!r}}}: expected a number, the weight of the "
                    f"reward term {key!r} in the potential"
                )
        for key, table in self.closeness.items():
            _check_closeness(key, table)
        if self.render_mode is not None and self.render_mode not in RENDER_MODES:
            raise ValueError(
                f"render_mode = {self.render_mode!r}: expected one of {', '.join(RENDER_MODES)} "
                f"or unset (harness runs headless: 'human' would open a window)"
            )


def _check_closeness(key: str, table: Any) -> None:
    """One ``closeness`` entry: a table of a number ``weight`` and a positive ``scale``."""
    example = f"closeness = {{{key} = {{weight = 10.0, scale = 0.07}}}}"
    if not isinstance(table, Mapping) or set(table) != {"weight", "scale"}:
        raise ValueError(
            f"closeness = {{{key} = {table!r}}}: expected a table of the weight and the scale "
            f"a of weight x a / (d^2 + a), e.g. {example}"
        )
    for name, value in table.items():
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or (name == "scale" and not value > 0):
            need = "a positive number" if name == "scale" else "a number"
            raise ValueError(f"closeness = {{{key} = {{{name} = {value!r}}}}}: expected {need}")


def accepts(env_id: str) -> bool:
    """A MyoSuite id (by its form; see :data:`ID_PATTERN`): also without MyoSuite installed, so
    that :func:`make_env` names the extra to install."""
    return ID_PATTERN.fullmatch(env_id) is not None


def _download_reason(env_id: str) -> str | None:
    return NEEDS_DOWNLOAD.get(_VARIANT.sub("myo", env_id))


def _registry(needed_for: str) -> Any:
    """gymnasium's registry with MyoSuite's ids in it (importing myosuite registers them); a
    missing MyoSuite, or a missing module it imports, names the extra."""
    try:
        import myosuite  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
    except ModuleNotFoundError as exc:
        # any module missing while MyoSuite imports is part of an incomplete [myo] install
        missing = MissingExtraError("myo", exc.name or "myosuite", needed_for)
        missing.args = (f"{missing} {INSTALL_MYOSUITE}",)
        raise missing from exc
    import gymnasium as gym

    return gym.registry


def known_ids() -> list[str]:
    """MyoSuite's ids (none without MyoSuite), less those refused (:data:`NEEDS_DOWNLOAD`)."""
    try:
        registry = _registry("")
    except MissingExtraError:
        return []
    return [i for i in registry if accepts(i) and _download_reason(i) is None]


def _check_kwargs(env_id: str, kwargs: dict[str, Any], registry: Any) -> None:
    """``[env] kwargs`` must name constructor options of the env: MyoSuite's constructors take
    ``**kwargs`` and ignore what they do not know, so a misspelt option would silently do
    nothing. The known ones are the named parameters of ``__init__`` along the env class's MRO
    and the keys of its registration."""
    if not kwargs:
        return
    import inspect

    from gymnasium.envs.registration import load_env_creator

    spec = registry[env_id]
    creator = spec.entry_point
    if isinstance(creator, str):
        creator = load_env_creator(creator)
    known = set(spec.kwargs)
    for cls in getattr(creator, "__mro__", (creator,)):
        init = cls.__dict__.get("__init__") if isinstance(cls, type) else cls
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self":
                known.add(p.name)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(
            f"[env] kwargs {kwargs} name {', '.join(map(repr, unknown))}, which {env_id} does "
            f"not take (its env would ignore it).{did_you_mean(unknown[0], known)}"
        )


def make_one(env_id: str, options: MyoConfig) -> Any:
    """One MyoSuite env in the episode-metrics wrapper (what each slot of the vector env
    holds; it imports MyoSuite itself, for the worker processes of an async vector env)."""
    import gymnasium as gym

    from harness_myo.episode import MyoEpisodeWrapper

    _registry(f"the MyoSuite env {env_id!r}")

    make_kwargs = dict(options.kwargs)
    if options.max_episode_steps is not None:
        make_kwargs["max_episode_steps"] = options.max_episode_steps
    if options.render_mode is not None:
        make_kwargs["render_mode"] = options.render_mode
    # gymnasium's passive checker only warns, once, that MyoSuite's infos share an object from
    # step to step, which the wrapper's fresh infos make moot; it is one more layer every step
    env = gym.make(env_id, disable_env_checker=True, **make_kwargs)
    return MyoEpisodeWrapper(
        env,
        success_steps=options.success_steps,
        metric_keys=tuple(options.metric_keys),
        alive_bonus=float(options.alive_bonus),
        forward_weight=float(options.forward_weight),
        progress={key: float(w) for key, w in options.progress.items()},
        closeness={
            key: (float(t["weight"]), float(t["scale"])) for key, t in options.closeness.items()
        },
        stage=options.curriculum_stage if options.curriculum else None,
        adaptive=AdaptiveRange.parse(options.adaptive) if options.adaptive else None,
    )


def make_env(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    vector: str = "sync",
    options: MyoConfig | None = None,
    render_mode: str | None = None,
) -> Any:
    """A vector env of ``num_envs`` MyoSuite envs with SAME_STEP autoreset, reset with ``seed``
    when given. Refuses ids that need a download (:data:`NEEDS_DOWNLOAD`) before building
    anything. ``render_mode="rgb_array"`` (``harness eval --video``; the same as ``[env]
    render_mode``) gives frames of MyoSuite's own ``render()``: 640x480, its free camera or
    the task's ``render_camera``, offscreen through EGL; an OpenGL context that cannot be
    made is refused here, naming ``MUJOCO_GL``."""
    options = options or MyoConfig()
    if render_mode is not None:
        if render_mode not in RENDER_MODES:
            raise ConfigError(
                f"render_mode = {render_mode!r}: the myo family renders "
                f"{', '.join(RENDER_MODES)} (frames, headless) only."
            )
        options = dataclasses.replace(options, render_mode=render_mode)
    if vector not in ("sync", "async"):
        raise ConfigError(f"[run] vector = {vector!r} must be 'sync' or 'async'.")
    reason = _download_reason(env_id)
    if reason is not None:
        raise ConfigError(
            f"[run] env = {env_id!r} cannot run here: it {reason}. harness refuses MyoSuite envs "
            f"that download data; choose another id (e.g. myoChallengeChaseTagP1-v0)."
        )
    if options.render_mode is not None:
        # before MuJoCo makes a GL context (at the first render); a user's choice stands
        os.environ.setdefault("MUJOCO_GL", "egl")
    registry = _registry(f"the MyoSuite env {env_id!r}")
    if env_id not in registry:
        raise ConfigError(
            f"[run] env = {env_id!r} is not a MyoSuite env id.{did_you_mean(env_id, known_ids())}"
        )
    _check_kwargs(env_id, options.kwargs, registry)
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    from harness_gymnasium.vector import LeanSyncVectorEnv

    one = _make_framed if render_mode is not None else make_one
    fns = [functools.partial(one, env_id, options)] * num_envs
    try:
        if vector == "sync":
            envs: Any = LeanSyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        else:
            envs = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    except TypeError as exc:  # a constructor option the env does not have
        raise ConfigError(f"[env] kwargs {options.kwargs} do not fit {env_id}: {exc}.") from None
    if render_mode is not None:
        from harness_gymnasium.render import probe_render

        probe_render(envs, env_id, seed)  # (it resets with seed)
    elif seed is not None:
        envs.reset(seed=seed)
    if seed is not None:
        envs.action_space.seed(seed)
    return envs


RENDER_CAMERAS = {"myoChallengeDieReorient": "plam_lookat", "myoChallengeOslRun": "side_view"}
"""The model camera films use, by task (id prefix): MyoSuite's free camera frames the whole
scene, where the hand and die are a few pixels (Die Reorient) and the runner leaves the view.
Chosen by eye among each model's cameras; MyoSuite's free camera for other tasks."""


def _make_framed(env_id: str, options: MyoConfig) -> Any:
    """:func:`make_one` filmed through the task's camera (:data:`RENDER_CAMERAS`), whose
    ending steps carry the frame they ended on (``harness eval --video``;
    :class:`harness_gymnasium.render.FinalFrame`)."""
    from harness_gymnasium.render import FinalFrame

    env = make_one(env_id, options)
    base = env.unwrapped
    camera = next((c for p, c in RENDER_CAMERAS.items() if env_id.startswith(p)), None)
    if camera is not None and hasattr(base, "render_camera"):
        import mujoco  # type: ignore[import-untyped, unused-ignore]

        if mujoco.mj_name2id(base.model, mujoco.mjtObj.mjOBJ_CAMERA, camera) >= 0:
            base.render_camera = camera  # (read by MyoSuite's render() at its first frame)
    return FinalFrame(env)


CURRICULUM = CurriculumSpec(merge=("kwargs",))
"""The family's curriculum (harness.curriculum applies and advances it): a stage's kwargs merge
into the current ones."""


def evaluation_options(options: MyoConfig | None) -> MyoConfig | None:
    """``EnvSpec.evaluation_options``: no adaptive goal range (a training aid); evaluations
    run the env's full range."""
    if options is None or not options.adaptive:
        return options
    return dataclasses.replace(options, adaptive={})


@hookimpl
def harness_iteration_end(run: Any, metrics: Mapping[str, float]) -> None:
    """Record where an adaptive goal range stands, for a resumed run
    (:func:`harness_myo.adaptive.resume_point`); the curriculum is the core's (``CURRICULUM``)."""
    options = run.config.env
    if not isinstance(options, MyoConfig):
        return
    mean_range = metrics.get("charts/adaptive_range")
    if options.adaptive and LOGGED_WINDOW in metrics and mean_range is not None:
        run.remember_env(adaptive=resume_point(options.adaptive, mean_range))


@hookimpl
def harness_register_envs() -> list[EnvSpec]:
    return [
        EnvSpec(
            "myo",
            make_env=make_env,
            accepts=accepts,
            config_cls=MyoConfig,
            known_ids=known_ids,
            protocols=protocols,
            render_modes=RENDER_MODES,
            evaluation_options=evaluation_options,
            curriculum=CURRICULUM,
            description="MyoSuite's musculoskeletal envs on MuJoCo, the NeurIPS MyoChallenge "
            "tasks among them (harness[myo])",
        )
    ]
