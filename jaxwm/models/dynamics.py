"""Deterministic MLP dynamics model predicting the state change and the reward.

Nagabandi et al. 2018, "Neural Network Dynamics for Model-Based Deep Reinforcement Learning
with Model-Free Fine-Tuning", sec. IV-A: the network maps normalised (s, a) to the
normalised target (s' - s, r); training minimises the mean squared error on normalised
targets. Normalisation statistics are refit from replay before every round of updates and
carried in the state, so prediction is a pure function of that state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct


class DynamicsMLP(nn.Module):
    out_dim: int
    hidden: Sequence[int] = (200, 200)

    @nn.compact
    def __call__(self, x):
        for width in self.hidden:
            x = nn.silu(nn.Dense(width)(x))
        return nn.Dense(self.out_dim)(x)


@struct.dataclass
class Normalizer:
    mean: jax.Array
    std: jax.Array

    @classmethod
    def identity(cls, dim: int) -> Normalizer:
        return cls(jnp.zeros(dim), jnp.ones(dim))

    @classmethod
    def fit(cls, x: jax.Array) -> Normalizer:
        return cls(jnp.mean(x, 0), jnp.std(x, 0) + 1e-6)


@struct.dataclass
class DynamicsState:
    params: dict
    opt_state: optax.OptState
    inputs: Normalizer  # over concat(obs, action)
    targets: Normalizer  # over concat(obs delta, reward)


def _inputs(obs, action):
    return jnp.concatenate([obs, action], -1)


def _targets(batch):
    return jnp.concatenate([batch["next_obs"] - batch["obs"], batch["reward"][..., None]], -1)


def init(model: DynamicsMLP, optimizer, key, obs_dim: int, action_dim: int) -> DynamicsState:
    params = model.init(key, jnp.zeros((1, obs_dim + action_dim)))
    return DynamicsState(params, optimizer.init(params), Normalizer.identity(obs_dim + action_dim),
                         Normalizer.identity(obs_dim + 1))


def refit_normalizers(state: DynamicsState, batch) -> DynamicsState:
    return state.replace(inputs=Normalizer.fit(_inputs(batch["obs"], batch["action"])),
                         targets=Normalizer.fit(_targets(batch)))


def predict(model: DynamicsMLP, state: DynamicsState, obs, action):
    """(obs [..., D], action [..., A]) -> (next_obs [..., D], reward [...])."""
    x = (_inputs(obs, action) - state.inputs.mean) / state.inputs.std
    y = model.apply(state.params, x) * state.targets.std + state.targets.mean
    return obs + y[..., :-1], y[..., -1]


def loss(params, model: DynamicsMLP, state: DynamicsState, batch):
    x = (_inputs(batch["obs"], batch["action"]) - state.inputs.mean) / state.inputs.std
    y = (_targets(batch) - state.targets.mean) / state.targets.std
    return jnp.mean((model.apply(params, x) - y) ** 2)


def train_step(model: DynamicsMLP, optimizer, state: DynamicsState, batch):
    value, grads = jax.value_and_grad(loss)(state.params, model, state, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return state.replace(params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state), value


def fit(model: DynamicsMLP, optimizer, state: DynamicsState, sample, key, num_updates: int,
        normalizer_batch):
    """``num_updates`` training steps in one scan, each on ``sample(key)``, after refitting
    the normalisers on ``normalizer_batch``. Returns the state and the mean and last loss."""
    state = refit_normalizers(state, normalizer_batch)

    def step(state, k):
        return train_step(model, optimizer, state, sample(k))

    state, losses = jax.lax.scan(step, state, jax.random.split(key, num_updates))
    return state, {"losses/model_loss": jnp.mean(losses), "losses/model_loss_last": losses[-1]}


def fresh_error(model: DynamicsMLP, state: DynamicsState, batch, valid) -> dict:
    """The one-step error on ``valid`` transitions the model has not trained on, beside that
    of predicting no change (what a model that learned nothing scores)."""
    predicted, _ = predict(model, state, batch["obs"], batch["action"])
    weights = valid / jnp.maximum(jnp.sum(valid), 1)
    sq = lambda x: jnp.sum(x**2, -1)  # noqa: E731
    return {"model/fresh_one_step_mse": jnp.sum(weights * sq(predicted - batch["next_obs"])),
            "model/zero_delta_mse": jnp.sum(weights * sq(batch["obs"] - batch["next_obs"]))}


@dataclasses.dataclass(frozen=True)
class DynamicsModel:
    """The MLP dynamics on the world-model protocol (``models.protocol``): the state is the
    observation vector, a step is ``predict`` (deterministic; the key is unused) and no
    episode ends in it. Its parameters are a ``DynamicsState``; actions arrive in [-1, 1] and
    reach the network in the env's units (``to_env``), as the planner acts."""

    net: DynamicsMLP
    action_dim: int
    to_env: Callable[[jax.Array], jax.Array]
    discrete = False
    decodes = False
    differentiable = True

    def initial(self, params, batch: int):
        return jnp.zeros((batch, params.inputs.mean.shape[-1] - self.action_dim))

    def observe(self, params, state, action, obs, is_first, key):
        del params, state, action, is_first, key
        return jnp.asarray(obs, jnp.float32)

    def step(self, params, state, action, key):
        del key
        next_obs, reward = predict(self.net, params, state, self.to_env(action))
        return next_obs, reward, jnp.ones_like(reward)

    def features(self, params, state):
        del params
        return state

    def decode(self, params, state):
        raise NotImplementedError("the MLP dynamics model predicts no frames")
