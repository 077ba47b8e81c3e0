"""Networks: the canonical-gradient convolution equals lax's, and the actor-critic's shapes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxwm import backend
from jaxwm.nets.actor_critic import ActorCritic
from jaxwm.nets.conv import (
    Conv2D,
    ConvTranspose2D,
    conv,
    conv_transpose,
    depth_to_kernel,
    depth_to_space,
    kernel_to_depth,
    space_to_depth,
)


def lax_conv(x, w, stride):
    return lax.conv_general_dilated(x, w, (stride, stride), "VALID",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))


# Nature CNN layers, a kernel that is not a multiple of its stride, rows past the last window,
# and a non-square input.
@pytest.mark.parametrize("height, width, kernel, stride", [
    (20, 20, 8, 4), (12, 12, 4, 2), (9, 9, 3, 1), (11, 11, 3, 2), (10, 13, 3, 2), (14, 13, 5, 3)])
def test_conv_and_its_gradients_match_lax(height, width, kernel, stride):
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(kernel * stride), 3)
    x = jax.random.normal(kx, (2, height, width, 3))
    w = jax.random.normal(kw, (kernel, kernel, 3, 5))
    y = lax_conv(x, w, stride)
    np.testing.assert_allclose(conv(x, w, stride), y, rtol=1e-5, atol=1e-5)
    g = jax.random.normal(kg, y.shape)
    loss = lambda f: lambda x, w: jnp.sum(f(x, w, stride) * g)
    dx_ref, dw_ref = jax.grad(loss(lax_conv), argnums=(0, 1))(x, w)
    dx, dw = jax.grad(loss(conv), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-4, atol=1e-4)


def test_space_to_depth_turns_a_strided_conv_into_a_stride_1_conv():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 12, 16, 3))
    w = jax.random.normal(jax.random.PRNGKey(1), (4, 4, 3, 5))
    np.testing.assert_array_equal(depth_to_space(space_to_depth(x, 2), 2), x)
    np.testing.assert_array_equal(depth_to_kernel(kernel_to_depth(w, 2), 2), w)
    assert space_to_depth(x, 2).shape == (2, 6, 8, 12)
    np.testing.assert_allclose(lax_conv(space_to_depth(x, 2), kernel_to_depth(w, 2), 1),
                               lax_conv(x, w, 2), rtol=1e-5, atol=1e-5)


def test_conv_gradient_in_a_rolled_scan_equals_plain_jit():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 20, 20, 4))
    w = jax.random.normal(jax.random.PRNGKey(1), (8, 8, 4, 6))
    grad = jax.grad(lambda w, x: jnp.sum(jnp.sin(conv(x, w, 4))))
    scanned = backend.jit(lambda w, xs: lax.scan(lambda c, x: (c, grad(w, x)), 0, xs)[1])(w, x)
    for i in range(3):
        np.testing.assert_allclose(scanned[i], jax.jit(grad)(w, x[i]), rtol=1e-5, atol=1e-5)


def test_conv2d_parameters_are_portable_between_implementations():
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 16, 16, 4))
    canonical, native = Conv2D(8, 4, 2, canonical_backward=True), Conv2D(8, 4, 2, canonical_backward=False)
    params = canonical.init(jax.random.PRNGKey(1), x)
    assert jax.tree.map(jnp.shape, params) == {"params": {"kernel": (4, 4, 4, 8), "bias": (8,)}}
    flax_conv = nn.Conv(8, (4, 4), strides=2, padding="VALID")
    shapes = jax.tree.map(jnp.shape, params)
    assert jax.tree.map(jnp.shape, flax_conv.init(jax.random.PRNGKey(1), x)) == shapes
    np.testing.assert_allclose(canonical.apply(params, x), native.apply(params, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(canonical.apply(params, x), flax_conv.apply(params, x), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="XLA:CPU option: other backends get no compiler options")
def test_backend_jit_keeps_convolutions_out_of_ynnpack_on_cpu():
    """The CPU option (see jaxwm.backend) must reach the compiler: no YNNPACK convolution."""
    assert backend.compiler_options() == backend.CPU_OPTIONS
    x, w = jnp.ones((8, 20, 20, 4)), jnp.ones((8, 8, 4, 32))
    f = lambda x, w: lax_conv(x, w, 4)
    if "__ynn_fusion" not in jax.jit(f).lower(x, w).compile().as_text():
        pytest.skip("this jaxlib does not hand convolutions to YNNPACK: nothing to keep out")
    compiled = backend.jit(f).lower(x, w).compile().as_text()
    assert "convolution(" in compiled and "__ynn_fusion" not in compiled
    np.testing.assert_allclose(backend.jit(f)(x, w), jax.jit(f)(x, w), rtol=1e-6)


@pytest.mark.parametrize("encoder, obs_shape, discrete", [
    ("mlp", (4,), True), ("mlp", (3,), False), ("nature_cnn", (4, 84, 84), True),
    ("grid_cnn", (3, 7, 7), True)])
def test_actor_critic_shapes(encoder, obs_shape, discrete):
    net = ActorCritic(discrete=discrete, action_dim=3, encoder=encoder,
                      separate_critic=encoder == "mlp")
    dtype = jnp.float32 if encoder == "mlp" else jnp.uint8
    obs, reset = jnp.zeros((2, 5) + obs_shape, dtype), jnp.zeros((2, 5), bool)
    params = net.init(jax.random.PRNGKey(0), net.initialize_carry(2), obs, reset)
    carry, dist, value = net.apply(params, net.initialize_carry(2), obs, reset)
    assert carry == ((), ()) and value.shape == (2, 5)
    action = dist.sample(jax.random.PRNGKey(1))
    assert action.shape == ((2, 5) if discrete else (2, 5, 3))
    assert dist.log_prob(action).shape == (2, 5)


def naive_conv_transpose(x, w, stride, padding, output_padding):
    """PyTorch's ConvTranspose2d by its definition: every input pixel scatters x[i] * w[k]
    to output s*i + k - p."""
    b, h, wd, _ = x.shape
    k, f = w.shape[0], w.shape[3]
    full = np.zeros((b, (h - 1) * stride + k + output_padding, (wd - 1) * stride + k
                     + output_padding, f))
    for i in range(h):
        for j in range(wd):
            full[:, i * stride:i * stride + k, j * stride:j * stride + k] += np.einsum(
                "bc,xycf->bxyf", x[:, i, j], w)
    out_h = (h - 1) * stride - 2 * padding + k + output_padding
    out_w = (wd - 1) * stride - 2 * padding + k + output_padding
    return full[:, padding:padding + out_h, padding:padding + out_w]


@pytest.mark.parametrize("kernel,stride,padding,output_padding",
                         [(4, 2, 1, 0), (3, 2, 1, 1), (5, 2, 0, 0), (6, 2, 0, 0), (3, 1, 1, 0),
                          (4, 2, 1, 1), (3, 3, 0, 2)])
def test_conv_transpose_matches_its_definition_and_autodiff(kernel, stride, padding,
                                                           output_padding):
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 4, 3))
    w = jax.random.normal(jax.random.PRNGKey(1), (kernel, kernel, 3, 2))
    y = conv_transpose(x, w, stride, padding, output_padding)
    np.testing.assert_allclose(y, naive_conv_transpose(np.asarray(x, np.float64),
                                                       np.asarray(w, np.float64), stride,
                                                       padding, output_padding),
                               rtol=1e-4, atol=1e-4)
    loss = lambda canonical: lambda x, w: jnp.sum(jnp.sin(  # noqa: E731
        conv_transpose(x, w, stride, padding, output_padding, canonical)))
    for got, want in zip(jax.grad(loss(True), argnums=(0, 1))(x, w),
                         jax.grad(loss(False), argnums=(0, 1))(x, w), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv_transpose_is_the_transpose_of_a_strided_conv():
    """<conv(x, w), y> = <x, conv_transpose(y, w)> for a VALID conv and padding 0."""
    x = jax.random.normal(jax.random.PRNGKey(2), (1, 10, 10, 3))
    w = jax.random.normal(jax.random.PRNGKey(3), (4, 4, 3, 5))
    y = jax.random.normal(jax.random.PRNGKey(4), lax_conv(x, w, 2).shape)
    np.testing.assert_allclose(jnp.vdot(lax_conv(x, w, 2), y),
                               jnp.vdot(x, conv_transpose(y, jnp.swapaxes(w, 2, 3), 2)),
                               rtol=1e-4)


@pytest.mark.parametrize("kernel,size,dtype", [(5, 1, None), (6, 3, None), (5, 2, jnp.bfloat16)])
def test_conv_transpose_with_flax_kernels_is_flaxs_conv_transpose(kernel, size, dtype):
    """DreamerV3's decoder moved from nn.ConvTranspose to ConvTranspose2D(flax_kernel=True):
    the same parameters must give the same outputs, so its checkpoints keep their meaning."""
    x = jax.random.normal(jax.random.PRNGKey(7), (2, size, size, 6))
    ours = ConvTranspose2D(4, kernel, 2, dtype=dtype, flax_kernel=True)
    flaxs = nn.ConvTranspose(4, (kernel, kernel), (2, 2), "VALID", dtype=dtype)
    params = flaxs.init(jax.random.PRNGKey(8), x)
    params = jax.tree.map(lambda v: v + 0.1, params)  # a bias that is not zero
    assert jax.tree.map(jnp.shape, ours.init(jax.random.PRNGKey(8), x)) == \
        jax.tree.map(jnp.shape, params)
    got, want = ours.apply(params, x), flaxs.apply(params, x)
    assert got.dtype == want.dtype
    tol = 2e-2 if dtype else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tol, atol=tol)


def test_conv2d_padding_is_pytorchs():
    x = jax.random.normal(jax.random.PRNGKey(5), (1, 7, 6, 2))
    layer = Conv2D(4, 4, 2, padding=1)
    params = layer.init(jax.random.PRNGKey(6), x)
    want = lax.conv_general_dilated(x, params["params"]["kernel"], (2, 2), ((1, 1), (1, 1)),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(layer.apply(params, x), want + params["params"]["bias"],
                               rtol=1e-5, atol=1e-5)


def test_a_kernel_larger_than_its_padded_input_is_not_swapped_with_it():
    """SimPLe's 3x3 middle layers over a 3x2 map: folded into the convolution, the pad would
    let XLA swap input and kernel (``ConvOperandSwapper``; a reversed kernel, ~100x slower on
    CPU). Forward and both gradients must keep the activations as the convolution's input."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 2, 8))
    layer = Conv2D(8, 3, padding=1)
    params = layer.init(jax.random.PRNGKey(1), x)
    loss = lambda p, x: jnp.sum(jnp.sin(layer.apply(p, x)))  # noqa: E731
    grads = jax.grad(loss, argnums=(0, 1))
    for fn in (layer.apply, grads):
        hlo = backend.jit(fn).lower(params, x).compile().as_text()
        convs = [line for line in hlo.splitlines() if " convolution(" in line]
        assert convs and not any("rhs_reversal" in line for line in convs), convs
    w = params["params"]["kernel"]
    want = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(layer.apply(params, x), want + params["params"]["bias"],
                               rtol=1e-5, atol=1e-5)
    ref = jax.grad(lambda w, x: jnp.sum(jnp.sin(lax.conv_general_dilated(
        x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))
        + params["params"]["bias"])), argnums=(0, 1))(w, x)
    dp, dx = grads(params, x)
    np.testing.assert_allclose(dp["params"]["kernel"], ref[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, ref[1], rtol=1e-4, atol=1e-4)
