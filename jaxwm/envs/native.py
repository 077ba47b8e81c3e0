"""Environments written in JAX (gymnax, Craftax, MuJoCo Playground) behind the acting layer's
interface.

An env id ``<suite>:<name>`` (``gymnax:CartPole-v1``, ``gymnax:Breakout-MinAtar``,
``craftax:Craftax-Classic-Symbolic-v1``, ``playground:CartpoleBalance``) names an env of a
suite whose envs are pure JAX functions (``jaxwm.envs.suites``). ``NativeEnv`` offers what
``factory.EnvPoolEnv`` offers (``spec``, ``xla_reset``/``xla_step``, host ``reset``/``step``
for the evaluator), but its env state is an ordinary pytree (``NativeState``): the acting
layer keeps it in the ``ActorState`` (``EnvStep.in_state``), so it is stepped inside the same
compiled program as the policy and the update, vmapped with it, and checkpointed with the rest
of the training state, so that a resume continues the same episodes.

Conventions, exactly envpool's (``jaxwm.envs.types``), whatever the suite does itself:

* Auto-reset: the step that ends an episode returns its true final observation with
  ``terminated`` or ``truncated``; the env's next step ignores its action and returns the
  first observation of a new episode, reward 0 and both flags False. (gymnax's own ``step``
  replaces the final observation by the next episode's first; the suites' ``step_env`` /
  ``reset_env`` without auto-reset are what is wrapped here.) Resets are computed only on a
  step where some env needs one (a ``lax.cond`` over the pool), since a Craftax reset
  generates a world.
* Time limits are jaxwm's: the suite's own limit is lifted (its parameters' step limit set
  to the largest int32) and ``truncated`` is set when an episode reaches
  ``env.max_episode_steps`` agent steps (0: the suite's default limit) without terminating,
  so termination (the value target is cut) and truncation (it is bootstrapped) stay apart.
* Randomness: each env has its own key, env i's from ``PRNGKey(seed + i)`` (envpool seeds env
  i with seed + i, so several processes' pools together are the one-process pool); every step
  splits it, so an env's future is a function of its state alone.
* ``episode_over`` is ``terminated | truncated`` and ``raw_reward`` the reward (no clipping).
* Outcomes (``StepResult.outcomes``, named in ``EnvSpec.outcomes``): what a suite reports of
  an episode at its last step, 0 elsewhere; Craftax's achievements, 1 where that episode
  unlocked one (``charts/`` and ``eval/achievements/<name>``, the success rates).

Observation layouts (per env):

===========  ===============================================================================
classic      gymnax's classic control: float32 vectors, as gymnax returns them.
minatar      MinAtar's channel frames (Young & Tian 2019; gymnax's ``*-MinAtar``): uint8
             ``(C, 10, 10)`` channels-first, each cell 0 or 255, so every pixel encoder's
             [0, 1] scaling sees MinAtar's binary channels. ``env.flatten_obs=True`` gives
             gymnax's float32 ``(10, 10, C)`` flattened to ``(100 C,)`` instead (PureJaxRL's
             ``FlattenObservationWrapper``, for its MLP).
craftax      symbolic: float32 vectors as Craftax returns them; pixels: uint8 ``(3, H, W)``
             channels-first (Craftax's float RGB in [0, 1] times 255; Craftax-Classic is
             63 x 63, resized where ``env.img_height`` and ``env.img_width`` are set).
dmc          Playground's DM Control Suite tasks: float32 state vectors, as Playground
             returns them; actions in [-1, 1]; ``env.frame_skip`` is the action repeat.
===========  ===============================================================================

A suite is an optional extra (``pip install 'jaxwm[gymnax]'``, ``'jaxwm[craftax]'``,
``'jaxwm[playground]'``): an id of a suite that is not installed stops with one line naming
the extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxwm.config import ConfigError
from jaxwm.envs import suites
from jaxwm.envs.families import observation_mask
from jaxwm.envs.types import EnvSpec, StepResult


def is_native(env_id: Any) -> bool:
    """Whether ``env_id`` names an env of a JAX suite (``<suite>:<name>``)."""
    return isinstance(env_id, str) and ":" in env_id


def is_minatar(env_id: Any) -> bool:
    """Whether ``env_id`` names one of gymnax's MinAtar games (``gymnax:Breakout-MinAtar``)."""
    return is_native(env_id) and env_id.startswith("gymnax:") and env_id.endswith("-MinAtar")


# ----------------------------------------------------------------------------- the pool


@struct.dataclass
class NativeState:
    """A pool of JAX envs between steps, every leaf ``[num_envs, ...]``: the suite's own
    ``inner`` state, each env's ``key``, the agent steps ``elapsed`` in its episode and
    whether the row it last returned was its episode's ``final`` one (its next step resets)."""

    inner: Any
    key: jax.Array
    elapsed: jax.Array
    final: jax.Array


class NativeEnv:
    """``num_envs`` envs of a JAX suite: ``xla_reset()`` (the pool's first state and rows,
    from its seed), the pure ``xla_step(state, action)``, and a host path (``reset``/``step``
    on numpy, the state held here) for the evaluator."""

    is_async = False
    in_state = True  # the acting layer keeps the env state in the ActorState

    def __init__(self, env_config: Mapping[str, Any], num_envs: int, seed: int) -> None:
        env_id = str(env_config.get("id"))
        if env_config.get("pixels", False):
            raise ConfigError(f"env.pixels=True renders DMC tasks with dm_control; {env_id} is "
                              "a JAX env, whose observations are what its id says (Craftax: "
                              "the -Pixels- ids). Leave env.pixels False.")
        self._suite, self._task = suites.task(env_id, env_config)
        task = self._task
        self.num_envs, self.seed, self._host_seed = num_envs, seed, seed
        limit = int(env_config.get("max_episode_steps", 0) or task.max_episode_steps)
        self._limit = limit
        example = jax.eval_shape(lambda k: task.observe(task.reset(k)[0]),
                                 jax.random.PRNGKey(0))
        self.spec = EnvSpec(
            env_id=env_id, family=task.family, num_envs=num_envs,
            obs_shape=tuple(example.shape), obs_dtype=np.dtype(example.dtype),
            discrete=task.discrete, num_actions=task.num_actions,
            action_shape=() if task.discrete else tuple(task.action_low.shape),
            action_low=task.action_low, action_high=task.action_high, max_episode_steps=limit,
            outcomes=task.outcome_names)
        self._mask = observation_mask(env_id, self.spec.obs_shape,
                                      env_config.get("masked_indices", ()))
        self._host_state = None
        self._start_jit = jax.jit(self._start)
        self._host_step = jax.jit(self.xla_step, donate_argnums=0)

    # ---- pure functions ------------------------------------------------------------------

    def _observe(self, raw):
        obs = jax.vmap(self._task.observe)(raw)
        return obs if self._mask is None else obs * self._mask

    def _prepare_action(self, action):
        if self.spec.discrete:
            return jnp.asarray(action).astype(jnp.int32)
        return jnp.clip(jnp.asarray(action, jnp.float32), self.spec.action_low,
                        self.spec.action_high)

    def _start(self, keys) -> tuple[NativeState, StepResult]:
        carried, reset_keys, _ = _split_each(keys)
        raw, inner = jax.vmap(self._task.reset)(reset_keys)
        # A suite's reset may leave Python scalars in its state (weakly typed arrays, e.g.
        # Craftax's player_direction), which its step makes strong: the state's types would
        # change after the first step and recompile every program that takes it.
        inner = jax.tree.map(lambda x: jnp.asarray(x, x.dtype), inner)
        n = self.num_envs
        zeros, falses = jnp.zeros(n, jnp.float32), jnp.zeros(n, bool)
        state = NativeState(inner=inner, key=carried, elapsed=jnp.zeros(n, jnp.int32),
                            final=falses)
        return state, StepResult(obs=self._observe(raw), reward=zeros, terminated=falses,
                                 truncated=falses, episode_over=falses, raw_reward=zeros,
                                 outcomes={name: zeros for name in self.spec.outcomes})

    def _seed_keys(self, seed: int):
        """Env i's key stream starts at ``PRNGKey(seed + i)``."""
        return jax.vmap(jax.random.PRNGKey)(seed + jnp.arange(self.num_envs))

    def xla_reset(self) -> tuple[NativeState, StepResult]:
        """Host call: the pool's first state and rows, env i seeded with ``seed + i``."""
        return self._start_jit(self._seed_keys(self.seed))

    def xla_step(self, state: NativeState, action) -> tuple[NativeState, StepResult]:
        """Pure and jittable: every env steps, or resets where its last row was final."""
        carried, step_keys, reset_keys = _split_each(state.key)
        raw, inner, reward, terminated = jax.vmap(self._task.step)(
            step_keys, state.inner, self._prepare_action(action))
        elapsed = state.elapsed + 1
        terminated = terminated.astype(bool)
        truncated = ~terminated & (elapsed >= self._limit)

        def with_resets(raw_inner):
            raw, inner = raw_inner
            fresh_raw, fresh_inner = jax.vmap(self._task.reset)(reset_keys)
            pick = lambda new, old: jnp.where(  # noqa: E731
                state.final.reshape(state.final.shape + (1,) * (old.ndim - 1)), new, old)
            return jax.tree.map(pick, fresh_raw, raw), jax.tree.map(pick, fresh_inner, inner)

        raw, inner = jax.lax.cond(jnp.any(state.final), with_resets, lambda x: x, (raw, inner))
        reset = state.final
        reward = jnp.where(reset, 0.0, reward.astype(jnp.float32))
        terminated, truncated = terminated & ~reset, truncated & ~reset
        done = terminated | truncated
        new = NativeState(inner=inner, key=carried, elapsed=jnp.where(reset, 0, elapsed),
                          final=done)
        # Read after the step (resets replace only envs whose last row was final, never one
        # that ends now): the ending episode's own outcomes.
        outcomes = {name: jnp.where(done, value, 0.0) for name, value in
                    (jax.vmap(self._task.outcomes)(inner) if self.spec.outcomes else {}).items()}
        return new, StepResult(obs=self._observe(raw), reward=reward, terminated=terminated,
                               truncated=truncated, episode_over=done, raw_reward=reward,
                               outcomes=outcomes)

    # ---- host path (evaluation) ----------------------------------------------------------

    def start(self, seed) -> tuple[NativeState, StepResult]:
        """Pure: every env reset, env i from ``PRNGKey(seed + i)`` (``seed`` may be traced)."""
        return self._start(self._seed_keys(seed))

    def next_host_seed(self) -> int:
        """The seed of the host path's next reset, which it then moves past: each reset (an
        evaluation's) starts other episodes."""
        seed, self._host_seed = self._host_seed, self._host_seed + self.num_envs
        return seed

    def reset(self) -> StepResult:
        """Every env reset (``next_host_seed``); numpy rows."""
        self._host_state, first = self._start_jit(self._seed_keys(self.next_host_seed()))
        return jax.device_get(first)

    def step(self, actions) -> StepResult:
        if self._host_state is None:
            raise RuntimeError("Call reset() before step().")
        self._host_state, result = self._host_step(self._host_state, jnp.asarray(actions))
        return jax.device_get(result)

    @property
    def can_render(self) -> bool:
        return False

    def render(self):
        raise RuntimeError(f"{self.spec.env_id} has no renderer in jaxwm yet.")

    def close(self) -> None:
        self._host_state = None


def _split_each(keys):
    """Each env's key -> (its next key, a key for this step, a key for a reset)."""
    keys = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
    return keys[:, 0], keys[:, 1], keys[:, 2]


def make_native(env_config: Mapping[str, Any], num_envs: int, seed: int,
                batch_size: int = 0) -> NativeEnv:
    """``num_envs`` envs of ``env_config.id`` (a ``<suite>:<name>`` id); refuses an
    asynchronous pool (these envs step inside the compiled program, all at once)."""
    if 0 < batch_size < num_envs:
        raise ConfigError(f"{env_config.get('id')} is a JAX env, stepped inside the compiled "
                          "program with every env at once; it has no asynchronous pool. Set "
                          "env.batch_size=0.")
    return NativeEnv(env_config, num_envs, seed)
