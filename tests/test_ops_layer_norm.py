"""ops.layer_norm: Mish's one-exponential form, and LayerNorm -> Mish with its hand-written
backward against flax's LayerNorm and JAX's own differentiation."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.ops.layer_norm import EPSILON, layer_norm, layer_norm_mish, mean_of_squares, mish


def autodiff_reference(x, scale, bias):
    return mish(nn.LayerNorm().apply({"params": {"scale": scale, "bias": bias}}, x))


def inputs(shape, spread=3.0, offset=1.0):
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    width = shape[-1]
    x = spread * jax.random.normal(k[0], shape) + offset
    scale = 1.0 + 0.3 * jax.random.normal(k[1], (width,))
    bias = 2.0 * jax.random.normal(k[2], (width,))
    weights = jax.random.normal(k[3], shape)  # a loss that weighs every output differently
    return x, scale, bias, weights


def centred_reference(x, scale, bias):
    """LayerNorm with the mean taken as zero (what ``centred=True`` computes)."""
    return mish(x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPSILON) * scale + bias)


def assert_gradients_match(loss_of, args, names, ours=layer_norm_mish,
                           theirs=autodiff_reference):
    """The gradients of ``loss_of(ours)`` and ``loss_of(theirs)`` (JAX's differentiation of
    the same function) with respect to every argument, within float32 rounding of the largest
    entry."""
    ours = jax.grad(loss_of(ours), (0, 1, 2))(*args)
    theirs = jax.grad(loss_of(theirs), (0, 1, 2))(*args)
    for name, a, b in zip(names, ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.abs(b).max()),
                                   err_msg=name)


def test_mish_with_one_exponential_equals_jaxs():
    x = jnp.linspace(-40.0, 40.0, 8001)
    np.testing.assert_allclose(mish(x), jax.nn.mish(x), atol=2e-6)
    np.testing.assert_allclose(jax.vmap(jax.grad(mish))(x), jax.vmap(jax.grad(jax.nn.mish))(x),
                               atol=1e-5)


def test_forward_equals_flax_layer_norm_then_mish():
    x, scale, bias, _ = inputs((3, 7, 64))
    np.testing.assert_allclose(layer_norm_mish(x, scale, bias),
                               autodiff_reference(x, scale, bias), atol=2e-6)


def test_backward_equals_autodiff_for_input_scale_and_bias():
    """Covers both branches of Mish's slope: with bias up to +-6 and a scale up to ~2, some
    normalised inputs pass z = 20, where Mish is the identity."""
    x, scale, bias, weights = inputs((3, 7, 64))
    bias = bias.at[:4].set(25.0)  # these features sit on the linear branch
    def loss(f):
        return lambda x, s, b: jnp.sum(weights * f(x, s, b))
    assert_gradients_match(loss, (x, scale, bias), ("x", "scale", "bias"))


def test_backward_under_vmap_over_stacked_parameters():
    """As in TD-MPC2's Q ensemble: one input, each head with its own scale and bias."""
    x, scale, bias, _ = inputs((5, 32))
    scales, biases = jnp.stack([scale, 2 * scale, -scale]), jnp.stack([bias, -bias, 0 * bias])

    def loss(f):
        return lambda x, s, b: jnp.sum(jax.vmap(lambda s_, b_: f(x, s_, b_))(s, b) ** 2)
    assert_gradients_match(loss, (x, scales, biases), ("x", "scales", "biases"))


def stacked_reference(x, scale, bias):
    """LayerNorm over the last axis, then a scale and bias of any shape that broadcasts."""
    normed = nn.LayerNorm(use_scale=False, use_bias=False).apply({}, x)
    return mish(normed * scale + bias)


def test_backward_with_stacked_parameters_broadcast_over_the_rows():
    """As ``models.tdmpc2.q_logits`` runs its heads: activations ``[rows, heads, width]`` with
    one scale and bias per head ``[heads, width]``, then ``[heads, rows, width]`` with
    ``[heads, 1, width]``; the parameters' gradients sum over the rows only."""
    x, _, _, weights = inputs((24, 3, 64))
    k_scale, k_bias = jax.random.split(jax.random.PRNGKey(5))
    scales = 1.0 + 0.3 * jax.random.normal(k_scale, (3, 64))
    biases = 2.0 * jax.random.normal(k_bias, (3, 64))

    def loss(f):
        return lambda x, s, b: jnp.sum(weights * f(x, s, b))
    assert_gradients_match(loss, (x, scales, biases), ("x", "scales", "biases"),
                           theirs=stacked_reference)
    heads_first = jnp.swapaxes(x, 0, 1)
    weights = jnp.swapaxes(weights, 0, 1)
    assert_gradients_match(loss, (heads_first, scales[:, None], biases[:, None]),
                           ("x", "scales", "biases"), theirs=stacked_reference)


def test_a_constant_row_gives_finite_gradients():
    """Zero variance: LayerNorm's epsilon keeps the row's gradient finite, as autodiff's."""
    x = jnp.ones((2, 16))
    scale, bias = jnp.ones(16), jnp.zeros(16)
    ours = jax.grad(lambda x: jnp.sum(layer_norm_mish(x, scale, bias) * jnp.arange(16.0)))(x)
    theirs = jax.grad(lambda x: jnp.sum(autodiff_reference(x, scale, bias) * jnp.arange(16.0)))(x)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_centred_equals_layer_norm_on_rows_of_zero_mean():
    x, scale, bias, _ = inputs((3, 7, 64))
    x = x - jnp.mean(x, -1, keepdims=True)
    np.testing.assert_allclose(layer_norm_mish(x, scale, bias, True),
                               autodiff_reference(x, scale, bias), atol=2e-6)
    np.testing.assert_allclose(
        layer_norm(x, scale, bias, True),
        nn.LayerNorm().apply({"params": {"scale": scale, "bias": bias}}, x), atol=2e-6)


def test_centred_backward_equals_autodiff_of_the_mean_free_function():
    """Its own gradient, not LayerNorm's: the input here is off-centre on purpose, where the
    two differ by LayerNorm's ``- mean(h)`` term."""
    x, scale, bias, weights = inputs((3, 7, 64))

    def loss(f):
        return lambda x, s, b: jnp.sum(weights * f(x, s, b))
    assert_gradients_match(loss, (x, scale, bias), ("x", "scale", "bias"),
                           ours=lambda x, s, b: layer_norm_mish(x, s, b, True),
                           theirs=centred_reference)


def test_centred_statistics_in_blocks_equal_the_plainmean_of_squares():
    """Widths over 32 take E[x^2] as partial sums of 32 (one pass on XLA:CPU): the same value,
    under vmap and differentiation, as the plain mean."""
    x = 2.0 * jax.random.normal(jax.random.PRNGKey(0), (3, 4, 512))
    np.testing.assert_allclose(mean_of_squares(x), jnp.mean(x * x, -1, keepdims=True),
                               rtol=1e-5)
    np.testing.assert_allclose(jax.vmap(mean_of_squares)(x), mean_of_squares(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(mean_of_squares(x)))(x),
                               2 * x / 512, rtol=1e-5)
