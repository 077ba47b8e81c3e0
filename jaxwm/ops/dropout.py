"""Inverted dropout from 16 random bits per element (Srivastava et al. 2014, "Dropout: A Simple
Way to Prevent Neural Networks from Overfitting", JMLR; inverted scaling as PyTorch's and
flax's ``Dropout``).

Why not ``flax.linen.Dropout``: it draws a float32 uniform per element, one 32-bit word of
JAX's threefry hash each, and on a CPU that hash is most of the dropout's cost (TD-MPC2's Q
heads drop 1% of 5 x 768 x 512 activations per update). Here each 32-bit word gives two
16-bit uniforms, so the hash runs half as often; what that saves in TD-MPC2's update is
measured in benchmarks/README.md (TD-MPC2, runs 6 and 7).

The rate is quantised to a multiple of 1/65536 (0.01 becomes 655/65536 = 0.0099945) and the
kept activations are divided by the exact keep probability, so the expectation of the output
equals the input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LEVELS = 1 << 16


def drop_threshold(rate: float) -> int:
    """The 16-bit level below which an element is dropped: ``round(rate * 65536)``."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    return round(rate * LEVELS)


def dropout(key: jax.Array, x: jax.Array, rate: float) -> jax.Array:
    """``x`` with each element zeroed with probability ``drop_threshold(rate) / 65536`` and the
    rest divided by the keep probability; ``x`` itself where that probability is 0."""
    threshold = drop_threshold(rate)
    if threshold == 0:
        return x
    words = jax.random.bits(key, ((x.size + 1) // 2,), jnp.uint32)
    halves = jnp.stack([words & 0xFFFF, words >> 16], -1).reshape(-1)[:x.size]
    keep = (halves >= threshold).reshape(x.shape)
    keep_prob = 1.0 - threshold / LEVELS
    return jnp.where(keep, x / keep_prob, 0).astype(x.dtype)
