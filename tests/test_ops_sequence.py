"""Episode-aware sequence ops (jaxwm/ops/sequence.py, selective_scan.py, ssd.py): hand-computed
cases, and every fast form against its sequential definition, with resets inside the sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.ops import selective_scan as ss
from jaxwm.ops import sequence, ssd

RESET = jnp.array([False, False, True, False])


def test_episode_windows_by_hand():
    x = jnp.array([[1.0], [2.0], [3.0], [4.0]])
    windows, buffer = sequence.episode_windows(jnp.array([[5.0], [6.0]]), x, RESET)
    expected = [[5, 6, 1], [6, 1, 2], [0, 0, 3], [0, 3, 4]]  # zero before the reset at t=2
    np.testing.assert_array_equal(windows[..., 0], expected)
    np.testing.assert_array_equal(buffer[:, 0], [3, 4])
    # A reset on the last step leaves only that step in the buffer.
    _, buffer = sequence.episode_windows(buffer, x[:2], jnp.array([False, True]))
    np.testing.assert_array_equal(buffer[:, 0], [0, 2])


def test_window_mask_by_hand():
    # Memory of 2 slots (the first invalid), then 3 steps with a reset at step 1.
    mask, valid = sequence.window_mask(jnp.array([False, True]), jnp.array([False, True, False]))
    expected = [[0, 1, 1, 0, 0],   # step 0: valid memory slot and itself
                [0, 0, 0, 1, 0],   # step 1: a new episode, only itself
                [0, 0, 0, 1, 1]]   # step 2: its episode's steps 1..2
    np.testing.assert_array_equal(mask, np.array(expected, bool))
    np.testing.assert_array_equal(valid, [True, True])


def test_episode_positions_by_hand():
    positions, following = sequence.episode_positions(jnp.array(5), RESET)
    np.testing.assert_array_equal(positions, [5, 6, 0, 1])
    assert int(following) == 2


def test_linear_scan_by_hand_and_against_definition():
    half = jnp.full((3,), 0.5)
    h = sequence.linear_scan(half, jnp.ones(3), jnp.array(4.0), jnp.array([False, False, True]))
    np.testing.assert_allclose(h, [3.0, 2.5, 1.0])  # 0.5*4+1, 0.5*3+1, reset: 0.5*0+1

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    a = jax.random.uniform(k1, (17, 3, 2))
    b = jax.random.normal(k2, (17, 3, 2))
    h0 = jax.random.normal(k3, (3, 2))
    reset = jnp.zeros(17, bool).at[jnp.array([0, 5, 6, 13])].set(True)
    np.testing.assert_allclose(sequence.linear_scan(a, b, h0, reset),
                               sequence.linear_scan_reference(a, b, h0, reset), rtol=1e-5,
                               atol=1e-6)


def _scan_inputs(steps=13, channels=6, state=4, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    x = jax.random.normal(ks[0], (steps, channels))
    dt = jax.nn.softplus(jax.random.normal(ks[1], (steps, channels)))
    A = -jnp.exp(jax.random.normal(ks[2], (channels, state)))
    B = jax.random.normal(ks[3], (steps, state))
    C = jax.random.normal(ks[4], (steps, state))
    h0 = jax.random.normal(ks[5], (channels, state))
    reset = jnp.zeros(steps, bool).at[jnp.array([3, 4, 10])].set(True)
    return x, dt, A, B, C, reset, h0


def _selective_scan_definition(x, dt, A, B, C, reset, h0):
    y, h = [], np.asarray(h0, np.float64)
    for t in range(x.shape[0]):
        h = (0 if reset[t] else np.exp(dt[t][:, None] * A) * h) + \
            (dt[t] * x[t])[:, None] * B[t][None, :]
        y.append(h @ np.asarray(C[t]))
    return np.stack(y), h


@pytest.mark.parametrize("method,chunk", [("associative", 16), ("sequential", 4),
                                          ("sequential", 16)])
def test_selective_scan_matches_its_definition(method, chunk):
    args = _scan_inputs()
    y, last = ss.selective_scan(*args, method=method, chunk=chunk)
    y_ref, last_ref = _selective_scan_definition(*map(np.asarray, args))
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(last, last_ref, rtol=1e-4, atol=1e-5)


def test_selective_scan_sequential_gradients_match_associative():
    # The sequential form has a hand-written VJP (recomputing states by chunk): check it.
    args = _scan_inputs()

    def loss(method, x, dt, A, B, C, h0):
        y, last = ss.selective_scan(x, dt, A, B, C, args[5], h0, method=method, chunk=4)
        return jnp.sum(jnp.sin(y)) + jnp.sum(last ** 2)

    diff = (0, 1, 2, 3, 4, 5)
    inputs = args[:5] + (args[6],)
    grads_seq = jax.grad(lambda *a: loss("sequential", *a), diff)(*inputs)
    grads_assoc = jax.grad(lambda *a: loss("associative", *a), diff)(*inputs)
    for g_seq, g_assoc in zip(grads_seq, grads_assoc, strict=True):
        np.testing.assert_allclose(g_seq, g_assoc, rtol=1e-4, atol=1e-5)


def test_selective_scan_unknown_method():
    with pytest.raises(ValueError, match="associative"):
        ss.selective_scan(*_scan_inputs(), method="parallel")


@pytest.mark.parametrize("chunk", [4, 5, 13])
def test_ssd_chunked_matches_quadratic_and_recurrence(chunk):
    ks = jax.random.split(jax.random.PRNGKey(1), 6)
    steps, heads, headdim, state = 13, 2, 3, 4
    x = jax.random.normal(ks[0], (steps, heads, headdim))
    dt = jax.nn.softplus(jax.random.normal(ks[1], (steps, heads)))
    A = -jnp.exp(jax.random.normal(ks[2], (heads,)))
    B = jax.random.normal(ks[3], (steps, state))
    C = jax.random.normal(ks[4], (steps, state))
    h0 = jax.random.normal(ks[5], (heads, headdim, state))
    reset = jnp.zeros(steps, bool).at[jnp.array([2, 7, 8])].set(True)
    y_ref, s_ref = ssd.ssd_reference(x, dt, A, B, C, reset, h0)
    for y, s in (ssd.ssd_chunked(x, dt, A, B, C, reset, h0, chunk),
                 ssd.ssd_quadratic(x, dt, A, B, C, reset, h0)):
        np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(s, s_ref, rtol=1e-4, atol=1e-5)
