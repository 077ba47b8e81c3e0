"""Diffusion over action chunks: the noise schedule, DDPM and DDIM steps, and the noise model.

Diffusion Policy (Chi et al. 2023, "Diffusion Policy: Visuomotor Policy Learning via Action
Diffusion", RSS; code real-stanford/diffusion_policy) denoises a chunk of ``horizon`` actions
conditioned on the last ``n_obs_steps`` observations, with the DDPM of Ho et al. 2020
("Denoising Diffusion Probabilistic Models") as its training objective and sampler:

* forward noising (Ho et al. eq. 4): ``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps``;
* loss (Ho et al. eq. 14, "epsilon prediction"): ``|| eps - eps_theta(x_t, t, obs) ||^2``;
* the ``squaredcos_cap_v2`` schedule (Nichol & Dhariwal 2021, "Improved DDPM", eq. 17):
  ``abar(t) = cos((t/T + 0.008) / 1.008 * pi / 2)^2``, ``beta_t = min(1 - abar(t+1)/abar(t),
  0.999)``, as diffusers' ``betas_for_alpha_bar``;
* DDPM reverse step (Ho et al. eqs. 6-7, diffusers' ``DDPMScheduler.step`` with
  ``variance_type="fixed_small"``, ``clip_sample=True``): ``x_0`` predicted from ``eps`` and
  clipped to [-1, 1], then the posterior ``q(x_{t-1} | x_t, x_0)``'s mean and variance;
* DDIM step (Song et al. 2021, "Denoising Diffusion Implicit Models", eq. 12; diffusers'
  ``DDIMScheduler.step``, ``set_alpha_to_one=True``): ``x_{t'} = sqrt(abar_t') x_0 +
  sqrt(1 - abar_t' - sigma^2) eps + sigma z``, ``sigma = eta sqrt((1-abar_t')/(1-abar_t)
  (1 - abar_t/abar_t'))``; eta = 0 (the reference's) is deterministic, and eta = 1 with every
  training step is DDPM again. One deliberate difference: with clipped samples the noise
  direction is recomputed from the clipped x_0 (diffusers' ``use_clipped_model_output=True``;
  the reference calls ``step`` with its default, False, which keeps the model's eps). Only
  this keeps x_0 and eps consistent, and DDIM at eta = 1 equal to DDPM.

The whole reverse process is one ``lax.scan`` (``sample``).

The noise model is the reference's ``ConditionalUnet1D`` (``diffusion_policy/model/diffusion/
conditional_unet1d.py``): a 1-D temporal U-Net over the chunk (time is the convolution axis,
actions the channels), residual blocks of two Conv1d -> GroupNorm -> Mish, FiLM conditioning
(Perez et al. 2018: a per-channel scale and bias from the condition, ``cond_predict_scale``)
on the diffusion step's sinusoidal embedding joined with the flattened observation history,
stride-2 Conv1d down and ConvTranspose1d up, skip connections. Its convolutions are
``nets.conv.Conv1D``, PyTorch's Conv1d / ConvTranspose1d computed as matmuls (why: there).
``MLPChunk`` is the plain behaviour-cloning baseline that regresses the same chunk directly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from jaxwm.nets.conv import Conv1D, torch_default_init

CLIP = 1.0  # actions are normalised to [-1, 1]; the reference's clip_sample_range


# ----------------------------------------------------------------------------- schedule


@struct.dataclass
class Schedule:
    """``betas``, ``alphas_cumprod`` (abar) over the ``T`` training steps."""

    betas: jax.Array
    alphas_cumprod: jax.Array

    @property
    def num_steps(self) -> int:
        return self.betas.shape[0]


def squaredcos_cap_v2(num_steps: int, max_beta: float = 0.999) -> Schedule:
    """Nichol & Dhariwal's cosine schedule, as diffusers' ``betas_for_alpha_bar``."""
    def abar(t):
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = [min(1 - abar((i + 1) / num_steps) / abar(i / num_steps), max_beta)
             for i in range(num_steps)]
    betas = jnp.asarray(betas, jnp.float32)
    return Schedule(betas, jnp.cumprod(1.0 - betas))


def add_noise(schedule: Schedule, x0: jax.Array, noise: jax.Array, t: jax.Array) -> jax.Array:
    """Forward noising ``q(x_t | x_0)`` at integer step ``t`` (per example: ``t`` [B])."""
    abar = schedule.alphas_cumprod[t].reshape(t.shape + (1,) * (x0.ndim - t.ndim))
    return jnp.sqrt(abar) * x0 + jnp.sqrt(1.0 - abar) * noise


def predict_x0(x_t, eps, abar_t, clip: bool):
    x0 = (x_t - jnp.sqrt(1.0 - abar_t) * eps) / jnp.sqrt(abar_t)
    return jnp.clip(x0, -CLIP, CLIP) if clip else x0


def ddpm_posterior(schedule: Schedule, x_t, eps, t, clip: bool = True):
    """``(mean, variance)`` of ``p(x_{t-1} | x_t)`` (diffusers' DDPM ``fixed_small``)."""
    abar_t = schedule.alphas_cumprod[t]
    abar_prev = jnp.where(t > 0, schedule.alphas_cumprod[jnp.maximum(t - 1, 0)], 1.0)
    alpha_t = abar_t / abar_prev
    beta_t = 1.0 - alpha_t
    x0 = predict_x0(x_t, eps, abar_t, clip)
    mean = (jnp.sqrt(abar_prev) * beta_t / (1.0 - abar_t)) * x0 \
        + (jnp.sqrt(alpha_t) * (1.0 - abar_prev) / (1.0 - abar_t)) * x_t
    variance = jnp.maximum((1.0 - abar_prev) / (1.0 - abar_t) * beta_t, 1e-20)
    return mean, variance


def ddpm_step(schedule: Schedule, x_t, eps, t, noise, clip: bool = True):
    mean, variance = ddpm_posterior(schedule, x_t, eps, t, clip)
    return mean + jnp.where(t > 0, jnp.sqrt(variance), 0.0) * noise


def ddim_step(schedule: Schedule, x_t, eps, t, t_prev, noise, eta: float = 0.0,
              clip: bool = True):
    """One DDIM step from ``t`` to ``t_prev`` (< 0: to the clean sample, abar = 1)."""
    abar_t = schedule.alphas_cumprod[t]
    abar_prev = jnp.where(t_prev >= 0, schedule.alphas_cumprod[jnp.maximum(t_prev, 0)], 1.0)
    x0 = predict_x0(x_t, eps, abar_t, clip)
    if clip:  # the noise direction that the clipped x_0 implies (keeps eta = 1 equal to DDPM)
        eps = (x_t - jnp.sqrt(abar_t) * x0) / jnp.sqrt(1.0 - abar_t)
    sigma = eta * jnp.sqrt((1.0 - abar_prev) / (1.0 - abar_t) * (1.0 - abar_t / abar_prev))
    direction = jnp.sqrt(jnp.maximum(1.0 - abar_prev - sigma ** 2, 0.0)) * eps
    return jnp.sqrt(abar_prev) * x0 + direction + sigma * noise


def timesteps(num_train: int, num_inference: int, sampler: str) -> jax.Array:
    """The reverse process's steps, first to last: every step for DDPM, ``num_inference``
    evenly spaced ones for DDIM (diffusers' ``leading`` spacing)."""
    if sampler == "ddpm":
        return jnp.arange(num_train - 1, -1, -1)
    stride = num_train // num_inference
    return jnp.arange(num_inference - 1, -1, -1) * stride


def sample(denoise, schedule: Schedule, shape: Sequence[int], key: jax.Array, *,
           sampler: str = "ddpm", num_inference: int = 100, eta: float = 0.0,
           clip: bool = True, per_step=None) -> jax.Array:
    """``x_0`` from Gaussian noise through the reverse process, one ``lax.scan``.
    ``denoise(x_t, t) -> eps`` (``t`` a scalar step broadcast over the batch), or
    ``denoise(x_t, t, per_step[i])`` with ``per_step`` a pytree of what the caller computed
    for all of ``timesteps(...)`` at once (leading axis: the step; e.g. the U-Net's
    ``conditions``)."""
    steps = timesteps(schedule.num_steps, num_inference, sampler)
    stride = schedule.num_steps // num_inference if sampler == "ddim" else 1
    k_init, k_steps = jax.random.split(key)
    x = jax.random.normal(k_init, tuple(shape))

    def body(x, inputs):
        t, k, extra = inputs
        eps = denoise(x, t) if per_step is None else denoise(x, t, extra)
        noise = jax.random.normal(k, x.shape)
        if sampler == "ddpm":
            x = ddpm_step(schedule, x, eps, t, noise, clip)
        else:
            x = ddim_step(schedule, x, eps, t, t - stride, noise, eta, clip)
        return x, None

    x, _ = jax.lax.scan(body, x, (steps, jax.random.split(k_steps, steps.shape[0]), per_step))
    return x


# ----------------------------------------------------------------------------- networks


def sinusoidal_embedding(t: jax.Array, dim: int) -> jax.Array:
    """The reference's ``SinusoidalPosEmb``: [sin(t w_i), cos(t w_i)], w_i = 10000^(-i/(d/2-1))."""
    half = dim // 2
    freqs = jnp.exp(-math.log(10000) * jnp.arange(half) / (half - 1))
    angles = t.astype(jnp.float32)[..., None] * freqs
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def Dense(features):  # noqa: N802  (a layer, named like one)
    return nn.Dense(features, kernel_init=torch_default_init)


def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


class GroupNorm(nn.Module):
    """GroupNorm (Wu & He 2018; PyTorch's ``nn.GroupNorm``) over ``[B, ..., C]``: per example
    and group of ``C / groups`` channels, ``(x - mean) / sqrt(var + eps)``, then a per-channel
    scale and bias. As ``flax.linen.GroupNorm`` (variance as E[x^2] - E[x]^2), but both moments
    come from one reduction where flax's makes two: at batch 1 (sampling) the activations are
    a few kilobytes, and a reduction costs its launch more than its arithmetic."""

    groups: int
    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x):
        channels = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (channels,))
        bias = self.param("bias", nn.initializers.zeros, (channels,))
        grouped = x.reshape(x.shape[:-1] + (self.groups, channels // self.groups))
        axes = tuple(range(1, x.ndim - 1)) + (x.ndim,)  # all but the batch and the group
        mean, mean_sq = jnp.mean(jnp.stack([grouped, grouped * grouped]),
                                 axis=tuple(a + 1 for a in axes), keepdims=True)
        inv = jax.lax.rsqrt(jnp.maximum(mean_sq - mean * mean, 0.0) + self.epsilon)
        return ((grouped - mean) * inv).reshape(x.shape) * scale + bias


class Conv1dBlock(nn.Module):
    """Conv1d (same padding) -> GroupNorm -> Mish, channels last ``[B, T, C]``."""

    features: int
    kernel_size: int
    groups: int

    @nn.compact
    def __call__(self, x):
        x = Conv1D(self.features, self.kernel_size, padding=self.kernel_size // 2)(x)
        return mish(GroupNorm(self.groups)(x))


class ConditionalResidualBlock1D(nn.Module):
    """Two ``Conv1dBlock``s with FiLM between them, and a 1x1 residual where widths differ.
    ``film [B, 2 * features]`` is the block's (scale, bias), computed by the U-Net's
    ``conditions`` (it does not depend on ``x``)."""

    features: int
    kernel_size: int
    groups: int

    @nn.compact
    def __call__(self, x, film):
        out = Conv1dBlock(self.features, self.kernel_size, self.groups)(x)
        scale, bias = jnp.split(film[..., None, :], 2, axis=-1)
        out = scale * out + bias
        out = Conv1dBlock(self.features, self.kernel_size, self.groups)(out)
        residual = x if x.shape[-1] == self.features else Conv1D(self.features, 1)(x)
        return out + residual


class ConditionalUnet1D(nn.Module):
    """``eps_theta(x_t [B, H, A], t [B], cond [B, D]) -> [B, H, A]`` (module docstring).

    Split in two for sampling: ``conditions(t, cond)`` is everything that does not depend on
    ``x_t`` (the step embedding's MLP and every block's FiLM), ``trunk(x_t, films)`` the rest.
    ``diffusion_policy.plan`` computes the conditions of all its sampling steps at once (one
    batched product instead of a matrix-vector product per step) and hands them to ``sample``
    as ``per_step``. The FiLM layers of all blocks are one Dense
    (the reference's per-block ``cond_encoder`` Linear layers side by side: the same
    parameters, one product instead of one per block).
    """

    action_dim: int
    down_dims: Sequence[int] = (256, 512, 1024)
    step_embed_dim: int = 256
    kernel_size: int = 5
    groups: int = 8

    def block_widths(self) -> list[int]:
        """The residual blocks' widths in call order: down levels, middle, up levels."""
        dims = list(self.down_dims)
        return [w for w in dims for _ in range(2)] + [dims[-1]] * 2 + \
            [w for w in reversed(dims[:-1]) for _ in range(2)]

    def setup(self):
        d = self.step_embed_dim
        self.step_hidden, self.step_out = Dense(4 * d), Dense(d)
        widths = self.block_widths()
        self.film = Dense(2 * sum(widths))
        block = dict(kernel_size=self.kernel_size, groups=self.groups)
        self.blocks = [ConditionalResidualBlock1D(w, **block) for w in widths]
        self.downsample = [Conv1D(w, 3, stride=2, padding=1) for w in self.down_dims[:-1]]
        self.upsample = [Conv1D(w, 4, stride=2, padding=1, transpose=True)
                         for w in reversed(self.down_dims[:-1])]
        # The reference builds this block with Conv1dBlock's default of 8 groups, whatever
        # n_groups is (``check`` asks down_dims[0] to be a multiple of 8).
        self.final_block = Conv1dBlock(self.down_dims[0], self.kernel_size, 8)
        self.final_conv = Conv1D(self.action_dim, 1)

    def conditions(self, t, cond):
        """``t [...]``, ``cond [..., D]`` -> each block's FiLM ``[..., 2 * width]`` (a list)."""
        step = self.step_out(mish(self.step_hidden(
            sinusoidal_embedding(t, self.step_embed_dim))))
        cond = jnp.broadcast_to(cond, step.shape[:-1] + cond.shape[-1:])
        films = self.film(mish(jnp.concatenate([step, cond], axis=-1)))
        cuts = list(itertools.accumulate(2 * w for w in self.block_widths()))[:-1]
        return jnp.split(films, cuts, axis=-1)

    def trunk(self, x, films):
        """``x [B, H, A]`` and ``conditions``' FiLMs (leading shape ``[B]``) -> eps."""
        chex.assert_rank(x, 3)
        chex.assert_axis_dimension(x, 2, self.action_dim)
        blocks, films = iter(self.blocks), iter(films)
        skips = []
        for i in range(len(self.down_dims)):
            x = next(blocks)(x, next(films))
            x = next(blocks)(x, next(films))
            skips.append(x)
            if i < len(self.down_dims) - 1:  # Downsample1d: Conv1d(k3, s2, p1)
                x = self.downsample[i](x)
        for _ in range(2):
            x = next(blocks)(x, next(films))
        # Up the same levels but the first; as the reference, the first level's skip is unused.
        for i, up in enumerate(self.upsample):
            x = jnp.concatenate([x, skips[-1 - i]], axis=-1)
            x = next(blocks)(x, next(films))
            x = next(blocks)(x, next(films))
            x = up(x)  # Upsample1d: ConvTranspose1d(k4, s2, p1)
        return self.final_conv(self.final_block(x))

    def __call__(self, x, t, cond):
        return self.trunk(x, self.conditions(t, cond))


class MLPChunk(nn.Module):
    """Behaviour cloning's baseline: the observation history -> the whole action chunk."""

    horizon: int
    action_dim: int
    hidden: Sequence[int] = (256, 256, 256)

    @nn.compact
    def __call__(self, cond):
        x = cond
        for width in self.hidden:
            x = mish(Dense(width)(x))
        x = Dense(self.horizon * self.action_dim)(x)
        return x.reshape(x.shape[:-1] + (self.horizon, self.action_dim))
