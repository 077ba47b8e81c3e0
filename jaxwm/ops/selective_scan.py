"""Mamba's selective scan with episode resets, in two equal forms.

Gu & Dao 2023, algorithm 2: per channel d and state n, with A_bar_t = exp(dt_t A) (zero-order
hold) and B_bar_t x_t = dt_t B_t x_t,

    h_t = A_bar_t * h_{t-1} + dt_t x_t B_t,      y_t = h_t C_t   (summed over n),

with h_{t-1} taken as 0 where ``reset[t]`` (a new episode).

* ``associative``: A_bar and the inputs are materialised as [T, D, N] and combined with
  ``jax.lax.associative_scan`` (``ops.sequence.linear_scan``, reset-aware): log-depth, the
  parallel form for accelerators.
* ``sequential``: one ``lax.scan`` step per time step computes A_bar_t, the input and y_t
  from [D, N] state only, and a custom VJP runs the adjoint recurrence backwards in time,
  recomputing states chunk by chunk from the states saved at chunk starts (as the fused CUDA
  kernel recomputes rather than stores). Nothing [T, D, N] is ever materialised, which is
  why it is the faster form on CPU (the associative scan's [T, D, N] intermediates are its
  cost there).

Unbatched (callers vmap over the batch): ``x``, ``dt`` [T, D]; ``A`` [D, N] (negative);
``B``, ``C`` [T, N]; ``reset`` [T] bool; ``h0`` [D, N]. Both return ``(y [T, D], h_T)``.
"""

from __future__ import annotations

from functools import partial

import chex
import jax
import jax.numpy as jnp

from jaxwm.ops.sequence import linear_scan

METHODS = ("associative", "sequential")


def _check(x, dt, A, B, C, reset, h0):
    steps, channels = x.shape
    chex.assert_shape(dt, (steps, channels))
    chex.assert_shape(A, (channels, None))
    chex.assert_shape((B, C), (steps, A.shape[1]))
    chex.assert_shape(reset, (steps,))
    chex.assert_shape(h0, A.shape)


def selective_scan(x, dt, A, B, C, reset, h0, method: str = "associative", chunk: int = 16):
    _check(x, dt, A, B, C, reset, h0)
    if method == "associative":
        decay = jnp.exp(dt[..., None] * A)  # [T, D, N]
        drive = (dt * x)[..., None] * B[:, None, :]
        h = linear_scan(decay, drive, h0, reset)
        return jnp.einsum("tdn,tn->td", h, C), h[-1]
    if method != "sequential":
        raise ValueError(f"selective_scan method must be one of {METHODS}, got {method!r}.")
    steps = x.shape[0]
    chunk = min(chunk, steps)
    pad = -steps % chunk
    keep = (~reset).astype(x.dtype)
    if pad:  # padding steps change nothing: no decay (dt = 0 gives exp(0) = 1), no input
        x, dt, B, C = (jnp.pad(v, [(0, pad), (0, 0)]) for v in (x, dt, B, C))
        keep = jnp.pad(keep, (0, pad), constant_values=1.0)
    y, last = _sequential(x, dt, A, B, C, keep, h0, chunk)
    return y[:steps], last


def _step(A, h, inputs):
    x_t, dt_t, b_t, c_t, keep_t = inputs
    h = jnp.exp(dt_t[:, None] * A) * (keep_t * h) + (dt_t * x_t)[:, None] * b_t[None, :]
    return h, h @ c_t


def _chunks(chunk, *arrays):
    return tuple(v.reshape((-1, chunk) + v.shape[1:]) for v in arrays)


def _forward(x, dt, A, B, C, keep, h0, chunk):
    """y [T, D], the last state, and the state entering each chunk [T / chunk, D, N]."""
    def run_chunk(h, inputs):
        end, y = jax.lax.scan(partial(_step, A), h, inputs)
        return end, (y, h)

    last, (y, entering) = jax.lax.scan(run_chunk, h0, _chunks(chunk, x, dt, B, C, keep))
    return y.reshape(x.shape), last, entering


@partial(jax.custom_vjp, nondiff_argnums=(7,))
def _sequential(x, dt, A, B, C, keep, h0, chunk):
    y, last, _ = _forward(x, dt, A, B, C, keep, h0, chunk)
    return y, last


def _sequential_fwd(x, dt, A, B, C, keep, h0, chunk):
    y, last, entering = _forward(x, dt, A, B, C, keep, h0, chunk)
    return (y, last), (x, dt, A, B, C, keep, entering)


def _sequential_bwd(chunk, residuals, cotangents):
    """The adjoint recurrence, backwards in time: g_t = dL/dh_t gathers dy_t C_t and flows to
    h_{t-1} through A_bar_t (not across a reset)."""
    x, dt, A, B, C, keep, entering = residuals
    dy, d_last = cotangents

    def back_chunk(carry, inputs):
        g, d_a = carry
        start, xs, dys = inputs
        _, states = jax.lax.scan(  # recompute this chunk's states h_t
            lambda h, i: (lambda h_new: (h_new, h_new))(_step(A, h, i)[0]), start, xs)
        previous = jnp.concatenate([start[None], states[:-1]])  # h_{t-1}

        def back_step(carry, inputs):
            g, d_a = carry
            (x_t, dt_t, b_t, c_t, keep_t), h_t, h_prev, dy_t = inputs
            g = g + dy_t[:, None] * c_t[None, :]
            decay = jnp.exp(dt_t[:, None] * A)
            g_decay = g * keep_t * h_prev * decay  # dL/d(dt A) through A_bar_t
            d_dt = jnp.sum(g_decay * A, axis=1) + jnp.sum(g * b_t[None, :], axis=1) * x_t
            d_a = d_a + g_decay * dt_t[:, None]
            grads = (dt_t * jnp.sum(g * b_t[None, :], axis=1),  # dx
                     d_dt,
                     (dt_t * x_t) @ g,  # dB
                     dy_t @ h_t,  # dC
                     jnp.sum(g * decay * h_prev))  # dkeep
            return (g * decay * keep_t, d_a), grads

        (g, d_a), grads = jax.lax.scan(back_step, (g, d_a), (xs, states, previous, dys),
                                       reverse=True)
        return (g, d_a), grads

    chunks = _chunks(chunk, x, dt, B, C, keep)
    (g, d_a), grads = jax.lax.scan(
        back_chunk, (d_last, jnp.zeros_like(A)),
        (entering, chunks, _chunks(chunk, dy)[0]), reverse=True)
    dx, d_dt, d_b, d_c, d_keep = (v.reshape((-1,) + v.shape[2:]) for v in grads)
    return dx, d_dt, d_a, d_b, d_c, d_keep, g


_sequential.defvjp(_sequential_fwd, _sequential_bwd)
