"""Transformer-XL and gated Transformer-XL (GTrXL) backbones with an episodic memory window.

TrXL: Dai et al. 2019, segment-level recurrence: each layer attends over its own inputs of
the previous ``memory`` steps (carried between segments) and the current segment, causally.
Here a step attends to itself and the ``memory`` steps before it *in its own episode*
(``ops.sequence.window_mask``), so a rollout segment, a single acting step and a whole
training sequence all see the same keys. Layers are pre-LayerNorm with a one-layer ReLU
projection, followed by a Dense + ReLU after the last layer, as in BenchNetRL's
``ppo_trxl.py`` (after CleanRL's); positions are the step index within the episode,
sinusoidally encoded and added to the embedded input.

GTrXL: Parisotto et al. 2020, "Stabilizing Transformers for RL", eq. 8-11: each residual
connection becomes a GRU-type gate g(x, y) = (1 - z) x + z h with
r = s(W_r y + U_r x), z = s(W_z y + U_z x - b_g), h = tanh(W_g y + U_g (r x)), the sublayer
output y passed through a ReLU first, and b_g = 2 so each layer starts near the identity.

Differences from BenchNetRL's ``ppo_trxl.py``, on purpose:
* it stores every step's memory window in the rollout buffer and trains each step's query
  alone against frozen memories; here the carry holds only the last ``memory`` layer inputs,
  the rollout stores the carry at its start and training runs whole sequences (gradients
  reach the memories), so memory cost does not grow with the episode length;
* a query attends to itself as well as its memory (theirs never does, and at an episode's
  first step attends to nothing but zeros); standard multi-head attention, scaled by the
  head dimension, with per-head projections (theirs shares Q/K/V weights across heads and
  scales by the model dimension); the positional encoding is added to the layer input,
  not only to the memories;
* GTrXL uses the paper's GRU-type gate; BenchNetRL's is a sigmoid highway gate
  g x + (1 - g) y with g = s(W x + b);
* Adam like every other backbone, not AdamW, and no entropy or learning-rate schedule of
  its own.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.nets.backbones.base import Backbone
from jaxwm.ops.sequence import episode_positions, window_mask


def sinusoidal(positions: jax.Array, dim: int) -> jax.Array:
    """Vaswani et al. 2017, sec. 3.5: [..., dim] encodings of integer positions."""
    half = dim // 2
    freq = jnp.exp(-np.log(10_000.0) * jnp.arange(half) / half)
    angle = positions[..., None].astype(jnp.float32) * freq
    enc = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)
    return jnp.pad(enc, [(0, 0)] * positions.ndim + [(0, dim - 2 * half)])


class GRUGate(nn.Module):
    """GTrXL's gate g(x, y) (Parisotto et al. 2020, eq. 11)."""

    bias: float = 2.0

    @nn.compact
    def __call__(self, x, y):
        dim = x.shape[-1]
        dense = lambda name, bias=False: nn.Dense(dim, use_bias=bias, name=name)  # noqa: E731
        r = nn.sigmoid(dense("w_r")(y) + dense("u_r")(x))
        z = nn.sigmoid(dense("w_z")(y) + dense("u_z")(x)
                       - self.param("b_g", nn.initializers.constant(self.bias), (dim,)))
        h = jnp.tanh(dense("w_g")(y) + dense("u_g")(r * x))
        return (1.0 - z) * x + z * h


class _Layer(nn.Module):
    heads: int
    gated: bool

    @nn.compact
    def __call__(self, h, keys, mask):
        dim = h.shape[-1]
        norm = nn.LayerNorm(name="norm_attention")
        attention = nn.MultiHeadDotProductAttention(num_heads=self.heads, qkv_features=dim)(
            norm(h), norm(keys), mask=mask[:, None])
        if self.gated:
            h = GRUGate(name="gate_attention")(h, nn.relu(attention))
        else:
            h = h + attention
        projection = nn.relu(nn.Dense(dim)(nn.LayerNorm(name="norm_projection")(h)))
        if self.gated:
            return GRUGate(name="gate_projection")(h, projection)
        return h + projection


class TransformerXL(Backbone):
    features: int = 512
    layers: int = 1
    heads: int = 2
    memory: int = 64
    gated: bool = False

    def initialize_carry(self, batch_size: int):
        return {"memory": jnp.zeros((batch_size, self.layers, self.memory, self.features)),
                "valid": jnp.zeros((batch_size, self.memory), bool),
                "position": jnp.zeros((batch_size,), jnp.int32)}

    @nn.compact
    def __call__(self, carry, x, reset):
        positions, next_position = jax.vmap(episode_positions)(carry["position"], reset)
        h = nn.relu(nn.Dense(self.features, name="embed")(x)) + sinusoidal(positions,
                                                                           self.features)
        mask, valid = jax.vmap(window_mask)(carry["valid"], reset)  # [B, T, M + T], [B, M]
        memories = []
        for layer in range(self.layers):
            keys = jnp.concatenate([carry["memory"][:, layer], h], axis=1)  # [B, M + T, D]
            memories.append(keys[:, -self.memory:])
            h = _Layer(self.heads, self.gated, name=f"layer_{layer}")(h, keys, mask)
        new = {"memory": jnp.stack(memories, axis=1), "valid": valid, "position": next_position}
        return new, nn.relu(nn.Dense(self.features, name="post")(h))
