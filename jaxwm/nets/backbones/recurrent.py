"""LSTM and GRU backbones (Hochreiter & Schmidhuber 1997; Cho et al. 2014).

Flax's cells inside ``nn.scan`` over time, the carry zeroed at each episode start before the
step is read (as CleanRL's ``ppo_atari_lstm`` does with ``(1 - done) * state``), then a
LayerNorm on the output as in BenchNetRL's ``ppo_lstm.py``. Input weights are orthogonal with
gain 1 and biases zero, as in CleanRL and BenchNetRL; the recurrent weights are orthogonal
(Flax's default).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.nets.backbones.base import Backbone, zero_where

CELLS = {"lstm": nn.OptimizedLSTMCell, "gru": nn.GRUCell}


class _ResetCell(nn.Module):
    kind: str
    features: int

    @nn.compact
    def __call__(self, carry, inputs):
        x, reset = inputs
        cell = CELLS[self.kind](self.features, kernel_init=nn.initializers.orthogonal(1.0))
        return cell(zero_where(reset, carry), x)


class RNN(Backbone):
    kind: str = "lstm"  # lstm | gru
    features: int = 256
    norm: bool = True  # the LayerNorm on the output (BenchNetRL's); World Models' MDN-RNN has none

    def initialize_carry(self, batch_size: int):
        # Separate buffers for c and h: a carry is donated, and one buffer donated twice fails.
        zeros = lambda: jnp.zeros((batch_size, self.features))  # noqa: E731
        return (zeros(), zeros()) if self.kind == "lstm" else zeros()  # LSTM: (c, h)

    @nn.compact
    def __call__(self, carry, x, reset):
        scan = nn.scan(_ResetCell, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=1, out_axes=1)
        carry, y = scan(self.kind, self.features, name="cell")(carry, (x, reset))
        return carry, nn.LayerNorm(name="norm")(y) if self.norm else y


class BlockLinear(nn.Module):
    """A block-diagonal dense layer: the input [..., G * I] splits into ``blocks`` groups, each
    mapped by its own [I, features / G] kernel (DreamerV3's ``BlockLinear``); G times fewer
    weights and FLOPs than a dense layer of the same width."""

    features: int
    blocks: int
    dtype: jnp.dtype = jnp.float32  # compute dtype; parameters stay float32

    @nn.compact
    def __call__(self, x):
        x = x.astype(self.dtype)
        groups = x.reshape(x.shape[:-1] + (self.blocks, x.shape[-1] // self.blocks))
        # Fan-in over the whole input (every block's inputs), as the official initialiser's
        # fans of a [G, I, O] kernel (embodied/jax/nets.py ``compute_fans``): weights sqrt(G)
        # smaller than a per-block fan-in would give.
        init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=-2,
                                                out_axis=-1)
        kernel = self.param("kernel", init, (self.blocks, groups.shape[-1],
                                             self.features // self.blocks))
        # One product batched over the groups, the input as its first operand, so that its
        # result is [G, ..., O] with the batch rows inside each group. ``jnp.einsum`` ordered
        # the operands the other way round, and XLA:CPU then kept the result as [G, O, batch],
        # which every elementwise op after it read across the grain: in DreamerV3's scans
        # those reads cost more than the products (``benchmarks/README.md``, DreamerV3).
        y = jax.lax.dot_general(jnp.moveaxis(groups, -2, 0), kernel.astype(self.dtype),
                                (((groups.ndim - 1,), (1,)), ((0,), (0,))))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        return jnp.moveaxis(y, 0, -2).reshape(y.shape[1:-1] + (-1,)) + bias.astype(self.dtype)


class BlockGRU(nn.Module):
    """DreamerV3's recurrent core (Hafner et al. 2023, appendix "Model sizes"; the official
    ``rssm.py::_core``): a GRU whose state of ``features`` units is split into ``blocks``
    groups, each updated from its own group and the shared input by block-diagonal layers
    (``layers`` hidden ones with RMSNorm + SiLU, then the gates). The update gate is
    ``sigmoid(u - 1)``, biased toward keeping the state early in training; the reset gate
    multiplies the candidate's pre-activation (``tanh(r * c)``), as in the official code.

    ``__call__(state [..., features], x [..., F]) -> new state``; one step, no reset (callers
    reset the state where an episode starts, as the RSSM does).
    """

    features: int
    blocks: int = 8
    layers: int = 1
    dtype: jnp.dtype = jnp.float32  # compute dtype; the state is kept in float32

    @nn.compact
    def __call__(self, state, x):
        g = self.blocks
        groups = lambda v: v.reshape(v.shape[:-1] + (g, v.shape[-1] // g))  # noqa: E731
        flat = lambda v: v.reshape(v.shape[:-2] + (-1,))  # noqa: E731
        shared = jnp.broadcast_to(x[..., None, :], x.shape[:-1] + (g, x.shape[-1]))
        h = flat(jnp.concatenate([groups(state), shared], -1))
        for i in range(self.layers):
            h = nn.silu(nn.RMSNorm(dtype=self.dtype, name=f"norm_{i}")(
                BlockLinear(self.features, g, self.dtype, name=f"hidden_{i}")(h)))
        gates = groups(BlockLinear(3 * self.features, g, self.dtype, name="gates")(h))
        gates = gates.astype(jnp.float32)
        reset, candidate, update = (flat(v) for v in jnp.split(gates, 3, -1))
        candidate = jnp.tanh(nn.sigmoid(reset) * candidate)
        update = nn.sigmoid(update - 1.0)
        return update * candidate + (1.0 - update) * state
