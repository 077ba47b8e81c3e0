"""A uniform replay buffer as pure functions over a fixed-shape state (flashbax-style).

``init`` allocates ``capacity`` slots shaped like one example transition; ``add`` writes a
batch circularly, skipping entries whose ``mask`` is False (envpool's reset transitions) by
compacting the kept ones with a cumulative sum, so shapes stay static under ``jit``;
``sample`` draws uniformly among filled slots.

Sequences (DreamerV3): a slot holds one step of every env (leaves ``[capacity, num_envs,
...]``, added without a mask, so time stays contiguous per env); ``sample_sequences`` draws
``length`` consecutive steps of one env, uniformly over every (start, env) pair whose window
lies inside the filled slots, oldest data first in ring order. Episode boundaries inside a
window are marked by the data's own ``is_first`` flags, not avoided.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ReplayState:
    data: Any  # pytree, every leaf [capacity, ...]
    insert: jax.Array  # next slot to write
    size: jax.Array  # filled slots
    capacity: int = struct.field(pytree_node=False)


def init(capacity: int, example: Any) -> ReplayState:
    """``example`` is one transition (no batch axis)."""
    if capacity <= 0:
        raise ValueError(f"Replay capacity must be > 0, got {capacity}.")
    data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype),
                        example)
    return ReplayState(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), capacity)


def add(state: ReplayState, batch: Any, mask: jax.Array | None = None) -> ReplayState:
    """Writes the rows of ``batch`` (leading axis n) whose ``mask`` is True."""
    n = jax.tree.leaves(batch)[0].shape[0]
    mask = jnp.ones(n, bool) if mask is None else mask
    chex.assert_shape(mask, (n,))
    offsets = jnp.cumsum(mask) - 1
    slots = (state.insert + offsets) % state.capacity
    slots = jnp.where(mask, slots, state.capacity)  # out of range: dropped by the scatter
    data = jax.tree.map(lambda buf, x: buf.at[slots].set(x, mode="drop"), state.data, batch)
    added = jnp.sum(mask).astype(jnp.int32)
    return state.replace(data=data, insert=(state.insert + added) % state.capacity,
                         size=jnp.minimum(state.size + added, state.capacity))


def sample(state: ReplayState, key: jax.Array, batch_size: int) -> Any:
    """Uniform over filled slots (the caller makes sure ``size > 0``)."""
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1))
    return jax.tree.map(lambda buf: buf[idx], state.data)


def sample_sequences(state: ReplayState, key: jax.Array, batch_size: int, length: int) -> Any:
    """[batch_size, length, ...] windows of consecutive steps of single envs (the caller makes
    sure ``size >= length``)."""
    k_start, k_env = jax.random.split(key)
    num_envs = jax.tree.leaves(state.data)[0].shape[1]
    starts = jax.random.randint(k_start, (batch_size,), 0,
                                jnp.maximum(state.size - length + 1, 1))
    envs = jax.random.randint(k_env, (batch_size,), 0, num_envs)
    oldest = (state.insert - state.size) % state.capacity
    slots = (oldest + starts[:, None] + jnp.arange(length)) % state.capacity  # [B, L]
    return jax.tree.map(lambda buf: buf[slots, envs[:, None]], state.data)
