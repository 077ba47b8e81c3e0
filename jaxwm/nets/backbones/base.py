"""The interface every memory backbone shares.

A backbone maps features [B, T, F] to features [B, T, H] through a carry, its memory:

* ``initialize_carry(batch)``: the empty memory, a pytree with leading axis ``batch``;
* ``__call__(carry, x [B, T, F], reset [B, T]) -> (carry, y [B, T, H])``: the sequence
  call, used in training over whole rollouts; ``reset`` marks episode starts, where the
  memory is cleared before the step is read, so nothing leaks across episodes;
* ``step(carry, x [B, F], reset [B]) -> (carry, y [B, H])``: one step, used when acting.

Processing a sequence in one call or one step at a time gives the same outputs (tested for
every backbone), so the memory a rollout starts from is all PPO needs to store.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class Backbone(nn.Module):
    """Base class: subclasses define ``features``, ``initialize_carry`` and ``__call__``."""

    def initialize_carry(self, batch_size: int):
        raise NotImplementedError

    def step(self, carry, x, reset):
        carry, y = self(carry, x[:, None], reset[:, None])
        return carry, y[:, 0]


def zero_where(reset: jax.Array, tree):
    """Zeros every leaf (leading axis = batch) where ``reset`` [B] is set."""
    return jax.tree.map(
        lambda leaf: jnp.where(reset.reshape((-1,) + (1,) * (leaf.ndim - 1)), 0, leaf), tree)
