"""DeepMind's Atari preprocessing for ALE ids (Mnih et al. 2015, as in OpenAI baselines'
``wrap_deepmind``), as one gymnasium wrapper: one Python call per agent step instead of a stack
of six wrappers around every emulator frame.

- **noop reset**: 1 to ``noop_max`` (30) no-op frames after every real reset;
- **frame skip** 4: the action repeats for 4 emulator frames, rewards are summed, and the
  frame is the pixelwise max of the last two (sprites that flicker between frames);
- **grayscale 84x84**: ALE's own luminance screen, area-resampled (the weights of cv2's
  INTER_AREA, rounded to within 1 grey level of it, without needing OpenCV);
- **frame stack** 4: observations are ``(4, 84, 84)`` uint8, oldest frame first;
- **episodic life** (training): a lost life ends the episode for the agent (terminated); the
  next reset continues the game with one no-op step instead of restarting it;
- **fire reset**: games that wait for FIRE (action 1 is FIRE, at least 3 actions: Breakout)
  get FIRE pressed after every reset, lost lives included;
- **reward clipping**: rewards become their sign (-1, 0, 1);
- **sticky actions**: ALE v5's ``repeat_action_probability``, default 0.25 here as in v5 and
  Machado et al. 2018's recommended protocol (harder to exploit by memorising action
  sequences); 0.0 gives the deterministic DeepMind 2015 protocol. v5's own frame skip is
  turned off (``frameskip=1``): this wrapper skips and max-pools.

The harness gymnasium plugin applies it to ``ALE/...`` ids (``[env] atari``, on by default for
them). Episode returns that harness reports are those the agent sees: per life, clipped.
Evaluate on whole games and real scores with ``--set env.episodic_life=false --set
env.clip_rewards=false``.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["AtariPreprocessing", "make_atari"]


def register_ale() -> bool:
    """Register the ``ALE/...`` ids with gymnasium; False when ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def make_atari(
    env_id: str,
    *,
    frame_stack: int = 4,
    episodic_life: bool = True,
    clip_rewards: bool = True,
    sticky_actions: float = 0.25,
    noop_max: int = 30,
    frame_skip: int = 4,
    screen_size: int = 84,
    max_episode_steps: int | None = None,
    **kwargs: Any,
) -> gym.Env[Any, Any]:
    """``env_id`` (an ALE id) with :class:`AtariPreprocessing`; ``kwargs`` go to
    ``gymnasium.make`` (they override ``sticky_actions`` with ``repeat_action_probability``);
    ``max_episode_steps`` counts agent steps (frame skips) of a whole game, not frames."""
    if not register_ale():
        raise gym.error.DependencyNotInstalled(
            f"{env_id} needs ale-py: pip install 'harness[atari]' (ale-py ships the ROMs)"
        )
    for key in ("frameskip", "obs_type"):
        if key in kwargs:
            raise TypeError(
                f"{key} is set by the Atari preprocessing (frameskip=1, "
                f"obs_type='grayscale'); drop it, or set [env] atari = false to use v5's own"
            )
    kwargs.setdefault("repeat_action_probability", sticky_actions)
    env = gym.make(env_id, frameskip=1, obs_type="grayscale", **kwargs)
    return AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        frame_stack=frame_stack,
        episodic_life=episodic_life,
        clip_rewards=clip_rewards,
        max_episode_steps=max_episode_steps,
    )


class AtariPreprocessing(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """The DeepMind pipeline (see the module docstring) around an ``ale_py`` env made with
    ``frameskip=1`` and ``obs_type='grayscale'``. It drives the emulator directly
    (``ale.act`` per frame, the screen read only for the two frames that are pooled): half
    the per-frame cost of calling the env's ``step`` four times."""

    def __init__(
        self,
        env: gym.Env[Any, Any],
        *,
        noop_max: int = 30,
        frame_skip: int = 4,
        screen_size: int = 84,
        frame_stack: int = 4,
        episodic_life: bool = True,
        clip_rewards: bool = True,
        max_episode_steps: int | None = None,
    ) -> None:
        super().__init__(env)
        base: Any = env.unwrapped
        if not hasattr(base, "ale") or getattr(base, "_frameskip", 1) != 1:
            raise ValueError(
                "AtariPreprocessing needs an ale_py env made with frameskip=1 (it skips frames)"
            )
        if getattr(base, "continuous", False):
            raise ValueError("AtariPreprocessing takes discrete ALE actions (continuous=False)")
        if frame_skip < 1 or frame_stack < 1 or noop_max < 0:
            raise ValueError("frame_skip and frame_stack must be >= 1, noop_max >= 0")
        self.ale = base.ale
        self._actions = list(base._action_set)  # index -> ALE action, as the env's step maps
        meanings = base.get_action_meanings()
        self.fire_reset = len(meanings) >= 3 and meanings[1] == "FIRE"
        self.noop_max = noop_max
        self.frame_skip = frame_skip
        self.episodic_life = episodic_life
        self.clip_rewards = clip_rewards
        height, width = base.observation_space.shape
        self._screens = np.zeros((2, height, width), np.uint8)  # the last two frames
        self._resize = _AreaResize((height, width), (screen_size, screen_size))
        self._stack = np.zeros((frame_stack, screen_size, screen_size), np.uint8)
        self.observation_space = spaces.Box(0, 255, self._stack.shape, np.uint8)
        self.max_episode_steps = max_episode_steps
        """Agent steps after which a game is truncated (counted here, not by a TimeLimit
        around this wrapper, so that truncation restarts the game under episodic life)."""
        self.lives = 0
        self._game_over = True
        self._steps = 0

    # -- emulator ------------------------------------------------------------------------
    def _skip(self, action: int) -> float:
        """Repeat ``action`` for ``frame_skip`` frames (fewer if the game ends); the last
        two frames' screens land in ``_screens``."""
        ale, act = self.ale, self._actions[int(action)]
        skip = self.frame_skip
        reward = 0.0
        for k in range(skip):
            reward += ale.act(act)
            if k >= skip - 2:
                ale.getScreenGrayscale(self._screens[k - skip + 2])
            if ale.game_over():  # (truncation included)
                if k < skip - 1:  # ended early: pool the final screen with itself
                    ale.getScreenGrayscale(self._screens[1])
                    self._screens[0] = self._screens[1]
                break
        if skip == 1:
            self._screens[0] = self._screens[1]
        return reward

    def _frame(self) -> np.ndarray:
        return self._resize(np.maximum(self._screens[0], self._screens[1]))

    def _observation(self, *, fill: bool = False) -> np.ndarray:
        frame = self._frame()
        if fill:
            self._stack[:] = frame
        else:
            self._stack[:-1] = self._stack[1:]
            self._stack[-1] = frame
        return self._stack.copy()  # a fresh array: a vector env keeps final observations

    # -- gymnasium -----------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        info: dict[str, Any] = {}
        go_on = self.episodic_life and not self._game_over and seed is None
        if go_on:  # a life was lost, the game goes on: one no-op step instead of a restart
            self._skip(0)
            go_on = not self.ale.game_over()
        if not go_on:
            _, info = self.env.reset(seed=seed, options=options)
            noop = self._actions[0]
            for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
                self.ale.act(noop)
                if self.ale.game_over():
                    self.env.reset()
            self._game_over = False
            self._steps = 0
            self.ale.getScreenGrayscale(self._screens[1])
            self._screens[0] = self._screens[1]
        if self.fire_reset:
            for action in (1, 2):
                self._skip(action)
                if self.ale.game_over():  # (extremely unlikely) start afresh
                    self._game_over = True
                    return self.reset()
        self.lives = self.ale.lives()
        info["lives"] = self.lives
        return self._observation(fill=True), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = self._skip(action)
        ale = self.ale
        terminated = bool(ale.game_over(with_truncation=False))
        self._steps += 1
        truncated = bool(ale.game_truncated()) or (
            self.max_episode_steps is not None and self._steps >= self.max_episode_steps
        )
        self._game_over = terminated or truncated
        lives = ale.lives()
        if self.episodic_life and 0 < lives < self.lives:
            terminated = True  # for the agent; reset() continues the game
        self.lives = lives
        if self.clip_rewards:
            reward = float(np.sign(reward))
        return self._observation(), reward, terminated, truncated, {"lives": lives}


class _AreaResize:
    """Area resampling of a 2-D uint8 image (``R @ x @ C.T`` with R and C the area weights),
    done as a few weighted gathers: each output row (column) overlaps at most
    ``ceil(scale) + 1`` input rows (columns). No BLAS call: a tiny matrix product on a
    multi-threaded BLAS costs milliseconds on a busy machine."""

    def __init__(self, shape: tuple[int, int], out: tuple[int, int]) -> None:
        self.rows, row_weights = _taps(shape[0], out[0])
        self.cols, self.col_weights = _taps(shape[1], out[1])
        self.row_weights = row_weights[:, :, None]  # (taps, out rows, 1): broadcast over cols

    def __call__(self, image: np.ndarray) -> np.ndarray:
        x = image.astype(np.float32)
        y = x[self.rows[0]] * self.row_weights[0]  # rows first: the gathers are contiguous
        for rows, weights in zip(self.rows[1:], self.row_weights[1:], strict=True):
            y += x[rows] * weights
        z = y[:, self.cols[0]] * self.col_weights[0]
        for cols, weights in zip(self.cols[1:], self.col_weights[1:], strict=True):
            z += y[:, cols] * weights
        out: np.ndarray = np.rint(z).astype(np.uint8)
        return out


def _taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and weights ``(taps, n_out)`` of the inputs each output averages (weight 0
    where an output has fewer taps)."""
    dense = _area_weights(n_in, n_out)
    taps = int((dense > 0).sum(axis=1).max())
    index = np.zeros((taps, n_out), np.intp)
    weights = np.zeros((taps, n_out), np.float32)
    for i in range(n_out):
        nonzero = np.flatnonzero(dense[i])
        index[: len(nonzero), i] = nonzero
        weights[: len(nonzero), i] = dense[i, nonzero]
    return index, weights


def _area_weights(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)``: each output averages the inputs it overlaps, by overlap length."""
    scale = n_in / n_out
    weights = np.zeros((n_out, n_in), np.float64)
    for i in range(n_out):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(math.floor(lo), min(n_in, math.ceil(hi))):
            weights[i, j] = (min(hi, j + 1) - max(lo, j)) / scale
    return weights.astype(np.float32)
