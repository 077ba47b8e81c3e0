"""Model predictive path integral control as TD-MPC2 plans (Williams et al. 2015, "Model
Predictive Path Integral Control using Covariance Variable Importance Sampling"; Hansen et al.
2022 and 2024, TD-MPC / TD-MPC2 sec. 3.3 and Algorithm 2; nicklashansen/tdmpc2 ``_plan``).

For one state and a horizon H, a Gaussian over action sequences ``SequencePrior(mean, std)``
(``jaxwm.agents.shooting``) is refined for ``iterations`` rounds:

1. sample ``num_samples - P`` sequences ``clip(mean + std * eps, -1, 1)`` and add the ``P``
   fixed sequences of a policy prior (TD-MPC2: 24 rollouts of its policy in the model);
2. score every sequence with ``objective(sequences, key) -> values`` (TD-MPC2: discounted
   model rewards plus a terminal Q-value);
3. keep the ``num_elites`` best (``shooting.top_k``), weight them by
   ``softmax(temperature * value)`` (the temperature multiplies, as the reference's code), and
   set ``mean`` and ``std`` to the weighted mean and standard deviation of the elites, the std
   clipped to ``[min_std, max_std]``.

The action executed is the first step of one elite, drawn in proportion to its weight (the
reference's Gumbel sampling over the elites' scores), plus ``std[0] * N(0, 1)`` noise scaled
by the acting temperature (1 in training, 0 in evaluation, where the reference adds none).

Warm start (``warm_start``): the next step's search starts from this step's final mean shifted
by one step (the last step's mean 0), or from zeros at an episode's first step; the std always
restarts at ``max_std``. As an acting-layer policy (``policy``) that mean is the carry, kept
per env, so a batch of envs plans in one jitted function of ``(params, carry, obs, is_first,
key)``: all of them vmapped at once, or ``envs_per_batch`` at a time one batch after another.

Any world model of ``models.protocol`` can be planned in: ``model_objective`` scores the
candidates by their rollouts in it (``protocol.rollout_sequences``) and a terminal value, from
a model state, which ``protocol.through_model`` keeps per env for models with a memory (an
RSSM); TD-MPC2's memoryless latent model encodes each observation instead (``start``).

Actions are in [-1, 1]; the caller maps them to an env's box.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxwm.agents.shooting import SequencePrior, top_k
from jaxwm.envs import acting
from jaxwm.models import protocol

Objective = Callable[[jax.Array, jax.Array], jax.Array]  # (sequences [N, H, A], key) -> [N]


@dataclasses.dataclass(frozen=True)
class MPPIHyper:
    horizon: int = 3
    iterations: int = 6
    num_samples: int = 512
    num_elites: int = 64
    num_pi_trajs: int = 24
    temperature: float = 0.5
    min_std: float = 0.05
    max_std: float = 2.0
    # Envs planned together in one vmapped batch; more envs go through ``lax.map`` in chunks of
    # this many. 0: all at once. On a CPU 1 is faster: one env's 512 candidates keep every
    # layer's activations (512 x 512 floats, 1 MB) in cache, 8 envs' do not
    # (benchmarks/README.md, TD-MPC2). On a GPU all at once fills the device.
    envs_per_batch: int = 0


def warm_start(prev_mean: jax.Array, is_first: jax.Array) -> jax.Array:
    """``prev_mean`` [H, A] shifted one step earlier with a zero last step, or zeros where
    ``is_first`` (a new episode)."""
    shifted = jnp.concatenate([prev_mean[1:], jnp.zeros_like(prev_mean[:1])])
    return jnp.where(is_first, jnp.zeros_like(prev_mean), shifted)


def elite_weights(values: jax.Array, temperature: float) -> jax.Array:
    """``softmax(temperature * values)`` over the elites (normalised scores)."""
    return jax.nn.softmax(temperature * (values - jnp.max(values)))


def refit(elite_seqs: jax.Array, weights: jax.Array, min_std: float,
          max_std: float) -> SequencePrior:
    """The weighted mean and std [H, A] of elites [E, H, A] under ``weights`` [E]."""
    w = weights[:, None, None]
    mean = jnp.sum(w * elite_seqs, 0) / (jnp.sum(weights) + 1e-9)
    std = jnp.sqrt(jnp.sum(w * (elite_seqs - mean) ** 2, 0) / (jnp.sum(weights) + 1e-9))
    return SequencePrior(mean, jnp.clip(std, min_std, max_std))


class Plan(NamedTuple):
    """What ``plan`` found: the final ``prior`` and the last round's elites [E, H, A] and
    weights [E]."""

    prior: SequencePrior
    elites: jax.Array
    weights: jax.Array


def plan(objective: Objective, key, mean: jax.Array, hyper: MPPIHyper,
         fixed: jax.Array | None = None) -> Plan:
    """MPPI from ``mean`` [H, A] (std ``max_std``) with the ``fixed`` sequences [P, H, A] among
    every round's candidates (module docstring)."""
    chex.assert_rank(mean, 2)
    fixed = jnp.zeros((0,) + mean.shape) if fixed is None else fixed
    num_sampled = hyper.num_samples - fixed.shape[0]
    if num_sampled < 1 or hyper.num_elites > hyper.num_samples:
        raise ValueError(f"MPPI needs num_samples ({hyper.num_samples}) > the {fixed.shape[0]} "
                         f"fixed sequences and >= num_elites ({hyper.num_elites}).")

    def iteration(carry, key):
        prior, _, _ = carry
        k_sample, k_value = jax.random.split(key)
        noise = jax.random.normal(k_sample, (num_sampled,) + mean.shape)
        sampled = jnp.clip(prior.mean + prior.std * noise, -1.0, 1.0)
        candidates = jnp.concatenate([fixed, sampled])
        values = jnp.nan_to_num(objective(candidates, k_value))
        elites, elite_values = top_k(candidates, values, hyper.num_elites)
        weights = elite_weights(elite_values, hyper.temperature)
        return (refit(elites, weights, hyper.min_std, hyper.max_std), elites, weights), None

    start = (SequencePrior(mean, jnp.full_like(mean, hyper.max_std)),
             jnp.zeros((hyper.num_elites,) + mean.shape),
             jnp.zeros(hyper.num_elites))
    (prior, elites, weights), _ = jax.lax.scan(iteration, start,
                                               jax.random.split(key, hyper.iterations))
    return Plan(prior, elites, weights)


def select(key, result: Plan, noise_scale) -> jax.Array:
    """The first action [A] of an elite drawn by weight, plus ``noise_scale * std[0]`` noise,
    clipped to [-1, 1]."""
    k_pick, k_noise = jax.random.split(key)
    index = jax.random.categorical(k_pick, jnp.log(result.weights + 1e-30))
    action = result.elites[index, 0]
    noise = jax.random.normal(k_noise, action.shape) * result.prior.std[0]
    return jnp.clip(action + noise_scale * noise, -1.0, 1.0)


def model_objective(model, model_params: Callable, terminal_value: Callable, discount: float,
                    prior: Callable | None = None, start: Callable | None = None) -> Callable:
    """``make_objective(params, state, key) -> (objective, fixed)`` for ``policy`` over any
    world model (``models.protocol``) from ONE model state (``start(params, obs)`` of an
    observation where the policy acts on observations): a candidate's value is its
    discounted rewards in the model until a state it does not continue from, plus
    ``discount^H terminal_value(params, final states, key)`` of one still alive
    (``protocol.planned_return``). ``prior(params, state, key)`` gives the fixed sequences
    [P, H, A] every round includes (a policy prior's rollouts), or ``None``."""

    def make_objective(params, state, key):
        if start is not None:
            state = start(params, state)
        k_prior, _ = jax.random.split(key)
        fixed = prior(params, state, k_prior) if prior is not None else None
        mp = model_params(params)

        def value(sequences, key):
            n = sequences.shape[0]
            starts = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), state)
            rewards, conts, final = protocol.rollout_sequences(
                model, mp, starts, sequences, jax.random.fold_in(key, 1))
            return protocol.planned_return(rewards, conts, terminal_value(params, final, key),
                                           discount)

        return value, fixed

    return make_objective


def policy(make_objective: Callable, hyper: MPPIHyper, action_dim: int) -> acting.Policy:
    """MPPI as an acting-layer policy over a batch of envs. ``make_objective(params, obs, key)
    -> (objective, fixed)`` builds one env's objective and fixed sequences (or ``None``) from
    its observation. The carry is each env's last mean [n, H, A]; ``temperature`` scales the
    exploration noise."""

    def init_carry(params, num_envs):
        del params
        return jnp.zeros((num_envs, hyper.horizon, action_dim))

    def act(params, carry, obs, is_first, key, temperature=1.0):
        def one(prev_mean, o, first, k):
            k_objective, k_plan, k_select = jax.random.split(k, 3)
            objective, fixed = make_objective(params, o, k_objective)
            result = plan(objective, k_plan, warm_start(prev_mean, first), hyper, fixed)
            return result.prior.mean, select(k_select, result, temperature)

        num_envs = is_first.shape[0]  # obs may be a model's state (a pytree)
        keys = jax.random.split(key, num_envs)
        if 0 < hyper.envs_per_batch < num_envs:
            mean, action = jax.lax.map(lambda args: one(*args), (carry, obs, is_first, keys),
                                       batch_size=hyper.envs_per_batch)
        else:  # all at once, with no loop around it
            mean, action = jax.vmap(one)(carry, obs, is_first, keys)
        return mean, action, {}

    return acting.Policy(init_carry=init_carry, act=act)
