"""Environments written in JAX (gymnax, Craftax) behind the acting layer's interface.

An env id ``<suite>:<name>`` (``gymnax:CartPole-v1``, ``gymnax:Breakout-MinAtar``,
``craftax:Craftax-Classic-Symbolic-v1``) names an env of a suite whose envs are pure JAX
functions (Lange 2022, gymnax; Matthews et al. 2024, "Craftax"). ``NativeEnv`` offers what
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
             63 x 63).
===========  ===============================================================================

A suite is an optional extra (``pip install 'jaxwm[gymnax]'``, ``'jaxwm[craftax]'``): an id
of a suite that is not installed stops with one line naming the extra.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxwm.config import ConfigError
from jaxwm.envs.families import UnknownEnvError, observation_mask
from jaxwm.envs.types import EnvSpec, StepResult

UNLIMITED = int(np.iinfo(np.int32).max)


@dataclasses.dataclass(frozen=True)
class Task:
    """One env of a suite without auto-reset or time limit, as pure functions of one env:
    ``reset(key) -> (raw_obs, state)``, ``step(key, state, action) -> (raw_obs, state,
    reward, terminated)``; ``observe(raw_obs)`` is jaxwm's layout of an observation."""

    family: str
    reset: Callable
    step: Callable
    observe: Callable
    discrete: bool
    num_actions: int | None
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    max_episode_steps: int  # the suite's own limit, the default


@dataclasses.dataclass(frozen=True)
class Suite:
    """A package of JAX envs: ``ids()`` its env names, ``task(name, env_config)`` one."""

    name: str
    module: str  # the Python package that must be importable
    extra: str  # jaxwm's optional extra that installs it
    ids: Callable[[], list[str]]
    task: Callable[[str, Mapping[str, Any]], Task]


# ----------------------------------------------------------------------------- gymnax


def _gymnax_ids() -> list[str]:
    import gymnax
    return list(gymnax.registered_envs)


def _gymnax_task(name: str, env_config: Mapping[str, Any]) -> Task:
    import gymnax
    from gymnax.environments import spaces

    env, params = gymnax.make(name)
    limit = int(params.max_steps_in_episode)
    unlimited = params.replace(max_steps_in_episode=UNLIMITED)
    minatar = name.endswith("-MinAtar")
    flatten = bool(env_config.get("flatten_obs", False))
    if flatten and not minatar:
        raise ConfigError(f"env.flatten_obs flattens MinAtar's frames; gymnax:{name} observes "
                          "vectors already. Leave it False.")

    def observe(obs):
        if not minatar:
            return obs.astype(jnp.float32)
        if flatten:
            return obs.astype(jnp.float32).reshape(-1)
        return (jnp.transpose(obs, (2, 0, 1)) * 255).astype(jnp.uint8)

    def step(key, state, action):
        obs, state, reward, done, _ = env.step_env(key, state, action, unlimited)
        return obs, state, reward, done

    space = env.action_space(params)
    discrete = isinstance(space, spaces.Discrete)
    low = None if discrete else np.broadcast_to(np.asarray(space.low, np.float32), space.shape)
    high = None if discrete else np.broadcast_to(np.asarray(space.high, np.float32),
                                                 space.shape)
    return Task(family="minatar" if minatar else "classic",
                reset=lambda key: env.reset_env(key, unlimited), step=step, observe=observe,
                discrete=discrete, num_actions=int(space.n) if discrete else None,
                action_low=low, action_high=high, max_episode_steps=limit)


# ----------------------------------------------------------------------------- craftax

CRAFTAX_IDS = ["Craftax-Classic-Symbolic-v1", "Craftax-Classic-Pixels-v1",
               "Craftax-Symbolic-v1", "Craftax-Pixels-v1"]


def _craftax_task(name: str, env_config: Mapping[str, Any]) -> Task:
    del env_config
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name(name, auto_reset=False)
    params = env.default_params
    unlimited = params.replace(max_timesteps=UNLIMITED)
    pixels = "Pixels" in name

    def observe(obs):
        if pixels:
            return (jnp.transpose(obs, (2, 0, 1)) * 255).round().astype(jnp.uint8)
        return obs.astype(jnp.float32)

    def step(key, state, action):
        obs, state, reward, done, _ = env.step_env(key, state, action, unlimited)
        return obs, state, reward, done

    return Task(family="craftax", reset=lambda key: env.reset_env(key, unlimited), step=step,
                observe=observe, discrete=True, num_actions=int(env.action_space(params).n),
                action_low=None, action_high=None,
                max_episode_steps=int(params.max_timesteps))


SUITES = {
    "gymnax": Suite("gymnax", "gymnax", "gymnax", _gymnax_ids, _gymnax_task),
    "craftax": Suite("craftax", "craftax", "craftax", lambda: list(CRAFTAX_IDS), _craftax_task),
}


def is_native(env_id: Any) -> bool:
    """Whether ``env_id`` names an env of a JAX suite (``<suite>:<name>``)."""
    return isinstance(env_id, str) and ":" in env_id


def _task(env_id: str, env_config: Mapping[str, Any]) -> tuple[str, Task]:
    """``(suite, Task)`` of ``env_id``, or one line saying what is wrong with it."""
    suite_name, _, name = env_id.partition(":")
    if suite_name not in SUITES:
        raise UnknownEnvError(f"Unknown env suite {suite_name!r} in {env_id!r}; JAX suites: "
                              f"{', '.join(sorted(SUITES))} (e.g. gymnax:CartPole-v1), or an "
                              "envpool id without a prefix (e.g. CartPole-v1).")
    suite = SUITES[suite_name]
    if importlib.util.find_spec(suite.module) is None:
        raise ConfigError(f"{env_id} needs the {suite.module} package: pip install "
                          f"'jaxwm[{suite.extra}]'.")
    ids = suite.ids()
    if name not in ids:
        raise UnknownEnvError(f"Unknown env id {env_id!r}: {suite_name} has no {name!r}."
                              f"{_where_else(suite_name, name, ids)}")
    return suite_name, suite.task(name, env_config)


def _where_else(suite_name: str, name: str, ids: list[str]) -> str:
    """The hint for a name ``suite_name`` lacks: the suite (or envpool) that has it, else
    the suite's close matches, else its envs."""
    for other in SUITES.values():
        if other.name != suite_name and importlib.util.find_spec(other.module) is not None \
                and name in other.ids():
            return f" It is {other.name}'s: {other.name}:{name}."
    import envpool  # the families module has imported it already
    if name in envpool.list_all_envs():
        return f" It is an envpool id: {name} (no prefix)."
    close = difflib.get_close_matches(name, ids, n=3)
    if close:
        return f" Did you mean: {', '.join(f'{suite_name}:{c}' for c in close)}?"
    return f" Its envs: {', '.join(ids)}."


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
        self._suite, self._task = _task(env_id, env_config)
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
            action_low=task.action_low, action_high=task.action_high, max_episode_steps=limit)
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
        n = self.num_envs
        zeros, falses = jnp.zeros(n, jnp.float32), jnp.zeros(n, bool)
        state = NativeState(inner=inner, key=carried, elapsed=jnp.zeros(n, jnp.int32),
                            final=falses)
        return state, StepResult(obs=self._observe(raw), reward=zeros, terminated=falses,
                                 truncated=falses, episode_over=falses, raw_reward=zeros)

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
        return new, StepResult(obs=self._observe(raw), reward=reward, terminated=terminated,
                               truncated=truncated, episode_over=done, raw_reward=reward)

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
