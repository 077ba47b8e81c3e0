"""Sequence ops that respect episode boundaries, for memory backbones (``nets.backbones``).

Every op is unbatched (time on axis 0; callers ``vmap`` over the batch) and takes ``reset``,
a bool per step that is True where a new episode starts: nothing before such a step may
influence it or anything after it. A segment's state carries over to the next segment, so
a sequence processed in pieces (one step at a time when acting, a whole rollout when
training) gives the same outputs as processed at once.

* ``episode_windows``: the last K inputs at every step (a causal window), zero before the
  episode start; a depthwise causal convolution (Mamba) and a frame stack are weighted sums
  or concatenations of it.
* ``window_mask``: which keys a query may attend to in a Transformer-XL segment: itself and
  the previous ``memory`` steps of its own episode (Dai et al. 2019, segment recurrence).
* ``linear_scan``: h_t = a_t * h_{t-1} + b_t with h_{t-1} = 0 at resets, as one
  ``jax.lax.associative_scan`` (Blelloch 1990; the parallel form of Mamba's selective scan,
  Gu & Dao 2023, sec. 3.3.2). A reset is folded into the decay (a_t = 0), which makes the
  associative operator (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2) reset-aware.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _episode_start(reset_ext: jax.Array) -> jax.Array:
    """For each position, the index of the latest reset at or before it (0 if none)."""
    idx = jnp.arange(reset_ext.shape[0])
    return jax.lax.cummax(jnp.where(reset_ext, idx, 0))


def episode_windows(buffer: jax.Array, x: jax.Array, reset: jax.Array):
    """Causal windows of length K = ``buffer.shape[0] + 1``.

    ``buffer`` [K-1, ...]: the inputs before this segment, oldest first, already zero where
    they belong to an earlier episode (as this function returns it). ``x`` [T, ...],
    ``reset`` [T]. Returns ``(windows [T, K, ...], buffer [K-1, ...])``: ``windows[t]`` holds
    x_{t-K+1} .. x_t (oldest first), zero where before the episode start of step t.
    """
    chex.assert_equal_shape_suffix((buffer, x), x.ndim - 1)
    chex.assert_shape(reset, (x.shape[0],))
    lags = buffer.shape[0]
    ext = jnp.concatenate([buffer, x], axis=0)
    start = _episode_start(jnp.concatenate([jnp.zeros(lags, bool), reset]))
    query = jnp.arange(x.shape[0]) + lags
    source = query[:, None] - lags + jnp.arange(lags + 1)[None, :]  # [T, K], oldest first
    valid = source >= start[query][:, None]
    expand = (slice(None), slice(None)) + (None,) * (x.ndim - 1)
    windows = jnp.where(valid[expand], ext[source], 0)
    tail = jnp.arange(ext.shape[0] - lags, ext.shape[0])
    keep = tail >= start[-1]
    new_buffer = jnp.where(keep[(slice(None),) + (None,) * (x.ndim - 1)], ext[tail], 0)
    return windows, new_buffer


def window_mask(carried_valid: jax.Array, reset: jax.Array):
    """Attention mask of a Transformer-XL segment with a memory of M = ``len(carried_valid)``.

    Keys are the M memory slots followed by the T segment steps. Query t may attend to key k
    when k is t itself or one of the M steps before it, in t's episode, and (for memory
    slots) valid. Returns ``(mask [T, M + T], valid [M])``, the latter for the memory the
    segment leaves behind (its last M keys).
    """
    memory, steps = carried_valid.shape[0], reset.shape[0]
    ext_valid = jnp.concatenate([carried_valid, jnp.ones(steps, bool)])
    start = _episode_start(jnp.concatenate([jnp.zeros(memory, bool), reset]))
    key = jnp.arange(memory + steps)[None, :]
    query = (jnp.arange(steps) + memory)[:, None]
    mask = ext_valid[None, :] & (key <= query) & (key >= query - memory) & \
        (key >= start[query[:, 0]][:, None])
    tail = jnp.arange(steps, memory + steps)
    return mask, ext_valid[tail] & (tail >= start[-1])


def episode_positions(position: jax.Array, reset: jax.Array):
    """Step index within the episode of each of T steps, given ``position`` (that of the
    step before the segment plus one). Returns ``(positions [T], next position)``."""
    t = jnp.arange(reset.shape[0])
    last_reset = jax.lax.cummax(jnp.where(reset, t, -1))
    positions = jnp.where(last_reset >= 0, t - last_reset, position + t)
    return positions, positions[-1] + 1


def linear_scan(a: jax.Array, b: jax.Array, h0: jax.Array, reset: jax.Array):
    """h_t = a_t * h_{t-1} + b_t for t = 0..T-1, from h_{-1} = ``h0``, with h_{t-1} taken as
    0 where ``reset[t]``. ``a``, ``b`` [T, ...]; ``h0`` [...]. Returns ``h`` [T, ...]."""
    chex.assert_equal_shape((a, b))
    chex.assert_shape(reset, (a.shape[0],))
    a = a * (~reset).reshape((-1,) + (1,) * (a.ndim - 1))

    def combine(left, right):
        a1, b1 = left
        a2, b2 = right
        return a1 * a2, a2 * b1 + b2

    decay, h = jax.lax.associative_scan(combine, (a, b))
    return h + decay * h0


def linear_scan_reference(a, b, h0, reset):
    """``linear_scan`` as a sequential ``lax.scan`` (the definition; for tests)."""

    def step(h, inputs):
        a_t, b_t, r_t = inputs
        h = a_t * jnp.where(r_t, 0.0, h) + b_t
        return h, h

    _, h = jax.lax.scan(step, h0, (a, b, reset))
    return h
