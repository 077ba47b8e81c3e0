"""The world-model protocol: the small interface every learned model exposes, so that any
agent that learns, plans or acts in imagination takes any model.

A world model is a frozen object (its networks and settings) whose methods are pure
functions of explicit parameters and keys, as dreamerv3's ``initial/observe/imagine`` and
evosax's strategies are:

* ``discrete``, ``action_dim``: the actions it takes, in agent units: one-hot ``[B, A]`` for
  a discrete space, ``[B, A]`` in [-1, 1] for a box (the model maps them to what it was
  trained on);
* ``initial(params, batch) -> state``: the state before anything is observed;
* ``observe(params, state, action, obs, is_first, key) -> state``: a start state from
  observed data: the state after seeing ``obs`` [B, ...] (in the env's layout), ``action``
  being the one taken at ``state``; where ``is_first``, from ``initial`` (an RSSM's
  posterior, TD-MPC2's encoding, a frame stack as it is, VAE + MDN-RNN's memory and code);
* ``step(params, state, action, key) -> (state, reward [B], cont [B])``: one imagined step
  given an action: the next state, the transition's reward and the probability that the
  episode continues (1 where the model cannot end one);
* ``features(params, state) -> [B, F]``: what a policy or value reads (for a pixel model
  whose policy reads pixels, the frames themselves);
* ``decodes`` and ``decode(params, state) -> frames [B, H, W, C]`` in [0, 1] where it
  decodes observations;
* ``differentiable``: whether a step's outputs have gradients with respect to its action and
  state (an agent that backpropagates through the dynamics needs it).

Over the protocol, one function each: ``imagine`` (a policy's rollout, differentiable: an
actor-critic's loss), ``rollout_sequences`` (fixed action sequences: a planner's candidates),
``as_env`` (the model as an env of the acting layer, so ``acting.rollout`` steps a PPO or
CMA-ES population in it as in a real env), ``through_model`` (a policy over model states
acting in a real env: each observation observed first), ``observe_sequence`` (the states of
replayed sequences: where imagination starts) and ``open_loop`` (predictions from replayed
sequences, the model alone after a few observed steps).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from jaxwm.envs import acting
from jaxwm.envs.types import StepResult


@runtime_checkable
class WorldModel(Protocol):
    discrete: bool
    action_dim: int
    decodes: bool
    differentiable: bool

    def initial(self, params, batch: int) -> Any: ...

    def observe(self, params, state, action, obs, is_first, key) -> Any: ...

    def step(self, params, state, action, key) -> tuple[Any, jax.Array, jax.Array]: ...

    def features(self, params, state) -> jax.Array: ...

    def decode(self, params, state) -> jax.Array: ...


class Trajectory(NamedTuple):
    """An imagined rollout of N starts over H steps: ``states`` [N, H + 1, ...] (the start
    first), ``actions`` [N, H, A] (agent units), ``rewards`` and ``conts`` [N, H] (of each
    transition)."""

    states: Any
    actions: jax.Array
    rewards: jax.Array
    conts: jax.Array


def agent_action(model: WorldModel, sample: jax.Array) -> jax.Array:
    """A policy's sample in the model's agent units: one-hot for discrete actions."""
    if model.discrete:
        return jax.nn.one_hot(sample, model.action_dim)
    return sample.astype(jnp.float32)


def imagine(model: WorldModel, params, start, act: Callable, horizon: int, key) -> Trajectory:
    """``horizon`` steps from ``start`` [N, ...] under ``act(features [N, F], key) -> action``
    (agent units), one ``lax.scan``; each step's key splits into the action's and the
    model's. Gradients flow where the model and ``act`` let them."""

    def step(state, k):
        k_act, k_step = jax.random.split(k)
        action = act(model.features(params, state), k_act)
        next_state, reward, cont = model.step(params, state, action, k_step)
        return next_state, (state, action, reward, cont)

    last, (states, actions, rewards, conts) = jax.lax.scan(
        step, start, jax.random.split(key, horizon))
    states = jax.tree.map(lambda seq, x: jnp.concatenate([seq, x[None]], 0), states, last)
    batch_first = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    return Trajectory(jax.tree.map(batch_first, states), batch_first(actions),
                      batch_first(rewards), batch_first(conts))


def rollout_sequences(model: WorldModel, params, start, sequences, key, emit: tuple = ()):
    """Fixed action ``sequences`` [N, H, A] from ``start`` [N, ...]: ``(rewards [N, H],
    conts [N, H], final state)``, one ``lax.scan`` (a planner's candidates, scored and never
    executed). ``emit``: also, as a fourth output, ``{name: [N, H, ...]}`` of each state after
    a step, for ``"features"`` and (a model that decodes) ``"frames"``."""
    views = {"features": model.features, "frames": model.decode}

    def step(state, inputs):
        action, k = inputs
        state, reward, cont = model.step(params, state, action, k)
        return state, (reward, cont, {name: views[name](params, state) for name in emit})

    keys = jax.random.split(key, sequences.shape[1])
    final, (rewards, conts, seen) = jax.lax.scan(step, start,
                                                 (jnp.swapaxes(sequences, 0, 1), keys))
    batch_first = partial(jnp.swapaxes, axis1=0, axis2=1)
    out = (batch_first(rewards), batch_first(conts), final)
    return out + (jax.tree.map(batch_first, seen),) if emit else out


def predict(model: WorldModel, params, obs, sequences, key) -> dict:
    """What the model predicts from observations ``obs`` [N, ...] under action ``sequences``
    [N, H, A] (agent units): ``rewards`` and ``continues`` [N, H], the ``features`` [N, H, F]
    of each state after a step and, where it decodes, its ``frames`` [N, H, ...]. What a
    trained run's ``world_model.imagine`` shows (``jaxwm.trained``)."""
    k_observe, k_steps = jax.random.split(key)
    batch = obs.shape[0]
    start = model.observe(params, model.initial(params, batch), jnp.zeros_like(sequences[:, 0]),
                          obs, jnp.ones(batch, bool), k_observe)
    emit = ("features", "frames") if model.decodes else ("features",)
    rewards, conts, _, seen = rollout_sequences(model, params, start, sequences, k_steps, emit)
    return {"rewards": rewards, "continues": conts, **seen}


def planned_return(rewards, conts, final_value, discount: float):
    """A planner's return of each candidate [N]: rewards discounted while the rollout is
    alive (until and including the step into a state with ``cont`` < 0.5) plus the discounted
    ``final_value`` [N] of a final state still alive."""
    ends = (conts < 0.5).astype(jnp.float32)
    alive = jnp.cumprod(1.0 - jnp.concatenate([jnp.zeros_like(ends[:, :1]), ends[:, :-1]], 1),
                        1)
    after = alive[:, -1] * (1.0 - ends[:, -1])
    horizon = rewards.shape[1]
    discounts = discount ** jnp.arange(horizon, dtype=jnp.float32)
    return jnp.sum(discounts * alive * rewards, 1) + discount ** horizon * after * final_value


def as_env(model: WorldModel, params) -> acting.EnvStep:
    """The model as an env of the acting layer (``acting.sync``): its state is ``(model
    state, alive [n], key)``; a step takes actions as a policy in the env gives them (an
    index, as PPO's, is made one-hot), observes ``features`` and ends an episode where
    ``cont`` < 0.5. An ended row stays ended (``terminated`` on every later row, so its later
    steps are invalid transitions), as MOPO's rollouts stop there: no imagined episode
    restarts. Start it with ``env_start(model, params, state, key)``."""

    def step(env_state, action):
        state, alive, key = env_state
        key, k_step = jax.random.split(key)
        if model.discrete and jnp.issubdtype(action.dtype, jnp.integer):
            action = jax.nn.one_hot(action, model.action_dim)
        state, reward, cont = model.step(params, state, action, k_step)
        ended = alive & (cont < 0.5)
        no = jnp.zeros_like(alive)
        return (state, alive & ~ended, key), StepResult(
            obs=model.features(params, state), reward=reward, terminated=~alive | ended,
            truncated=no, episode_over=ended, raw_reward=reward)

    return acting.sync(step)


def env_start(model: WorldModel, params, state, key):
    """``(env_state, first rows)`` of ``as_env`` from model states [n, ...]: what
    ``acting.ActorState.start`` and ``acting.rollout`` take."""
    obs = model.features(params, state)
    n = obs.shape[0]
    alive = jnp.ones(n, bool)
    first = StepResult(obs=obs, reward=jnp.zeros(n), terminated=~alive, truncated=~alive,
                       episode_over=~alive, raw_reward=jnp.zeros(n))
    return (state, alive, key), first


def through_model(model: WorldModel, model_params: Callable, inner: acting.Policy,
                  to_env: Callable) -> acting.Policy:
    """A policy acting in a real env through ``model``: each observation is observed into the
    model's state (with the action taken before it), then ``inner`` acts on that state
    (``inner.act`` receives model states where a policy receives observations) and returns
    an action in agent units, which ``to_env`` maps to the env's. ``model_params(params)``
    picks the model's parameters out of the policy's. Carry: ``(model state, last action,
    inner carry)``."""

    def init_carry(params, num_envs):
        return (model.initial(model_params(params), num_envs),
                jnp.zeros((num_envs, model.action_dim)), inner.init_carry(params, num_envs))

    def act(params, carry, obs, is_first, key, temperature=1.0):
        state, last_action, inner_carry = carry
        k_obs, k_act = jax.random.split(key)
        state = model.observe(model_params(params), state, last_action, obs, is_first, k_obs)
        inner_carry, action, extras = inner.act(params, inner_carry, state, is_first, k_act,
                                                temperature)
        return (state, action, inner_carry), to_env(action), extras

    return acting.Policy(init_carry=init_carry, act=act)


def open_loop(model: WorldModel, params, batch, context: int, key):
    """Open-loop predictions on replayed sequences ``batch`` [B, T] (the replay's convention:
    ``obs``, the ``action`` taken at it, ``reward`` and ``is_first`` arriving with it): the
    first ``context`` observations observed, then the model alone under the replayed
    actions. Returns ``(rewards [B, T - context], states [B, T - context, ...])``, the
    predictions for steps ``context .. T - 1`` (compare ``batch["reward"][:, context:]``)."""
    actions = agent_action(model, batch["action"])
    time_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    k_obs, k_img = jax.random.split(key)
    seen = observe_sequence(model, params, jax.tree.map(lambda x: x[:, :context], batch),
                            k_obs)
    state = jax.tree.map(lambda x: x[:, -1], seen)

    def imagine_step(state, inputs):
        action, k = inputs
        state, reward, _ = model.step(params, state, action, k)
        return state, (state, reward)

    rest = time_major(actions[:, context - 1:-1])
    _, (states, rewards) = jax.lax.scan(imagine_step, state,
                                        (rest, jax.random.split(k_img, rest.shape[0])))
    return time_major(rewards), jax.tree.map(time_major, states)


def observe_sequence(model: WorldModel, params, batch, key):
    """The states ``[B, T, ...]`` after observing each step of replayed sequences ``batch``
    (``obs``, the ``action`` taken at it, ``is_first``; one ``lax.scan`` of ``observe``):
    where imagination or a dream starts from real data."""
    actions = agent_action(model, batch["action"])
    prev = jnp.concatenate([jnp.zeros_like(actions[:, :1]), actions[:, :-1]], 1)
    time_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731

    def step(state, inputs):
        obs, action, first, k = inputs
        state = model.observe(params, state, action, obs, first, k)
        return state, state

    xs = jax.tree.map(time_major, (batch["obs"], prev, batch["is_first"]))
    _, states = jax.lax.scan(step, model.initial(params, actions.shape[0]),
                             (*xs, jax.random.split(key, actions.shape[1])))
    return jax.tree.map(time_major, states)


def replay_starts(model: WorldModel, params, replay, key, sequences: int, length: int,
                  num: int):
    """``num`` model states drawn uniformly from the states of ``sequences`` replayed
    sequences of ``length`` steps (``observe_sequence``): where a dream starts."""
    k_batch, k_observe, k_pick = jax.random.split(key, 3)
    seen = observe_sequence(model, params, replay.sample(k_batch, sequences, length), k_observe)
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), seen)
    picks = jax.random.randint(k_pick, (num,), 0, sequences * length)
    return jax.tree.map(lambda x: x[picks], flat)
