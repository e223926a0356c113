"""The target-velocity field of NeurIPS 2019 "Learn to Move" (osim-rl's ``envs/target``), on
current SciPy.

The rules, restated from osim-rl 3.0.11 (``envs/target/v_tgt_field.py``):

* The field lives in the horizontal plane of the ground frame with axes ``x`` (OpenSim X,
  forward) and ``y`` (leftward, i.e. **minus** OpenSim Z); a pose is ``(x, y, yaw)`` with
  ``yaw`` the ``pelvis_rotation`` coordinate (a positive yaw turns the heading from +x towards
  +y).
* It is tabulated on a 40 m x 40 m map, 2 points per metre (81 x 81 points), centred on the
  agent when the map is made, and read by bilinear interpolation.
* Version 0 (difficulty 0): a constant 1.4 m/s forward (+x) everywhere.
* Versions 1-3: a *sink*. A sink is placed ``r ~ U(5, 7)`` m from the agent at the angle
  ``th`` drawn from ``U(0, 0)`` (v1), ``U(-pi/2, pi/2)`` (v2) or ``U(-pi, pi)`` (v3). Every map
  point's vector points at the sink, with a magnitude that depends on its distance ``d`` to the
  sink (:func:`sink_amplitude`; ``d_sink`` is the agent-to-sink distance when it was made and
  ``v_phase0 ~ U(-pi, pi)``). Staying within ``r_target = 0.3`` m of the sink for longer than
  ``t0_target ~ U(2, 4)`` s "reaches" it: a new sink is drawn ``U(5, 7)`` m further along the
  path (the path angle accumulates the drawn angles), and the map is re-centred on the agent.
  Versions 1 and 2 make new targets forever; version 3 makes one new target, so two targets can
  be reached (``n_new_target = 2``).
* The observation is the field on an 11 x 11 grid, 1 m apart from -5 to 5 m in the agent's
  body frame (forward, leftward), the vectors rotated into the body frame as well.

Differences from the original, all deliberate:

* ``scipy.interpolate.interp2d`` (removed from SciPy) is replaced by one
  :class:`~scipy.interpolate.RegularGridInterpolator` (``method="linear"``) holding both
  components, queried once for all 121 points of the local grid (the original looped in Python,
  242 interpolator calls a step). interp2d(x, y, z) wants ``z[j, i]`` at ``(x[i], y[j])``, which
  is why the original passed transposes; here the values array is indexed ``[i_x, i_y]``
  directly, the same bilinear function.
* Out-of-map points: interp2d's default (``fill_value=None``) evaluated the degree-1 FITPACK
  spline, whose evaluation (``fpbisp``) clamps each coordinate into the knot range, so a point
  off the map got the value of the nearest point on the map's edge. We clamp the query
  coordinates to the map before interpolating, which reproduces that. (RegularGridInterpolator's
  own ``fill_value=None`` would extrapolate linearly instead; ``bounds_error=False`` is kept only
  as a guard, no query reaches it.)
* The map's grid is built from integer counts (81 points); the original's float ``mgrid`` could
  make 82 when re-centred at a non-round position (one extra grid line 20.5 m away).
* A grid point exactly on the sink gets the zero vector (the original divided 0 by 0: NaN).
* All randomness comes from the ``numpy.random.Generator`` given to :meth:`TargetField.reset`,
  never from NumPy's global state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.interpolate import RegularGridInterpolator

LOCAL_GRID = 11
"""Points per side of the local observation grid (11 x 11 = 121 points, 242 values)."""

D_DEC = 1.0
"""Within this distance (m) of the sink the target speed decreases linearly to zero."""


@dataclass(frozen=True)
class FieldVersion:
    """The parameters of one field version (= the L2M difficulty)."""

    map_half_width: float = 20.0
    """The map spans +-this many metres around the agent in x and y."""
    map_res: int = 2
    """Map points per metre."""
    get_half_width: int = 5
    """The local grid spans +-this many metres (1 m apart)."""
    constant: tuple[float, float] | None = None
    """Version 0's constant target velocity (x, y); None for sink versions."""
    v_amp_rng: tuple[float, float] = (0.8, 1.8)
    """Range of the target speed (m/s) around a sink."""
    sink_r: tuple[float, float] = (5.0, 7.0)
    """Range of the distance (m) from the agent (or the previous sink) to a new sink."""
    sink_th: tuple[float, float] = (0.0, 0.0)
    """Range of the angle (rad) of a new sink, relative to the path so far."""
    r_target: float = 0.3
    """Radius (m) within which the agent is at the sink."""
    n_new_target: float = math.inf
    """How many targets can be reached (version 3: 2; versions 1-2: unlimited)."""


VERSIONS: dict[int, FieldVersion] = {
    0: FieldVersion(constant=(1.4, 0.0), n_new_target=1),
    1: FieldVersion(sink_th=(0.0, 0.0)),
    2: FieldVersion(sink_th=(-math.pi / 2, math.pi / 2)),
    3: FieldVersion(sink_th=(-math.pi, math.pi), n_new_target=2),
}


def sink_amplitude(
    d: np.ndarray, d_sink: float, v_amp_rng: tuple[float, float], v_phase0: float
) -> np.ndarray:
    """The target speed at distance ``d`` from a sink (osim-rl's ``_set_sink_vtgt_amp``).

    Far away (``d > d_sink + 1``) it is the top speed; between 1 m and ``d_sink + 1`` it
    oscillates sinusoidally with the distance (phase ``v_phase0 + 2 pi d / d_sink``) within
    ``v_amp_rng``; within 1 m it falls linearly to zero at the sink, from the value the sinusoid
    has at 1 m.
    """
    lo, hi = v_amp_rng
    half, mean = 0.5 * (hi - lo), 0.5 * (lo + hi)
    wave = half * np.sin(v_phase0 + d / d_sink * 2 * np.pi) + mean
    at_dec = half * np.sin(v_phase0 + D_DEC / d_sink * 2 * np.pi) + mean
    return np.where(d > d_sink + D_DEC, hi, np.where(d > D_DEC, wave, d * at_dec))


def rotate(
    x: np.ndarray | float, y: np.ndarray | float, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Rotate the vectors ``(x, y)`` by ``theta`` (counter-clockwise)."""
    c, s = math.cos(theta), math.sin(theta)
    return np.asarray(c * x - s * y), np.asarray(s * x + c * y)


class TargetField:
    """The L2M 2019 target-velocity field of one version, driven by the agent's pose.

    ``reset(rng)`` draws the first target (all draws from ``rng``); ``update(pose)`` advances the
    target logic by one step of ``dt`` seconds and returns the local 2 x 11 x 11 field and whether
    a target was reached at this update; :meth:`velocity_at` is the target velocity at points of
    the ground plane (what the reward compares the pelvis velocity with).
    """

    def __init__(self, version: int, *, dt: float = 0.01):
        if version not in VERSIONS:
            raise ValueError(
                f"target-field version must be one of {sorted(VERSIONS)}, got {version}"
            )
        self.version = version
        self.params = VERSIONS[version]
        self.dt = float(dt)
        n = self.params.get_half_width
        offsets = np.arange(-n, n + 1, dtype=np.float64)
        # local grid offsets [i, j] = (forward i - 5, leftward j - 5), flattened i-major
        gx, gy = np.meshgrid(offsets, offsets, indexing="ij")
        self._local_x = gx.reshape(-1)
        self._local_y = gy.reshape(-1)
        self._rng: np.random.Generator | None = None
        self.t = 0.0
        self.i = 0
        self.i_target = 1
        self.t_target = 0.0
        self.t0_target = math.inf
        self.path_th = 0.0
        self.sink: np.ndarray | None = None
        """The current sink (x, y); None for the constant version."""
        self.d_sink = 0.0
        """The agent-to-sink distance when the sink was made (scales the speed's wave)."""
        self.v_phase0 = 0.0
        """The phase of the speed's wave (drawn per sink)."""
        self.pose = np.zeros(3)
        self.map_x = np.zeros(0)
        self.map_y = np.zeros(0)
        self.values = np.zeros((0, 0, 2))
        self._interp: RegularGridInterpolator | None = None
        self._lo = np.zeros(2)
        self._hi = np.zeros(2)

    # -- the map ------------------------------------------------------------------------
    def _make_map(self, centre: np.ndarray) -> None:
        p = self.params
        k = round(p.map_half_width * p.map_res)
        steps = np.arange(-k, k + 1, dtype=np.float64) / p.map_res
        self.map_x = steps + float(centre[0])
        self.map_y = steps + float(centre[1])
        self._lo = np.array([self.map_x[0], self.map_y[0]])
        self._hi = np.array([self.map_x[-1], self.map_y[-1]])

    def _set_values(self, values: np.ndarray) -> None:
        """Install the map's vectors, ``values[i_x, i_y] = (vx, vy)``."""
        self.values = values
        self._interp = RegularGridInterpolator(
            (self.map_x, self.map_y), values, method="linear", bounds_error=False, fill_value=None
        )

    def _make_sink_values(self, v_phase0: float) -> None:
        """Every map point's vector points at the sink, scaled by :func:`sink_amplitude`."""
        assert self.sink is not None
        self.d_sink = float(np.linalg.norm(self.sink - self.pose[:2]))
        self.v_phase0 = v_phase0
        dx = self.sink[0] - self.map_x[:, None]
        dy = self.sink[1] - self.map_y[None, :]
        d = np.hypot(dx, dy)
        amp = sink_amplitude(d, self.d_sink, self.params.v_amp_rng, v_phase0)
        scale = np.divide(amp, d, out=np.zeros_like(d), where=d > 0)
        self._set_values(np.stack((scale * dx, scale * dy), axis=-1))

    def _new_sink(self, rng: np.random.Generator) -> None:
        """Draw the next sink along the path, then its speed phase and dwell time."""
        p = self.params
        r = rng.uniform(*p.sink_r)
        th = rng.uniform(*p.sink_th)
        self.path_th += th
        step = np.array([math.cos(self.path_th) * r, math.sin(self.path_th) * r])
        self.sink = step + (self.pose[:2] if self.sink is None else self.sink)
        v_phase0 = float(rng.uniform(-math.pi, math.pi))
        self.t0_target = float(rng.uniform(2.0, 4.0))
        self._make_sink_values(v_phase0)

    # -- episode --------------------------------------------------------------------------
    def reset(self, rng: np.random.Generator, pose: np.ndarray | None = None) -> None:
        """A new episode: the map centred on ``pose`` (default: the origin, as the original
        always did), and for sink versions the first sink drawn from ``rng``."""
        self._rng = rng
        self.t, self.i, self.i_target, self.t_target = 0.0, 0, 1, 0.0
        self.t0_target = math.inf
        self.path_th = 0.0
        self.sink = None
        self.pose = np.zeros(3) if pose is None else np.asarray(pose, dtype=np.float64).copy()
        self._make_map(self.pose)
        const = self.params.constant
        if const is not None:
            values = np.empty((self.map_x.size, self.map_y.size, 2))
            values[..., 0], values[..., 1] = const
            self._set_values(values)
        else:
            self._new_sink(rng)

    def update(self, pose: np.ndarray) -> tuple[np.ndarray, bool]:
        """One step: the agent is at ``pose = (x, y, yaw)``. Returns the local field
        (2 x 11 x 11, body frame) and whether a target was reached at this update."""
        if self._rng is None:
            raise RuntimeError("TargetField.update before reset")
        self.t += self.dt
        self.i += 1
        self.pose = np.asarray(pose, dtype=np.float64).copy()
        reached = False
        if self.sink is not None:
            if float(np.linalg.norm(self.sink - self.pose[:2])) < self.params.r_target:
                self.t_target += self.dt
            else:
                self.t_target = 0.0
            if self.t_target > self.t0_target and self.i_target <= self.params.n_new_target:
                if self.i_target < self.params.n_new_target:
                    self._make_map(self.pose)
                    self._new_sink(self._rng)
                self.i_target += 1
                self.t_target = 0.0
                reached = True
        return self.local_field(self.pose), reached

    # -- queries --------------------------------------------------------------------------
    def velocity_at(self, points: np.ndarray) -> np.ndarray:
        """The target velocity (vx, vy) at ground-frame points (..., 2): bilinear on the map,
        points off the map take the value at the nearest point of its edge."""
        assert self._interp is not None, "TargetField used before reset"
        pts = np.clip(np.asarray(points, dtype=np.float64), self._lo, self._hi)
        return np.asarray(self._interp(pts.reshape(-1, 2))).reshape(pts.shape)

    def local_field(self, pose: np.ndarray) -> np.ndarray:
        """The field on the 11 x 11 grid around ``pose`` in the body frame: ``[c, i, j]`` is
        component ``c`` (0 forward, 1 leftward) at ``i - 5`` m forward and ``j - 5`` m left."""
        x, y, yaw = float(pose[0]), float(pose[1]), float(pose[2])
        qx, qy = rotate(self._local_x, self._local_y, yaw)
        v = self.velocity_at(np.stack((qx + x, qy + y), axis=-1))
        lx, ly = rotate(v[:, 0], v[:, 1], -yaw)
        n = LOCAL_GRID
        return np.stack((lx.reshape(n, n), ly.reshape(n, n)))
