"""``L2M2019-v0``: the NeurIPS 2019 "Learn to Move" challenge, gymnasium-native.

The rules are those of osim-rl 3.0.11 ``L2M2019Env``, re-implemented on
:class:`~harness_osim.sim.OsimSim` (OpenSim 4.6) and :mod:`harness_osim.vtgt` (current SciPy):

* Model ``gait14dof22musc_20170320.osim``: 3-D, 22 muscles (11 per leg). One step is 0.01 s.
* Action: 22 excitations in [0, 1] in the *competition's* order, per leg (right, then left):
  HAB, HAD, HFL, GLU, HAM, RF, VAS, BFSH, GAS, SOL, TA (:data:`ACTION_MUSCLES`). The model's
  muscle ``k`` gets ``action[ACT2MUS[k]]``.
* Reset: the model's default state with the 12-value ``init_pose`` (:data:`INIT_POSE`: standing
  still, pelvis 0.94 m) written into the generalized coordinates and speeds (all other speeds
  0), muscles equilibrated, time 0; then the target field of the difficulty is drawn.
* Difficulty 0-3 is the target field's version (:mod:`harness_osim.vtgt`); time limits
  1000, 1000, 1000 and 2500 steps. Difficulty 2 was round 1, difficulty 3 round 2.
* ``terminated``: the pelvis is below 0.6 m. ``truncated``: ``istep >= time_limit``.
* Footsteps: a foot is in contact while its ground-reaction force ``forces["foot_r"][1]``
  (``foot_l``) is below -5 % of the body weight (75.1646 kg x 9.80665 m/s^2); a new footstep is a
  foot going from no contact to contact (both feet count as one footstep if they land in the
  same step). Both feet count as in contact at reset.
* Reward (:func:`round1_reward` for difficulty 0-2, :func:`round2_reward` for 3), per step:
  0.1 for being alive; the step's effort ``sum(activation^2) dt``, its duration ``dt`` and
  its velocity error ``(v_pelvis - v_tgt(pelvis)) dt`` (horizontal, in the field's x/y plane)
  accumulate into the current footstep (:class:`FootstepAccumulator`); when a footstep is
  rewarded: ``10 del_t - w_v |del_v| - effort`` (``w_v`` 1 in round 1, 3 in round 2) and the
  accumulators restart. Round 1 adds a success bonus at the time limit without a fall
  (see :func:`round1_reward`). Round 2 also rewards the unfinished footstep at a successful end
  (no fall, time limit, more than 5 footsteps) and adds 500 when a target is reached.

Timing, exactly as osim-rl (where its ``step`` computes the reward *before* detecting the
step's footstep and before updating the target field):

* A footstep detected at step ``k`` is rewarded at step ``k + 1``, and the success test of
  round 2 counts the footsteps detected before the current step.
* A target reached at the field update of step ``k`` earns its 500 at step ``k + 1``.
* The reward's ``v_tgt`` is read from the field *before* the step's field update (the same map
  unless a target was reached at that update).
* osim-rl returns 0 when there is no previous state dictionary; its ``step`` always records one
  before integrating, so that never happens in an episode: the first step's reward is computed
  like any other, and so it is here.

Coordinates: the target field's plane has x = OpenSim X (forward) and y = -Z (leftward; OpenSim
Z points right). :meth:`L2M2019Env.target_velocity` and ``info["target_velocity"]`` convert
back to the ground frame: ``(vx, 0, -vy)``.

Observations:

* ``"official"`` (339 values, osim-rl's ``get_observation``): the target field on the 11 x 11
  body-frame grid (242 values: the 121 forward components, then the 121 leftward ones, each
  ``[i, j]`` = ``i - 5`` m forward, ``j - 5`` m left, row-major), then 97 body values (see
  :func:`official_body`).
* ``"relative"`` (421 values): the 339 official values (which are already in the pelvis
  heading frame) followed by 82 features (see :func:`relative_features`).

What this env shares with ``Prosthetics-v0`` (option checking, reset, the action check, the
simulator-failure path, the state accessors) is :class:`~harness_osim.base.CompetitionEnv`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from harness.errors import ConfigError
from harness_osim.base import OBSERVATIONS as OBSERVATIONS
from harness_osim.base import CompetitionEnv, StepResult, is_int
from harness_osim.sim import OsimSim, opensim
from harness_osim.vtgt import TargetField

MODEL_FILE = "gait14dof22musc_20170320.osim"
MASS = 75.16460000000001
"""The model's mass (kg) as osim-rl hard-codes it (the model sums to this up to rounding)."""
G = 9.80665
BODYWEIGHT = MASS * G
LENGTH0 = 1.0
"""Leg length (m) the official observation and velocity reward divide by."""
FALL_HEIGHT = 0.6
CONTACT_FRACTION = 0.05
"""A foot is in contact while its vertical ground force exceeds this fraction of body weight."""
TIME_LIMITS: dict[int, int] = {0: 1000, 1: 1000, 2: 1000, 3: 2500}
"""Difficulty -> the official episode length in steps."""

ALIVE = 0.1
W_FOOTSTEP = 10.0
W_EFFORT = 1.0
W_V_ROUND1 = 1.0
W_V_ROUND2 = 3.0
SUCCESS_BONUS_ROUND1 = 10.0
TARGET_BONUS = 500.0
MIN_FOOTSTEPS_ROUND2 = 5
"""Round 2's successful end needs more than this many footsteps."""

LEG_MUSCLES = (
    ("HAB", "abd"),
    ("HAD", "add"),
    ("HFL", "iliopsoas"),
    ("GLU", "glut_max"),
    ("HAM", "hamstrings"),
    ("RF", "rect_fem"),
    ("VAS", "vasti"),
    ("BFSH", "bifemsh"),
    ("GAS", "gastroc"),
    ("SOL", "soleus"),
    ("TA", "tib_ant"),
)
"""The competition's muscle order per leg: (abbreviation, model muscle name without side)."""
ACTION_MUSCLES = tuple(f"{name}_{side}" for side in "rl" for _, name in LEG_MUSCLES)
"""Model muscle names in action order."""
ACT2MUS = (0, 1, 4, 7, 3, 2, 5, 6, 8, 9, 10, 11, 12, 15, 18, 14, 13, 16, 17, 19, 20, 21)
"""osim-rl's map: the model's muscle ``k`` is excited by ``action[ACT2MUS[k]]``."""

INIT_POSE = (0.0, 0.0, 0.94, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
"""osim-rl's initial pose: forward speed, rightward speed (m/s), pelvis height (m), trunk lean
(rad, + forward), then per leg (right, left): hip adduction*, hip flexion*, knee extension,
ankle flexion* (rad). *osim-rl's labels; the values are written negated into
``hip_adduction``/``hip_flexion``/``ankle_angle`` (see :func:`pose_writer`), so + is hip
abduction, hip extension and ankle plantarflexion, as in the observation."""

RULE_OPTIONS = ("difficulty", "time_limit", "init_pose", "accuracy")
"""The options :meth:`L2M2019Env.configure` may change between episodes."""
N_VTGT = 242
N_BODY = 97
N_OFFICIAL = N_VTGT + N_BODY
N_RELATIVE_EXTRA = 82


# -- reward bookkeeping ---------------------------------------------------------------------
@dataclass
class FootstepAccumulator:
    """What the rules accumulate over the current footstep (osim-rl's
    ``d_reward["footstep"]``): its duration ``del_t`` (s), the integral ``del_v`` of the
    horizontal velocity error ``v_pelvis - v_tgt`` (m, field x/y plane) and the ``effort``
    integral of ``sum(activation^2)``."""

    del_t: float = 0.0
    del_v: np.ndarray = field(default_factory=lambda: np.zeros(2))
    effort: float = 0.0

    def add(self, dt: float, act2: float, v_body: np.ndarray, v_tgt: np.ndarray) -> None:
        self.effort += act2 * dt
        self.del_t += dt
        self.del_v = self.del_v + (v_body - v_tgt) * dt

    def footstep_reward(self, w_v: float) -> tuple[float, float]:
        """Close the footstep: returns ``(10 del_t, the full footstep reward)`` and restarts
        the accumulators."""
        r_step = W_FOOTSTEP * self.del_t
        r_v = -w_v * float(np.linalg.norm(self.del_v)) / LENGTH0
        r_e = -W_EFFORT * self.effort
        self.del_t, self.del_v, self.effort = 0.0, np.zeros(2), 0.0
        return r_step, r_step + r_v + r_e


@dataclass
class RewardBook:
    """The per-episode reward state: the footstep accumulator, the total effort, the footstep
    detector's state and the events of the previous step that the rules reward one step late."""

    footstep: FootstepAccumulator = field(default_factory=FootstepAccumulator)
    effort_total: float = 0.0
    n_footsteps: int = 0
    new_footstep: bool = False
    """A footstep was detected at the end of the previous step (rewarded at this one)."""
    target_reached: bool = False
    """The previous step's field update reached a target (its bonus is paid at this one)."""
    r_contact: bool = True
    l_contact: bool = True

    def detect_footstep(self, foot_r_fy: float, foot_l_fy: float) -> bool:
        """Update the contacts from the feet's vertical ground forces; True on a new step."""
        r = foot_r_fy < -CONTACT_FRACTION * BODYWEIGHT
        l = foot_l_fy < -CONTACT_FRACTION * BODYWEIGHT  # noqa: E741
        self.new_footstep = (not self.r_contact and r) or (not self.l_contact and l)
        if self.new_footstep:
            self.n_footsteps += 1
        self.r_contact, self.l_contact = r, l
        return self.new_footstep


def _accumulate(
    book: RewardBook, dt: float, act2: float, v_body: np.ndarray, v_tgt: np.ndarray
) -> None:
    book.effort_total += act2 * dt
    book.footstep.add(dt, act2, v_body, v_tgt)


def round1_reward(
    book: RewardBook,
    *,
    dt: float,
    act2: float,
    v_body: np.ndarray,
    v_tgt: np.ndarray,
    fell: bool,
    at_limit: bool,
) -> float:
    """osim-rl's ``get_reward_1`` (difficulty 0-2) for one step; updates ``book``.

    ``act2`` is ``sum(activation^2)`` after the step, ``v_body``/``v_tgt`` the pelvis and target
    velocities (field x/y plane), ``fell`` the pelvis below 0.6 m, ``at_limit`` the step count
    at or past the time limit.

    The success bonus (``at_limit`` without a fall) is ``reward_footstep_0 + 10`` in osim-rl,
    where ``reward_footstep_0`` is only assigned when a footstep is rewarded at the same step;
    otherwise the name is unbound and osim-rl crashes (UnboundLocalError). Its commented-out
    line states the intent: pay the unfinished footstep's ``10 del_t``, "do not penalize for the
    simulation terminating in a middle of a step". So: if a footstep was rewarded at this step,
    the bonus re-adds that footstep's ``10 del_t`` (what osim-rl does); otherwise it pays
    ``10 del_t`` of the unfinished footstep (the intent). Either way, + 10.
    """
    reward = ALIVE
    _accumulate(book, dt, act2, v_body, v_tgt)
    r_step: float | None = None
    if book.new_footstep:
        r_step, r_footstep = book.footstep.footstep_reward(W_V_ROUND1)
        reward += r_footstep
    if not fell and at_limit:
        if r_step is None:
            r_step = W_FOOTSTEP * book.footstep.del_t
        reward += r_step + SUCCESS_BONUS_ROUND1
    return reward


def round2_reward(
    book: RewardBook,
    *,
    dt: float,
    act2: float,
    v_body: np.ndarray,
    v_tgt: np.ndarray,
    fell: bool,
    at_limit: bool,
) -> float:
    """osim-rl's ``get_reward_2`` (difficulty 3) for one step; updates ``book``. Arguments as
    :func:`round1_reward`. A successful end (no fall, at the limit, more than 5 footsteps so
    far) closes the unfinished footstep like a new one; a target reached at the previous step's
    field update adds 500."""
    reward = ALIVE
    _accumulate(book, dt, act2, v_body, v_tgt)
    success = not fell and at_limit and book.n_footsteps > MIN_FOOTSTEPS_ROUND2
    if book.new_footstep or success:
        reward += book.footstep.footstep_reward(W_V_ROUND2)[1]
    if book.target_reached:
        reward += TARGET_BONUS
    return reward


def activation_effort(desc: dict[str, Any]) -> float:
    """``sum(activation^2)`` over all muscles (summed in sorted name order, as osim-rl)."""
    muscles = desc["muscles"]
    return float(sum(muscles[m]["activation"] ** 2 for m in sorted(muscles)))


# -- reset pose -----------------------------------------------------------------------------
def pose_writer(init_pose: tuple[float, ...]) -> Callable[[Any, Any], None]:
    """The ``pose(model, state)`` callback of :meth:`OsimSim.reset` writing osim-rl's 12-value
    initial pose into the state (generalized coordinate indices of this model: 0 pelvis_tilt,
    1 list, 2 rotation, 3-5 tx/ty/tz, 6/7 right hip flexion/adduction, 9/10 left, 13/14 knees
    right/left, 15/16 ankles right/left)."""
    p = init_pose

    def write(model: Any, state: Any) -> None:
        q = state.getQ()
        for index, value in (
            (3, 0.0),  # x (forward)
            (5, 0.0),  # z (rightward)
            (1, 0.0),  # roll
            (2, 0.0),  # yaw
            (4, p[2]),  # pelvis height
            (0, -p[3]),  # trunk lean
            (7, -p[4]),  # right hip adduction
            (6, -p[5]),  # right hip flexion
            (13, p[6]),  # right knee
            (15, -p[7]),  # right ankle
            (10, -p[8]),  # left hip adduction
            (9, -p[9]),  # left hip flexion
            (14, p[10]),  # left knee
            (16, -p[11]),  # left ankle
        ):
            q.set(index, float(value))
        state.setQ(q)
        u = opensim().Vector(state.getNU(), 0.0)
        u.set(3, float(p[0]))  # forward speed
        u.set(5, float(p[1]))  # rightward speed
        state.setU(u)

    return write


# -- observations ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MuscleScale:
    """Per leg (right, left), the model names of the 11 muscles in observation order with their
    maximum isometric forces and optimal fibre lengths."""

    names: tuple[tuple[str, ...], tuple[str, ...]]
    max_force: tuple[np.ndarray, np.ndarray]
    opt_length: tuple[np.ndarray, np.ndarray]

    @classmethod
    def of(cls, sim: OsimSim) -> MuscleScale:
        index = {name: k for k, name in enumerate(sim.muscle_names)}
        names = tuple(tuple(f"{m}_{side}" for _, m in LEG_MUSCLES) for side in "rl")
        fmax = tuple(np.array([sim.max_forces[index[n]] for n in leg]) for leg in names)
        lopt = tuple(np.array([sim.optimal_lengths[index[n]] for n in leg]) for leg in names)
        return cls(
            names=(names[0], names[1]), max_force=(fmax[0], fmax[1]), opt_length=(lopt[0], lopt[1])
        )


def official_body(desc: dict[str, Any], scale: MuscleScale) -> np.ndarray:
    """The 97 body values of the official observation (osim-rl's ``get_observation`` after the
    target field), in this order:

    * pelvis (9): height; pitch (+ forward) = ``-pelvis_tilt``; roll = ``pelvis_list``;
      velocity forward, leftward, upward (body heading frame, / LENGTH0); angular velocities
      ``-d pelvis_tilt``, ``d pelvis_list``, ``d pelvis_rotation``.
    * per leg, right then left (44 each): ground reaction force / body weight (3: forward,
      lateral (+ right for the right leg, + left for the left leg), upward), joint angles (4:
      hip abduction ``-hip_adduction``, hip extension ``-hip_flexion``, knee ``knee_angle``,
      ankle extension ``-ankle_angle``), their velocities (4), then per muscle in
      :data:`LEG_MUSCLES` order (33): fibre force / max isometric force, fibre length / optimal
      length, fibre velocity / optimal length.
    """
    gp = desc["joint_pos"]["ground_pelvis"]
    gv = desc["joint_vel"]["ground_pelvis"]
    yaw = gp[2]
    c, s = math.cos(yaw), math.sin(yaw)
    vx, vy, vz = desc["body_vel"]["pelvis"]
    out = np.empty(N_BODY)
    out[0] = desc["body_pos"]["pelvis"][1]
    out[1] = -gp[0]
    out[2] = gp[1]
    out[3] = (c * vx - s * vz) / LENGTH0
    out[4] = -(s * vx + c * vz) / LENGTH0
    out[5] = vy / LENGTH0
    out[6] = -gv[0]
    out[7] = gv[1]
    out[8] = gv[2]
    jp, jv, forces, muscles = desc["joint_pos"], desc["joint_vel"], desc["forces"], desc["muscles"]
    k = 9
    for leg, side in enumerate("rl"):
        f = forces[f"foot_{side}"]
        gx, gy, gz = f[0] / BODYWEIGHT, f[1] / BODYWEIGHT, f[2] / BODYWEIGHT
        lateral = s * -gx + c * -gz  # rightward
        out[k] = c * -gx - s * -gz
        out[k + 1] = lateral if side == "r" else -lateral
        out[k + 2] = -gy
        hip, knee, ankle = f"hip_{side}", f"knee_{side}", f"ankle_{side}"
        for base, src in ((k + 3, jp), (k + 7, jv)):
            out[base] = -src[hip][1]
            out[base + 1] = -src[hip][0]
            out[base + 2] = src[knee][0]
            out[base + 3] = -src[ankle][0]
        states = [muscles[n] for n in scale.names[leg]]
        block = out[k + 11 : k + 44].reshape(11, 3)
        block[:, 0] = [m["fiber_force"] for m in states]
        block[:, 0] /= scale.max_force[leg]
        block[:, 1] = [m["fiber_length"] for m in states]
        block[:, 1] /= scale.opt_length[leg]
        block[:, 2] = [m["fiber_velocity"] for m in states]
        block[:, 2] /= scale.opt_length[leg]
        k += 44
    return out


def heading_frame(vectors: np.ndarray, yaw: float) -> np.ndarray:
    """Ground-frame vectors (..., 3: X forward, Y up, Z right) in the pelvis heading frame
    (..., 3: forward, leftward, up), i.e. rotated by ``-yaw`` about the vertical."""
    c, s = math.cos(yaw), math.sin(yaw)
    x, up, left = vectors[..., 0], vectors[..., 1], -vectors[..., 2]
    return np.stack((c * x + s * left, -s * x + c * left, up), axis=-1)


def relative_features(
    desc: dict[str, Any], bodies: tuple[str, ...], v_tgt_local: np.ndarray
) -> np.ndarray:
    """The 82 values the ``"relative"`` observation adds to the official 339, all in the pelvis
    heading frame (forward, leftward, up; rotated by the pelvis yaw only):

    * 36: positions of the 12 other bodies (:attr:`L2M2019Env.bodies` order) relative to the
      pelvis;
    * 36: their velocities;
    * 6: centre of mass relative to the pelvis, and its velocity;
    * 2: the target velocity at the pelvis (forward, leftward; the centre of the local field);
    * 2: target velocity minus pelvis velocity (forward, leftward).
    """
    yaw = desc["joint_pos"]["ground_pelvis"][2]
    pelvis = np.asarray(desc["body_pos"]["pelvis"])
    pos = np.array([desc["body_pos"][b] for b in bodies]) - pelvis
    vel = np.array([desc["body_vel"][b] for b in bodies])
    misc = desc["misc"]
    com = np.array([np.asarray(misc["mass_center_pos"]) - pelvis, misc["mass_center_vel"]])
    v_pelvis = heading_frame(np.asarray(desc["body_vel"]["pelvis"]), yaw)[:2]
    return np.concatenate(
        (
            heading_frame(pos, yaw).reshape(-1),
            heading_frame(vel, yaw).reshape(-1),
            heading_frame(com, yaw).reshape(-1),
            v_tgt_local,
            v_tgt_local - v_pelvis,
        )
    )


# -- options ----------------------------------------------------------------------------------
def _check_difficulty(value: Any) -> int:
    if not is_int(value) or int(value) not in TIME_LIMITS:
        raise ConfigError(
            f"L2M2019-v0 option difficulty={value!r} is not allowed; allowed values: 0 "
            f"(constant 1.4 m/s), 1 (sinks straight ahead), 2 (round 1: sinks within +-90 deg), "
            f"3 (round 2: sinks in any direction, two targets)."
        )
    return int(value)


def _check_init_pose(value: Any) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        pose = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        pose = ()
    if len(pose) != len(INIT_POSE) or not all(math.isfinite(v) for v in pose):
        raise ConfigError(
            f"L2M2019-v0 option init_pose={value!r} is not allowed; allowed values: None "
            f"(standing, {list(INIT_POSE)}) or 12 finite numbers: forward speed, rightward "
            f"speed, pelvis height, trunk lean, then per leg (right, left) hip adduction, hip "
            f"flexion, knee extension, ankle flexion (osim-rl's INIT_POSE and labels)."
        )
    return pose


# -- the env ----------------------------------------------------------------------------------
class L2M2019Env(CompetitionEnv):
    """NeurIPS 2019 Learn to Move (see the module docstring for the rules).

    Options: ``difficulty`` (0-3), ``time_limit`` (steps; None: the difficulty's),
    ``init_pose`` (12 values as :data:`INIT_POSE`; None: standing), ``accuracy`` (OpenSim
    integrator accuracy) and ``observation`` (``"official"``: 339 values; ``"relative"``: 421).
    :meth:`configure` changes the first four; they take effect at the next :meth:`reset`. The
    observation sizes do not depend on them.

    :meth:`state_desc` is osim-rl's state dictionary plus ``"v_tgt_field"`` (the 2 x 11 x 11
    local field the observation shows). Actions and :meth:`activations` are in the
    competition's order (``[i]`` belongs to ``action[i]``, see :data:`ACTION_MUSCLES`).

    Every step's info holds ``official_reward`` (= the reward), ``target_velocity`` (ground
    frame, what this step's reward compared the pelvis velocity with), ``footsteps`` (the
    footsteps detected so far) and ``target_reached`` (this step's field update reached a
    target; the bonus is paid at the next step). If OpenSim fails during a step, the episode
    ends as truncated with reward 0, the last good observation and ``info["sim_error"]``;
    further steps repeat that until :meth:`reset`.
    """

    env_id = "L2M2019-v0"
    model_file = MODEL_FILE
    rule_options = RULE_OPTIONS

    def __init__(
        self,
        *,
        difficulty: int = 3,
        time_limit: int | None = None,
        init_pose: list[float] | None = None,
        accuracy: float = 5e-5,
        observation: str = "official",
    ) -> None:
        super().__init__(
            observation=observation,
            options={
                "difficulty": difficulty,
                "time_limit": time_limit,
                "init_pose": init_pose,
                "accuracy": accuracy,
            },
        )
        by_action = [ACTION_MUSCLES[ACT2MUS[k]] for k in range(len(ACT2MUS))]
        if by_action != self.sim.muscle_names:
            raise ConfigError(
                f"{self.sim.path} does not have the muscles of Learn to Move 2019 in the "
                f"expected order ({by_action}); got {self.sim.muscle_names}."
            )
        self.scale = MuscleScale.of(self.sim)
        self._apply_options()
        self.field = TargetField(self.difficulty, dt=self.sim.step_size)
        self.sim.reset(self._reset_pose())
        first = self.sim.state_desc()
        self.bodies: tuple[str, ...] = tuple(b for b in first["body_pos"] if b != "pelvis")
        size = N_OFFICIAL if observation == "official" else N_OFFICIAL + N_RELATIVE_EXTRA
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.book = RewardBook()
        self._obs = np.zeros(size, dtype=np.float32)
        self._v_tgt = np.zeros(2)

    # -- options -------------------------------------------------------------------------------
    def _check_rule_option(self, key: str, value: Any) -> Any:
        if key == "difficulty":
            return _check_difficulty(value)
        if key == "time_limit":
            return self._check_time_limit(value, "difficulty", TIME_LIMITS)
        if key == "init_pose":
            return _check_init_pose(value)
        return self._check_positive(key, value)  # accuracy

    def _apply_options(self) -> None:
        opts = self._options
        self.difficulty: int = opts["difficulty"]
        self.time_limit = opts["time_limit"] or TIME_LIMITS[self.difficulty]
        self.init_pose: tuple[float, ...] = opts["init_pose"] or INIT_POSE
        self.sim.accuracy = opts["accuracy"]

    # -- episode ---------------------------------------------------------------------------------
    def _draw_task(self) -> None:
        if self.field.version != self.difficulty:
            self.field = TargetField(self.difficulty, dt=self.sim.step_size)
        self.field.reset(self.np_random)

    def _reset_pose(self) -> Callable[[Any, Any], None]:
        return pose_writer(self.init_pose)

    def _first_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self.book = RewardBook()
        raw = self.sim.state_desc()
        self._v_tgt = self.field.velocity_at(_pelvis_xy(raw))
        desc = self._update_field(raw)
        return desc, {"target_velocity": self.target_velocity(), "footsteps": 0}

    def _advance(self, excitation: np.ndarray) -> StepResult:
        raw = self._simulate(excitation[list(ACT2MUS)])
        # the reward, before this step's footstep detection and field update (see module doc)
        self._v_tgt = self.field.velocity_at(_pelvis_xy(raw))
        fell = bool(raw["body_pos"]["pelvis"][1] < FALL_HEIGHT)
        at_limit = self.sim.istep >= self.time_limit
        rule = round2_reward if self.difficulty == 3 else round1_reward
        reward = float(
            rule(
                self.book,
                dt=self.sim.step_size,
                act2=activation_effort(raw),
                v_body=_pelvis_velocity_xy(raw),
                v_tgt=self._v_tgt,
                fell=fell,
                at_limit=at_limit,
            )
        )
        forces = raw["forces"]
        self.book.detect_footstep(forces["foot_r"][1], forces["foot_l"][1])
        desc = self._update_field(raw)
        obs = self._observe_finite(desc)
        self._prev_desc, self._desc, self._obs = self._desc, desc, obs
        info = {
            "official_reward": reward,
            "target_velocity": self.target_velocity(),
            "footsteps": self.book.n_footsteps,
            "target_reached": self.book.target_reached,
        }
        return obs.copy(), reward, fell, at_limit, info

    # -- accessors for shaping and featurisation ------------------------------------------------
    def target_velocity(self) -> np.ndarray:
        """The target velocity at the pelvis, ground frame ``(vx, 0, vz)`` with ``vz = -vy`` of
        the field: after a step, what its reward compared the pelvis velocity with; after
        reset, the target at the initial pelvis position."""
        return np.array([self._v_tgt[0], 0.0, -self._v_tgt[1]])

    # -- internals --------------------------------------------------------------------------------
    def _action_muscles(self) -> tuple[str, ...]:
        return ACTION_MUSCLES

    def _update_field(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Advance the target field to the pose of ``raw`` and return the state dictionary
        (a shallow copy: the simulator's cache is never modified) with the local field."""
        d = raw["body_pos"]["pelvis"]
        pose = np.array([d[0], -d[2], raw["joint_pos"]["ground_pelvis"][2]])
        local, reached = self.field.update(pose)
        self.book.target_reached = reached
        return {**raw, "v_tgt_field": local}

    def _observe(self, desc: dict[str, Any]) -> np.ndarray:
        local = desc["v_tgt_field"]
        parts = [local.reshape(-1), official_body(desc, self.scale)]
        if self.observation_kind == "relative":
            parts.append(relative_features(desc, self.bodies, local[:, 5, 5]))
        return np.concatenate(parts).astype(np.float32)

    def _failure_info(self) -> dict[str, Any]:
        return {"footsteps": self.book.n_footsteps, "target_reached": False}


def _pelvis_xy(desc: dict[str, Any]) -> np.ndarray:
    """The pelvis position in the field's plane (x forward, y = -Z leftward)."""
    p = desc["body_pos"]["pelvis"]
    return np.array([p[0], -p[2]])


def _pelvis_velocity_xy(desc: dict[str, Any]) -> np.ndarray:
    v = desc["body_vel"]["pelvis"]
    return np.array([v[0], -v[2]])
