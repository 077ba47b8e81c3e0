"""The DreamerV3 optimiser: per-tensor AGC, the order of the chain by hand, the warm-up."""

import jax.numpy as jnp
import numpy as np
import optax

from jaxwm.agents.optim import clip_by_agc, dreamer_optimizer


def test_agc_per_tensor():
    params = {
        "big": jnp.array([3.0, 4.0]),  # ||p|| = 5, so the bound is 0.3 * 5 = 1.5
        "small": jnp.array([3.0, 4.0]),
        "zero": jnp.zeros(2),  # bound from the floor: 0.3 * 1e-3
        "matrix": jnp.array([[1.0, 0.0], [0.0, 0.0]]),  # ||p|| = 1, one column is all zero
    }
    grads = {
        "big": jnp.array([30.0, 40.0]),  # norm 50 > 1.5: rescaled to norm 1.5
        "small": jnp.array([0.3, 0.4]),  # norm 0.5 < 1.5: untouched
        "zero": jnp.array([0.0, 1.0]),
        "matrix": jnp.array([[0.0, 0.0], [0.0, 1.0]]),
    }
    opt = clip_by_agc(0.3, 1e-3)
    out, _ = opt.update(grads, opt.init(params), params)
    np.testing.assert_allclose(out["big"], [0.9, 1.2], rtol=1e-6)
    np.testing.assert_array_equal(out["small"], grads["small"])
    np.testing.assert_allclose(out["zero"], [0.0, 3e-4], rtol=1e-6)
    # One norm for the whole tensor: bound 0.3 * 1. (Unit-wise clipping, as
    # optax.adaptive_grad_clip, would bound the second column by its floor: 3e-4.)
    np.testing.assert_allclose(out["matrix"], [[0.0, 0.0], [0.0, 0.3]], rtol=1e-6)


def test_chain_order_by_hand():
    lr, b1, b2, eps, agc = 0.1, 0.9, 0.999, 1e-20, 0.3
    opt = dreamer_optimizer(learning_rate=lr, agc=agc, beta1=b1, beta2=b2, eps=eps, warmup=0)
    param = jnp.asarray(1.0)
    state = opt.init(param)
    nu = mu = 0.0
    p = 1.0
    for t, g in enumerate([0.5, -0.1], start=1):
        # clip -> rms -> momentum -> lr, in numpy float64
        g_clip = g / max(1.0, abs(g) / (agc * max(1e-3, abs(p))))
        nu = b2 * nu + (1 - b2) * g_clip**2
        u = g_clip / (np.sqrt(nu / (1 - b2**t)) + eps)
        mu = b1 * mu + (1 - b1) * u
        expected = -lr * mu / (1 - b1**t)
        update, state = opt.update(jnp.asarray(g), state, param)
        np.testing.assert_allclose(update, expected, rtol=1e-5)
        param = optax.apply_updates(param, update)
        p += expected
        if t == 1:
            # By hand: 0.5 is clipped to 0.3; the first RMS step gives sign(g) = 1, the debiased
            # momentum of one value is that value, so the update is -lr.
            assert abs(g_clip - 0.3) < 1e-12
            np.testing.assert_allclose(update, -lr, rtol=1e-5)
    # Step 2 by hand: p = 0.9, |g| = 0.1 < 0.27 (unclipped); nu = 0.999 * 9e-5 + 0.001 * 0.01,
    # u = -0.1 / sqrt(nu / 0.001999) = -0.44730, mu = 0.09 + 0.1 * u, update = -0.1 * mu / 0.19.
    np.testing.assert_allclose(update, -0.023826, rtol=1e-4)


def test_warmup_is_linear_from_zero():
    opt = dreamer_optimizer(learning_rate=1.0, warmup=4)
    param = jnp.asarray(100.0)  # large, so AGC never clips a gradient of 1
    state = opt.init(param)
    updates = []
    for _ in range(6):
        update, state = opt.update(jnp.asarray(1.0), state, param)
        updates.append(float(update))
    # A constant gradient normalises to 1 and its debiased momentum is 1, so the update is
    # -lr(k) with lr(k) = k / 4 during the warm-up, then constant.
    np.testing.assert_allclose(updates, [0.0, -0.25, -0.5, -0.75, -1.0, -1.0], rtol=1e-5, atol=1e-7)
