"""World Models' agent and its learning as pieces: vision V, memory M and controller C (Ha &
Schmidhuber 2018, sec. 2-4 and fig. 4; hardmaru/WorldModelsExperiments ``carracing/``).
``jaxwm.algos.worldmodels`` wires them to envs, phase artifacts and the loop.

Acting (``policy``): at every step the frame is cropped and resized to 64x64
(``models.vision_memory.preprocess``), V encodes it to ``z`` (a sample of its posterior, as
the reference's ``encode_obs``), C acts on ``[z, h]`` with ``h`` M's LSTM output, and M steps
its memory on ``[z, a]`` with the action as the env receives it. The carry is M's LSTM state
``(c, h)``, zeroed at each episode's first step; the parameters are ``{"vae", "rnn",
"controller"}``. A CMA-ES population acts in one pool (``population_policy``): each group
its own controller, V and M shared (``acting.grouped``'s ``params_axes``).

Learning, each a pure function the algorithm compiles:

* ``vae_update``: one Adam step of V on a batch of frames (L2 + KL with free bits);
* ``encode``: frames to their posterior's mean and log variance (a ``latents`` row each), and
  8 frames above their reconstructions;
* ``rnn_update``: one step of M on windows of latent rows, ``z`` sampled from each row's
  posterior as the reference's ``rnn_train.py``; the memory resets inside a window where a
  row starts anew, and a transition counts only if both rows belong to one episode;
* ``real_generation`` / ``dream_generation``: one CMA-ES generation (``agents.cma_es``), ask
  -> the population acts -> tell, in the real env (a freshly reset pool, each candidate
  scored by the mean return of its envs' first episodes, ``cma_es.first_episode_returns``)
  or in M's dream (``models.vision_memory.VisionMemory`` as an env of the acting layer,
  ``protocol.as_env``, from latents of real episode starts);
* ``dream_beside_real``: M's dream of a real stretch beside the real frames, both decoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxwm.agents import cma_es
from jaxwm.agents.cma_es import Controller
from jaxwm.envs import acting
from jaxwm.media import Image, Video
from jaxwm.models import mdnrnn, vae
from jaxwm.models.vision_memory import VisionMemory, preprocess

RECONSTRUCTIONS = 8  # frames shown with their reconstructions
DREAM_FRAMES = 64  # steps of the dream-beside-real video


@struct.dataclass
class Learner:
    params: Any
    opt_state: optax.OptState



def brownian(spec, dt: float = 1 / 50) -> acting.Policy:
    """ctallec/world-models' ``sample_continuous_policy``: each env's action a Brownian
    motion, ``a' = clip(a + sqrt(dt) N(0, I), low, high)``, from a uniform draw at each
    episode's start; smoother, longer-ranging drives than uniform noise per step (the car
    leaves its start more often). The carry is each env's last action."""
    low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)

    def init_carry(params, num_envs):
        del params
        return jnp.zeros((num_envs,) + tuple(spec.action_shape))

    def act(params, carry, obs, is_first, key, temperature=1.0):
        del params, obs, temperature
        k_start, k_step = jax.random.split(key)
        fresh = acting.uniform_action(spec, k_start, carry.shape[0])
        step = jnp.sqrt(dt) * jax.random.normal(k_step, carry.shape)
        action = jnp.clip(jnp.where(is_first[:, None], fresh, carry + step), low, high)
        return action, action, {}

    return acting.Policy(init_carry=init_carry, act=act)


@dataclasses.dataclass(frozen=True)
class Agent:
    vision: vae.ConvVAE
    memory: mdnrnn.MDNRNN
    controller: Controller
    to_env: Callable[[jax.Array], jax.Array]  # tanh's [-1, 1] -> the env's actions
    crop_rows: int = 0
    vae_tx: optax.GradientTransformation = optax.adam(1e-4)
    rnn_tx: optax.GradientTransformation = optax.adam(1e-3)
    vae_hyper: vae.VAEHyper = vae.VAEHyper()
    constrain: Callable = lambda tree: tree  # splits a batch over the devices

    def model(self, temperature: float = 1.0) -> VisionMemory:
        """V and M as a world model (``models.protocol``), dreaming at ``temperature``."""
        return VisionMemory(self.vision, self.memory, self.controller.action_dim, self.to_env,
                            self.crop_rows, temperature)

    # ------------------------------------------------------------------ acting

    def policy(self) -> acting.Policy:
        model = self.model()

        def init_carry(params, num_envs):
            del params
            return self.memory.initialize_carry(num_envs)

        def act(params, carry, obs, is_first, key, temperature=1.0):
            del temperature  # the controller is deterministic given z
            z = model.encode(params, obs, key)
            carry = jax.tree.map(lambda x: jnp.where(is_first[:, None], 0.0, x), carry)
            action = self.to_env(self.controller.act(params["controller"],
                                                     jnp.concatenate([z, carry[1]], -1)))
            return model.remember(params, carry, z, action)[0], action, {}

        return acting.Policy(init_carry=init_carry, act=act)

    def population_policy(self, population: int) -> acting.Policy:
        """``policy`` over a pool split into ``population`` groups: params ``{"vae", "rnn"}``
        shared and ``"controller"`` [population, num_params]."""
        return acting.grouped(self.policy(), population,
                              params_axes={"vae": None, "rnn": None, "controller": 0})

    # ------------------------------------------------------------------ data

    def frame_rows(self, steps: acting.Steps) -> dict:
        """A collect's steps ``[T, n]`` as ``frames`` rows, env by env (each env's steps in
        order): uint8 64x64 frames, the action, the reward, ``reset`` where a row does not
        continue the one before it (an episode's first row, or the first of an env's
        stretch), ``done``."""
        t, n = steps.is_first.shape
        frames = jax.vmap(lambda f: preprocess(f, self.crop_rows))(steps.obs)
        rows = {"frame": (frames * 255).round().astype(jnp.uint8),
                "action": steps.action.astype(jnp.float32),
                "reward": steps.reward.astype(jnp.float32),
                "reset": steps.is_first.at[0].set(True), "done": steps.done}
        return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape((t * n,) + x.shape[2:]),
                            rows)

    @staticmethod
    def join_processes(rows) -> dict:
        """Every process's ``frame_rows`` (leaves ``[processes, rows, ...]``) as one process
        stepping all their envs would write them: env by env, the envs in process order (the
        order ``acting.make_pool`` seeds them in)."""
        return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), rows)

    def row_examples(self) -> tuple[dict, dict]:
        """One row each of the ``frames`` and ``latents`` artifacts."""
        frame = {"frame": np.zeros(vae.FRAME, np.uint8),
                 "action": np.zeros(self.controller.action_dim, np.float32),
                 "reward": np.zeros((), np.float32), "reset": np.zeros((), bool),
                 "done": np.zeros((), bool)}
        z = np.zeros(self.vision.z_dim, np.float32)
        return frame, {"mu": z, "logvar": z, **{k: v for k, v in frame.items() if k != "frame"}}

    # ------------------------------------------------------------------ V and M

    def init(self, k_vae, k_rnn) -> tuple[Learner, Learner]:
        """V's and M's learners, from a key each."""
        vae_params = vae.init(self.vision, k_vae)
        rnn_params = mdnrnn.init(self.memory, k_rnn, self.controller.action_dim)
        return (Learner(vae_params, self.vae_tx.init(vae_params)),
                Learner(rnn_params, self.rnn_tx.init(rnn_params)))

    def vae_update(self, learner: Learner, frames, key):
        frames = self.constrain(frames.astype(jnp.float32) / 255.0)
        (_, metrics), grads = jax.value_and_grad(
            lambda p: vae.loss(self.vision, p, frames, key, self.vae_hyper), has_aux=True)(
            learner.params)
        updates, opt_state = self.vae_tx.update(grads, learner.opt_state)
        return Learner(optax.apply_updates(learner.params, updates), opt_state), metrics

    def encode(self, params, rows):
        """``latents`` rows (posterior mean and log variance, with the frames' actions,
        rewards and flags) of ``frames`` rows, and V's reconstructions as an image."""
        frames = self.constrain(rows["frame"].astype(jnp.float32) / 255.0)
        mu, logvar = self.vision.apply(params, frames, method=vae.ConvVAE.encode)
        latents = {"mu": mu, "logvar": logvar,
                   **{k: rows[k] for k in ("action", "reward", "reset", "done")}}
        shown = self.vision.apply(params, mu[:RECONSTRUCTIONS], method=vae.ConvVAE.decode)
        strip = lambda x: jnp.concatenate(list(x), axis=1)  # noqa: E731
        image = Image(jnp.concatenate([strip(frames[:RECONSTRUCTIONS]), strip(shown)], 0))
        return latents, {"vae/reconstructions": image}

    def rnn_batch(self, window, key):
        """An MDN-RNN batch from latent windows [B, L + 1] (module docstring)."""
        z = vae.sample(window["mu"], window["logvar"], key)
        inside = ~window["done"][:, :-1] & ~window["reset"][:, 1:]
        return {"z": z, "action": window["action"][:, :-1], "reset": window["reset"][:, :-1],
                "mask": inside, "reward": window["reward"][:, 1:],
                "done": window["done"][:, 1:]}

    def rnn_update(self, learner: Learner, window, key):
        batch = self.constrain(self.rnn_batch(window, key))
        (_, metrics), grads = jax.value_and_grad(
            lambda p: mdnrnn.loss(self.memory, p, batch), has_aux=True)(learner.params)
        updates, opt_state = self.rnn_tx.update(grads, learner.opt_state)
        return Learner(optax.apply_updates(learner.params, updates), opt_state), metrics

    # ------------------------------------------------------------------ C

    def real_generation(self, evolution: cma_es.Evolution, env: acting.EnvStep, episodes: int,
                        max_steps: int):
        """One generation in the real env ``env`` (a pool of ``population x episodes``):
        ``(es, vae params, rnn params, handle, first rows, key) -> (es, metrics)``."""
        population = evolution.population
        policy = self.population_policy(population)
        pool_size = population * episodes

        def generation(es, vae_params, rnn_params, handle, first, key):
            def evaluate(candidates, key):
                params = {"vae": vae_params, "rnn": rnn_params, "controller": candidates}
                actor = acting.ActorState.start(first, policy.init_carry(params, pool_size),
                                                pool_size)
                _, _, steps, _ = acting.rollout(policy, env, params, actor, handle,
                                                jax.random.split(key, population),
                                                max_steps + 1)
                return cma_es.first_episode_returns(steps).reshape(population, -1).mean(-1), {}

            return evolution.generation(es, evaluate, key)

        return generation

    def dream_generation(self, evolution: cma_es.Evolution, episodes: int, max_steps: int,
                         temperature: float):
        """One generation inside M's dream (``cma_es.generation_in_model`` of V and M):
        ``(es, vae params, rnn params, latent windows, key) -> (es, metrics)``; the
        population's controllers act on ``[z, h]`` in ``population x episodes`` dreams
        started from real latents (the windows' first rows)."""
        n = evolution.population * episodes
        in_model = cma_es.generation_in_model(evolution, self.controller,
                                              self.model(temperature), episodes, max_steps)

        def generation(es, vae_params, rnn_params, windows, key):
            k_start, k_env, k_run = jax.random.split(key, 3)
            first = windows["mu"][:, 0]
            picks = jax.random.randint(k_start, (n,), 0, first.shape[0])
            z0 = vae.sample(first[picks], windows["logvar"][:, 0][picks], k_start)
            starts = (self.memory.initialize_carry(n), z0)
            return in_model(es, {"vae": vae_params, "rnn": rnn_params}, starts, k_env, k_run)

        return generation

    def dream_beside_real(self, vae_params, rnn_params, windows, key, temperature: float):
        """The first latent window's real frames (decoded from V's posterior means, left)
        beside M's dream of them (right): M started from the window's first latent, fed the
        real actions, its own samples as its next inputs, all decoded by V."""
        window = jax.tree.map(lambda x: x[0, :DREAM_FRAMES], windows)
        steps = window["mu"].shape[0]
        z0 = vae.sample(window["mu"][:1], window["logvar"][:1], key)
        model = self.model(temperature)
        params = {"vae": vae_params, "rnn": rnn_params}

        def step(carry, inputs):
            memory, z, k = carry
            action, k_next = inputs
            memory, out = model.remember(params, memory, z, action[None])
            z = mdnrnn.sample(out, k, temperature)
            return (memory, z, k_next), z[0]

        keys = jax.random.split(key, steps)
        _, dreamed = jax.lax.scan(step, (self.memory.initialize_carry(1), z0, keys[0]),
                                  (window["action"][:-1], keys[1:]))
        dreamed = jnp.concatenate([z0, dreamed])
        decode = lambda z: self.vision.apply(vae_params, z, method=vae.ConvVAE.decode)  # noqa
        return Video(jnp.concatenate([decode(window["mu"]), decode(dreamed)], axis=2), fps=15)

