"""Every seed of a run, from one place: named streams over :class:`numpy.random.SeedSequence`.

A run has one seed (``[run] seed``). Everything random in it draws from a *stream* of that
seed: a child of ``SeedSequence(seed)`` named by what it serves and where (the envs reset at
step 4000; farm actor 3 after its second restart; the evaluation at step 20000). Streams are
independent of each other by construction (SeedSequence hashes the seed and the stream's key
together), so two streams never replay each other's numbers, and neighbouring seeds do not
overlap as sums did (``seed + step``: seed 1 at step 1 reset the envs like seed 2 at step 0).

Nothing else in the harness derives a seed; :data:`STREAMS` lists them all:

``envs``
    the serial run's envs, reset when its collector starts (key: the run step, so a resumed
    run plays new episodes).
``actor``
    a farm actor's own root (keys: actor index, restarts, run step); inside the actor
    :class:`Seeds` of that root gives its ``envs`` and its ``exploration`` generator.
``exploration``
    the generator a farm actor's policy or the policy server explores with.
``evaluation``
    the envs of an evaluation during training (key: the run step); an evaluation of a
    finished run adds a second key (``competitions/baselines.py``: 1 fresh episodes,
    2 the official protocol's).
``confirmation``
    the second evaluation that confirms ``stop_at_return`` (key: the run step).
``backend``
    the framework's own generator (``Backend.seed``: initial weights, dropout).
``agent``
    the agent's generator (``Agent.rng``: replay sampling and what the algorithm draws).

An env is reset with an int (gymnasium seeds env ``i`` of a vector env with ``seed + i``), so
:meth:`Seeds.seed` gives ints below ``2**30``: room for any number of envs in an int32.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STREAMS", "Seeds"]

STREAMS: dict[str, int] = {
    "envs": 1,
    "actor": 2,
    "exploration": 3,
    "evaluation": 4,
    "confirmation": 5,
    "backend": 6,
    "agent": 7,
}
"""Each stream's name and its first spawn-key word (fixed: a run's numbers depend on it)."""

SEED_BITS = 30
"""An int seed is below ``2**SEED_BITS`` (see the module docstring)."""


class Seeds:
    """The streams of one root seed (``[run] seed``, or a farm actor's root).

    ``Seeds(1).seed("envs", 4000)`` is the int the envs are reset with at step 4000;
    ``.generator("exploration")`` a :class:`numpy.random.Generator`. Keys are ints (0 or
    more); a stream's keys are always the same number of the same things (its entry above)."""

    def __init__(self, root: int) -> None:
        root = int(root)
        if root < 0:
            raise ValueError(f"a seed is 0 or more, got {root}")
        self.root = root

    def sequence(self, stream: str, *keys: int) -> np.random.SeedSequence:
        """The :class:`~numpy.random.SeedSequence` of ``stream`` at ``keys``."""
        if stream not in STREAMS:
            known = ", ".join(STREAMS)
            raise KeyError(f"no random stream {stream!r} (harness.seeds.STREAMS: {known})")
        words = (STREAMS[stream], *(_word(k) for k in keys))
        return np.random.SeedSequence(self.root, spawn_key=words)

    def seed(self, stream: str, *keys: int) -> int:
        """An int seed from ``stream`` at ``keys`` (for APIs that take an int: an env's
        ``reset(seed=)``, ``Backend.seed``, a remote actor's root), below ``2**30``."""
        word = int(self.sequence(stream, *keys).generate_state(1, np.uint32)[0])
        return word >> (32 - SEED_BITS)

    def generator(self, stream: str, *keys: int) -> np.random.Generator:
        """A generator drawing from ``stream`` at ``keys``."""
        return np.random.default_rng(self.sequence(stream, *keys))


def _word(key: int) -> int:
    key = int(key)
    if key < 0:
        raise ValueError(f"a stream key is 0 or more, got {key}")
    return key
