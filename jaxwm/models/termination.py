"""Known termination rules for model rollouts ("static functions", MBPO / MOPO).

A learned dynamics model predicts the next state but not whether the episode ended, so model
rollouts stop where the real env's rule would end the episode. These are gymnasium's
``terminated`` conditions for the v4 MuJoCo envs, written on the predicted next observation
(``exclude_current_positions_from_observation``: obs[0] is the torso height for Hopper,
Walker2d and Ant), as MBPO's ``static_fns`` do; HalfCheetah and Pendulum never terminate.

``termination_fn(env_id)`` -> ``fn(obs, action, next_obs) -> bool [B]``.
"""

from __future__ import annotations

import jax.numpy as jnp


def _finite(next_obs):
    return jnp.all(jnp.isfinite(next_obs), -1)


def hopper(obs, action, next_obs):
    height, angle = next_obs[..., 0], next_obs[..., 1]
    healthy = (_finite(next_obs) & jnp.all(jnp.abs(next_obs[..., 1:]) < 100, -1)
               & (height > 0.7) & (jnp.abs(angle) < 0.2))
    return ~healthy


def walker2d(obs, action, next_obs):
    height, angle = next_obs[..., 0], next_obs[..., 1]
    healthy = (height > 0.8) & (height < 2.0) & (angle > -1.0) & (angle < 1.0)
    return ~healthy


def ant(obs, action, next_obs):
    height = next_obs[..., 0]
    return ~(_finite(next_obs) & (height >= 0.2) & (height <= 1.0))


def never(obs, action, next_obs):
    return jnp.zeros(next_obs.shape[:-1], bool)


TERMINATION = {"hopper": hopper, "walker2d": walker2d, "ant": ant, "halfcheetah": never,
               "pendulum": never}


def termination_fn(env_id: str):
    family = env_id.split("-")[0].lower()
    if family not in TERMINATION:
        raise ValueError(f"No termination rule for {env_id!r}; known env families: "
                         f"{sorted(TERMINATION)}. Add one to jaxwm/models/termination.py.")
    return TERMINATION[family]
