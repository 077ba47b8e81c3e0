"""A VALID-padded 2-D convolution whose backward pass is two GEMMs on CPU.

Why: XLA:CPU runs a convolution's forward pass on its fast path, but the gradient
convolutions (swapped dimension numbers) fall off it, and inside a rolled ``lax.scan`` they
fall much further. On 2 CPU cores a Nature-CNN gradient step at batch 256 took 0.477 s
natively and 0.323 s with this VJP under plain jit, and 4.24 s vs 0.291 s inside a rolled
``lax.scan`` (``benchmarks/results/conv_grad_cpu.md``); results agree to float precision.

How: the forward pass stays ``lax.conv_general_dilated`` (fast on XLA:CPU, and what the
rollout runs); the backward pass is two GEMMs over the patch matrix, ``dW = patches(x)^T dy``
and ``dx = col2im(dy W^T)`` (col2im being the VJP of the patch extraction: pads and adds).
Patches are built by space-to-depth and contiguous slices when the kernel is a multiple of the
stride (8x8/4 and 4x4/2 in the Nature CNN), or by strided slices otherwise.

Parameters are named and laid out as ``flax.linen.Conv``'s (``kernel`` HWIO, ``bias``), so
checkpoints move freely between backends.
"""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

_DIMS = ("NHWC", "HWIO", "NHWC")


def _conv(x, w, stride):
    return lax.conv_general_dilated(x, w, (stride, stride), "VALID", dimension_numbers=_DIMS)


def patches(x: jax.Array, kernel: int, stride: int) -> jax.Array:
    """[B, H, W, C] -> [B, OH, OW, kernel*kernel*C], features ordered (row, col, channel)."""
    b, h, w, c = x.shape
    oh, ow = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    if stride > 1 and kernel % stride == 0:
        k = kernel // stride
        x = x[:, : (oh - 1) * stride + kernel, : (ow - 1) * stride + kernel]
        y = x.reshape(b, x.shape[1] // stride, stride, x.shape[2] // stride, stride, c)
        y = y.transpose(0, 1, 3, 2, 4, 5).reshape(b, y.shape[1], y.shape[3], -1)
        cols = jnp.stack([y[:, i:i + oh, j:j + ow] for i in range(k) for j in range(k)], 3)
        cols = cols.reshape(b, oh, ow, k, k, stride, stride, c).transpose(0, 1, 2, 3, 5, 4, 6, 7)
        return cols.reshape(b, oh, ow, kernel * kernel * c)
    cols = [lax.slice(x, (0, i, j, 0), (b, i + stride * (oh - 1) + 1, j + stride * (ow - 1) + 1, c),
                      (1, stride, stride, 1))
            for i in range(kernel) for j in range(kernel)]
    return jnp.concatenate(cols, -1)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def conv_gemm_grad(x, w, stride):
    return _conv(x, w, stride)


def _fwd(x, w, stride):
    return _conv(x, w, stride), (x, w)


def _bwd(stride, residuals, dy):
    x, w = residuals
    cols, cols_vjp = jax.vjp(lambda x_: patches(x_, w.shape[0], stride), x)
    dw = jnp.einsum("bhwk,bhwf->kf", cols, dy).reshape(w.shape)
    dcols = jnp.einsum("bhwf,kf->bhwk", dy, w.reshape(-1, w.shape[-1]))
    return cols_vjp(dcols)[0], dw  # XLA drops the input gradient where nobody uses it


conv_gemm_grad.defvjp(_fwd, _bwd)


class Conv2D(nn.Module):
    """VALID conv, square kernel. ``gemm_backward=None`` uses the GEMM backward on CPU only."""

    features: int
    kernel: int
    stride: int
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    gemm_backward: bool | None = None

    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", self.kernel_init, (self.kernel, self.kernel, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        use_gemm = self.gemm_backward
        if use_gemm is None:
            use_gemm = jax.default_backend() == "cpu"
        y = conv_gemm_grad(x, w, self.stride) if use_gemm else _conv(x, w, self.stride)
        return y + bias
