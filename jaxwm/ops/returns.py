"""Return estimators as reverse ``lax.scan``s: GAE for env rollouts, lambda-returns for imagination.

Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", eq. 16:  A_t = sum_l (gamma * lambda)^l * delta_{t+l},
with  delta_t = r_t + gamma * V(s_{t+1}) - V(s_t).

Termination and truncation are kept apart (Pardo et al. 2018, "Time Limits in RL"): a
terminated step has no bootstrap (delta_t = r_t - V(s_t)); a truncated step bootstraps from
the value of the true final observation, which envpool's auto-reset convention hands us
(see ``jaxwm.envs.types``). Both cut the recursion so that advantages never flow across an
episode boundary. CleanRL instead treats truncation as termination; this is the deliberate
difference.

``lambda_return`` is DreamerV3's critic target over an imagined trajectory (see its docstring).

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


def lambda_return(
    rewards: chex.Array,
    values: chex.Array,
    continues: chex.Array,
    bootstrap: chex.Array,
    gamma: float,
    lambda_: float | chex.Array,
) -> chex.Array:
    """Lambda-returns of ONE imagined trajectory of H steps (DreamerV3, Hafner et al. 2023, eq. 7).

        R_t = rewards[t] + gamma * continues[t] * ((1 - lambda) * values[t] + lambda * R_{t+1}),
        R_H = bootstrap,

    computed for t = H-1 .. 0: the paper's r_t + gamma c_t ((1 - lambda) v_t + lambda R_{t+1}),
    as the official ``lambda_return`` of danijar/dreamerv3. With lambda = 1 this is the
    discounted Monte-Carlo return plus the discounted bootstrap; with lambda = 0 it is the
    one-step TD target rewards[t] + gamma * continues[t] * values[t].

    Alignment: the arguments are ALREADY shifted by one step: index t holds the reward, continue
    flag and value of the state REACHED by step t, and R_t is the target for the state the step
    starts from. Worked example, H = 2: imagination starts in s_0 and reaches s_1, s_2; the
    model predicts r_i, c_i and the critic v_i at each s_i (i = 1, 2). Then call

        lambda_return(rewards=[r_1, r_2], values=[v_1, v_2], continues=[c_1, c_2],
                      bootstrap=v_2, gamma, lambda_)  ->  [R(s_0), R(s_1)]

    with R(s_1) = r_2 + gamma c_2 v_2 and
    R(s_0) = r_1 + gamma c_1 ((1 - lambda) v_1 + lambda R(s_1)). That is, for per-state arrays
    r, c, v of length H + 1 over s_0..s_H: ``lambda_return(r[1:], v[1:], c[1:], v[-1], ...)``,
    which targets the critic at s_0..s_{H-1}. A zero continue (the model predicts the episode
    ended on reaching s_{t+1}) cuts both the bootstrap and the recursion.

    Args:
      rewards: [H] r_{t+1}, the reward predicted at the state reached by step t.
      values: [H] v_{t+1}, the critic's value of that state.
      continues: [H] c_{t+1} in [0, 1] (bool or float), the predicted continue flag there.
      bootstrap: [] v_H, the value of the last state (R_H).
      gamma: discount.
      lambda_: lambda-return mixing weight, a scalar or [H] per step (0 at step t: R_t stops
        at its one-step target r_t + gamma c_t v_t, as on replayed sequences where the state
        reached is an episode's last: ``agents.imagination.replay_returns``).

    Returns:
      [H] the lambda-returns R_0 .. R_{H-1}.
    """
    chex.assert_rank([rewards, values, continues], 1)
    chex.assert_equal_shape([rewards, values, continues])
    continues = continues.astype(rewards.dtype)
    bootstrap = jnp.asarray(bootstrap, rewards.dtype)
    chex.assert_rank(bootstrap, 0)

    lambdas = jnp.broadcast_to(jnp.asarray(lambda_, rewards.dtype), rewards.shape)

    def step(next_return, xs):
        reward, value, cont, lam = xs
        ret = reward + gamma * cont * ((1.0 - lam) * value + lam * next_return)
        return ret, ret

    _, returns = jax.lax.scan(step, bootstrap, (rewards, values, continues, lambdas),
                              reverse=True)
    return returns
