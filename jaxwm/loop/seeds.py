"""Several independent seeds in one process (``--config.num_seeds=N``).

An algorithm that supports it keeps a leading seed axis on its whole state and ``vmap``s its
hooks over it: one compile, one env pool of N x ``env.num_envs`` envs, N agents that share
nothing but the hardware. The loop's RNG key gets the same axis: seed k's key is
``PRNGKey(seed + k * env.num_envs)``, split exactly as a one-seed run splits its key, and its
envs are envpool's envs ``seed + k * num_envs ..`` of the pool. So seed k trains exactly as a
one-seed run with ``--config.seed=seed + k * env.num_envs`` would (tested), and the N seeds
are as independent as N separate runs, at a fraction of the cost on one machine.

Counters count per seed (``env_steps`` is each agent's own experience, as ``total_env_steps``
is each agent's budget), so clocks and schedules mean what they mean for one seed; the
throughput of the whole pool is N times ``charts/SPS``. Metrics with a seed axis are returned
as ``metrics.PerSeed`` and logged as their mean over seeds plus ``<name>/seed_<k>`` and
``<name>/seed_std``; the learning-curve PNG draws the mean and a band of one std.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The evaluation pool's envpool seed is the run's seed plus this (envpool seeds env i of a pool
# with seed + i), apart from the training pool's, which starts at the run's seed. Separate runs
# share envs where their seeds are closer than a pool's size (``report.runs.env_streams``).
EVAL_SEED_OFFSET = 10_000


def loop_key(seed: int, num_seeds: int, stride: int) -> jax.Array:
    """The loop's key: [2] for one seed, [N, 2] (seed k from ``seed + k * stride``) for N."""
    if num_seeds == 1:
        return jax.random.PRNGKey(seed)
    return jax.vmap(jax.random.PRNGKey)(seed + stride * jnp.arange(num_seeds))


def run_seeds(config) -> list[int]:
    """The seed of each of a config's ``num_seeds`` agents, as a one-seed run would have it
    (``--config.seed``): for host-side randomness an algorithm draws per seed."""
    return [config.seed + k * config.env.num_envs for k in range(config.num_seeds)]


def stack(per_seed: list):
    """Per-seed trees (one per ``run_seeds``) as one tree with a seed axis; the tree itself
    for one seed."""
    if len(per_seed) == 1:
        return per_seed[0]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *per_seed)


def split(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``jax.random.split(key)`` as two keys, per seed where ``key`` has a seed axis."""
    if key.ndim == 1:
        new, sub = jax.random.split(key)
        return new, sub
    keys = jax.vmap(jax.random.split)(key)  # [N, 2, 2]
    return keys[:, 0], keys[:, 1]


def vmap(fn, num_seeds: int, **kwargs):
    """``fn`` over a leading seed axis (``jax.vmap``), or ``fn`` itself for one seed."""
    return jax.vmap(fn, **kwargs) if num_seeds > 1 else fn


def fold_in(key: jax.Array, data: int) -> jax.Array:
    """``jax.random.fold_in(key, data)``, per seed where ``key`` has a seed axis."""
    if key.ndim == 1:
        return jax.random.fold_in(key, data)
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, data)
