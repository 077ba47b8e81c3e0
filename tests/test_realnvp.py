"""RealNVP: invertibility, log-det against autodiff, normalisation on a 2-D grid, training
with early stopping and its threshold; GORMPO's penalty shapes on known inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.models import realnvp
from jaxwm.models.dynamics import Normalizer


def _random_flow(dim, key=0):
    """A flow with non-zero output layers (the zero init is the identity, too easy a test)."""
    flow = realnvp.RealNVP(dim, num_couplings=4, hidden=(32, 32))
    params = flow.init(jax.random.key(key), jnp.zeros((1, dim)))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(key + 1), len(leaves))
    params = jax.tree.unflatten(tree, [v + 0.1 * jax.random.normal(k, v.shape)
                                       for v, k in zip(leaves, keys, strict=True)])
    return flow, params


def test_inverse_of_forward_is_identity():
    flow, params = _random_flow(5)
    x = jax.random.normal(jax.random.key(3), (64, 5))
    z, _ = flow.apply(params, x)
    back = flow.apply(params, z, method=realnvp.RealNVP.inverse)
    assert float(jnp.max(jnp.abs(z - x))) > 0.1  # the flow does something
    np.testing.assert_allclose(back, x, atol=1e-5)


def test_log_det_equals_autodiff_jacobian():
    flow, params = _random_flow(4)
    x = jax.random.normal(jax.random.key(4), (6, 4))
    _, log_det = flow.apply(params, x)
    one = lambda v: flow.apply(params, v[None])[0][0]  # noqa: E731
    for i in range(6):
        _, want = jnp.linalg.slogdet(jax.jacfwd(one)(x[i]))
        np.testing.assert_allclose(log_det[i], want, rtol=1e-4, atol=1e-4)


def test_density_integrates_to_one_on_a_2d_grid():
    flow, params = _random_flow(2, key=7)
    spec = realnvp.DensitySpec(dim=2, num_couplings=4, hidden=(32, 32))
    scaler = Normalizer(jnp.array([0.5, -1.0]), jnp.array([2.0, 0.5]))
    grid = np.linspace(-15, 15, 601)
    xs, ys = np.meshgrid(grid * 2 + 0.5, grid * 0.5 - 1.0)  # the scaler's frame
    points = jnp.asarray(np.stack([xs.ravel(), ys.ravel()], 1), jnp.float32)
    density = np.exp(np.asarray(realnvp.log_prob(spec, params, scaler, points, chunk=50_000)))
    cell = (grid[1] - grid[0]) ** 2 * 2.0 * 0.5
    assert spec.flow.dim == flow.dim
    np.testing.assert_allclose(density.sum() * cell, 1.0, atol=0.02)


def test_training_lowers_validation_nll_and_sets_the_5_percent_threshold():
    rng = np.random.default_rng(0)
    # A correlated, non-Gaussian 2-D cloud.
    a = rng.normal(size=4000)
    x = np.stack([a, a**2 + 0.1 * rng.normal(size=4000)], 1).astype(np.float32)
    train, val, test = realnvp.split_indices(len(x), rng)
    assert (len(train), len(val), len(test)) == (2400, 800, 800)
    spec = realnvp.DensitySpec(dim=2, num_couplings=4, hidden=(32, 32), batch_size=128)
    x = jnp.asarray(x)
    state = realnvp.init_density(spec, jax.random.key(0), Normalizer.fit(x[train]))
    epoch = jax.jit(lambda s, k: realnvp.train_density_epoch(spec, s, x, jnp.asarray(train),
                                                             jnp.asarray(val), k))
    nlls = []
    for i in range(8):
        state, metrics = epoch(state, jax.random.key(i))
        nlls.append(float(metrics["density/val_nll"]))
    assert nlls[-1] < nlls[0] - 0.2
    logp = realnvp.log_prob(spec, state.patience.best_params, state.scaler, x[val])
    assert abs(float(jnp.mean(logp < state.tau)) - 0.05) < 0.01


def test_penalty_shapes_on_known_inputs():
    tau = 1.0
    logp = jnp.array([2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -100.0])
    # linear: tau - logp clipped at 0, capped at Tukey's fence of all of tau - logp, as
    # GORMPO's code (-1, 0, 1, 2, 3, 4, 101 -> Q1 0.5, Q3 3.5, fence 3.5 + 1.5 * 3 = 8).
    np.testing.assert_allclose(realnvp.penalty("linear", logp, tau),
                               [0, 0, 1, 2, 3, 4, 8], atol=1e-6)
    # Every sample well inside the data (tau - logp = -4..-7, fence -2.5): no penalty, where
    # the code's np.clip(x, 0, -2.5) would give every sample a bonus of 2.5.
    inside = jnp.array([5.0, 6.0, 7.0, 8.0])
    np.testing.assert_allclose(realnvp.penalty("linear", inside, tau), 0.0)
    inv = realnvp.penalty("inverse", logp[:4], tau)
    np.testing.assert_allclose(inv, [0, 0, np.e / (1 + 1e-6), np.e / (np.exp(-1) + 1e-6)],
                               rtol=1e-5)
    np.testing.assert_allclose(realnvp.penalty("tanh", logp[:4], tau),
                               [0, 0, np.tanh(0.1), np.tanh(0.2)], rtol=1e-6)
    soft = realnvp.penalty("softplus", jnp.array([0.0, 2.0, -1000.0]), tau)
    np.testing.assert_allclose(soft, [np.log(2), np.log1p(np.exp(-2)), 1000.0], rtol=1e-6)
    assert np.isfinite(np.asarray(soft)).all()
    with pytest.raises(ValueError, match="valid: \\['linear', 'inverse', 'tanh', 'softplus'\\]"):
        realnvp.penalty("square", logp, tau)
