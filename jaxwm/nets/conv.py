"""A VALID-padded 2-D convolution whose gradients stay on XLA:CPU's fast convolution path.

Why: XLA:CPU runs a convolution fast (Eigen's spatial convolution) only in the canonical form
``NHWC x HWIO -> NHWC`` without dilations. Autodiff's gradient convolutions are not in that
form: the weight gradient contracts over the batch with a stride-dilated kernel, and the input
gradient convolves a stride-dilated output gradient (3/4 zeros for stride 2) with a transposed
kernel. Under plain ``jit`` XLA's layout pass rewrites them into the canonical form, but inside
a rolled ``lax.scan`` (a while loop) it does not, and they fall back to naive loops, tens of
times slower (``benchmarks/results/conv_grad_cpu.md``). This is what makes CleanRL's scan PPO
crawl on CPU (``benchmarks/REFERENCES.md``).

How: ``conv``'s forward pass is ``lax.conv_general_dilated``; its custom VJP computes both
gradients as dense, stride-1, canonical convolutions, which hold in any loop form:

1. space-to-depth: a stride-s convolution with kernel K (padded with zeros to a multiple of s)
   equals a stride-1 convolution with kernel K/s over ``s x s`` blocks of the input, folded
   into channels (``space_to_depth``, ``kernel_to_depth``); this removes the dilations and the
   wasted multiplications by zero;
2. weight gradient of a stride-1 convolution: the batch plays the role of input channels,
   ``dW[C, KH, KW, F] = conv(x[C, H, W, B], dy[OH, OW, B, F])``;
3. input gradient of a stride-1 convolution: the "full" convolution of ``dy`` with the flipped,
   transposed kernel, ``dx = conv(pad(dy, K-1), flip(W)[KH, KW, F, C])``.

In a rolled scan this is faster than XLA's own rewrite under plain jit
(``benchmarks/results/conv_grad_cpu.md``). The results are the same to float precision.
``jaxwm.backend.jit`` adds the other half of the CPU speed: it keeps XLA from handing
convolutions to YNNPACK, several times slower here.

Parameters are named and laid out as ``flax.linen.Conv``'s (``kernel`` HWIO, ``bias``), so
checkpoints move freely between backends and implementations.
"""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

_DIMS = ("NHWC", "HWIO", "NHWC")


def _conv(x, w, stride=1, padding="VALID"):
    return lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=_DIMS)


def space_to_depth(x: jax.Array, s: int) -> jax.Array:
    """[B, H, W, C] -> [B, H/s, W/s, s*s*C], each s x s block folded into channels (row, col, c)."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // s, s, w // s, s, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h // s, w // s, s * s * c)


def depth_to_space(x: jax.Array, s: int) -> jax.Array:
    """The inverse of ``space_to_depth``."""
    b, h, w, c = x.shape
    x = x.reshape(b, h, w, s, s, c // (s * s)).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h * s, w * s, c // (s * s))


def kernel_to_depth(w: jax.Array, s: int) -> jax.Array:
    """[K, K, C, F] -> [K/s, K/s, s*s*C, F]: ``space_to_depth`` of the kernel, with the output
    features as the batch, so its channel order matches the input's."""
    return jnp.transpose(space_to_depth(jnp.transpose(w, (3, 0, 1, 2)), s), (1, 2, 3, 0))


def depth_to_kernel(w: jax.Array, s: int) -> jax.Array:
    """The inverse of ``kernel_to_depth``."""
    return jnp.transpose(depth_to_space(jnp.transpose(w, (3, 0, 1, 2)), s), (1, 2, 3, 0))


def _fit(x: jax.Array, height: int, width: int) -> jax.Array:
    """Crops or zero-pads the bottom/right of [B, H, W, C] to [B, height, width, C]."""
    x = x[:, :height, :width]
    return jnp.pad(x, ((0, 0), (0, height - x.shape[1]), (0, width - x.shape[2]), (0, 0)))


def _stride1_grads(x, w, dy):
    """(dx, dW) of a VALID stride-1 convolution, as canonical convolutions; x is exactly the
    rows and columns the windows read."""
    k = w.shape[0]
    x_t = jnp.transpose(x, (3, 1, 2, 0))  # [C, H, W, B]
    dy_t = jnp.transpose(dy, (1, 2, 0, 3))  # [OH, OW, B, F]
    dw = jnp.transpose(_conv(x_t, dy_t), (1, 2, 0, 3))
    w_flipped = jnp.transpose(w[::-1, ::-1], (0, 1, 3, 2))  # [K, K, F, C]
    dx = _conv(dy, w_flipped, padding=[(k - 1, k - 1), (k - 1, k - 1)])
    return dx, dw


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def conv(x: jax.Array, w: jax.Array, stride: int) -> jax.Array:
    """VALID convolution ``[B, H, W, C] x [K, K, C, F] -> [B, OH, OW, F]``."""
    return _conv(x, w, stride)


def _conv_fwd(x, w, stride):
    return _conv(x, w, stride), (x, w)


def _conv_bwd(stride, residuals, dy):
    x, w = residuals
    kernel, height, width = w.shape[0], x.shape[1], x.shape[2]
    padded = -(-kernel // stride) * stride  # kernel size rounded up to a multiple of the stride
    out_h, out_w = dy.shape[1:3]
    # The rows/columns the padded windows read: past the last window nothing gets a gradient;
    # the kernel's zero padding may read a few zero rows past the input.
    read_h, read_w = (out_h - 1) * stride + padded, (out_w - 1) * stride + padded
    w_padded = jnp.pad(w, ((0, padded - kernel), (0, padded - kernel), (0, 0), (0, 0)))
    dx, dw = _stride1_grads(space_to_depth(_fit(x, read_h, read_w), stride),
                            kernel_to_depth(w_padded, stride), dy)
    dx = _fit(depth_to_space(dx, stride), height, width)
    dw = depth_to_kernel(dw, stride)[:kernel, :kernel]
    return dx, dw  # XLA drops the input gradient where nobody uses it (the first layer)


conv.defvjp(_conv_fwd, _conv_bwd)


class Conv2D(nn.Module):
    """VALID conv with a square kernel.

    ``canonical_backward=None`` uses ``conv``'s canonical gradients on the CPU backend only;
    other backends (cuDNN on GPU) handle autodiff's gradient convolutions themselves.
    """

    features: int
    kernel: int
    stride: int = 1
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    canonical_backward: bool | None = None
    dtype: jnp.dtype | None = None  # compute dtype (e.g. bfloat16); parameters stay float32

    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", self.kernel_init, (self.kernel, self.kernel, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        if self.dtype is not None:
            x, w, bias = (v.astype(self.dtype) for v in (x, w, bias))
        canonical = self.canonical_backward
        if canonical is None:
            canonical = jax.default_backend() == "cpu"
        y = conv(x, w, self.stride) if canonical else _conv(x, w, self.stride)
        return y + bias
