"""Networks: the GEMM-gradient convolution equals lax's, and the actor-critic's shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxwm.nets.actor_critic import ActorCritic
from jaxwm.nets.conv import Conv2D, conv_gemm_grad, patches


@pytest.mark.parametrize("size, kernel, stride", [(20, 8, 4), (12, 4, 2), (9, 3, 1), (11, 3, 2)])
def test_conv_and_its_gradients_match_lax(size, kernel, stride):
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (2, size, size, 3))
    w = jax.random.normal(kw, (kernel, kernel, 3, 5))
    ref = lambda x, w: lax.conv_general_dilated(x, w, (stride, stride), "VALID",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = ref(x, w)
    np.testing.assert_allclose(conv_gemm_grad(x, w, stride), y, rtol=1e-5, atol=1e-5)
    p = patches(x, kernel, stride)
    np.testing.assert_allclose(p @ w.reshape(-1, 5), y, rtol=1e-4, atol=1e-4)
    g = jax.random.normal(kg, y.shape)
    loss = lambda f: lambda x, w: jnp.sum(f(x, w) * g)
    dx_ref, dw_ref = jax.grad(loss(ref), argnums=(0, 1))(x, w)
    dx, dw = jax.grad(loss(lambda x, w: conv_gemm_grad(x, w, stride)), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-4, atol=1e-4)


def test_conv2d_parameters_are_portable_between_implementations():
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 16, 16, 4))
    gemm, native = Conv2D(8, 4, 2, gemm_backward=True), Conv2D(8, 4, 2, gemm_backward=False)
    params = gemm.init(jax.random.PRNGKey(1), x)
    assert jax.tree.map(jnp.shape, params) == {"params": {"kernel": (4, 4, 4, 8), "bias": (8,)}}
    np.testing.assert_allclose(gemm.apply(params, x), native.apply(params, x), rtol=1e-5, atol=1e-5)


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
    assert carry == () and value.shape == (2, 5)
    action = dist.sample(jax.random.PRNGKey(1))
    assert action.shape == ((2, 5) if discrete else (2, 5, 3))
    assert dist.log_prob(action).shape == (2, 5)
