"""The MyoChallenge tasks and their evaluation protocols (``harness eval RUN --protocol NAME``).

Each challenge task has a phase-1 env (what the packs train on) and the phase-2 env the final
leaderboard was computed on (harder goals, randomised object or terrain); MyoSuite registers both.
A run of either phase can be evaluated with:

* ``phase1``: the phase-1 env;
* ``phase2``: the phase-2 env;
* ``official``: the challenge's final evaluation, the phase-2 env (for Relocate, the wider
  ``P2eval`` ranges the organisers evaluated on) over the number of episodes the evaluation ran.

The score is MyoSuite's own ``get_metrics`` per episode (``score``; see
:mod:`harness_myo.episode`), averaged over the episodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.registry import EvalProtocol


@dataclass(frozen=True)
class Challenge:
    """One MyoChallenge task: its phase ids and how its submissions were evaluated."""

    title: str
    """Year and task, as the challenge named it."""
    phase1: str
    phase2: str
    official: str
    """The env id of the final evaluation (the phase-2 id, or its 'eval' variant)."""
    episodes: int
    """Episodes per evaluation of a submission. No challenge published its count: the 2023
    leaderboard's scores are all multiples of 1/99, so 99 there; 100 for 2022 and 20 for OslRun
    are harness's choices (docs/competitions.md)."""
    ranking: str
    """What the leaderboard ranked by."""
    source: str
    """Where the protocol comes from."""
    score: Callable[[Mapping[str, Sequence[float]]], float] | None = None
    """The score over episodes where it is not the mean of their ``score``s."""


def clipped_track_fraction(metrics: Mapping[str, Sequence[float]]) -> float:
    """OslRun's score (RunTrackEnv.get_metrics): the mean track fraction, clipped to [0, 1]."""
    values = metrics["track_fraction"]
    return min(1.0, max(0.0, sum(values) / len(values)))


CHALLENGES: tuple[Challenge, ...] = (
    Challenge(
        "MyoChallenge 2022 Die Reorient",
        "myoChallengeDieReorientP1-v0",
        "myoChallengeDieReorientP2-v0",
        "myoChallengeDieReorientP2-v0",
        episodes=100,
        ranking="success rate (solved on more than 5 of 150 steps), then effort",
        source="Caggiano et al., PMLR 220:233-250 (2023); MyoSuite ReorientEnv.get_metrics",
    ),
    Challenge(
        "MyoChallenge 2022 Baoding",
        "myoChallengeBaodingP1-v1",
        "myoChallengeBaodingP2-v1",
        "myoChallengeBaodingP2-v1",
        episodes=100,
        ranking="the fraction of the episode spent solved, then effort",
        source="Caggiano et al., PMLR 220:233-250 (2023); MyoSuite BaodingEnv.get_metrics",
    ),
    Challenge(
        "MyoChallenge 2023 Relocate",
        "myoChallengeRelocateP1-v0",
        "myoChallengeRelocateP2-v0",
        "myoChallengeRelocateP2eval-v0",
        episodes=99,
        ranking="success rate (object in the receptacle on more than 5 steps), then effort",
        source="MyoChallenge 2023 rules; MyoSuite RelocateEnv.get_metrics",
    ),
    Challenge(
        "MyoChallenge 2024 prosthetic-leg running (OslRun)",
        "myoChallengeOslRunFixed-v0",
        "myoChallengeOslRunRandom-v0",
        "myoChallengeOslRunRandom-v0",
        episodes=20,
        ranking="the fraction of the track covered, then time, then effort",
        source="MyoChallenge 2024 rules; MyoSuite RunTrackEnv.get_metrics",
        score=clipped_track_fraction,
    ),
)
"""The challenge tasks harness knows the protocols of."""

_VARIANTS = ("Sarc", "Fati", "Reaf")


def challenge_of(env_id: str) -> Challenge | None:
    """The challenge task ``env_id`` belongs to (either phase, or a variant of one), if any."""
    base = env_id
    for variant in _VARIANTS:  # myoSarcChallenge... / myoFatiChallenge... share the protocol
        base = base.replace(f"myo{variant}Challenge", "myoChallenge")
    for challenge in CHALLENGES:
        if base in (challenge.phase1, challenge.phase2, challenge.official):
            return challenge
    return None


INTERFACE_KWARGS = frozenset({"frame_skip", "obs_keys", "normalize_act", "weighted_reward_keys"})
"""The constructor kwargs a protocol keeps from the run: what the policy's interface depends on
(its control step, observations, action scaling) and the reward weights, which no score reads.
A longer control step is an action repeat of MyoSuite's (the same muscle controls held over
the same simulated time), so the challenge could have been sent that policy. Every other kwarg
(goal ranges, object or terrain randomisation) defines the task, and the protocol's env id
registers the challenge's own."""


def task_reset(options: Any) -> dict[str, Any]:
    """``EvalProtocol.env_reset``: the run's kwargs less the task's, and no curriculum (a run
    that trained through stages saves its last stage's goal ranges and kwargs)."""
    reset: dict[str, Any] = {
        "kwargs": {k: v for k, v in options.kwargs.items() if k in INTERFACE_KWARGS}
    }
    if options.curriculum:
        reset.update(curriculum=[], curriculum_thresholds=[], curriculum_stage=0)
    return reset


def protocols(env_id: str) -> Mapping[str, EvalProtocol]:
    """``EnvSpec.protocols``: the protocols of ``env_id``'s challenge (none for other ids)."""
    challenge = challenge_of(env_id)
    if challenge is None:
        return {}
    c = challenge
    phases = {
        "phase1": (c.phase1, f"{c.title}, phase 1 ({c.phase1})"),
        "phase2": (c.phase2, f"{c.title}, phase 2 ({c.phase2})"),
        "official": (c.official, f"{c.title}, official evaluation ({c.official}; {c.ranking})"),
    }
    return {
        name: EvalProtocol(
            name, c.episodes, env, description=text, score=c.score, env_reset=task_reset
        )
        for name, (env, text) in phases.items()
    }
