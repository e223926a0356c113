"""One OpenSim model stepped like the competitions stepped it: a constant control per muscle
(``PrescribedController``), ``step_size`` seconds per step, integrated by OpenSim's ``Manager``
with the given accuracy, and the state read back as osim-rl's state dictionary.

This replaces osim-rl's ``OsimModel``, which no longer runs on OpenSim 4.6
(``PrescribedController.prescribeControlForActuator`` now takes the actuator's name). Only the
model files of the ``osim-rl`` package are used; none of its code is imported.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import ConfigError

_quiet = False


def opensim() -> Any:
    """The ``opensim`` module, with its per-integration info logging turned off (once)."""
    global _quiet
    try:
        import opensim as osim_module
    except ImportError:
        raise ConfigError(
            "The OpenSim environments need the `opensim` and `osim-rl` packages: "
            "pip install 'harness[osim]'"
        ) from None
    if not _quiet:
        osim_module.Logger.setLevelString("error")
        _quiet = True
    return osim_module


def model_path(file_name: str) -> Path:
    """The path of a model file shipped in the ``osim-rl`` package (``osim/models/``)."""
    spec = importlib.util.find_spec("osim")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"The OpenSim model {file_name} ships in the `osim-rl` package, which is not "
            f"installed: pip install 'harness[osim]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / file_name
    if not path.is_file():
        raise ConfigError(f"OpenSim model file {path} is missing (reinstall osim-rl 3.0.11).")
    return path


class SimulationError(RuntimeError):
    """The simulator failed or produced a non-finite state; the episode cannot go on."""


class OsimSim:
    """An OpenSim model with one constant-function controller per muscle.

    ``reset(pose)`` starts a new episode (``pose(model, state)`` may edit the initial state's
    coordinates before the muscles are equilibrated); ``actuate(a)`` sets the muscle
    excitations for the next step (clipped to [0, 1]); ``integrate()`` advances one step;
    ``state_desc()`` is osim-rl's state dictionary of the current step (computed once per step).
    """

    def __init__(self, model_file: str | Path, *, accuracy: float = 5e-5, step_size: float = 0.01):
        osim = opensim()
        path = Path(model_file)
        if not path.is_absolute():
            path = model_path(str(model_file))
        self.path = path
        self.accuracy = float(accuracy)
        self.step_size = float(step_size)
        self.model = osim.Model(str(path))
        self.model.initSystem()
        self.muscles = self.model.getMuscles()
        self.muscle_names = [self.muscles.get(j).getName() for j in range(self.muscles.getSize())]
        brain = osim.PrescribedController()
        for j, name in enumerate(self.muscle_names):
            brain.addActuator(self.muscles.get(j))
            brain.prescribeControlForActuator(name, osim.Constant(1.0))
        self.model.addController(brain)
        self.state = self.model.initSystem()
        functions = brain.get_ControlFunctions()
        self._controls = [
            osim.Constant.safeDownCast(functions.get(j)) for j in range(functions.getSize())
        ]
        self.bodies = self.model.getBodySet()
        self.joints = self.model.getJointSet()
        self.forces = self.model.getForceSet()
        self.markers = self.model.getMarkerSet()
        self._body_list = [self.bodies.get(i) for i in range(self.bodies.getSize())]
        self._joint_list = [self.joints.get(i) for i in range(self.joints.getSize())]
        self._coords = [
            [j.get_coordinates(k) for k in range(j.numCoordinates())] for j in self._joint_list
        ]
        self._force_list = [self.forces.get(i) for i in range(self.forces.getSize())]
        self._marker_list = [self.markers.get(i) for i in range(self.markers.getSize())]
        self._muscle_list = [self.muscles.get(j) for j in range(self.muscles.getSize())]
        self.max_forces = np.array([m.getMaxIsometricForce() for m in self._muscle_list])
        self.optimal_lengths = np.array([m.getOptimalFiberLength() for m in self._muscle_list])
        self.manager: Any = None
        self.istep = 0
        self.last_action = np.zeros(len(self.muscle_names))
        self._desc: dict[str, Any] | None = None
        self._desc_step = -1

    @property
    def n_muscles(self) -> int:
        return len(self.muscle_names)

    # -- episode ------------------------------------------------------------------------
    def reset(self, pose: Callable[[Any, Any], None] | None = None) -> None:
        osim = opensim()
        # the controllers' values belong to the model, not the state: without this the first
        # steps of an episode would depend on the previous episode's last excitations
        for control in self._controls:
            control.setValue(0.0)
        self.state = self.model.initializeState()
        if pose is not None:
            pose(self.model, self.state)
        self.model.equilibrateMuscles(self.state)
        self.state.setTime(0.0)
        self.istep = 0
        self.manager = osim.Manager(self.model)
        self.manager.setIntegratorAccuracy(self.accuracy)
        self.manager.initialize(self.state)
        self.last_action = np.zeros(self.n_muscles)
        self._desc = None
        self._desc_step = -1

    def actuate(self, action: Any) -> None:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape[0] != self.n_muscles:
            raise ValueError(f"expected {self.n_muscles} muscle excitations, got {a.shape[0]}")
        if not np.all(np.isfinite(a)):
            raise ValueError("non-finite muscle excitation; values in [0, 1] are required")
        a = np.clip(a, 0.0, 1.0)
        self.last_action = a
        for control, value in zip(self._controls, a, strict=True):
            control.setValue(float(value))

    def integrate(self) -> None:
        """One step of ``step_size`` seconds; raises :class:`SimulationError` when OpenSim
        fails or the state stops being finite."""
        self.istep += 1
        try:
            self.state = self.manager.integrate(self.step_size * self.istep)
        except RuntimeError as exc:
            raise SimulationError(
                f"OpenSim integration failed at step {self.istep}: {exc}"
            ) from exc
        q = self.state.getQ()
        u = self.state.getU()
        values = [q.get(i) for i in range(q.size())] + [u.get(i) for i in range(u.size())]
        if not np.all(np.isfinite(values)):
            raise SimulationError(f"non-finite OpenSim state at step {self.istep}")

    # -- reading the state ---------------------------------------------------------------
    def activations(self) -> np.ndarray:
        return np.array([m.getActivation(self.state) for m in self._muscle_list])

    def state_desc(self) -> dict[str, Any]:
        """osim-rl's state dictionary (joint_pos/vel/acc, body_pos/vel/acc and their _rot
        variants, forces, muscles, markers, misc) of the current step."""
        if self._desc is not None and self._desc_step == self.istep:
            return self._desc
        s = self.state
        self.model.realizeAcceleration(s)
        d: dict[str, Any] = {k: {} for k in ("joint_pos", "joint_vel", "joint_acc")}
        for joint, coords in zip(self._joint_list, self._coords, strict=True):
            name = joint.getName()
            d["joint_pos"][name] = [c.getValue(s) for c in coords]
            d["joint_vel"][name] = [c.getSpeedValue(s) for c in coords]
            d["joint_acc"][name] = [c.getAccelerationValue(s) for c in coords]
        for kind in ("pos", "vel", "acc"):
            d[f"body_{kind}"], d[f"body_{kind}_rot"] = {}, {}
        for body in self._body_list:
            name = body.getName()
            transform = body.getTransformInGround(s)
            p = transform.p()
            vel = body.getVelocityInGround(s)
            acc = body.getAccelerationInGround(s)
            rot = transform.R().convertRotationToBodyFixedXYZ()
            v_lin, v_ang, a_lin, a_ang = vel.get(1), vel.get(0), acc.get(1), acc.get(0)
            d["body_pos"][name] = [p[i] for i in range(3)]
            d["body_vel"][name] = [v_lin.get(i) for i in range(3)]
            d["body_acc"][name] = [a_lin.get(i) for i in range(3)]
            d["body_pos_rot"][name] = [rot.get(i) for i in range(3)]
            d["body_vel_rot"][name] = [v_ang.get(i) for i in range(3)]
            d["body_acc_rot"][name] = [a_ang.get(i) for i in range(3)]
        d["forces"] = {}
        for force in self._force_list:
            values = force.getRecordValues(s)
            d["forces"][force.getName()] = [values.get(i) for i in range(values.size())]
        d["muscles"] = {}
        for muscle in self._muscle_list:
            d["muscles"][muscle.getName()] = {
                "activation": muscle.getActivation(s),
                "fiber_length": muscle.getFiberLength(s),
                "fiber_velocity": muscle.getFiberVelocity(s),
                "fiber_force": muscle.getFiberForce(s),
            }
        d["markers"] = {}
        for marker in self._marker_list:
            loc, mv, ma = (
                marker.getLocationInGround(s),
                marker.getVelocityInGround(s),
                marker.getAccelerationInGround(s),
            )
            d["markers"][marker.getName()] = {
                "pos": [loc[i] for i in range(3)],
                "vel": [mv[i] for i in range(3)],
                "acc": [ma[i] for i in range(3)],
            }
        com = self.model.calcMassCenterPosition(s)
        com_v = self.model.calcMassCenterVelocity(s)
        com_a = self.model.calcMassCenterAcceleration(s)
        d["misc"] = {
            "mass_center_pos": [com[i] for i in range(3)],
            "mass_center_vel": [com_v[i] for i in range(3)],
            "mass_center_acc": [com_a[i] for i in range(3)],
        }
        self._desc, self._desc_step = d, self.istep
        return d
