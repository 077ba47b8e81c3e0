"""ops.dropout: the rate's quantisation, the kept fraction, the expectation, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.ops.dropout import drop_threshold, dropout


def test_the_rate_is_quantised_to_sixteen_bits():
    assert drop_threshold(0.01) == 655  # 0.0099945
    assert drop_threshold(0.5) == 32768
    assert drop_threshold(0.0) == 0
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        drop_threshold(1.0)


def test_drops_the_rate_and_keeps_the_expectation():
    x = jnp.full((1001, 999), 2.0)  # an odd number of elements: the last word is half used
    y = dropout(jax.random.PRNGKey(0), x, 0.25)
    dropped = float(jnp.mean(y == 0))
    # 1e6 Bernoulli(0.25) draws: standard error 4.3e-4.
    assert abs(dropped - 0.25) < 3e-3
    np.testing.assert_allclose(np.unique(np.asarray(y)), [0.0, 2.0 / 0.75], rtol=1e-6)
    assert abs(float(jnp.mean(y)) - 2.0) < 0.02
    assert y.shape == x.shape and y.dtype == x.dtype


def test_both_halves_of_each_word_are_used_independently():
    y = dropout(jax.random.PRNGKey(1), jnp.ones((2, 200_000)), 0.5).reshape(-1)
    low, high = np.asarray(y[0::2] == 0), np.asarray(y[1::2] == 0)
    assert abs(low.mean() - 0.5) < 0.01 and abs(high.mean() - 0.5) < 0.01
    assert abs(np.mean(low & high) - 0.25) < 0.01  # independent: P(both) = 0.25


def test_same_key_same_mask_and_rate_zero_is_the_identity():
    x = jax.random.normal(jax.random.PRNGKey(2), (64, 33))
    a = dropout(jax.random.PRNGKey(3), x, 0.1)
    np.testing.assert_array_equal(a, dropout(jax.random.PRNGKey(3), x, 0.1))
    assert not np.array_equal(a, dropout(jax.random.PRNGKey(4), x, 0.1))
    assert dropout(jax.random.PRNGKey(3), x, 0.0) is x
