"""World Models' agent as one acting-layer policy: vision V, memory M and controller C
(Ha & Schmidhuber 2018, sec. 2 and fig. 4; hardmaru/WorldModelsExperiments
``carracing/model.py``).

At every step: the frame is cropped and resized to 64x64 (``preprocess``), V encodes it to
``z`` (a sample of its posterior, as the reference's ``encode_obs``), C acts on ``[z, h]``
with ``h`` M's LSTM output, and M steps its memory on ``[z, a]`` with the action as the env
receives it. The policy's carry is M's LSTM state ``(c, h)``, zeroed at each episode's first
step. Its parameters are ``{"vae", "rnn", "controller"}``; evaluating a CMA-ES population in
one pool (``population_policy``) gives each group its own controller and shares V and M
(``acting.grouped``'s ``params_axes``), so 64 candidates cost one copy of the models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxwm.agents.cma_es import Controller
from jaxwm.envs import acting
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
class Agent:
    vision: vae.ConvVAE
    memory: mdnrnn.MDNRNN
    controller: Controller
    to_env: Callable[[jax.Array], jax.Array]  # tanh's [-1, 1] -> the env's actions
    crop_rows: int = 0

    def features(self, params, carry, frames, is_first, key):
        """(z [n, z_dim], M's carry zeroed where ``is_first``): what C reads with h."""
        mu, logvar = self.vision.apply(params["vae"], preprocess(frames, self.crop_rows),
                                       method=vae.ConvVAE.encode)
        reset = is_first[:, None]
        carry = jax.tree.map(lambda x: jnp.where(reset, 0.0, x), carry)
        return vae.sample(mu, logvar, key), carry

    def step_memory(self, params, carry, z, action):
        """M's carry after reading ``[z, action]`` (one step)."""
        carry, _ = self.memory.apply(params["rnn"], carry, z[:, None], action[:, None],
                                     jnp.zeros((z.shape[0], 1), bool))
        return carry

    def policy(self) -> acting.Policy:
        def init_carry(params, num_envs):
            del params
            return self.memory.initialize_carry(num_envs)

        def act(params, carry, obs, is_first, key, temperature=1.0):
            del temperature  # the controller is deterministic given z
            z, carry = self.features(params, carry, obs, is_first, key)
            _, h = carry
            action = self.to_env(self.controller.act(params["controller"],
                                                     jnp.concatenate([z, h], -1)))
            return self.step_memory(params, carry, z, action), action, {}

        return acting.Policy(init_carry=init_carry, act=act)

    def population_policy(self, population: int) -> acting.Policy:
        """``policy`` over a pool split into ``population`` groups: params ``{"vae", "rnn"}``
        shared and ``"controller"`` [population, num_params]."""
        return acting.grouped(self.policy(), population,
                              params_axes={"vae": None, "rnn": None, "controller": 0})
