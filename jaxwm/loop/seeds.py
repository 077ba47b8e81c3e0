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


def loop_key(seed: int, num_seeds: int, stride: int) -> jax.Array:
    """The loop's key: [2] for one seed, [N, 2] (seed k from ``seed + k * stride``) for N."""
    if num_seeds == 1:
        return jax.random.PRNGKey(seed)
    return jax.vmap(jax.random.PRNGKey)(seed + stride * jnp.arange(num_seeds))


def split(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``jax.random.split(key)`` as two keys, per seed where ``key`` has a seed axis."""
    if key.ndim == 1:
        new, sub = jax.random.split(key)
        return new, sub
    keys = jax.vmap(jax.random.split)(key)  # [N, 2, 2]
    return keys[:, 0], keys[:, 1]


def env_step_over_seeds(env_step, num_seeds: int):
    """``env_step(handle, action [E_total])`` made callable under ``vmap`` over seeds.

    envpool's XLA step is one custom call over the whole pool and has no batching rule.
    Under ``vmap``, actions [N, E] become one call on [N * E] (seed k's actions are envs
    k*E .. (k+1)*E - 1, the pool's order) and the results are split back into [N, E]; the
    handle stays unbatched, as there is one pool.
    """

    def pool_step(handle, action):  # action [N, E] -> results [N, E]
        handle, result = env_step(handle, action.reshape((-1,) + action.shape[2:]))
        return handle, split_pool(result, num_seeds)

    @jax.custom_batching.custom_vmap
    def step(handle, action):
        # Seen unbatched only while JAX traces a scan body for its shapes: one seed's view.
        handle, result = pool_step(handle, jnp.stack([action] * num_seeds))
        return handle, jax.tree.map(lambda x: x[0], result)

    @step.def_vmap
    def _over_seeds(axis_size, in_batched, handle, action):
        handle_batched, action_batched = in_batched
        if any(jax.tree.leaves(handle_batched)):
            raise ValueError("The env handle cannot have a seed axis: there is one pool.")
        if axis_size != num_seeds or not action_batched:
            raise ValueError(f"The pool steps {num_seeds} seeds' actions at once; got a "
                             f"batch of {axis_size} (batched: {action_batched}).")
        handle, result = pool_step(handle, action)
        return (handle, result), (jax.tree.map(lambda _: False, handle),
                                  jax.tree.map(lambda _: True, result))

    return step


def fold_in(key: jax.Array, data: int) -> jax.Array:
    """``jax.random.fold_in(key, data)``, per seed where ``key`` has a seed axis."""
    if key.ndim == 1:
        return jax.random.fold_in(key, data)
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, data)


def split_pool(tree, num_seeds: int):
    """Leaves [N * E, ...] (the pool's order) -> [N, E, ...]."""
    return jax.tree.map(lambda x: x.reshape((num_seeds, -1) + x.shape[1:]), tree)


def merge_pool(tree):
    """Leaves [N, E, ...] -> [N * E, ...]."""
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)
