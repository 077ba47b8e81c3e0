"""Random-shooting model-predictive control with an adaptable action-sequence prior.

Nagabandi et al. 2018 (sec. IV-B): sample K action sequences of horizon H, roll each out in
the learned model, execute the first action of the sequence with the highest predicted
return, replan at the next step. Rollouts in the model are ``lax.scan`` over the horizon
(``imagine``) and ``vmap`` over candidates.

The candidates come half from a uniform distribution over the action box (plain random
shooting) and half from a per-timestep Gaussian prior. ``refit_prior`` moves that prior
toward elite sequences found in imagination, as in the cross-entropy method (Rubinstein
1999; Chua et al. 2018 use CEM per decision), with momentum; the uniform half keeps the
planner at least as good as random shooting whatever the prior learns.

Functions here are unbatched over states (one observation); callers ``vmap``, except
``policy``, the planner as an acting-layer policy over a batch of envs. MPPI
(``jaxwm.agents.mppi``, TD-MPC2's planner) builds on ``SequencePrior``, ``imagine`` and
``top_k``.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
from flax import struct

from jaxwm.envs import acting

StepFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]  # (obs, a) -> (obs', r)


@struct.dataclass
class SequencePrior:
    mean: jax.Array  # [H, A]
    std: jax.Array  # [H, A]

    @classmethod
    def create(cls, horizon: int, low: jax.Array, high: jax.Array) -> SequencePrior:
        mid, half = (high + low) / 2, (high - low) / 2
        return cls(jnp.broadcast_to(mid, (horizon,) + mid.shape),
                   jnp.broadcast_to(half, (horizon,) + half.shape))


def imagine(step_fn: StepFn, obs: jax.Array, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rolls ``actions`` [H, A] through the model from ``obs``: (rewards [H], final obs)."""
    chex.assert_rank(actions, 2)

    def step(o, a):
        o, r = step_fn(o, a)
        return o, r

    final, rewards = jax.lax.scan(step, obs, actions)
    return rewards, final


def sample_candidates(key, prior: SequencePrior, num: int, low, high) -> jax.Array:
    """[num, H, A]: the first half uniform in the box, the rest from the clipped prior."""
    k_uniform, k_prior = jax.random.split(key)
    shape = prior.mean.shape
    n_uniform = num - num // 2
    uniform = jax.random.uniform(k_uniform, (n_uniform,) + shape, minval=low, maxval=high)
    gauss = prior.mean + prior.std * jax.random.normal(k_prior, (num // 2,) + shape)
    return jnp.concatenate([uniform, jnp.clip(gauss, low, high)], 0)


def plan(step_fn: StepFn, obs, key, prior: SequencePrior, num_candidates: int, low, high):
    """Returns (first action [A], candidates [K, H, A], their imagined returns [K])."""
    chex.assert_rank(obs, 1)
    chex.assert_equal_shape([prior.mean[0], low, high])
    candidates = sample_candidates(key, prior, num_candidates, low, high)
    rewards, _ = jax.vmap(lambda seq: imagine(step_fn, obs, seq))(candidates)
    returns = jnp.sum(rewards, axis=-1)
    return candidates[jnp.argmax(returns), 0], candidates, returns


def top_k(candidates: jax.Array, returns: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The ``k`` best sequences [k, H, A] and their returns [k], best first."""
    chex.assert_rank([candidates, returns], [3, 1])
    best, idx = jax.lax.top_k(returns, k)
    return candidates[idx], best


def elites(candidates: jax.Array, returns: jax.Array, num_elites: int) -> jax.Array:
    """The ``num_elites`` best sequences [E, H, A]."""
    return top_k(candidates, returns, num_elites)[0]


def imagined_elites(step_fn: StepFn, starts, key, prior: SequencePrior, num_candidates: int,
                    num_elites: int, low, high):
    """Planning from each of the ``starts`` [N, D]: the elite sequences of all of them
    ``[N * E, H, A]`` (a CEM step's data), and the imagined returns of the best, mean,
    uniform and prior candidates."""
    _, candidates, returns = jax.vmap(
        lambda o, k: plan(step_fn, o, k, prior, num_candidates, low, high)
    )(starts, jax.random.split(key, starts.shape[0]))
    elite = jax.vmap(elites, in_axes=(0, 0, None))(candidates, returns, num_elites)
    n_uniform = num_candidates - num_candidates // 2
    metrics = {
        "imagine/best_return": jnp.mean(jnp.max(returns, -1)),
        "imagine/mean_return": jnp.mean(returns),
        "imagine/uniform_best_return": jnp.mean(jnp.max(returns[:, :n_uniform], -1)),
        "imagine/prior_best_return": jnp.mean(jnp.max(returns[:, n_uniform:], -1)),
    }
    return elite.reshape((-1,) + elite.shape[2:]), metrics


def refit_prior(prior: SequencePrior, elite_seqs: jax.Array, momentum: float,
                min_std: float) -> SequencePrior:
    """CEM step: move mean/std toward the elites' moments ([N, H, A] pooled over states)."""
    chex.assert_shape(elite_seqs, (None,) + prior.mean.shape)
    mean = momentum * prior.mean + (1 - momentum) * jnp.mean(elite_seqs, 0)
    std = momentum * prior.std + (1 - momentum) * jnp.std(elite_seqs, 0)
    return SequencePrior(mean, jnp.maximum(std, min_std))


def policy(step_fn_for: Callable[[object], StepFn], num_candidates: int, low, high
           ) -> acting.Policy:
    """Planning as a policy (``acting.stateless``): ``params = (model_params, prior)``, each
    env plans with its own key and acts with the first action of its best candidate. It is
    deterministic given the key, so ``temperature`` is ignored."""

    def act(params, obs, key, temperature):
        del temperature
        model_params, prior = params
        step_fn = step_fn_for(model_params)
        keys = jax.random.split(key, obs.shape[0])
        return jax.vmap(lambda o, k: plan(step_fn, o, k, prior, num_candidates, low, high)[0])(
            jnp.asarray(obs, jnp.float32), keys)

    return acting.stateless(act)
