"""``Prosthetics-v0``: the NeurIPS 2018 "AI for Prosthetics" challenge, gymnasium-native.

The rules are those of osim-rl 2.x ``ProstheticsEnv`` (the class osim-rl 3 no longer ships),
re-implemented on :class:`~harness_osim.sim.OsimSim` and OpenSim 4.6:

* Model ``gait14dof22musc_pros_20180507.osim``: 3-D, 14 degrees of freedom, 19 muscles; the right
  leg is a passive prosthesis (bodies ``pros_tibia_r``/``pros_foot_r``, no ``talus_r``/``toes_r``).
  One step is 0.01 s, integrated with accuracy 5e-5.
* Reset: the model's default pose, muscles equilibrated, time 0.
* Action: 19 excitations in [0, 1] in the model's muscle order (clipped; NaN is rejected).
* ``terminated``: the pelvis is below 0.6 m. ``truncated``: ``istep >= time_limit`` (300 steps in
  round 1, 1000 in round 2).
* Reward, round 1: ``9 - (v_pelvis_x - 3)^2``.
  Round 2: ``10 - (v_x - t_x)^2 - (v_z - t_z)^2 - 0.001 * sum(activation^2)`` with ``v`` the
  pelvis velocity in the ground frame and ``t`` the target velocity of the step.
* Round-2 target velocity: see :func:`generate_targets`.

Which target a step is rewarded against: osim-rl read ``targets[istep]`` after integrating, so
the step that *ends* at step index ``istep`` (``istep`` = 1 for the first step) is rewarded
against ``targets[istep]``; ``targets[0]`` is what the agent sees at reset. This env does the
same: ``info["target_velocity"]`` of a step and :meth:`ProstheticsEnv.target_velocity` after it
are ``targets[istep]``.

Where this module deliberately follows osim-rl's source rather than a cleaner reading of it:

* The official observation (:func:`official_observation`) is osim-rl's *planar projection*
  (x, y and the rotation about z of each body): 160 values in both rounds, without the target
  velocity (round-2 competitors read the target from the state dictionary). Use
  ``observation="relative"`` (or :meth:`ProstheticsEnv.state_desc`) for a policy that must see
  the target.
* The target vector is ``[s cos(h), 0, s sin(h)]`` (osim-rl's ``rect``). Only the reward reads
  it, and the heading changes are symmetric, so the sign convention of z changes nothing for an
  agent that is given the target; it matters only when comparing with recorded 2018 episodes.

What this env shares with ``L2M2019-v0`` (option checking, reset, the action check, the
simulator-failure path, the state accessors) is :class:`~harness_osim.base.CompetitionEnv`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from harness.errors import ConfigError
from harness_osim.base import OBSERVATIONS as OBSERVATIONS
from harness_osim.base import CompetitionEnv, StepResult, is_int

MODEL_FILE = "gait14dof22musc_pros_20180507.osim"
ROUNDS: dict[int, int] = {1: 300, 2: 1000}
"""Round -> the official episode length in steps."""
ROUND1_TARGET = (3.0, 0.0, 0.0)
"""Round 1 rewards the pelvis x velocity against 3 m/s; exposed as a constant target."""
FALL_HEIGHT = 0.6
INITIAL_SPEED = 1.25
N_CHANGES = 10
MAX_SPEED_CHANGE = 0.5
MAX_HEADING_CHANGE = math.pi / 8
ACTIVATION_COST = 0.001
RULE_OPTIONS = ("round", "time_limit", "poisson_lambda", "accuracy")
"""The options :meth:`ProstheticsEnv.configure` may change between episodes."""

OFFICIAL_BODIES = ("pelvis", "head", "torso", "toes_l", "toes_r", "talus_l", "talus_r")
MISSING_BODIES = frozenset({"toes_r", "talus_r"})
"""Bodies of the intact model that the prosthetic model lacks; osim-rl put 9 zeros there."""
OFFICIAL_JOINTS = ("ankle_l", "ankle_r", "back", "hip_l", "hip_r", "knee_l", "knee_r")
"""``back`` is the lumbar PinJoint; the model's second joint named ``back`` (a WeldJoint with no
coordinates) is renamed ``back_0`` by OpenSim 4.6 and is not used."""


# -- target velocity --------------------------------------------------------------------------
@dataclass(frozen=True)
class TargetTrajectory:
    """A round-2 target: per-step ``speed`` (m/s), ``heading`` (rad), the ground-frame
    ``velocity`` (n, 3) and the sorted ``change_steps`` drawn (including ones beyond the
    episode, and duplicates, exactly as drawn)."""

    speed: np.ndarray
    heading: np.ndarray
    velocity: np.ndarray
    change_steps: np.ndarray


def target_velocity_vector(speed: float, heading: float) -> np.ndarray:
    """The ground-frame velocity of a target (speed, heading): ``[s cos h, 0, s sin h]``.

    This is osim-rl 2.x's ``rect`` (its source has ``z = r sin(theta)``), kept so that targets
    and rewards match recorded 2018 episodes; heading changes are symmetric in sign, so either
    convention yields the same distribution of tasks.
    """
    return np.array([speed * math.cos(heading), 0.0, speed * math.sin(heading)])


def generate_targets(
    rng: np.random.Generator, n_steps: int, poisson_lambda: float = 300.0
) -> TargetTrajectory:
    """osim-rl 2.x's round-2 target velocity for step indices ``0 .. n_steps - 1``.

    The speed starts at 1.25 m/s and the heading at 0. Change steps are
    ``cumsum(poisson(poisson_lambda, 10))``; at a change step ``i >= 1`` the speed moves by
    ``choice([-1, 1]) * uniform(-0.5, 0.5)`` and the heading by
    ``choice([-1, 1]) * uniform(-pi/8, pi/8)`` (drawn in that order); otherwise both carry over.
    A step that is drawn twice (a zero Poisson gap) changes once, and step 0 never changes,
    as in osim-rl. ``rng`` is the env's ``np_random``, so the seed fixes the whole trajectory.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    change_steps = np.cumsum(rng.poisson(poisson_lambda, N_CHANGES))
    changes = {int(i) for i in change_steps}
    speed = np.empty(n_steps)
    heading = np.empty(n_steps)
    speed[0], heading[0] = INITIAL_SPEED, 0.0
    for i in range(1, n_steps):
        speed[i], heading[i] = speed[i - 1], heading[i - 1]
        if i in changes:
            speed[i] += rng.choice([-1, 1]) * rng.uniform(-MAX_SPEED_CHANGE, MAX_SPEED_CHANGE)
            heading[i] += rng.choice([-1, 1]) * rng.uniform(-MAX_HEADING_CHANGE, MAX_HEADING_CHANGE)
    velocity = np.stack(
        [speed * np.cos(heading), np.zeros(n_steps), speed * np.sin(heading)], axis=1
    )
    return TargetTrajectory(speed, heading, velocity, change_steps)


# -- rewards ----------------------------------------------------------------------------------
def round1_reward(desc: dict[str, Any]) -> float:
    """``9 - (v_pelvis_x - 3)^2``: the round-1 reward of the step that produced ``desc``."""
    return 9.0 - (float(desc["body_vel"]["pelvis"][0]) - ROUND1_TARGET[0]) ** 2


def round2_reward(desc: dict[str, Any], target: np.ndarray, activations: np.ndarray) -> float:
    """``10 - (v_x - t_x)^2 - (v_z - t_z)^2 - 0.001 * sum(a^2)``: the round-2 reward."""
    vel = desc["body_vel"]["pelvis"]
    penalty = ACTIVATION_COST * float(np.sum(np.square(activations)))
    penalty += (float(vel[0]) - float(target[0])) ** 2
    penalty += (float(vel[2]) - float(target[2])) ** 2
    return 10.0 - penalty


# -- observations -----------------------------------------------------------------------------
def official_observation(desc: dict[str, Any]) -> np.ndarray:
    """osim-rl 2.x ``ProstheticsEnv.get_observation()`` (``project=True``), float64.

    A planar projection; for the prosthetic model it has 160 values, in this order:

    1. Bodies ``pelvis, head, torso, toes_l, toes_r, talus_l, talus_r``. Each body gives 9 values
       ``[x, y, vx, vy, ax, ay, rz, vrz, arz]`` (position, velocity, acceleration in the ground
       frame; body-fixed XYZ rotation angle about z and the z components of angular velocity
       and acceleration). The pelvis gives the last 8 (its x is dropped). Every other body
       gives x, y and rz *relative to the pelvis* (osim-rl subtracted the pelvis' entries 0, 1
       and 6); the rest is absolute. ``toes_r`` and ``talus_r`` do not exist on the prosthetic
       leg and give 9 zeros each. 8 + 4 * 9 + 2 * 9 = 62 values.
    2. Joints ``ankle_l, ankle_r, back, hip_l, hip_r, knee_l, knee_r``: the coordinate values,
       then speeds, then accelerations (hips have 3 coordinates, the rest 1): 33 values.
    3. Muscles sorted by name: activation, fiber length, fiber velocity: 19 * 3 = 57 values.
    4. Centre of mass: x, y relative to the pelvis, velocity (3), acceleration (3): 8 values.

    The target velocity is not part of it (osim-rl appended nothing in round 2 either).
    """
    res: list[float] = []
    pelvis: list[float] = []
    for body in OFFICIAL_BODIES:
        if body in MISSING_BODIES:
            res += [0.0] * 9
            continue
        cur = [
            *desc["body_pos"][body][0:2],
            *desc["body_vel"][body][0:2],
            *desc["body_acc"][body][0:2],
            desc["body_pos_rot"][body][2],
            desc["body_vel_rot"][body][2],
            desc["body_acc_rot"][body][2],
        ]
        if body == "pelvis":
            pelvis = cur
            res += cur[1:]
        else:
            for i in (0, 1, 6):
                cur[i] -= pelvis[i]
            res += cur
    for joint in OFFICIAL_JOINTS:
        res += desc["joint_pos"][joint]
        res += desc["joint_vel"][joint]
        res += desc["joint_acc"][joint]
    muscles = desc["muscles"]
    for name in sorted(muscles):
        m = muscles[name]
        res += [m["activation"], m["fiber_length"], m["fiber_velocity"]]
    misc = desc["misc"]
    res += [misc["mass_center_pos"][i] - pelvis[i] for i in range(2)]
    res += misc["mass_center_vel"]
    res += misc["mass_center_acc"]
    return np.asarray(res, dtype=np.float64)


def _rot_x(t: float) -> np.ndarray:
    c, s = math.cos(t), math.sin(t)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _rot_y(t: float) -> np.ndarray:
    c, s = math.cos(t), math.sin(t)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _rot_z(t: float) -> np.ndarray:
    c, s = math.cos(t), math.sin(t)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def body_rotation(angles: Any) -> np.ndarray:
    """The body-to-ground rotation matrix from the state dictionary's ``body_pos_rot`` angles
    (OpenSim's body-fixed XYZ sequence: ``R = Rx(a) Ry(b) Rz(c)``)."""
    a, b, c = (float(v) for v in angles)
    rotation: np.ndarray = _rot_x(a) @ _rot_y(b) @ _rot_z(c)
    return rotation


def heading_angle(pelvis_rotation: np.ndarray) -> float:
    """The pelvis yaw about the vertical (+y) axis: the angle of its forward (x) axis projected
    on the ground plane. A yaw of ``psi`` points the pelvis along ``(cos psi, 0, -sin psi)``."""
    forward = pelvis_rotation[:, 0]
    return math.atan2(-float(forward[2]), float(forward[0]))


def heading_matrix(psi: float) -> np.ndarray:
    """Ground frame -> heading frame (the ground frame turned by the pelvis yaw ``psi``): the
    pelvis' forward direction becomes +x, up stays +y."""
    return _rot_y(-psi)


@dataclass(frozen=True)
class RelativeLayout:
    """What the relative observation reads, fixed per model: bodies other than the pelvis (model
    order), ``(joint, coordinate index)`` pairs other than the pelvis' free joint, and muscle
    names with their optimal fiber lengths and maximum isometric forces (model order)."""

    bodies: tuple[str, ...]
    coordinates: tuple[tuple[str, int], ...]
    muscles: tuple[str, ...]
    optimal_lengths: np.ndarray
    max_forces: np.ndarray

    @property
    def size(self) -> int:
        return 13 + 6 * len(self.bodies) + 2 * len(self.coordinates) + 4 * len(self.muscles) + 10


def relative_observation(
    desc: dict[str, Any], target: np.ndarray, layout: RelativeLayout
) -> np.ndarray:
    """A featurisation for learning that is invariant to where the model stands and which way
    it faces, float64. All vectors are expressed in the *heading frame* (the ground frame turned
    about the vertical by the pelvis yaw, see :func:`heading_angle`). In this order:

    1. Pelvis (13): height; linear velocity (3); angular velocity (3); its x and y axes (6,
       which encode pitch and roll without angle wrap-around).
    2. Every other body in model order (6 each; 10 bodies -> 60): position minus the pelvis
       position (3), linear velocity (3).
    3. Joint coordinates other than the pelvis' 6 free ones (2 each; 11 -> 22): value, speed.
    4. Muscles in model order (4 each; 19 -> 76): activation, fiber length / optimal fiber
       length, fiber velocity / optimal fiber length (per second), fiber force / maximum
       isometric force.
    5. Centre of mass (6): position minus the pelvis position (3), velocity (3).
    6. Target (4): target velocity (x, z) and target minus pelvis velocity (x, z). Round 1
       uses its constant target (3, 0, 0) so that the size does not depend on the round.

    181 values for this model.
    """
    pelvis_rot = body_rotation(desc["body_pos_rot"]["pelvis"])
    to_heading = heading_matrix(heading_angle(pelvis_rot))
    pelvis_pos = np.asarray(desc["body_pos"]["pelvis"], dtype=np.float64)
    pelvis_vel = to_heading @ np.asarray(desc["body_vel"]["pelvis"], dtype=np.float64)
    parts: list[np.ndarray] = [
        np.array([pelvis_pos[1]]),
        pelvis_vel,
        to_heading @ np.asarray(desc["body_vel_rot"]["pelvis"], dtype=np.float64),
        (to_heading @ pelvis_rot[:, :2]).T.reshape(-1),
    ]
    for body in layout.bodies:
        pos = np.asarray(desc["body_pos"][body], dtype=np.float64) - pelvis_pos
        parts.append(to_heading @ pos)
        parts.append(to_heading @ np.asarray(desc["body_vel"][body], dtype=np.float64))
    parts.append(
        np.array(
            [
                value
                for joint, k in layout.coordinates
                for value in (desc["joint_pos"][joint][k], desc["joint_vel"][joint][k])
            ],
            dtype=np.float64,
        )
    )
    muscles = desc["muscles"]
    m = np.array(
        [
            [
                muscles[name]["activation"],
                muscles[name]["fiber_length"],
                muscles[name]["fiber_velocity"],
                muscles[name]["fiber_force"],
            ]
            for name in layout.muscles
        ],
        dtype=np.float64,
    ).reshape(len(layout.muscles), 4)
    m[:, 1] /= layout.optimal_lengths
    m[:, 2] /= layout.optimal_lengths
    m[:, 3] /= layout.max_forces
    parts.append(m.reshape(-1))
    misc = desc["misc"]
    com = np.asarray(misc["mass_center_pos"], dtype=np.float64) - pelvis_pos
    parts.append(to_heading @ com)
    parts.append(to_heading @ np.asarray(misc["mass_center_vel"], dtype=np.float64))
    target_h = to_heading @ np.asarray(target, dtype=np.float64)
    parts.append(np.array([target_h[0], target_h[2]]))
    parts.append(np.array([target_h[0] - pelvis_vel[0], target_h[2] - pelvis_vel[2]]))
    return np.concatenate(parts)


# -- options ----------------------------------------------------------------------------------
def _check_round(value: Any) -> int:
    if not is_int(value) or value not in ROUNDS:
        raise ConfigError(
            f"Prosthetics-v0 option round={value!r} is not allowed; allowed values: 1 (walk at "
            f"3 m/s, {ROUNDS[1]} steps) or 2 (follow a changing target velocity, "
            f"{ROUNDS[2]} steps)."
        )
    return int(value)


# -- the env ----------------------------------------------------------------------------------
class ProstheticsEnv(CompetitionEnv):
    """NeurIPS 2018 AI for Prosthetics (see the module docstring for the rules).

    Options: ``round`` (1 or 2), ``time_limit`` (steps; None: 300 in round 1, 1000 in round 2),
    ``poisson_lambda`` (mean number of steps between target changes, round 2), ``accuracy``
    (OpenSim integrator accuracy) and ``observation`` (``"official"``: 160 values, see
    :func:`official_observation`; ``"relative"``: 181 values, see :func:`relative_observation`).
    :meth:`configure` changes the first four; they take effect at the next :meth:`reset`.
    Neither observation kind changes size with them.

    :meth:`state_desc` is osim-rl's state dictionary plus ``"target_vel"`` (3 floats, the target
    of this step). Actions and :meth:`activations` are in the model's muscle order.

    If OpenSim fails during a step, the episode ends as truncated with reward 0, the last good
    observation and ``info["sim_error"]``; further steps repeat that until :meth:`reset`.
    """

    env_id = "Prosthetics-v0"
    model_file = MODEL_FILE
    rule_options = RULE_OPTIONS

    def __init__(
        self,
        *,
        round: int = 1,
        time_limit: int | None = None,
        poisson_lambda: float = 300.0,
        accuracy: float = 5e-5,
        observation: str = "official",
    ) -> None:
        super().__init__(
            observation=observation,
            options={
                "round": round,
                "time_limit": time_limit,
                "poisson_lambda": poisson_lambda,
                "accuracy": accuracy,
            },
        )
        self._apply_options()
        self.sim.reset()
        first = self.sim.state_desc()
        self.layout = RelativeLayout(
            bodies=tuple(b for b in first["body_pos"] if b != "pelvis"),
            coordinates=tuple(
                (joint, k)
                for joint, values in first["joint_pos"].items()
                if joint != "ground_pelvis"
                for k in range(len(values))
            ),
            muscles=tuple(self.sim.muscle_names),
            optimal_lengths=np.asarray(self.sim.optimal_lengths, dtype=np.float64),
            max_forces=np.asarray(self.sim.max_forces, dtype=np.float64),
        )
        self._targets = np.tile(np.asarray(ROUND1_TARGET), (self.time_limit + 1, 1))
        self._desc = {**first, "target_vel": list(ROUND1_TARGET)}
        size = self._observe(self._desc).shape[0]
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self._istep = 0
        self._obs = self._observe(self._desc)

    # -- options -------------------------------------------------------------------------------
    def _check_rule_option(self, key: str, value: Any) -> Any:
        if key == "round":
            return _check_round(value)
        if key == "time_limit":
            return self._check_time_limit(value, "round", ROUNDS)
        return self._check_positive(key, value)  # poisson_lambda, accuracy

    def _apply_options(self) -> None:
        opts = self._options
        self.round: int = opts["round"]
        self.time_limit = opts["time_limit"] or ROUNDS[self.round]
        self.poisson_lambda: float = opts["poisson_lambda"]
        self.sim.accuracy = opts["accuracy"]

    # -- episode ---------------------------------------------------------------------------------
    def _draw_task(self) -> None:
        n = self.time_limit + 1
        if self.round == 2:
            self._targets = generate_targets(self.np_random, n, self.poisson_lambda).velocity
        else:
            self._targets = np.tile(np.asarray(ROUND1_TARGET), (n, 1))

    def _first_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self._istep = 0
        return self._describe(self.sim.state_desc()), {"target_velocity": self.target_velocity()}

    def _advance(self, excitation: np.ndarray) -> StepResult:
        desc = self._describe(self._simulate(excitation))
        obs = self._observe_finite(desc)
        activations = self.sim.activations() if self.round == 2 else None
        self._prev_desc, self._desc, self._obs = self._desc, desc, obs
        self._istep = self.sim.istep
        target = self.target_velocity()
        if activations is None:
            reward = round1_reward(desc)
        else:
            reward = round2_reward(desc, target, activations)
        terminated = bool(desc["body_pos"]["pelvis"][1] < FALL_HEIGHT)
        truncated = self._istep >= self.time_limit
        info = {"official_reward": reward, "target_velocity": target}
        return obs.copy(), reward, terminated, truncated, info

    # -- accessors for shaping and featurisation ------------------------------------------------
    def target_velocity(self) -> np.ndarray:
        """The target velocity (ground frame, shape (3,)) of the current step index; the last
        step's reward was computed against it."""
        target: np.ndarray = self._targets[min(self._istep, len(self._targets) - 1)].copy()
        return target

    @property
    def targets(self) -> np.ndarray:
        """The target velocity of every step index of this episode (ground frame), shape
        ``(time_limit + 1, 3)``; row ``i`` rewards the step that ends at step index ``i``."""
        return self._targets.copy()

    # -- internals --------------------------------------------------------------------------------
    def _describe(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The simulator's dictionary ``raw`` (shallow-copied, so the simulator's cache is never
        modified) plus the target velocity of the current step."""
        target = self._targets[min(self.sim.istep, len(self._targets) - 1)]
        return {**raw, "target_vel": [float(v) for v in target]}

    def _observe(self, desc: dict[str, Any]) -> np.ndarray:
        if self.observation_kind == "official":
            obs = official_observation(desc)
        else:
            obs = relative_observation(desc, np.asarray(desc["target_vel"]), self.layout)
        return obs.astype(np.float32)
