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

One more XLA rewrite is kept out: after folding a zero pad into a convolution,
``ConvOperandSwapper`` swaps input and kernel whenever the kernel covers more positions than
the unpadded input has (a 3x3 kernel over SimPLe's 3x2 bottleneck), and XLA:CPU runs the
swapped convolution far slower (``benchmarks/README.md``, SimPLe). ``pad`` keeps such a pad
a pad.

Transposed convolutions (the decoders of pixel world models, SimPLe's next-frame predictor
stepped in a scan) are written the same way: ``conv_transpose`` computes PyTorch's
``ConvTranspose2d`` as a stride-1 ``conv`` producing ``s*s`` times the features, followed by
``depth_to_space`` (the "sub-pixel convolution" identity, Shi et al. 2016, "Real-Time Single
Image and Video Super-Resolution Using an Efficient Sub-Pixel Convolutional Neural Network",
sec. 2.2). A stride-s transposed convolution written directly is a convolution of the input
dilated by s (``lhs_dilation``), which is not canonical, so inside a loop both it and its
gradients would leave the fast path.
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


def pad(x: jax.Array, low: int, high: int, kernel: int) -> jax.Array:
    """Zero-pads rows and columns of ``[B, H, W, C]`` by ``low`` before and ``high`` after,
    for a ``kernel x kernel`` convolution to read.

    Where the kernel covers more positions than ``x`` has, the padded input goes through an
    optimisation barrier: XLA would fold the pad into the convolution and then, by
    ``ConvOperandSwapper``'s rule (kernel area > input area), swap input and kernel, which
    XLA:CPU runs far slower (SimPLe's 3x3 middle layers over 3x2 maps). The barrier costs one
    copy of a map that small."""
    if not (low or high):
        return x
    padded = jnp.pad(x, ((0, 0), (low, high), (low, high), (0, 0)))
    if kernel * kernel > x.shape[1] * x.shape[2]:
        padded = lax.optimization_barrier(padded)
    return padded


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
    dx = _conv(pad(dy, k - 1, k - 1, k), w_flipped)
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


def conv_transpose(x: jax.Array, w: jax.Array, stride: int, padding: int = 0,
                   output_padding: int = 0, canonical: bool = True) -> jax.Array:
    """PyTorch's ``ConvTranspose2d``: ``[B, H, W, C] x [K, K, C, F] -> [B, OH, OW, F]`` with
    ``out[s*i + k - p] += x[i] * w[k]`` (per spatial axis) and ``OH = (H - 1) s - 2p + K +
    output_padding``.

    Output row ``s*q + t`` only receives kernel rows ``k = s*m + t``, from input row ``q - m``;
    so with the kernel zero-padded to ``K' s`` rows (``K' = ceil(K / s)``), every output phase
    ``t`` is a stride-1 correlation of the input (padded by ``K' - 1``) with kernel rows
    ``s (K' - 1 - j) + t``. All ``s*s`` phases are one stride-1 convolution with ``s*s*F``
    features, interleaved back by ``depth_to_space``; the full result is then cropped by
    ``padding``. ``canonical``: ``conv``'s canonical gradients (else autodiff's)."""
    k, s = w.shape[0], stride
    channels, features = w.shape[2], w.shape[3]
    taps = -(-k // s)
    w = jnp.pad(w, ((0, taps * s - k), (0, taps * s - k), (0, 0), (0, 0)))
    w = w.reshape(taps, s, taps, s, channels, features)[::-1, :, ::-1]  # [j, t, j, t, C, F]
    w = w.transpose(0, 2, 4, 1, 3, 5).reshape(taps, taps, channels, s * s * features)
    x = pad(x, taps - 1, taps - 1, taps)
    y = depth_to_space(conv(x, w, 1) if canonical else _conv(x, w, 1), s)
    out_h = (x.shape[1] - 2 * (taps - 1) - 1) * s - 2 * padding + k + output_padding
    out_w = (x.shape[2] - 2 * (taps - 1) - 1) * s - 2 * padding + k + output_padding
    # output_padding may reach past the full result: those rows receive nothing (zeros).
    return _fit(y[:, padding:, padding:], out_h, out_w)


def _use_canonical(canonical: bool | None) -> bool:
    return jax.default_backend() == "cpu" if canonical is None else canonical


class Conv2D(nn.Module):
    """Conv with a square kernel, VALID after ``padding`` zeros on every side (PyTorch's
    ``padding``).

    ``canonical_backward=None`` uses ``conv``'s canonical gradients on the CPU backend only;
    other backends (cuDNN on GPU) handle autodiff's gradient convolutions themselves.
    """

    features: int
    kernel: int
    stride: int = 1
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    canonical_backward: bool | None = None
    dtype: jnp.dtype | None = None  # compute dtype (e.g. bfloat16); parameters stay float32
    padding: int = 0

    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", self.kernel_init, (self.kernel, self.kernel, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        if self.dtype is not None:
            x, w, bias = (v.astype(self.dtype) for v in (x, w, bias))
        x = pad(x, self.padding, self.padding, self.kernel)
        y = conv(x, w, self.stride) if _use_canonical(self.canonical_backward) else \
            _conv(x, w, self.stride)
        return y + bias


class ConvTranspose2D(nn.Module):
    """``conv_transpose`` as a layer (PyTorch's ``ConvTranspose2d`` semantics); ``kernel``
    is ``[K, K, in, out]``, each input pixel's contribution to the ``K x K`` outputs it
    scatters to.

    ``flax_kernel``: the kernel is stored as ``flax.linen.ConvTranspose`` (``padding="VALID"``,
    ``transpose_kernel=False``) stores it, spatially flipped against PyTorch's, so a module
    that began on ``nn.ConvTranspose`` keeps its parameters' meaning (and its checkpoints)
    while computing through ``conv_transpose``. flax's form is a convolution of the
    stride-dilated input, which XLA:CPU runs slowly, its gradients most of all
    (``benchmarks/README.md``, DreamerV3)."""

    features: int
    kernel: int
    stride: int = 1
    padding: int = 0
    output_padding: int = 0
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    canonical_backward: bool | None = None
    dtype: jnp.dtype | None = None  # compute dtype (e.g. bfloat16); parameters stay float32
    flax_kernel: bool = False

    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", self.kernel_init, (self.kernel, self.kernel, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        if self.flax_kernel:
            w = w[::-1, ::-1]
        if self.dtype is not None:
            x, w, bias = (v.astype(self.dtype) for v in (x, w, bias))
        return conv_transpose(x, w, self.stride, self.padding, self.output_padding,
                              _use_canonical(self.canonical_backward)) + bias


# ----------------------------------------------------------------------------- 1-D, as matmuls


def conv1d(x: jax.Array, w: jax.Array, stride: int = 1, padding: int = 0) -> jax.Array:
    """PyTorch's ``Conv1d`` on channels-last ``x [B, L, C]`` with ``w [K, C, F]``, computed as
    one matrix product over the K shifted windows (im2col), not as an XLA convolution.

    Why: the 1-D convolutions of temporal U-Nets (Diffusion Policy's, over 16-step action
    chunks) have lengths of 4 to 16 and up to 1024 channels, where XLA:CPU's convolution runs
    an order of magnitude below the same arithmetic as a matmul (benchmarks/README.md,
    "Diffusion Policy": one measurement); a matmul also stays fast in any loop form and
    under autodiff. The windows are static strided slices, K copies of a small activation,
    laid side by side tap-major (``[B, L', K * C]``) so that the product's right operand is
    ``w`` itself reshaped (no copy): with the windows stacked on an axis of their own, XLA
    chose to transpose the weights instead, on every call (inside a sampler's scan, every
    step's largest cost at batch 1).
    """
    k, c, f = w.shape
    if padding:
        x = jnp.pad(x, ((0, 0), (padding, padding), (0, 0)))
    length = (x.shape[1] - k) // stride + 1
    span = stride * (length - 1) + 1
    windows = jnp.concatenate([x[:, i:i + span:stride] for i in range(k)], axis=-1)
    return windows @ w.reshape(k * c, f)


def conv_transpose1d(x: jax.Array, w: jax.Array, stride: int, padding: int = 0) -> jax.Array:
    """PyTorch's ``ConvTranspose1d`` on ``x [B, L, C]`` with ``w [K, C, F]``: input step m
    adds ``x[m] @ w[k]`` to output step ``stride * m + k - padding`` (length
    ``(L - 1) * stride - 2 * padding + K``). One matmul per tap (``w[k]`` as stored: one
    product over all taps would need ``w`` transposed to ``[C, K * F]``, a copy per call);
    tap k's rows are spread ``stride`` apart and shifted by k with pads and reshapes (no
    scatter), then summed."""
    k = w.shape[0]
    b, length = x.shape[:2]
    full = (length - 1) * stride + k
    out = 0.0
    for i in range(k):
        tap = x @ w[i]  # [B, L, F]
        spread = jnp.pad(tap[:, :, None], ((0, 0), (0, 0), (0, stride - 1), (0, 0)))
        spread = spread.reshape(b, length * stride, -1)[:, :full - i]
        out = out + jnp.pad(spread, ((0, 0), (i, full - i - spread.shape[1]), (0, 0)))
    return out[:, padding:full - padding]


# PyTorch's default weight init for Conv and Linear layers (kaiming_uniform with a = sqrt(5)):
# U(-1/sqrt(fan_in), 1/sqrt(fan_in)). Uniform draws also compile far faster than flax's
# truncated-normal default, which matters for networks of many small layers.
torch_default_init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")


class Conv1D(nn.Module):
    """``conv1d`` as a layer; ``kernel`` is ``[K, in, out]`` as ``flax.linen.Conv``'s."""

    features: int
    kernel: int
    stride: int = 1
    padding: int = 0
    transpose: bool = False  # ConvTranspose1d instead

    @nn.compact
    def __call__(self, x):
        w = self.param("kernel", torch_default_init, (self.kernel, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        op = conv_transpose1d if self.transpose else conv1d
        return op(x, w, self.stride, self.padding) + bias
