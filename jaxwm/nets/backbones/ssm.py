"""Mamba and Mamba-2 backbones, in pure JAX with episode resets.

Mamba: Gu & Dao 2023, "Mamba: linear-time sequence modeling with selective state spaces",
sec. 3 and algorithm 2: input projection to (x, z); a depthwise causal convolution; SiLU;
data-dependent (dt, B, C); zero-order-hold discretisation A_bar = exp(dt A),
B_bar x = dt B x; the selective scan h_t = A_bar_t h_{t-1} + B_bar_t x_t, y = C h + D x; gated
by SiLU(z); output projection. The scan is ``ops.selective_scan``: the associative scan
(``jax.lax.associative_scan`` with a reset-aware operator) or, on CPU by default, a sequential
scan with a hand-written backward pass that never materialises [T, D, N] (faster there);
both give the same values and gradients. The convolution reads
``ops.sequence.episode_windows``. Initialisation follows
``mamba_ssm``: A = -(1..N) per channel (S4D-real), dt in [0.001, 0.1] log-uniformly through an
inverse-softplus bias, D = 1.

Mamba-2: Dao & Gu 2024, "Transformers are SSMs", sec. 7 (the Mamba-2 block): one input
projection to (z, x, B, C, dt); the convolution over (x, B, C); a scalar decay per head
(A per head, initialised uniformly in [1, 16]); the SSD layer ``ops.ssd.ssd_chunked``; a gated
RMSNorm, norm(y * SiLU(z)); output projection. One group of (B, C).

Both sit in BenchNetRL's block (``ppo_mamba.py``): the input projected to ``features`` (u),
out = LayerNorm(u + MLP(mixer(u))) with MLP = Dense(features / 2), ReLU, Dense(features).
Both carry the convolution's last ``conv - 1`` inputs and the SSM state; at an episode start
both are cleared, during acting and during training alike. BenchNetRL's Mamba update instead
runs each minibatch sequence without resets, and (through mamba_ssm ignoring the state it
is handed) from a zero state; ``ppo.update_resets=False`` reproduces the missing resets for
comparison (from the rollout's first state, as the reference intended).
"""

from __future__ import annotations

import math
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.nets.backbones.base import Backbone
from jaxwm.ops.selective_scan import METHODS, selective_scan
from jaxwm.ops.sequence import episode_windows
from jaxwm.ops.ssd import ssd_chunked


def resolve_scan(scan: str) -> str:
    """``auto`` -> ``sequential`` on CPU (the faster there), ``associative`` on accelerators
    (the parallel form)."""
    if scan == "auto":
        return "sequential" if jax.default_backend() == "cpu" else "associative"
    if scan not in METHODS:
        raise ValueError(f"Mamba scan must be 'auto' or one of {METHODS}, got {scan!r}.")
    return scan


def _dt_bias(key, shape, dtype=jnp.float32, dt_min=1e-3, dt_max=0.1):
    """Inverse softplus of dt drawn log-uniformly in [dt_min, dt_max] (mamba_ssm)."""
    dt = jnp.exp(jax.random.uniform(key, shape, dtype) * (np.log(dt_max) - np.log(dt_min))
                 + np.log(dt_min))
    dt = jnp.maximum(dt, 1e-4)
    return dt + jnp.log(-jnp.expm1(-dt))


def _uniform(bound: float):
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, -bound, bound)


class CausalConv(nn.Module):
    """Depthwise causal 1-D convolution over time, reset at episode starts. PyTorch's
    Conv1d initialisation (uniform in +-1/sqrt(width) for a depthwise kernel)."""

    width: int

    @nn.compact
    def __call__(self, x, buffer, reset):
        channels = x.shape[-1]
        kernel = self.param("kernel", _uniform(self.width ** -0.5), (self.width, channels))
        bias = self.param("bias", _uniform(self.width ** -0.5), (channels,))
        windows, buffer = jax.vmap(episode_windows)(buffer, x, reset)  # [B, T, K, C]
        return jnp.einsum("btkc,kc->btc", windows, kernel) + bias, buffer


def _block(u, mixed, features: int):
    """BenchNetRL's residual block around a Mamba mixer."""
    hidden = nn.relu(nn.Dense(max(features // 2, 1), name="post_0")(mixed))
    return nn.LayerNorm(name="post_norm")(u + nn.Dense(features, name="post_1")(hidden))


class Mamba(Backbone):
    features: int = 450  # d_model
    state: int = 64  # d_state (N), BenchNetRL's default (mamba_ssm's is 16)
    conv: int = 4  # d_conv
    expand: int = 1
    scan: str = "auto"  # auto (sequential on CPU, associative elsewhere) | one of METHODS

    @property
    def inner(self) -> int:
        return self.expand * self.features

    def initialize_carry(self, batch_size: int):
        return {"conv": jnp.zeros((batch_size, self.conv - 1, self.inner)),
                "ssm": jnp.zeros((batch_size, self.inner, self.state))}

    @nn.compact
    def __call__(self, carry, x, reset):
        inner, state = self.inner, self.state
        dt_rank = math.ceil(self.features / 16)
        u = nn.Dense(self.features, name="input")(x)
        xs, z = jnp.split(nn.Dense(2 * inner, use_bias=False, name="in_proj")(u), 2, axis=-1)
        xs, conv_buffer = CausalConv(self.conv, name="conv")(xs, carry["conv"], reset)
        xs = nn.silu(xs)
        dt, b, c = jnp.split(nn.Dense(dt_rank + 2 * state, use_bias=False, name="x_proj")(xs),
                             [dt_rank, dt_rank + state], axis=-1)
        dt = nn.softplus(nn.Dense(inner, kernel_init=_uniform(dt_rank ** -0.5),
                                  bias_init=_dt_bias, name="dt_proj")(dt))  # [B, T, D]
        a_log = self.param("A_log", lambda key, shape: jnp.log(jnp.broadcast_to(
            jnp.arange(1, state + 1, dtype=jnp.float32), shape)), (inner, state))
        skip = self.param("D", nn.initializers.ones, (inner,))
        scan = jax.vmap(partial(selective_scan, method=resolve_scan(self.scan)),
                        in_axes=(0, 0, None, 0, 0, 0, 0))
        y, last = scan(xs, dt, -jnp.exp(a_log), b, c, reset, carry["ssm"])
        out = nn.Dense(self.features, use_bias=False, name="out_proj")((y + skip * xs) * nn.silu(z))
        return {"conv": conv_buffer, "ssm": last}, _block(u, out, self.features)


class Mamba2(Backbone):
    features: int = 512  # d_model
    state: int = 64  # d_state (N)
    conv: int = 4
    expand: int = 1
    headdim: int = 64  # P
    chunk: int = 64  # SSD chunk length (shorter sequences use their own length)

    @property
    def inner(self) -> int:
        return self.expand * self.features

    @property
    def heads(self) -> int:
        return self.inner // self.headdim

    def initialize_carry(self, batch_size: int):
        return {"conv": jnp.zeros((batch_size, self.conv - 1, self.inner + 2 * self.state)),
                "ssm": jnp.zeros((batch_size, self.heads, self.headdim, self.state))}

    @nn.compact
    def __call__(self, carry, x, reset):
        inner, state, heads = self.inner, self.state, self.heads
        batch, steps = x.shape[:2]
        u = nn.Dense(self.features, name="input")(x)
        projected = nn.Dense(2 * inner + 2 * state + heads, use_bias=False, name="in_proj")(u)
        z, xbc, dt = jnp.split(projected, [inner, 2 * inner + 2 * state], axis=-1)
        xbc, conv_buffer = CausalConv(self.conv, name="conv")(xbc, carry["conv"], reset)
        xs, b, c = jnp.split(nn.silu(xbc), [inner, inner + state], axis=-1)
        dt = nn.softplus(dt + self.param("dt_bias", _dt_bias, (heads,)))  # [B, T, H]
        a_log = self.param("A_log", lambda key, shape: jnp.log(
            jax.random.uniform(key, shape, minval=1.0, maxval=16.0)), (heads,))
        skip = self.param("D", nn.initializers.ones, (heads,))
        xs = xs.reshape(batch, steps, heads, self.headdim)
        ssd = jax.vmap(ssd_chunked, in_axes=(0, 0, None, 0, 0, 0, 0, None))
        y, ssm_state = ssd(xs, dt, -jnp.exp(a_log), b, c, reset, carry["ssm"],
                           min(self.chunk, steps))
        y = (y + skip[:, None] * xs).reshape(batch, steps, inner)
        y = nn.RMSNorm(epsilon=1e-5, name="norm")(y * nn.silu(z))
        out = nn.Dense(self.features, use_bias=False, name="out_proj")(y)
        return {"conv": conv_buffer, "ssm": ssm_state}, _block(u, out, self.features)
