"""World Models' V and M as one world model on the protocol (``models.protocol``; Ha &
Schmidhuber 2018, sec. 2-4): the ConvVAE's latent ``z`` of each frame and the MDN-RNN's
memory ``(c, h)`` over ``[z, a]``.

The state is ``((c, h), z)``: M's memory and the current latent. ``observe`` steps the memory
on the previous latent and action, zeroes it where an episode starts and encodes the frame
(``preprocess``: cropped and resized to 64x64), drawing ``z`` from V's posterior as the
reference's ``encode_obs``; ``step`` is the paper's dream (sec. 4.4): the memory reads ``[z,
a]``, the next latent is drawn from M's mixtures at ``temperature``, and M's reward and done
heads (where it has them) give the reward and the continuation (done probability > 0.5
ends the dream). ``features`` are ``[z, h]``, what the controller reads; ``decode`` is V's
decoder. Actions arrive in [-1, 1] and reach M through ``to_env``, as the env receives them
(CarRacing's gas rescaled, ``agents.cma_es.carracing_action``). Parameters: ``{"vae",
"rnn"}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxwm.models import mdnrnn, vae


def preprocess(frames: jax.Array, crop_rows: int = 0) -> jax.Array:
    """uint8 frames [n, H, W, 3] (or envpool's [n, 3, H, W]) -> float [n, 64, 64, 3] in
    [0, 1]: the first ``crop_rows`` rows kept if set (CarRacing: 84 of 96, dropping the
    dashboard, as the reference's ``_process_frame``), then a bilinear resize."""
    if frames.shape[1] == 3 and frames.shape[-1] != 3:  # channels first
        frames = jnp.moveaxis(frames, 1, -1)
    frames = frames[:, :crop_rows] if crop_rows else frames
    frames = frames.astype(jnp.float32) / 255.0
    return jax.image.resize(frames, (frames.shape[0],) + vae.FRAME, "bilinear")


@dataclasses.dataclass(frozen=True)
class VisionMemory:
    vision: vae.ConvVAE
    memory: mdnrnn.MDNRNN
    action_dim: int
    to_env: Callable[[jax.Array], jax.Array]  # [-1, 1] -> the env's actions, as M reads them
    crop_rows: int = 0
    temperature: float = 1.0
    discrete: bool = False  # actions one-hot (M trained on them so), else boxes in [-1, 1]
    decodes = True
    differentiable = True  # reparameterised latents (the mixture's pick has no gradient)

    def initial(self, params, batch: int):
        del params
        return self.memory.initialize_carry(batch), jnp.zeros((batch, self.vision.z_dim))

    def encode(self, params, frames, key):
        """z [n, z_dim] drawn from V's posterior of raw frames."""
        mu, logvar = self.vision.apply(params["vae"], preprocess(frames, self.crop_rows),
                                       method=vae.ConvVAE.encode)
        return vae.sample(mu, logvar, key)

    def remember(self, params, carry, z, action):
        """M after reading ``[z, action]`` (env units): (carry, outputs of that step)."""
        carry, out = self.memory.apply(params["rnn"], carry, z[:, None], action[:, None],
                                       jnp.zeros((z.shape[0], 1), bool))
        return carry, jax.tree.map(lambda x: x[:, 0], out)

    def observe(self, params, state, action, obs, is_first, key):
        carry, z = state
        carry, _ = self.remember(params, carry, z, self.to_env(action))
        carry = jax.tree.map(lambda x: jnp.where(is_first[:, None], 0.0, x), carry)
        return carry, self.encode(params, obs, key)

    def step(self, params, state, action, key):
        carry, z = state
        carry, out = self.remember(params, carry, z, self.to_env(action))
        z = mdnrnn.sample(out, key, self.temperature)
        n = z.shape[0]
        reward = out.get("reward", jnp.zeros(n))
        cont = 1.0 - jax.nn.sigmoid(out["done_logit"]) if "done_logit" in out else jnp.ones(n)
        return (carry, z), reward, cont

    def features(self, params, state):
        del params
        (_, h), z = state
        return jnp.concatenate([z, h], -1)

    def decode(self, params, state):
        _, z = state
        flat = z.reshape((-1, z.shape[-1]))
        frames = self.vision.apply(params["vae"], flat, method=vae.ConvVAE.decode)
        return frames.reshape(z.shape[:-1] + frames.shape[1:])
