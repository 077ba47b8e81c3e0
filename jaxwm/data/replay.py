"""Replay buffers as pure functions over fixed-shape states: one type per layout.

* ``TransitionReplay`` (SAC, mbrs, MOPO's model buffer): independent transitions in a ring
  of ``capacity`` slots. ``add`` writes a batch, skipping rows whose ``mask`` is False
  (envpool's reset transitions) by compacting the kept ones with a cumulative sum, so shapes
  stay static under ``jit``; ``sample`` draws uniformly among filled slots.
* ``SequenceReplay`` (DreamerV3): every env's steps in time order, ``[capacity // num_envs,
  num_envs, ...]``, added a chunk of steps at a time with no mask (time stays contiguous per
  env); ``sample`` draws windows of ``length`` consecutive steps of one env, uniformly over
  every (start, env) pair inside the filled steps. Episode boundaries inside a window are
  marked by the data's own ``is_first`` flags, not avoided.

``capacity`` means one thing for both: transitions (env steps over all envs), as DreamerV3's
``replay.size`` does; ``transitions`` is how many a buffer holds and ``added`` how many it has
been given in all (DreamerV3's achieved train ratio counts them). ``can_sample(...)`` is
whether a batch can be drawn (a device bool, so no host sync); ``sample`` on a buffer that
cannot is the caller's mistake and returns zeros of the right shape. The two types have
different ``sample`` signatures, so a transition buffer can never be sampled as sequences or
the reverse.

Why not flashbax (instadeepai/flashbax): its buffers are the same idea (pure ``init/add/
sample`` over a pytree state), but ``add`` has no mask, and envpool's reset transitions must
not be stored (a flat buffer stores consecutive steps and pairs them as ``(first, second)``,
so a reset would become a transition from a final observation to the next episode's first).
Its trajectory buffer's layout is ours with a period and a minimum length, which DreamerV3
does not need. Keeping these ~100 lines avoids a dependency for no gain; both keep exact
resume (the state is a plain pytree) and donation (updated in place under ``jit``).

Several processes (``jaxwm.launch``): each steps its own share of the envs, and
``join_processes`` lays their gathered rows out as one process stepping every env would add
them, so the replay, replicated like the parameters, is the one-process replay.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


def _allocate(leading: tuple[int, ...], example: Any):
    return jax.tree.map(lambda x: jnp.zeros(leading + jnp.shape(x), jnp.asarray(x).dtype),
                        example)


@struct.dataclass
class TransitionReplay:
    """Independent transitions: every leaf ``[capacity, ...]``."""

    data: Any
    insert: jax.Array  # next slot to write
    size: jax.Array  # filled slots
    added: jax.Array  # transitions given to add, in all
    capacity: int = struct.field(pytree_node=False)

    @classmethod
    def create(cls, capacity: int, example: Any) -> TransitionReplay:
        """``example`` is one transition (no batch axis)."""
        if capacity <= 0:
            raise ValueError(f"Replay capacity must be > 0, got {capacity}.")
        zero = lambda: jnp.zeros((), jnp.int32)  # noqa: E731 -- a buffer each: donated apart
        return cls(_allocate((capacity,), example), zero(), zero(), zero(), capacity)

    @property
    def transitions(self) -> jax.Array:
        return self.size

    def add(self, batch: Any, mask: jax.Array | None = None) -> TransitionReplay:
        """Writes the rows of ``batch`` (leading axis n) whose ``mask`` is True."""
        n = jax.tree.leaves(batch)[0].shape[0]
        mask = jnp.ones(n, bool) if mask is None else mask
        chex.assert_shape(mask, (n,))
        offsets = jnp.cumsum(mask) - 1
        slots = (self.insert + offsets) % self.capacity
        slots = jnp.where(mask, slots, self.capacity)  # out of range: dropped by the scatter
        data = jax.tree.map(lambda buf, x: buf.at[slots].set(x, mode="drop"), self.data, batch)
        added = jnp.sum(mask).astype(jnp.int32)
        return self.replace(data=data, insert=(self.insert + added) % self.capacity,
                            size=jnp.minimum(self.size + added, self.capacity),
                            added=self.added + added)

    @staticmethod
    def join_processes(rows, steps: int):
        """``add``'s arguments from every process (leaves ``[processes, steps * envs, ...]``,
        time-major) as the ones a single process stepping all their envs would pass: each
        step's envs in process order, the order ``acting.make_pool`` seeds them in."""
        def join(x):
            processes, n = x.shape[:2]
            by_step = x.reshape((processes, steps, n // steps) + x.shape[2:])
            return np.swapaxes(by_step, 0, 1).reshape((processes * n,) + x.shape[2:])

        return jax.tree.map(join, rows)

    def can_sample(self) -> jax.Array:
        return self.size > 0

    def sample(self, key: jax.Array, batch_size: int) -> Any:
        """``batch_size`` transitions, uniformly over the filled slots."""
        idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(self.size, 1))
        return jax.tree.map(lambda buf: buf[idx], self.data)


@struct.dataclass
class SequenceReplay:
    """Every env's steps in time order: every leaf ``[steps, num_envs, ...]`` with ``steps =
    capacity // num_envs``; ``size`` counts filled steps (per env)."""

    data: Any
    insert: jax.Array  # next step to write
    size: jax.Array  # filled steps
    added: jax.Array  # transitions given to add, in all
    capacity: int = struct.field(pytree_node=False)

    @classmethod
    def create(cls, capacity: int, example: Any, num_envs: int) -> SequenceReplay:
        """``example`` is one env's step (no batch or time axis); ``capacity`` transitions
        over all ``num_envs`` envs."""
        steps = capacity // num_envs
        if steps <= 0:
            raise ValueError(f"Replay capacity {capacity} holds no step of {num_envs} envs.")
        zero = lambda: jnp.zeros((), jnp.int32)  # noqa: E731 -- a buffer each: donated apart
        return cls(_allocate((steps, num_envs), example), zero(), zero(), zero(),
                   steps * num_envs)

    @property
    def steps(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]

    @property
    def num_envs(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[1]

    @property
    def transitions(self) -> jax.Array:
        return self.size * self.num_envs

    def add(self, chunk: Any) -> SequenceReplay:
        """Writes ``chunk``, leaves ``[T, num_envs, ...]``: T steps of every env."""
        t = jax.tree.leaves(chunk)[0].shape[0]
        slots = (self.insert + jnp.arange(t)) % self.steps
        data = jax.tree.map(lambda buf, x: buf.at[slots].set(x), self.data, chunk)
        return self.replace(data=data, insert=(self.insert + t) % self.steps,
                            size=jnp.minimum(self.size + t, self.steps),
                            added=self.added + t * self.num_envs)

    @staticmethod
    def join_processes(rows, steps: int):
        """``add``'s arguments from every process (leaves ``[processes, T, envs, ...]``) as
        the ones a single process stepping all their envs would pass (``[T, processes * envs,
        ...]``, the envs in process order, as ``acting.make_pool`` seeds them)."""
        del steps  # the chunk keeps its time axis

        def join(x):
            by_step = np.swapaxes(x, 0, 1)
            return by_step.reshape(by_step.shape[:1] + (-1,) + by_step.shape[3:])

        return jax.tree.map(join, rows)

    def can_sample(self, length: int) -> jax.Array:
        return self.size >= length

    def sample(self, key: jax.Array, batch_size: int, length: int) -> Any:
        """``[batch_size, length, ...]`` windows of consecutive steps of single envs, oldest
        data first in ring order."""
        k_start, k_env = jax.random.split(key)
        starts = jax.random.randint(k_start, (batch_size,), 0,
                                    jnp.maximum(self.size - length + 1, 1))
        envs = jax.random.randint(k_env, (batch_size,), 0, self.num_envs)
        oldest = (self.insert - self.size) % self.steps
        slots = (oldest + starts[:, None] + jnp.arange(length)) % self.steps  # [B, L]
        return jax.tree.map(lambda buf: buf[slots, envs[:, None]], self.data)
