"""The DreamerV3 optimiser as an ``optax.chain`` (Hafner et al. 2023, arXiv:2301.04104).

The paper trains every network with adaptive gradient clipping (Brock et al. 2021) and LaProp
(Ziyin et al. 2020), i.e. Adam with the RMS normalisation applied BEFORE the momentum, with
eps = 1e-20. The chain mirrors the official ``embodied/jax/opt.py`` / ``Agent._make_opt`` of
danijar/dreamerv3, in this order:

  1. ``clip_by_agc``: per-tensor adaptive gradient clipping;
  2. RMS scaling g / (sqrt(nu_hat) + eps), nu an EMA of g^2 with Adam's bias correction;
  3. momentum: bias-corrected EMA of the normalised updates (LaProp);
  4. learning rate, ramped linearly from 0 over ``warmup`` steps, then constant.

Apart from step 1 this is ``optax.chain(scale_by_rms, ema)``, not ``optax.adam`` (which would
apply the momentum before the RMS division).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def clip_by_agc(agc: float = 0.3, floor: float = 1e-3) -> optax.GradientTransformation:
    """Adaptive gradient clipping PER TENSOR, as the official DreamerV3 code.

    For each leaf: upper = agc * max(floor, ||param||_2); update *= 1 / max(1, ||g||_2 / upper),
    so a gradient larger than ``agc`` times its parameter is rescaled to exactly that norm.
    ``floor`` keeps zero-initialised tensors (biases, zero output layers) trainable.

    Not ``optax.adaptive_grad_clip``: that clips unit-wise (one norm per output unit, as in
    Brock et al.'s NFNets), whereas DreamerV3 takes one norm over the whole tensor; the two
    differ for every matrix. ``agc = 0`` disables clipping (as the official code).
    """

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        if not agc:
            return updates, state
        if params is None:
            raise ValueError("clip_by_agc needs params: call update(grads, state, params).")

        def clip(update, param):
            upper = agc * jnp.maximum(floor, jnp.linalg.norm(param.ravel()))
            return update * (1.0 / jnp.maximum(1.0, jnp.linalg.norm(update.ravel()) / upper))

        return jax.tree.map(clip, updates, params), state

    return optax.GradientTransformation(init_fn, update_fn)


def dreamer_optimizer(
    learning_rate: float = 4e-5,
    agc: float = 0.3,
    agc_floor: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-20,
    warmup: int = 1000,
) -> optax.GradientTransformation:
    """AGC -> RMS scaling -> momentum -> warmed-up learning rate (defaults: the paper's).

    ``warmup = 0`` means a constant learning rate. The update at step k < warmup is scaled by
    learning_rate * k / warmup, so the very first update is 0 (as the official schedule).
    """
    if warmup > 0:
        # linear_schedule holds the end value after ``warmup`` steps: the official code's
        # join of a linear ramp with a constant schedule.
        schedule = optax.linear_schedule(0.0, learning_rate, warmup)
    else:
        schedule = optax.constant_schedule(learning_rate)
    return optax.chain(
        clip_by_agc(agc, agc_floor),
        # eps outside the sqrt, bias-corrected nu: g / (sqrt(nu / (1 - beta2^t)) + eps), as the
        # official ``scale_by_rms``.
        optax.scale_by_rms(decay=beta2, eps=eps, eps_in_sqrt=False, bias_correction=True),
        # mu = beta1 mu + (1 - beta1) u, returned as mu / (1 - beta1^t): the official momentum.
        optax.ema(beta1, debias=True),
        optax.scale_by_learning_rate(schedule),
    )
