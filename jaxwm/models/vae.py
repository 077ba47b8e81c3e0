"""World Models' vision model V: a convolutional VAE over 64x64 RGB frames (Ha & Schmidhuber
2018, "Recurrent World Models Facilitate Policy Evolution", NeurIPS, sec. 2.1 and appendix
A.1; hardmaru/WorldModelsExperiments ``carracing/vae/vae.py``).

Encoder: four 4x4 stride-2 VALID convolutions with 32, 64, 128, 256 filters and ReLU
(64 -> 31 -> 14 -> 6 -> 2), flattened to 1024, then two dense heads for the mean and the log
variance of a diagonal Gaussian over ``z`` (32 dims); ``z = mu + exp(logvar / 2) * eps``.
Decoder: a dense layer to 1024, reshaped to 1x1x1024, then transposed convolutions with 128,
64, 32 and 3 filters, kernels 5, 5, 6, 6, stride 2 (1 -> 5 -> 13 -> 30 -> 64), ReLU between
and a sigmoid at the end. Every convolution goes through ``nets.conv`` (canonical gradients
on the CPU, so the VAE also trains fast inside a compiled loop).

Loss per frame (the reference's): the squared error summed over pixels and channels, plus
the KL divergence to N(0, I) summed over z, floored at ``kl_tolerance * z_dim`` (free bits:
0.5 x 32 = 16 nats, below which the KL term has no gradient); both averaged over the batch.
Frames are float in [0, 1].
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.nets.conv import Conv2D, ConvTranspose2D

FRAME = (64, 64, 3)


@dataclasses.dataclass(frozen=True)
class VAEHyper:
    z_dim: int = 32
    kl_tolerance: float = 0.5  # free bits per z dimension


class ConvVAE(nn.Module):
    z_dim: int = 32

    def setup(self):
        self.enc = [Conv2D(f, 4, stride=2, name=f"enc_conv{i + 1}")
                    for i, f in enumerate((32, 64, 128, 256))]
        self.mu_head = nn.Dense(self.z_dim, name="enc_fc_mu")
        self.logvar_head = nn.Dense(self.z_dim, name="enc_fc_log_var")
        self.dec_fc = nn.Dense(1024, name="dec_fc")
        self.dec = [ConvTranspose2D(f, k, stride=2, name=f"dec_deconv{i + 1}")
                    for i, (f, k) in enumerate(((128, 5), (64, 5), (32, 6), (3, 6)))]

    def encode(self, frames):
        """Frames [B, 64, 64, 3] in [0, 1] -> (mu, logvar), each [B, z_dim]."""
        h = frames
        for conv in self.enc:
            h = nn.relu(conv(h))
        h = h.reshape(h.shape[0], -1)
        return self.mu_head(h), self.logvar_head(h)

    def decode(self, z):
        """z [B, z_dim] -> frames [B, 64, 64, 3] in (0, 1)."""
        h = self.dec_fc(z).reshape(z.shape[0], 1, 1, 1024)
        for deconv in self.dec[:-1]:
            h = nn.relu(deconv(h))
        return nn.sigmoid(self.dec[-1](h))

    def __call__(self, frames, key):
        mu, logvar = self.encode(frames)
        z = sample(mu, logvar, key)
        return self.decode(z), mu, logvar


def sample(mu, logvar, key):
    return mu + jnp.exp(logvar / 2) * jax.random.normal(key, mu.shape)


def kl_divergence(mu, logvar):
    """KL(N(mu, exp(logvar)) || N(0, I)) summed over the last axis."""
    return -0.5 * jnp.sum(1 + logvar - mu ** 2 - jnp.exp(logvar), -1)


def loss(model: ConvVAE, params, frames, key, hyper: VAEHyper = VAEHyper()):
    """``(loss, metrics)`` on frames [B, 64, 64, 3] in [0, 1] (module docstring)."""
    recon, mu, logvar = model.apply(params, frames, key)
    reconstruction = jnp.mean(jnp.sum((frames - recon) ** 2, axis=(1, 2, 3)))
    kl = kl_divergence(mu, logvar)
    kl_floored = jnp.mean(jnp.maximum(kl, hyper.kl_tolerance * model.z_dim))
    total = reconstruction + kl_floored
    return total, {"vae/loss": total, "vae/reconstruction": reconstruction,
                   "vae/kl": jnp.mean(kl), "vae/kl_floored": kl_floored}


def init(model: ConvVAE, key):
    k_params, k_noise = jax.random.split(key)
    return model.init(k_params, jnp.zeros((1,) + FRAME), k_noise)
