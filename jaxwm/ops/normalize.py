"""Running mean/variance and the observation / reward normalisation built on it.

Parallel variance update of Chan et al. 1979 (as in OpenAI baselines' ``RunningMeanStd``).
Reward normalisation follows gym's ``NormalizeReward`` (used by CleanRL's MuJoCo PPO): rewards
are divided by the running std of the *discounted return*, not of the reward itself.

``PercentileScale`` is DreamerV3's return normalisation for the actor (Hafner et al. 2023).
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


@struct.dataclass
class PercentileScale:
    """EMA of the 5th and 95th percentiles of returns (DreamerV3, "Robust predictions", eq. 11).

    Hafner et al. 2023 (arXiv:2301.04104) scale the actor's advantages by
    S = EMA(Per(R, 95) - Per(R, 5)) and divide by max(1, S): large returns are scaled down but
    small ones are never scaled up, so that near-zero, noisy returns of sparse-reward tasks are
    not amplified. Percentiles rather than a standard deviation make S robust to outlier returns.
    The actor uses (R - v) / scale(); the offset ``low`` cancels in the advantage.
    Like the official code (``retnorm``, ``debias: False``), the EMA starts at 0 uncorrected.
    """

    low: jax.Array
    high: jax.Array

    @classmethod
    def create(cls):
        return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))

    def update(
        self, values: jax.Array, rate: float = 0.01, low_pct: float = 5.0, high_pct: float = 95.0
    ) -> PercentileScale:
        """EMA step toward the percentiles of ``values`` (any shape, pooled over all elements).

        The statistics are not a training signal, hence the stop-gradient.
        """
        values = jax.lax.stop_gradient(jnp.asarray(values, jnp.float32))
        low = (1.0 - rate) * self.low + rate * jnp.percentile(values, low_pct)
        high = (1.0 - rate) * self.high + rate * jnp.percentile(values, high_pct)
        return PercentileScale(low, high)

    def scale(self, limit: float = 1.0) -> jax.Array:
        """max(limit, high - low), the advantage divisor; a constant for the gradient."""
        return jax.lax.stop_gradient(jnp.maximum(limit, self.high - self.low))
