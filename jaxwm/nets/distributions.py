"""Action distributions as small pure functions over their parameters.

Categorical for discrete actions; diagonal Gaussian with a state-independent log-std for
continuous actions (Schulman et al. 2017, PPO, sec. 6.1; CleanRL ``ppo_continuous_action``).
The Gaussian is not tanh-squashed: sampled actions are clipped by the environment layer, and
log-probabilities are those of the unclipped sample, as in the references.

``sample_at_temperature`` acts at a temperature T: the categorical's logits divided by T
(softmax temperature; SimPLe evaluates at 0.5) or the Gaussian's standard deviation times T;
T = 0 is the mode, T = 1 the distribution itself.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Categorical:
    logits: jax.Array  # [..., num_actions]

    def sample(self, key):
        return jax.random.categorical(key, self.logits).astype(jnp.int32)

    def mode(self):
        return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)

    def tempered(self, temperature):
        return Categorical(self.logits / temperature)

    def log_prob(self, action):
        log_p = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(log_p, action[..., None].astype(jnp.int32), -1)[..., 0]

    def entropy(self):
        log_p = jax.nn.log_softmax(self.logits)
        return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


@struct.dataclass
class DiagGaussian:
    mean: jax.Array  # [..., action_dim]
    log_std: jax.Array  # broadcastable to mean

    def sample(self, key):
        return self.mean + jnp.exp(self.log_std) * jax.random.normal(key, self.mean.shape)

    def mode(self):
        return self.mean

    def tempered(self, temperature):
        return DiagGaussian(self.mean, self.log_std + jnp.log(temperature))

    def log_prob(self, action):
        z = (action - self.mean) * jnp.exp(-self.log_std)
        per_dim = -0.5 * z**2 - self.log_std - 0.5 * math.log(2 * math.pi)
        return jnp.sum(per_dim, axis=-1)

    def entropy(self):
        per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + self.log_std
        return jnp.sum(jnp.broadcast_to(per_dim, self.mean.shape), axis=-1)


def sample_at_temperature(dist, key, temperature):
    """A sample of ``dist`` at ``temperature`` (a traced scalar, so changing it does not
    recompile); exactly the mode at 0."""
    sample = dist.tempered(jnp.maximum(temperature, 1e-6)).sample(key)
    return jnp.where(temperature > 0, sample, dist.mode())
