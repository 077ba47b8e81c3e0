"""RealNVP density model and GORMPO's density penalties, as pure functions.

Dinh et al. 2017, "Density estimation using Real NVP": a stack of affine coupling layers
``y = x_m + (1 - m) * (x * exp(s(x_m)) + t(x_m))`` with binary masks ``m`` alternating between
the even and the odd coordinates (sec. 3.3-3.4), so each layer is invertible with log-det
``sum((1 - m) * s)`` (eq. 6), and the density is the standard normal's at the output times
the Jacobian (eq. 3). GORMPO's settings (seed system 002): 6 couplings, separate scale and
shift MLPs [256, 256] with ReLU, ``s = tanh(.)``; Adam 1e-3, batch 128, up to 60 epochs with
patience 15, split 0.6 / 0.2 / 0.2; inputs standardised with the training split's mean/std.

GORMPO's threshold ``tau`` is the 5% quantile of the validation log-probabilities, and the
penalty shapes (``penalty``) turn a log-probability into a non-negative reward penalty:

* ``linear``: ``clip(tau - logp, 0, Q3 + 1.5 IQR)``, the cap being Tukey's upper fence of
  ``tau - logp`` over the batch, as GORMPO's code takes it (see ``penalty``);
* ``inverse``: ``e^tau / (e^logp + 1e-6)`` where ``logp < tau``, else 0;
* ``tanh``: ``max(0, tanh(0.1 (tau - logp)))``;
* ``softplus``: ``log(1 + e^-logp)`` (computed as ``softplus(-logp)``, which does not
  overflow; the reference's form does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxwm.models.dynamics import Normalizer
from jaxwm.models.patience import Patience, observe

PENALTY_SHAPES = ("linear", "inverse", "tanh", "softplus")


class _MLP(nn.Module):
    hidden: Sequence[int]
    out_dim: int

    @nn.compact
    def __call__(self, x):
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        # Zero-initialised output: every coupling starts as the identity (stable start).
        return nn.Dense(self.out_dim, kernel_init=nn.initializers.zeros)(x)


class Coupling(nn.Module):
    """One affine coupling layer; ``mask`` 1 where coordinates pass through unchanged."""

    mask: np.ndarray
    hidden: Sequence[int] = (256, 256)

    def setup(self):
        dim = len(self.mask)
        self.scale_net = _MLP(self.hidden, dim)
        self.shift_net = _MLP(self.hidden, dim)

    def _s_t(self, kept):
        return jnp.tanh(self.scale_net(kept)), self.shift_net(kept)

    def __call__(self, x):
        m = jnp.asarray(self.mask, x.dtype)
        s, t = self._s_t(x * m)
        y = x * m + (1 - m) * (x * jnp.exp(s) + t)
        return y, jnp.sum((1 - m) * s, -1)

    def inverse(self, y):
        m = jnp.asarray(self.mask, y.dtype)
        s, t = self._s_t(y * m)
        return y * m + (1 - m) * (y - t) * jnp.exp(-s)


class RealNVP(nn.Module):
    dim: int
    num_couplings: int = 6
    hidden: Sequence[int] = (256, 256)

    def setup(self):
        even = (np.arange(self.dim) % 2 == 0).astype(np.float32)
        self.layers = [Coupling(even if i % 2 == 0 else 1 - even, tuple(self.hidden))
                       for i in range(self.num_couplings)]

    def __call__(self, x):
        """Data -> latent: (z, log|det dz/dx|)."""
        log_det = jnp.zeros(x.shape[:-1])
        for layer in self.layers:
            x, ld = layer(x)
            log_det = log_det + ld
        return x, log_det

    def inverse(self, z):
        for layer in reversed(self.layers):
            z = layer.inverse(z)
        return z

    def log_prob(self, x):
        z, log_det = self(x)
        base = -0.5 * jnp.sum(z**2, -1) - 0.5 * self.dim * np.log(2 * np.pi)
        return base + log_det


def penalty(shape: str, log_prob, tau):
    """GORMPO's penalty of the given shape for log-probabilities ``log_prob`` [B].

    The linear shape's cap ``Q3 + 1.5 IQR`` is Tukey's upper fence of all of ``tau - logp``
    in the batch, as GORMPO's ``TransitionModel._return_kde_penalty`` takes it
    (``np.percentile`` over the whole batch). Where the fence is negative (every sample well
    inside the data) the code's ``np.clip(x, 0, cap)`` returns ``cap`` for every sample, a
    bonus (it happens: ~2 per step from one of three GORMPO densities fitted on Pendulum,
    benchmarks/fidelity/README.md); here the cap is floored at 0, so such a batch is not
    penalised."""
    if shape == "linear":
        raw = tau - log_prob
        q1, q3 = jnp.percentile(raw, 25), jnp.percentile(raw, 75)
        return jnp.clip(raw, 0.0, jnp.maximum(q3 + 1.5 * (q3 - q1), 0.0))
    if shape == "inverse":
        return jnp.where(log_prob < tau, jnp.exp(tau) / (jnp.exp(log_prob) + 1e-6), 0.0)
    if shape == "tanh":
        return jnp.maximum(0.0, jnp.tanh(0.1 * (tau - log_prob)))
    if shape == "softplus":
        return jax.nn.softplus(-log_prob)
    raise ValueError(f"Unknown penalty shape {shape!r}; valid: {list(PENALTY_SHAPES)}.")


@dataclasses.dataclass(frozen=True)
class DensitySpec:
    dim: int
    num_couplings: int = 6
    hidden: tuple[int, ...] = (256, 256)
    learning_rate: float = 1e-3
    batch_size: int = 128
    max_epochs: int = 60
    patience: int = 15
    threshold_quantile: float = 0.05

    @property
    def flow(self) -> RealNVP:
        return RealNVP(self.dim, self.num_couplings, self.hidden)


@struct.dataclass
class DensityState:
    params: dict
    opt_state: optax.OptState
    scaler: Normalizer  # over the training split's inputs
    patience: Patience  # snapshot by validation NLL
    tau: jax.Array  # 5% quantile of the snapshot's validation log-probs
    epochs: jax.Array  # int32 []


def init_density(spec: DensitySpec, key, scaler: Normalizer) -> DensityState:
    params = spec.flow.init(key, jnp.zeros((1, spec.dim)))
    return DensityState(params, optax.adam(spec.learning_rate).init(params), scaler,
                        Patience.start(params), jnp.asarray(-jnp.inf, jnp.float32),
                        jnp.zeros((), jnp.int32))


def log_prob(spec: DensitySpec, params, scaler: Normalizer, x, chunk: int = 8192):
    """Log-density of raw inputs ``x`` [N, dim] (in chunks, so that large N fits), including
    the standardisation's Jacobian so that it is a density over the raw inputs."""
    def one(rows):
        return spec.flow.apply(params, (rows - scaler.mean) / scaler.std,
                               method=RealNVP.log_prob)

    n = x.shape[0]
    if n <= chunk:
        out = one(x)
    else:
        pad = -n % chunk
        padded = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad,) + x.shape[1:])])
        out = jax.lax.map(one, padded.reshape((-1, chunk) + x.shape[1:])).reshape(-1)[:n]
    return out - jnp.sum(jnp.log(scaler.std))


def train_density_epoch(spec: DensitySpec, state: DensityState, x, train_index, val_index,
                        key):
    """One pass over the training split in shuffled minibatches (maximum likelihood), then
    the validation NLL, the snapshot/patience rule and the threshold of the snapshot."""
    tx = optax.adam(spec.learning_rate)
    num_batches = max(1, len(train_index) // spec.batch_size)
    order = jax.random.permutation(key, train_index)[:num_batches * spec.batch_size]

    def step(carry, rows):
        params, opt_state = carry
        batch = (x[rows] - state.scaler.mean) / state.scaler.std
        nll = lambda p: -jnp.mean(spec.flow.apply(p, batch, method=RealNVP.log_prob))  # noqa: E731
        value, grads = jax.value_and_grad(nll)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    (params, opt_state), losses = jax.lax.scan(
        step, (state.params, state.opt_state), order.reshape(num_batches, spec.batch_size))
    val_logp = log_prob(spec, params, state.scaler, x[val_index])
    patience = observe(state.patience, -jnp.mean(val_logp), params, min_improvement=0.0)
    improved = patience.epochs_since_improvement == 0
    tau = jnp.where(improved, jnp.quantile(val_logp, spec.threshold_quantile), state.tau)
    state = state.replace(params=params, opt_state=opt_state, patience=patience, tau=tau,
                          epochs=state.epochs + 1)
    return state, {"losses/density_nll": jnp.mean(losses),
                   "density/val_nll": -jnp.mean(val_logp),
                   "density/best_val_nll": patience.best_loss, "density/threshold": tau,
                   "density/epochs_since_improvement": patience.epochs_since_improvement}


def split_indices(num: int, rng, fractions=(0.6, 0.2, 0.2)):
    """A random (train, validation, test) split of ``range(num)``."""
    perm = rng.permutation(num)
    n_train, n_val = int(num * fractions[0]), int(num * fractions[1])
    return perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
