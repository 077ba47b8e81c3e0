"""LSTM and GRU backbones (Hochreiter & Schmidhuber 1997; Cho et al. 2014).

Flax's cells inside ``nn.scan`` over time, the carry zeroed at each episode start before the
step is read (as CleanRL's ``ppo_atari_lstm`` does with ``(1 - done) * state``), then a
LayerNorm on the output as in BenchNetRL's ``ppo_lstm.py``. Input weights are orthogonal with
gain 1 and biases zero, as in CleanRL and BenchNetRL; the recurrent weights are orthogonal
(Flax's default).
"""

from __future__ import annotations

import flax.linen as nn
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

    def initialize_carry(self, batch_size: int):
        # Separate buffers for c and h: a carry is donated, and one buffer donated twice fails.
        zeros = lambda: jnp.zeros((batch_size, self.features))  # noqa: E731
        return (zeros(), zeros()) if self.kind == "lstm" else zeros()  # LSTM: (c, h)

    @nn.compact
    def __call__(self, carry, x, reset):
        scan = nn.scan(_ResetCell, variable_broadcast="params", split_rngs={"params": False},
                       in_axes=1, out_axes=1)
        carry, y = scan(self.kind, self.features, name="cell")(carry, (x, reset))
        return carry, nn.LayerNorm(name="norm")(y)
