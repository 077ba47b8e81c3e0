"""Observation encoders: the Nature CNN for pixels, small CNNs for grids, an MLP for vectors.

Nature CNN: Mnih et al. 2015, "Human-level control through deep RL", Methods (32 8x8/4,
64 4x4/2, 64 3x3/1, dense 512), with CleanRL's orthogonal initialisation (gain sqrt 2). Its
convolutions are ``nets.conv.Conv2D`` (gradients that stay fast inside a rolled scan on CPU;
same parameters as ``nn.Conv``).
Pixel observations arrive channels-first uint8 (the envs layer's convention) and are scaled
to [0, 1] here, so buffers can stay uint8.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxwm.nets.conv import Conv2D

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "silu": nn.silu}


def orthogonal(scale: float):
    return nn.initializers.orthogonal(scale)


class MLP(nn.Module):
    """Dense layers with orthogonal init; ``hidden`` may be empty (identity)."""

    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)))(x))
        return x


def _to_nhwc(x):
    """[..., C, H, W] uint8 -> ([N, H, W, C] float in [0, 1], batch_shape)."""
    batch_shape = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    return jnp.transpose(x, (0, 2, 3, 1)).astype(jnp.float32) / 255.0, batch_shape


class NatureCNN(nn.Module):
    """Input [..., C, H, W] uint8 (or float in [0, 255]); output [..., 512]."""

    dense: int = 512
    canonical_backward: bool | None = None  # None: on the CPU backend (see nets.conv)

    @nn.compact
    def __call__(self, x):
        x, batch_shape = _to_nhwc(x)
        for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            conv = Conv2D(features, kernel, stride, orthogonal(np.sqrt(2)),
                          canonical_backward=self.canonical_backward)
            x = nn.relu(conv(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.dense, kernel_init=orthogonal(np.sqrt(2)))(x))
        return x.reshape(batch_shape + (self.dense,))


class GridCNN(nn.Module):
    """Small CNN for MiniGrid's 7x7 egocentric view (Willems' rl-starter-files: 16/32/64 2x2).

    The Nature CNN's 8x8 stride-4 first layer does not fit a 7x7 input. Its convolutions are
    ``Conv2D`` too: autodiff's convolution gradients crawl in PPO's rolled-scan update on CPU
    (``agents.ppo``, "Loop form").
    """

    dense: int = 256

    @nn.compact
    def __call__(self, x):
        x, batch_shape = _to_nhwc(x)
        x = x * 255.0 / 10.0  # MiniGrid cells hold small integer codes, not intensities
        for features in (16, 32, 64):
            conv = Conv2D(features, 2, kernel_init=orthogonal(np.sqrt(2)))
            x = nn.relu(conv(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.dense, kernel_init=orthogonal(np.sqrt(2)))(x))
        return x.reshape(batch_shape + (self.dense,))


class MinAtarCNN(nn.Module):
    """The MinAtar network's encoder (Young & Tian 2019, "MinAtar", Sec. 4: one 3x3 stride-1
    convolution of 16 channels, then a dense layer of 128) for its 10x10 channel frames
    (``envs.native``: channels-first, cells 0 or 255), where the Nature CNN's 8x8 stride-4
    first layer does not fit."""

    dense: int = 128

    @nn.compact
    def __call__(self, x):
        x, batch_shape = _to_nhwc(x)
        x = nn.relu(Conv2D(16, 3, kernel_init=orthogonal(np.sqrt(2)))(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.dense, kernel_init=orthogonal(np.sqrt(2)))(x))
        return x.reshape(batch_shape + (self.dense,))
