"""Collecting transitions for off-policy learners: one jittable ``lax.scan`` over env steps.

``Cursor`` is the per-env state between calls (the current observation, whether the last
step ended an episode, episode statistics). ``collect`` steps the envs ``num_steps`` times
with actions from ``choose(obs, key)`` and returns every step as a transition
``{obs, action, reward, next_obs, terminated}`` flattened to ``[num_steps * num_envs]``,
time-major, with ``valid`` False for envpool's reset transitions (the step taken from a final
observation, ``jaxwm.envs.types``), which a replay or dataset must skip. Truncated steps are
valid and keep ``terminated`` False, so learners bootstrap them.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from jaxwm.envs.stats import EpisodeStats


@struct.dataclass
class Cursor:
    obs: jax.Array
    prev_done: jax.Array
    stats: EpisodeStats

    @classmethod
    def start(cls, first_obs: jax.Array) -> Cursor:
        n = first_obs.shape[0]
        return cls(first_obs, jnp.zeros(n, bool), EpisodeStats.create(n))


def collect(env_step: Callable, cursor: Cursor, handle, choose: Callable, key: jax.Array,
            num_steps: int):
    """``(cursor, handle, transitions, valid, completed)``; ``completed`` is
    ``EpisodeStats.update``'s per-step record of finished episodes, ``[num_steps, num_envs]``
    (for ``episode_metrics``)."""

    def step(carry, step_key):
        cursor, handle = carry
        action = choose(cursor.obs, step_key)
        handle, res = env_step(handle, action)
        stats, completed = cursor.stats.update(res)
        transition = {"obs": cursor.obs, "action": action, "reward": res.reward,
                      "next_obs": res.obs, "terminated": res.terminated}
        return (Cursor(res.obs, res.done, stats), handle), (transition, ~cursor.prev_done,
                                                            completed)

    (cursor, handle), (steps, valid, completed) = jax.lax.scan(
        step, (cursor, handle), jax.random.split(key, num_steps))
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (steps, valid))
    return cursor, handle, *flat, completed
