"""Running mean/variance and the observation / reward normalisation built on it.

Parallel variance update of Chan et al. 1979 (as in OpenAI baselines' ``RunningMeanStd``).
Reward normalisation follows gym's ``NormalizeReward`` (used by CleanRL's MuJoCo PPO): rewards
are divided by the running std of the *discounted return*, not of the reward itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class RunningMeanStd:
    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape=()):
        return cls(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32),
                   jnp.asarray(1e-4, jnp.float32))

    def update(self, batch: jax.Array) -> RunningMeanStd:
        """``batch`` has one leading axis of samples and the tracked shape after it."""
        batch_mean = jnp.mean(batch, axis=0)
        batch_var = jnp.var(batch, axis=0)
        batch_count = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        return RunningMeanStd(mean, m2 / total, total)

    def normalize(self, x, clip: float = 10.0, epsilon: float = 1e-8):
        return jnp.clip((x - self.mean) / jnp.sqrt(self.var + epsilon), -clip, clip)

    def scale(self, x, clip: float = 10.0, epsilon: float = 1e-8):
        """Divides by the std without centring (reward normalisation)."""
        return jnp.clip(x / jnp.sqrt(self.var + epsilon), -clip, clip)
