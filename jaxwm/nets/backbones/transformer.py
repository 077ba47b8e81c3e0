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
* acting (one query against the whole window) takes attention's query-side form
  (``Attention``), which never projects the memory's keys and values: one step costs
  ~2 H M D multiply-adds for attention instead of ~2 M D^2 (8 envs at BenchNetRL's
  classic-control sizes: 0.10 GFLOP per step instead of 1.2);
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


class Attention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, eq. 1) with the parameters of flax's
    ``nn.MultiHeadDotProductAttention`` (``query``/``key``/``value``/``out``), computed in the
    cheaper of two equal forms.

    Standard: project the S keys and values, then attend: 2 S D^2 + 2 T S D multiply-adds.
    Query-side ("absorbed"): a head's score q_h . (m W_k,h + b_k,h) equals (q_h W_k,h^T) . m plus
    q_h . b_k,h, which is the same for every key and cancels in the softmax; and its output
    sum_s w_s (m_s W_v,h + b_v,h) equals (sum_s w_s m_s) W_v,h + b_v,h since the weights sum to
    one. So the keys need no projection: 2 T D^2 + 2 T H S D. Acting (T = 1, S = memory + 1)
    takes this form, about D / H times cheaper than re-projecting the whole memory window at
    every step; training sequences (T >> D / H) take the standard one.
    """

    heads: int

    @nn.compact
    def __call__(self, queries, keys, mask):
        """``queries`` [B, T, D], ``keys`` [B, S, D] (also the values), ``mask`` [B, T, S]."""
        (t, dim), s = queries.shape[1:], keys.shape[1]
        head_dim = dim // self.heads
        dense = lambda name: nn.DenseGeneral((self.heads, head_dim), name=name)  # noqa: E731
        q = dense("query")(queries) / jnp.sqrt(head_dim).astype(queries.dtype)  # [B, T, H, d]
        key_proj, value_proj = dense("key"), dense("value")
        if 2 * t * dim * (dim + self.heads * s) < 2 * s * dim * (dim + t):
            if self.is_initializing():  # create key/value parameters as flax would
                key_proj(keys[:, :1])
                value_proj(keys[:, :1])
            params = self.variables["params"]
            q_in = jnp.einsum("bthd,Dhd->bthD", q, params["key"]["kernel"])
            logits = jnp.einsum("bthD,bsD->bhts", q_in, keys)
            weights = _masked_softmax(logits, mask)
            mixed = jnp.einsum("bhts,bsD->bthD", weights, keys)
            heads = (jnp.einsum("bthD,Dhd->bthd", mixed, params["value"]["kernel"])
                     + params["value"]["bias"])
        else:
            logits = jnp.einsum("bthd,bshd->bhts", q, key_proj(keys))
            weights = _masked_softmax(logits, mask)
            heads = jnp.einsum("bhts,bshd->bthd", weights, value_proj(keys))
        return nn.DenseGeneral(dim, axis=(-2, -1), name="out")(heads)


def _masked_softmax(logits, mask):
    """Softmax over keys of [B, H, T, S] logits where ``mask`` [B, T, S] allows, as flax's
    ``dot_product_attention`` does it (masked logits set to the dtype's minimum)."""
    logits = jnp.where(mask[:, None], logits, jnp.finfo(logits.dtype).min)
    return jax.nn.softmax(logits, axis=-1)


class _Layer(nn.Module):
    heads: int
    gated: bool

    @nn.compact
    def __call__(self, h, keys, mask):
        dim = h.shape[-1]
        norm = nn.LayerNorm(name="norm_attention")
        # Named as flax's own attention module was, so earlier checkpoints still load.
        attention = Attention(self.heads, name="MultiHeadDotProductAttention_0")(
            norm(h), norm(keys), mask)
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
