"""World Models' controller C and its optimiser, CMA-ES (Ha & Schmidhuber 2018, sec. 2.3 and
3.3; Hansen 2016, "The CMA Evolution Strategy: A Tutorial").

The controller is one linear layer, ``a = tanh(W [z, h] + b)``: 32 + 256 inputs, 3 actions,
(32 + 256) x 3 + 3 = 867 parameters, evolved as one flat vector. CarRacing's gas and brake
live in [0, 1]: the reference rescales the gas from tanh's [-1, 1] as ``(a + 1) / 2`` and
clips the brake at 0 (``carracing/model.py``; ``carracing_action``), and its MDN-RNN reads
the action so mapped.

CMA-ES comes from evosax (Lange 2022, "evosax: JAX-based Evolution Strategies"), a maintained
JAX library: its ask and tell are pure functions over a state pytree, so one generation
(ask -> evaluate the population -> tell) is a single jitted function, and the evolution state
is checkpointed like any other. Writing CMA-ES again (rank-one and rank-mu updates,
cumulative step-size adaptation, eigendecompositions) would be a second, less tested copy.
evosax minimises; ``tell`` here takes returns and negates them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxwm.envs import acting
from jaxwm.models import protocol

MIN_POPULATION = 4  # CMA-ES needs a few candidates to estimate a covariance


@dataclasses.dataclass(frozen=True)
class Controller:
    """``tanh(W [z, h] + b)`` over a flat parameter vector."""

    input_dim: int  # z_dim + hidden
    action_dim: int

    @property
    def num_params(self) -> int:
        return (self.input_dim + 1) * self.action_dim

    def act(self, flat: jax.Array, features: jax.Array) -> jax.Array:
        """``features`` [..., input_dim] -> actions in [-1, 1] [..., action_dim]. ``flat``
        is laid out as the reference's (``set_model_params``): the bias, then the weight
        matrix row by row."""
        b = flat[: self.action_dim]
        w = flat[self.action_dim:].reshape(self.input_dim, self.action_dim)
        return jnp.tanh(features @ w + b)


def carracing_action(action: jax.Array) -> jax.Array:
    """tanh's [-1, 1]^3 as the reference drives CarRacing (``carracing/model.py``): steering
    as it is, gas rescaled ``(a + 1) / 2``, brake clipped to [0, 1] (so it is off for half of
    the controller's outputs). Other boxes use ``envs.types.ActionBox``'s affine map."""
    return jnp.stack([action[..., 0], (action[..., 1] + 1) / 2,
                      jnp.clip(action[..., 2], 0.0, 1.0)], -1)


@dataclasses.dataclass(frozen=True)
class Evolution:
    """CMA-ES over ``num_params`` numbers with ``population`` candidates per generation,
    starting from zeros with step size ``sigma`` (the reference's 0.1)."""

    num_params: int
    population: int = 64
    sigma: float = 0.1

    def __post_init__(self):
        if self.population < MIN_POPULATION:
            raise ValueError(f"CMA-ES needs a population of at least {MIN_POPULATION}, got "
                             f"{self.population}.")

    @property
    def strategy(self):
        from evosax.algorithms import CMA_ES

        return CMA_ES(population_size=self.population, solution=jnp.zeros(self.num_params))

    @property
    def params(self):
        return self.strategy.default_params.replace(std_init=self.sigma)

    def init(self, key) -> Any:
        state = self.strategy.init(key, jnp.zeros(self.num_params), self.params)
        # evosax leaves a few fields weakly typed until the first tell; strong types from the
        # start keep a jitted generation from compiling twice.
        return jax.tree.map(lambda x: jnp.asarray(x, dtype=x.dtype), state)

    def ask(self, state, key) -> tuple[jax.Array, Any]:
        """Candidates [population, num_params] and the state that asked for them."""
        return self.strategy.ask(key, state, self.params)

    def tell(self, state, candidates, returns, key):
        """The state after ``candidates`` scored ``returns`` [population] (higher better),
        and metrics: the generation's best, mean and std of returns, the step size."""
        state, _ = self.strategy.tell(key, candidates, -returns, state, self.params)
        return state, {"cma/return_best": jnp.max(returns), "cma/return_mean": jnp.mean(returns),
                       "cma/return_std": jnp.std(returns), "cma/sigma": state.std}

    def mean(self, state) -> jax.Array:
        return state.mean

    def generation(self, state, evaluate, key):
        """One generation, ask -> evaluate -> tell, jittable as a whole: ``evaluate(candidates
        [population, num_params], key) -> (returns [population], extra metrics)``; returns the
        new state and the metrics of ``tell`` and ``evaluate``."""
        k_ask, k_evaluate, k_tell = jax.random.split(key, 3)
        candidates, state = self.ask(state, k_ask)
        returns, metrics = evaluate(candidates, k_evaluate)
        state, told = self.tell(state, candidates, returns, k_tell)
        return state, {**metrics, **told}


def first_episode_returns(steps) -> jax.Array:
    """Each env's return [n] over its first episode in a rollout ``[T, n]`` (``acting.Steps``)
    that started from a reset: the reward arriving with row t counts while no earlier row
    ended the episode (a row that ends it brings its last reward; the next row starts
    another)."""
    ended_before = jnp.cumsum(steps.done, axis=0) - steps.done > 0
    counts = (jnp.arange(steps.reward.shape[0])[:, None] > 0) & ~ended_before
    return jnp.sum(jnp.where(counts, steps.reward, 0.0), axis=0)


def controller_action(controller: Controller, flat, features, discrete: bool):
    """``tanh(W f + b)``, or its argmax one-hot for discrete actions."""
    out = controller.act(flat, features)
    return jax.nn.one_hot(jnp.argmax(out, -1), controller.action_dim) if discrete else out


def controller_policy(controller: Controller, population: int, discrete: bool = False):
    """The population's controllers as one grouped policy over features (params: the
    candidates [population, num_params])."""
    return acting.grouped(acting.stateless(
        lambda flat, obs, key, temperature: controller_action(controller, flat, obs,
                                                              discrete)), population)


def controller_on_model(controller: Controller, model) -> acting.Policy:
    """One controller acting on a world model's states (``protocol.through_model``'s
    ``inner``): params ``{"model", "controller"}``, the controller on the state's
    features."""
    return acting.stateless(lambda params, state, key, temperature: controller_action(
        controller, params["controller"], model.features(params["model"], state),
        model.discrete))


def generation_in_model(evolution: Evolution, controller: Controller, model, episodes: int,
                        max_steps: int):
    """One CMA-ES generation inside any world model (``models.protocol``), as World Models
    evolves in its dream: ``generation(es, model params, starts, env key, key) -> (es,
    metrics)``, the ``population x episodes`` dreams starting from the model states
    ``starts``, each candidate scored by the mean return of its dreams' first episodes
    (``first_episode_returns``) over ``max_steps`` steps."""
    population = evolution.population
    n = population * episodes
    policy = controller_policy(controller, population, model.discrete)

    def generation(es, model_params, starts, env_key, key):
        env_state, start = protocol.env_start(model, model_params, starts, env_key)

        def evaluate(candidates, key):
            actor = acting.ActorState.start(start, (), n)
            _, _, steps, _ = acting.rollout(policy, protocol.as_env(model, model_params),
                                            candidates, actor, env_state, jax.random.split(
                                                key, population), max_steps + 1)
            returns = first_episode_returns(steps).reshape(population, -1).mean(-1)
            return returns, {"dream/episode_return": jnp.mean(returns)}

        return evolution.generation(es, evaluate, key)

    return generation


def group_returns(reward: jax.Array, valid: jax.Array, groups: int) -> jax.Array:
    """Each group's mean return per env: ``reward`` and ``valid`` ``[T, groups * n]`` (a
    rollout's rewards, and which of them count) summed over time and averaged over the
    group's ``n`` envs (the reference averages a candidate's episodes)."""
    total = jnp.sum(jnp.where(valid, reward, 0.0), axis=0)
    return total.reshape(groups, -1).mean(-1)
