"""Return estimators: generalised advantage estimation (GAE) as a reverse ``lax.scan``.

Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", eq. 16:  A_t = sum_l (gamma * lambda)^l * delta_{t+l},
with  delta_t = r_t + gamma * V(s_{t+1}) - V(s_t).

Termination and truncation are kept apart (Pardo et al. 2018, "Time Limits in RL"): a
terminated step has no bootstrap (delta_t = r_t - V(s_t)); a truncated step bootstraps from
the value of the true final observation, which envpool's auto-reset convention hands us
(see ``jaxwm.envs.types``). Both cut the recursion so that advantages never flow across an
episode boundary. CleanRL instead treats truncation as termination; this is the deliberate
difference.

Inputs are unbatched over environments (time axis only); callers ``vmap`` over envs.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def gae(
    rewards: chex.Array,
    values: chex.Array,
    next_values: chex.Array,
    terminated: chex.Array,
    truncated: chex.Array,
    gamma: float,
    lambda_: float,
) -> tuple[chex.Array, chex.Array]:
    """Generalised advantages and lambda-returns for one trajectory of length T.

    Args:
      rewards: [T] reward r_t received after acting at step t.
      values: [T] V(s_t).
      next_values: [T] V(s_{t+1}), where s_{t+1} is the observation the step returned
        (the final observation when the episode ended at t).
      terminated: [T] episode ended at t by reaching a terminal state.
      truncated: [T] episode ended at t by a time limit (bootstrapped, then cut).
      gamma: discount.
      lambda_: GAE lambda.

    Returns:
      (advantages [T], returns [T]) with returns = advantages + values.
    """
    chex.assert_rank([rewards, values, next_values, terminated, truncated], 1)
    chex.assert_equal_shape([rewards, values, next_values, terminated, truncated])
    not_terminal = 1.0 - terminated.astype(jnp.float32)
    continues = not_terminal * (1.0 - truncated.astype(jnp.float32))
    deltas = rewards + gamma * not_terminal * next_values - values

    def step(next_advantage, xs):
        delta, cont = xs
        advantage = delta + gamma * lambda_ * cont * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        step, jnp.zeros((), deltas.dtype), (deltas, continues), reverse=True
    )
    return advantages, advantages + values
