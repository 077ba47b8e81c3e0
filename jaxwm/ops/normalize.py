"""Running mean/variance and the observation / reward normalisation built on it.

Parallel variance update of Chan et al. 1979 (as in OpenAI baselines' ``RunningMeanStd``).
Reward normalisation follows gym's ``NormalizeReward`` (used by CleanRL's MuJoCo PPO): rewards
are divided by the running std of the *discounted return*, not of the reward itself.

``PercentileScale`` is DreamerV3's return normalisation for the actor (Hafner et al. 2023).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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

    @staticmethod
    def merge_updates(start: RunningMeanStd, updated: RunningMeanStd) -> RunningMeanStd:
        """The statistics of ``start`` followed by every process's samples, given each
        process's ``updated`` = ``start`` + its own samples (leaves stacked on a leading
        process axis, numpy). Exact (Chan et al.'s combination, in float64 on the host): each
        process's batch moments are recovered from the difference with ``start``, pooled, and
        combined with ``start`` once."""
        c0, m0 = np.float64(start.count), np.asarray(start.mean, np.float64)
        m2_0 = np.asarray(start.var, np.float64) * c0
        counts = np.asarray(updated.count, np.float64)  # [P]
        n_all = (counts - c0).sum()
        if not n_all > 0:  # nothing was added (normalisation off): nothing to merge
            return jax.tree.map(jnp.asarray, start)
        c = counts.reshape((-1,) + (1,) * m0.ndim)  # broadcast over the tracked shape
        n = c - c0  # each process's number of samples
        batch_means = (c * np.asarray(updated.mean, np.float64) - c0 * m0) / n
        batch_m2 = (c * np.asarray(updated.var, np.float64) - m2_0
                    - (batch_means - m0) ** 2 * c0 * n / c)
        pooled_mean = (n * batch_means).sum(0) / n_all
        pooled_m2 = (batch_m2 + n * (batch_means - pooled_mean) ** 2).sum(0)
        total = c0 + n_all
        delta = pooled_mean - m0
        mean = m0 + delta * n_all / total
        m2 = m2_0 + pooled_m2 + delta ** 2 * c0 * n_all / total
        return RunningMeanStd(jnp.asarray(mean, jnp.float32), jnp.asarray(m2 / total, jnp.float32),
                              jnp.asarray(total, jnp.float32))

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


@struct.dataclass
class RunningScale:
    """TD-MPC2's Q scale for the policy loss (Hansen et al. 2024, sec. 3.4;
    nicklashansen/tdmpc2 ``common/scale.py``): an EMA, starting at 1, of
    ``max(1, Per(Q, 95) - Per(Q, 5))`` over each batch's Q-values, so the policy's objective
    ``Q / scale`` has a similar size on every task. Unlike ``PercentileScale`` (DreamerV3) the
    EMA runs over the clipped range itself rather than over each percentile, and starts at 1
    rather than 0."""

    value: jax.Array

    @classmethod
    def create(cls):
        return cls(jnp.ones((), jnp.float32))

    def update(self, values: jax.Array, tau: float = 0.01) -> RunningScale:
        values = jax.lax.stop_gradient(jnp.asarray(values, jnp.float32)).reshape(-1)
        spread = jnp.maximum(jnp.percentile(values, 95.0) - jnp.percentile(values, 5.0), 1.0)
        return RunningScale(self.value + tau * (spread - self.value))
