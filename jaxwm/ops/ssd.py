"""Mamba-2's state-space duality (SSD) with episode resets, chunked and quadratic.

Dao & Gu 2024, "Transformers are SSMs", sec. 6 (the SSD algorithm, listing 1). Per head h
with a scalar decay, a state S_t [P, N] evolves as

    S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T,        y_t = S_t C_t,

with S_{t-1} taken as 0 where ``reset[t]`` (a new episode). Unrolled,
y_i = sum_{j<=i} L_ij (C_i . B_j) dt_j x_j + exp(sum_{k<=i} dt_k A) [no reset in 0..i] S_{-1} C_i,
with L_ij = exp(sum_{k=j+1..i} dt_k A) where no reset lies in (j, i] and 0 otherwise.

``ssd_chunked`` evaluates that in chunks of ``chunk`` steps (quadratic inside a chunk, a
short recurrence over chunk states between them), O(T chunk) work instead of O(T^2) and
parallel on accelerators; ``ssd_quadratic`` is the dense form and ``ssd_reference`` the
recurrence, both for tests. Decays are handled in log space as cumulative sums, and resets as
cumulative counts, so no -inf arithmetic is needed. Unbatched (callers vmap over the batch):
``x`` [T, H, P], ``dt`` [T, H] (positive), ``A`` [H] (negative), ``B``/``C`` [T, N],
``reset`` [T], ``h0`` [H, P, N].
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _check(x, dt, A, B, C, reset, h0):
    steps, heads, _ = x.shape
    chex.assert_shape(dt, (steps, heads))
    chex.assert_shape(A, (heads,))
    chex.assert_equal_shape((B, C))
    chex.assert_shape(reset, (steps,))
    chex.assert_shape(h0, (heads, x.shape[2], B.shape[1]))


def _decay_matrix(log_a, resets, log_a_query=None, resets_query=None):
    """L[i, j, h] = exp(cs_i - cs_j) where i >= j and no reset in (j, i], else 0, from
    inclusive cumulative sums ``log_a`` [T, H] and reset counts ``resets`` [T]."""
    steps = log_a.shape[0]
    causal = jnp.tril(jnp.ones((steps, steps), bool))
    same_episode = resets[:, None] == resets[None, :]
    diff = log_a[:, None, :] - log_a[None, :, :]
    keep = (causal & same_episode)[..., None]
    return jnp.where(keep, jnp.exp(jnp.where(keep, diff, 0.0)), 0.0)


def ssd_quadratic(x, dt, A, B, C, reset, h0):
    """The dense (attention-like) form: returns ``(y [T, H, P], final state [H, P, N])``."""
    _check(x, dt, A, B, C, reset, h0)
    log_a = jnp.cumsum(dt * A, axis=0)  # [T, H]
    resets = jnp.cumsum(reset)
    decay = _decay_matrix(log_a, resets)  # [T, T, H]
    scores = decay * (C @ B.T)[..., None]  # [T, T, H]
    y = jnp.einsum("ijh,jhp->ihp", scores, x * dt[..., None])
    from_h0 = jnp.where((resets == 0)[:, None], jnp.exp(log_a), 0.0)  # [T, H]
    y = y + from_h0[..., None] * jnp.einsum("hpn,tn->thp", h0, C)
    to_end = jnp.where((resets == resets[-1])[:, None], jnp.exp(log_a[-1] - log_a), 0.0)
    state = jnp.einsum("th,thp,tn->hpn", to_end, x * dt[..., None], B)
    state = state + jnp.where(resets[-1] == 0, jnp.exp(log_a[-1]), 0.0)[:, None, None] * h0
    return y, state


def ssd_chunked(x, dt, A, B, C, reset, h0, chunk: int):
    """SSD in chunks of ``chunk`` steps; T is padded to a multiple of it with steps that
    change nothing (dt = 0: no decay, no input). Returns ``(y [T, H, P], state [H, P, N])``."""
    _check(x, dt, A, B, C, reset, h0)
    steps = x.shape[0]
    pad = -steps % chunk
    if pad:
        x, dt, B, C = (jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1)) for v in (x, dt, B, C))
        reset = jnp.pad(reset, (0, pad))
    n = x.shape[0] // chunk
    split = lambda v: v.reshape((n, chunk) + v.shape[1:])  # noqa: E731
    xdt = split(x * dt[..., None])  # [n, L, H, P]
    B, C = split(B), split(C)  # [n, L, N]
    log_a = jnp.cumsum(split(dt * A), axis=1)  # [n, L, H], inclusive within each chunk
    resets = jnp.cumsum(split(reset.astype(jnp.int32)), axis=1)  # [n, L]

    # Inside each chunk: the dense form.
    decay = jax.vmap(_decay_matrix)(log_a, resets)  # [n, L, L, H]
    scores = decay * jnp.einsum("cin,cjn->cij", C, B)[..., None]
    y = jnp.einsum("cijh,cjhp->cihp", scores, xdt)

    # Each chunk's own contribution to the state at its end, and how much of the state
    # entering it survives to its end (none if an episode starts inside it).
    survive_to_end = (resets == resets[:, -1:])[..., None]  # [n, L, 1]
    to_end = jnp.where(survive_to_end, jnp.exp(log_a[:, -1:] - log_a), 0.0)  # [n, L, H]
    chunk_states = jnp.einsum("clh,clhp,cln->chpn", to_end, xdt, B)
    chunk_decay = jnp.where((resets[:, -1] == 0)[:, None], jnp.exp(log_a[:, -1]), 0.0)  # [n, H]

    def carry_over(state, inputs):
        decay_c, own = inputs
        return decay_c[:, None, None] * state + own, state  # emit the state entering the chunk

    final, entering = jax.lax.scan(carry_over, h0, (chunk_decay, chunk_states))  # [n, H, P, N]
    from_entering = jnp.where((resets == 0)[..., None], jnp.exp(log_a), 0.0)  # [n, L, H]
    y = y + from_entering[..., None] * jnp.einsum("chpn,cln->clhp", entering, C)
    return y.reshape((n * chunk,) + y.shape[2:])[:steps], final


def ssd_reference(x, dt, A, B, C, reset, h0):
    """The recurrence itself, one step at a time (for tests)."""
    _check(x, dt, A, B, C, reset, h0)

    def step(state, inputs):
        x_t, dt_t, B_t, C_t, r_t = inputs
        state = jnp.where(r_t, 0.0, state)
        state = jnp.exp(dt_t * A)[:, None, None] * state + \
            (dt_t[:, None] * x_t)[..., None] * B_t[None, None, :]
        return state, jnp.einsum("hpn,n->hp", state, C_t)

    final, y = jax.lax.scan(step, h0, (x, dt, B, C, reset))
    return y, final
