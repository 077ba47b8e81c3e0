"""LayerNorm followed by Mish, with a backward pass written out by hand (Ba, Kiros and Hinton
2016, "Layer Normalization"; Misra 2019, "Mish: A Self Regularized Non-Monotonic Activation
Function").

Every hidden layer of TD-MPC2's model ends in LayerNorm -> Mish (``models.tdmpc2``), and on a
CPU much of the update's time beyond its matrix products goes to these layers' backward
over the Q ensemble's activations (5 heads x 3 steps x 256 rows x 512). Differentiating
flax's ``LayerNorm`` and Mish automatically gives XLA a dozen elementwise ops and four
reductions per layer (in the 5M update's compiled program it even materialised LayerNorm's
scale broadcast to the activations' full shape). The backward here is the closed form below:
four sums (two per feature for the scale and bias, two per row for the input's gradient)
and one elementwise expression for the input's gradient. What it saves is measured in
benchmarks/README.md (TD-MPC2).

The forward is flax's ``LayerNorm`` (``use_fast_variance``: var = E[x^2] - E[x]^2, clipped
at 0; epsilon 1e-6) then Mish in ``mish``'s one-exponential form, so outputs equal
``mish(nn.LayerNorm()(x))`` to float32 rounding (tests/test_ops_layer_norm.py).

With x-hat = (x - mean) * r, r = (var + eps)^-1/2, z = x-hat * scale + bias, y = mish(z) and
g = dL/dz = dL/dy * mish'(z), the gradients are (the standard LayerNorm backward):

    dL/dbias  = sum over rows of g
    dL/dscale = sum over rows of g * x-hat
    dL/dx     = r * (h - mean(h) - x-hat * mean(h * x-hat)),  h = g * scale, means per row.

mish'(z) = tanh(sp) + z sigmoid(z) (1 - tanh(sp)^2), sp = softplus(z); with e = exp(z) and
n = e (e + 2), tanh(sp) = n / (n + 2) and sigmoid(z) = e / (1 + e). Above z = 20, where
``mish`` returns z, the derivative is 1.

``centred=True`` is for inputs whose rows have zero mean by construction (a Linear whose
weights ``models.tdmpc2.centre_weights`` centred): the mean is taken as 0, so the forward
makes one row reduction (E[x^2]) instead of two, and the input's gradient drops its
``- mean(h)`` term (the exact gradient of that function).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

EPSILON = 1e-6  # flax.linen.LayerNorm's default
MISH_LINEAR_ABOVE = 20.0  # mish(z) = z to float32 precision above this


def mish(x: jax.Array) -> jax.Array:
    """Mish, ``x tanh(softplus(x))``, with one exponential: ``tanh(log(1 + e^x)) = n / (n + 2)``
    for ``n = e^x (e^x + 2)``. ``jax.nn.mish`` takes an exp, a log1p and a tanh. Equal to
    ``jax.nn.mish`` within 2e-6 (tests/test_ops_layer_norm.py)."""
    e = jnp.exp(jnp.minimum(x, MISH_LINEAR_ABOVE))
    n = e * (e + 2.0)
    return jnp.where(x > MISH_LINEAR_ABOVE, x, x * n / (n + 2.0))


def _mish_slope(z: jax.Array) -> jax.Array:
    """mish'(z) (module docstring)."""
    e = jnp.exp(jnp.minimum(z, MISH_LINEAR_ABOVE))
    n = e * (e + 2.0)
    t = n / (n + 2.0)
    return jnp.where(z > MISH_LINEAR_ABOVE, 1.0, t + z * (e / (1.0 + e)) * (1.0 - t * t))


def mean_of_squares(x):
    """E[x^2] over the last axis. XLA:CPU writes a row reduction over more than 32 features
    as a square pass, then a reduce-window pass, then a reduce; summing blocks of 32 across
    the blocks first, behind an optimisation barrier (so XLA does not merge the two sums back
    into one reduction), gives it one pass that squares and sums as it reads (what that
    saves in planning: benchmarks/README.md, TD-MPC2). Other backends keep the plain mean:
    the trick answers XLA:CPU's reduction rewrite and was not measured elsewhere."""
    n = x.shape[-1]
    if jax.default_backend() != "cpu" or n % 32 or n == 32:
        return jnp.mean(x * x, -1, keepdims=True)
    squares = (x * x).reshape(x.shape[:-1] + (n // 32, 32))
    partial_sums = jax.lax.optimization_barrier(jnp.sum(squares, -2))
    return jnp.sum(partial_sums, -1, keepdims=True) / n


def _normalise(x, scale, bias, centred):
    if centred:
        mean = jnp.zeros(x.shape[:-1] + (1,), x.dtype)
        var = mean_of_squares(x)
    else:
        mean = jnp.mean(x, -1, keepdims=True)
        var = jnp.maximum(jnp.mean(x * x, -1, keepdims=True) - mean * mean, 0.0)
    rstd = jax.lax.rsqrt(var + EPSILON)
    x_hat = (x - mean) * rstd
    return x_hat, x_hat * scale + bias, mean, rstd


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array,
               centred: bool = False) -> jax.Array:
    """LayerNorm alone (flax's arithmetic, differentiated by JAX), for layers that end in
    something other than Mish (TD-MPC2's SimNorm latents)."""
    return _normalise(x, scale, bias, centred)[1]


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm_mish(x: jax.Array, scale: jax.Array, bias: jax.Array,
                    centred: bool = False) -> jax.Array:
    """``mish(LayerNorm(x))`` over the last axis, with ``scale`` and ``bias`` of that size
    (or any shape that broadcasts to ``x``'s, for stacked layers with one scale per layer);
    ``centred``: the rows of ``x`` have zero mean already (module docstring)."""
    return mish(_normalise(x, scale, bias, centred)[1])


def _forward(x, scale, bias, centred):
    _, z, mean, rstd = _normalise(x, scale, bias, centred)
    # Keep x and the row statistics, not x-hat: the backward recomputes x-hat and z in the
    # fusions that read x anyway, so nothing of the activations' size is stored twice.
    return mish(z), (x, scale, bias, mean, rstd)


def _sum_to(v, shape):
    """``v`` summed down to ``shape``, which broadcasts to ``v.shape``: a parameter's gradient
    from its broadcast's (``scale`` may be ``[features]``, or ``[heads, 1, features]`` for
    stacked layers, ``models.tdmpc2.q_logits``)."""
    lead = v.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and v.shape[lead + i] != 1)
    return jnp.sum(v, axes).reshape(shape)


def _backward(centred, residuals, grad_out):
    x, scale, bias, mean, rstd = residuals
    x_hat = (x - mean) * rstd
    g = grad_out * _mish_slope(x_hat * scale + bias)
    d_bias = _sum_to(g, bias.shape)
    d_scale = _sum_to(g * x_hat, scale.shape)
    h = g * scale
    d_x = h - x_hat * jnp.mean(h * x_hat, -1, keepdims=True)
    if not centred:
        d_x = d_x - jnp.mean(h, -1, keepdims=True)
    return rstd * d_x, d_scale, d_bias


layer_norm_mish.defvjp(_forward, _backward)
