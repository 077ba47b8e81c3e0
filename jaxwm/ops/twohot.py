"""Symlog transform and two-hot discrete regression (DreamerV3's "Robust predictions").

Hafner et al. 2023, "Mastering Diverse Domains through World Models" (arXiv:2301.04104):

* eq. 1:  symlog(x) = sign(x) * log(1 + |x|),   symexp(x) = sign(x) * (exp(|x|) - 1).
  symlog squashes large magnitudes but is the identity near 0, so one set of hyperparameters
  works for rewards and returns of any scale.
* eq. 9:  a scalar y is regressed as a categorical over K fixed bins B (255 bins evenly spaced
  in symlog space on [-20, 20]): the target twohot(symlog(y)) puts weight on the two bins that
  enclose symlog(y), by linear interpolation, and the loss is the cross-entropy to the network's
  softmax. The gradient of a cross-entropy is bounded in size whatever the scale of y, unlike
  a squared error, and the categorical can represent multi-modal targets.

Usage: reward and critic heads output K logits, predict ``symexp(decode(logits, b))`` and train
on ``loss(logits, symlog(y), b)`` with ``b = bins()``.

Two spaces (``Regression``): the paper (and the 2023 release of danijar/dreamerv3) two-hot
encodes symlog(y) over bins evenly spaced in symlog space and predicts symexp(E[bin]), as
TD-MPC2 does; the current official DreamerV3 code (``embodied/jax/heads.py::symexp_twohot``,
``outs.py::TwoHot``) places the bins at symexp of the evenly spaced values (``symexp_bins``),
two-hot encodes y itself and predicts E[bin] in raw space. The two differ where the head is
unsure: probabilities split between returns of 10 and 90 predict 30.6 in symlog space (the
symexp of the mean log) and 50 in raw space (the mean), so symlog-space values sit below the
mean return, most where the critic is least certain.

``encode``, ``decode`` and ``loss`` take any leading batch shape; the bin axis is last.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp


def symlog(x: chex.Array) -> chex.Array:
    """sign(x) * log(1 + |x|) (eq. 1); log1p keeps precision for small |x|."""
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x: chex.Array) -> chex.Array:
    """sign(x) * (exp(|x|) - 1), the inverse of ``symlog`` (eq. 1)."""
    return jnp.sign(x) * jnp.expm1(jnp.abs(x))


def bins(num_bins: int = 255, low: float = -20.0, high: float = 20.0) -> jnp.ndarray:
    """[num_bins] bin positions in symlog space, evenly spaced on [low, high] (paper defaults).

    symexp(20) ~ 5e8 covers any reward or return in practice.
    """
    return jnp.linspace(low, high, num_bins, dtype=jnp.float32)


def symexp_bins(num_bins: int = 255, limit: float = 20.0) -> jnp.ndarray:
    """[num_bins] raw-space bins at symexp of evenly spaced values on [-limit, limit]: one half
    built and mirrored, so the bins are exactly symmetric about 0 (the official
    ``Head.symexp_twohot``; a zero-initialised head then predicts exactly 0 with ``decode``).
    An even count has no bin at 0 (the official code's has two, which two-hot cannot
    interpolate between)."""
    half = symexp(jnp.linspace(-limit, 0.0, num_bins // 2 + 1, dtype=jnp.float32))
    if num_bins % 2:
        return jnp.concatenate([half, -half[:-1][::-1]])
    return jnp.concatenate([half[:-1], -half[:-1][::-1]])


def encode(x: chex.Array, bin_positions: chex.Array) -> chex.Array:
    """Two-hot encoding (eq. 9) of ``x`` [...] over sorted bins [K]; returns weights [..., K].

    With b_k <= x <= b_{k+1}:  w_k = (b_{k+1} - x) / (b_{k+1} - b_k),  w_{k+1} = 1 - w_k, all
    other weights 0, so sum(w) = 1 and sum(w * b) = x. Values outside [b_0, b_{K-1}] put weight
    1 on the nearest edge bin. ``x`` must already be in the bins' space (symlog).
    """
    chex.assert_rank(bin_positions, 1)
    num_bins = bin_positions.shape[0]
    # k: index of the last bin <= x, clipped so that [b_k, b_{k+1}] is a valid interval even
    # outside the range; the clip of the interpolation weight below then handles the edges.
    k = jnp.clip(jnp.sum(bin_positions <= x[..., None], axis=-1) - 1, 0, num_bins - 2)
    lower, upper = bin_positions[k], bin_positions[k + 1]
    w_upper = jnp.clip((x - lower) / (upper - lower), 0.0, 1.0)
    return (
        jax.nn.one_hot(k, num_bins) * (1.0 - w_upper)[..., None]
        + jax.nn.one_hot(k + 1, num_bins) * w_upper[..., None]
    )


def decode(logits: chex.Array, bin_positions: chex.Array) -> chex.Array:
    """Expected bin position under softmax(logits [..., K]); returns [...] in symlog space."""
    chex.assert_rank(bin_positions, 1)
    chex.assert_axis_dimension(logits, -1, bin_positions.shape[0])
    terms = jax.nn.softmax(logits, axis=-1) * bin_positions
    # Add the i-th term from the left to the i-th from the right before summing (as the official
    # code): with symmetric bins and uniform probabilities (a zero-initialised head) the pairs
    # (nearly) cancel, so the prediction starts at the bins' exact mean where a left-to-right
    # sum accumulates ~2e-7. That mean is not exactly 0 (~1e-9 to ~4e-8 by CPU): linspace is
    # not exactly symmetric in float32; under jit XLA may also fuse into FMAs.
    num_bins = bin_positions.shape[0]
    half = num_bins // 2
    left, right = terms[..., :half], terms[..., num_bins - half :]
    middle = terms[..., half : num_bins - half].sum(-1)  # the centre bin when K is odd, else empty
    return middle + (left[..., ::-1] + right).sum(-1)


def loss(logits: chex.Array, target: chex.Array, bin_positions: chex.Array) -> chex.Array:
    """Cross-entropy -sum(twohot(target) * log_softmax(logits)) (eq. 9); returns [...].

    ``target`` [...] is in symlog space (pass ``symlog(y)``) and is a constant: no gradient
    flows into it, it is a regression target.
    """
    chex.assert_shape(logits, (*target.shape, bin_positions.shape[0]))
    weights = encode(jax.lax.stop_gradient(target), bin_positions)
    return -jnp.sum(weights * jax.nn.log_softmax(logits, axis=-1), axis=-1)


SPACES = ("symlog", "symexp")


@dataclasses.dataclass(frozen=True)
class Regression:
    """A two-hot regression head: its bins, its prediction and its loss, in one of
    ``SPACES`` (module docstring): ``symlog`` (the paper, TD-MPC2) or ``symexp`` (the current
    official DreamerV3 code)."""

    space: str = "symlog"
    num_bins: int = 255

    def __post_init__(self):
        if self.space not in SPACES:
            raise ValueError(f"Unknown two-hot space {self.space!r}; choose one of {SPACES}.")

    def bins(self) -> jnp.ndarray:
        return bins(self.num_bins) if self.space == "symlog" else symexp_bins(self.num_bins)

    def predict(self, logits: chex.Array) -> chex.Array:
        """The prediction in raw units from logits [..., K]."""
        expected = decode(logits, self.bins())
        return symexp(expected) if self.space == "symlog" else expected

    def loss(self, logits: chex.Array, y: chex.Array) -> chex.Array:
        """Cross-entropy to the two-hot encoding of ``y`` (raw units, no gradient)."""
        return loss(logits, symlog(y) if self.space == "symlog" else y, self.bins())
