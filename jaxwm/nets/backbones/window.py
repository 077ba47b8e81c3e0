"""Backbones without learned memory: feed-forward, and a window of the last k inputs.

``FeedForward`` passes features through (the "1 frame" agent). ``FrameStack`` keeps the
last k - 1 inputs in its carry and concatenates them with the current one, zero before the
episode start: the "4 frames" agent of BenchNetRL for vector observations, where envpool
has no frame stack (for Atari, envpool's ``env.frame_stack`` stacks frames instead).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.nets.backbones.base import Backbone
from jaxwm.ops.sequence import episode_windows


class FeedForward(Backbone):
    def initialize_carry(self, batch_size: int):
        del batch_size
        return ()

    @nn.compact
    def __call__(self, carry, x, reset):
        del reset
        return carry, x


def empty_window(batch_size: int, frames: int, size: int) -> jax.Array:
    """A ``FrameStack``'s empty carry (callable without building the module)."""
    return jnp.zeros((batch_size, frames - 1, size))


class FrameStack(Backbone):
    """[B, T, D] -> [B, T, frames * D], oldest first."""

    frames: int = 4
    size: int = 0  # D, needed for the empty carry

    def initialize_carry(self, batch_size: int):
        return empty_window(batch_size, self.frames, self.size)

    @nn.compact
    def __call__(self, carry, x, reset):
        windows, carry = jax.vmap(episode_windows)(carry, x.astype(carry.dtype), reset)
        return carry, windows.reshape(windows.shape[:2] + (-1,))
