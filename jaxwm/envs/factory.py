"""``make_env``: one envpool batch with a host path (numpy) and an XLA path (jit/scan).

Both paths run the same post-processing (``families.transform_obs`` and ``_to_result``), so a
rollout through ``xla_step`` inside ``lax.scan`` returns exactly what ``step`` returns on the
host for the same seed and actions. The pool is synchronous (``batch_size == num_envs``)
unless built with a smaller ``batch_size`` (below), and uses envpool's Gymnasium API, whose
``terminated``/``truncated`` are passed through unchanged (envpool sets ``truncated`` when
``max_episode_steps`` is reached, ``terminated`` otherwise).
Auto-reset is envpool's; see ``jaxwm.envs.types``.

Asynchronous pools (``make_env(..., batch_size=B)`` with ``B < num_envs``; envpool's async
mode): every env steps on its own thread as soon as it has an action, and ``xla_recv`` returns
the first ``B`` envs to finish, with their ids, whichever they are; ``xla_send`` hands those
envs their actions. ``xla_async_reset`` starts all of them. The synchronous calls (``step``,
``xla_step``, ``reset``, ``xla_reset``) refuse such a pool. Within one ``recv`` the ids are
distinct (an env is not ready again before its action is sent); across ``recv``s envs appear
unevenly. ``jaxwm.agents.ppo.collect_from_pool`` turns that stream back into trajectories.

Actions: discrete actions are cast to int32. Continuous actions are cast to float32 and
**clipped to the action space's [low, high]** before they are sent, on both paths, so a
Gaussian policy may emit unbounded samples (the learner keeps the unclipped sample for its
log-probability).

Masking: ``env_config.masked_indices`` lists dims of a vector observation that are set to 0
on both paths, e.g. (1, 3) for CartPole's velocities: the partially observable variants
BenchNetRL uses ("velocity masking", zeroed rather than removed as in its
``MaskObservationWrapper``, so the observation keeps its shape).

Float64 envs (MuJoCo and DMC): envpool 1.2.5 computes these in float64 and its XLA custom call
expects float64 actions and writes float64 observations. With JAX's default 32-bit mode the
call would be built with float32 buffers and crash the process, so ``xla_step`` builds and
traces only the envpool call inside ``jax.enable_x64(True)`` and casts back to float32 at the
boundary; the rest of the program stays 32-bit.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import envpool
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.config import ConfigError
from jaxwm.envs import dmc_pixels, host, mujoco_video, native
from jaxwm.envs.families import (
    UnknownEnvError,
    dummy_obs,
    envpool_kwargs,
    infer_family,
    observation_mask,
    transform_obs,
)
from jaxwm.envs.host import HOST_ENVS, HostEnv
from jaxwm.envs.types import EnvSpec, StepResult

# envpool builds float64 gymnasium Boxes that gymnasium narrows to float32, warning once per
# env; the narrowing is what we want (observations are float32), so the warning is noise.
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32.*")


def make_env(env_config: Mapping[str, Any], num_envs: int, seed: int, *,
             render: bool = False, batch_size: int = 0,
             num_threads: int = 0) -> EnvPoolEnv | HostEnv | native.NativeEnv:
    """Build an envpool batch of ``num_envs`` copies of ``env_config.id``: synchronous, or
    asynchronous returning ``batch_size`` envs per ``recv`` if ``0 < batch_size < num_envs``.

    ``num_threads``: envpool's worker threads; 0 leaves envpool's default (one per env of a
    batch) for a synchronous pool and takes ``min(batch_size, cores)`` for an asynchronous
    one, whose threads compete with the learner for the cores.

    ``render``: build envpool's renderer, for an env that records video (evaluation). Off
    for training envs: envpool's ``render_mode="rgb_array"`` keeps a full-size RGB frame per
    env and step, a sizeable share of raw Atari throughput (``benchmarks/ppo_throughput.py``,
    the env-path audit rows). MuJoCo and DMC envs render through EGL
    (``jaxwm.envs.mujoco_video``), checked here by one rendered frame: a ``ConfigError`` line
    saying what to install where that fails.

    Ids of ``jaxwm.envs.host.HOST_ENVS`` (``"crafter"``) are Python packages' envs stepped on
    the host behind the same interface (``HostEnv``), and so are DMC tasks with
    ``env_config.pixels`` (``jaxwm.envs.dmc_pixels``: dm_control renders them).

    Ids ``<suite>:<name>`` (``gymnax:CartPole-v1``) are envs written in JAX
    (``jaxwm.envs.native``), whose state the acting layer keeps in the training state.

    ``env_config`` (an ``ml_collections.ConfigDict`` or any mapping) is read with ``.get`` and
    defaults, so partially filled configs work; fields are documented in
    ``jaxwm.envs.families.envpool_kwargs``. Raises ``UnknownEnvError`` for an id envpool does
    not register, before anything is built.
    """
    env_id = env_config.get("id", None)
    if not env_id:
        raise UnknownEnvError("env_config.id is required, e.g. 'CartPole-v1' or 'Breakout-v5'.")
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
    if native.is_native(env_id):
        return native.make_native(env_config, num_envs, seed, batch_size)
    pixels = bool(env_config.get("pixels", False))
    host_env = HOST_ENVS.get(str(env_id).lower())  # a Python package's env (jaxwm.envs.host)
    if (host_env or pixels) and 0 < batch_size < num_envs:
        raise ConfigError(f"{env_id}{' from pixels' * pixels} runs on the host and has no "
                          "asynchronous mode; set env.batch_size=0.")
    if host_env:
        return host_env(env_config, num_envs, seed)
    family = infer_family(str(env_id))
    if pixels:
        _require_dmc(str(env_id))
        return dmc_pixels.make_dmc_pixels(env_config, num_envs, seed)
    if not 0 <= batch_size <= num_envs:
        raise ConfigError(f"batch_size={batch_size} must be in [0, num_envs={num_envs}] "
                          "(0: all envs, synchronous).")
    masked = tuple(int(i) for i in env_config.get("masked_indices", ()) or ())
    kwargs = envpool_kwargs(family, env_config)
    batch_size = batch_size or num_envs
    if num_threads or batch_size < num_envs:
        kwargs["num_threads"] = num_threads or min(batch_size, os.cpu_count() or 1)
    return EnvPoolEnv(str(env_id), family, num_envs, seed, kwargs, masked, render=render,
                      batch_size=batch_size)


def _is_reset_step(info, xp) -> Any:
    """Whether a step was envpool's reset step (every env's ``elapsed_step`` back at 0): with
    an action repeat, an agent step after an episode's end is that one control step alone,
    so the next episode's agent steps stay aligned with its control steps. DMC's episodes
    have a fixed length, so a synchronous pool's envs end together."""
    return xp.all(xp.asarray(info["elapsed_step"]) == 0)


def _summed(first, then):
    """envpool's ``(obs, reward, terminated, truncated, info)`` of ``then`` with the rewards
    of both steps: one agent step of an action repeat."""
    obs, reward, terminated, truncated, info = then
    return obs, first[1] + reward, terminated, truncated, info


def probe_spec(env_config: Mapping[str, Any]) -> EnvSpec:
    """The ``EnvSpec`` of ``env_config``'s env (for one env), from one env built and closed at
    once: how validation checks an algorithm against the env's spaces before anything else is
    built. Raises ``UnknownEnvError`` / ``ConfigError`` as ``make_env`` does."""
    check_available(env_config)
    env = make_env(env_config, num_envs=1, seed=0)
    try:
        return env.spec
    finally:
        env.close()


def check_available(env_config: Mapping[str, Any]) -> None:
    """Raises a ``ConfigError`` saying what to install if ``env_config`` asks for an env whose
    Python package or renderer is missing here (for validation, before anything is built)."""
    if native.is_native(env_config.get("id", "")):
        return  # building its spec (probe_spec) checks the suite and the id
    if env_config.get("pixels", False):
        _require_dmc(str(env_config.get("id", "")))
        dmc_pixels.check_available()
    host.check_available(env_config.get("id", ""))


def _require_dmc(env_id: str) -> None:
    if env_id.lower() in HOST_ENVS or infer_family(env_id) != "dmc":
        raise ConfigError(f"env.pixels=True renders DMC tasks with dm_control (e.g. "
                          f"WalkerWalk-v1, CheetahRun-v1); {env_id} is not one.")


def _is_float64(space: Any) -> bool:
    if hasattr(space, "spaces") and isinstance(space.spaces, Mapping):
        return any(_is_float64(s) for s in space.spaces.values())
    return np.dtype(space.dtype) == np.float64


class EnvPoolEnv:
    """A vectorised envpool env with numpy (host) and jittable (XLA) step functions."""

    def __init__(self, env_id: str, family: str, num_envs: int, seed: int, kwargs: dict[str, Any],
                 masked: tuple[int, ...] = (), *, render: bool = False,
                 batch_size: int | None = None) -> None:
        self._family = family
        self._render = render
        self.batch_size = batch_size or num_envs
        kwargs = dict(kwargs)
        self._repeat = int(kwargs.pop("action_repeat", 1))
        if self._repeat > 1 and self.batch_size < num_envs:
            raise ConfigError(f"{env_id}: an action repeat (env.frame_skip={self._repeat}) "
                              "needs a synchronous pool; set env.batch_size=0.")
        if render and family in mujoco_video.FAMILIES:
            # Never render before this check: without EGL envpool's MuJoCo ends the process.
            kwargs.update(mujoco_video.render_kwargs(family, env_id))
            mujoco_video.check(env_id, {k: v for k, v in kwargs.items() if k != "num_threads"})
        elif render:
            kwargs["render_mode"] = "rgb_array"
        self._env = envpool.make(
            env_id,
            env_type="gymnasium",
            num_envs=num_envs,
            batch_size=self.batch_size,
            seed=seed,
            **kwargs,
        )
        obs_space, act_space = self._env.observation_space, self._env.action_space
        # What the C++ side reads (int32 for Discrete, whose gymnasium dtype says int64).
        self._action_dtype = np.dtype(self._env.spec.action_array_spec["action"].dtype)
        self._x64 = _is_float64(obs_space) or self._action_dtype == np.float64
        discrete = isinstance(act_space, gymnasium.spaces.Discrete)
        example = transform_obs(family, dummy_obs(obs_space), np)
        self.spec = EnvSpec(
            env_id=env_id,
            family=family,
            num_envs=num_envs,
            obs_shape=tuple(example.shape[1:]),
            obs_dtype=np.dtype(example.dtype),
            discrete=discrete,
            num_actions=int(act_space.n) if discrete else None,
            action_shape=() if discrete else tuple(act_space.shape),
            action_low=None if discrete else np.asarray(act_space.low, np.float32),
            action_high=None if discrete else np.asarray(act_space.high, np.float32),
            max_episode_steps=int(self._env.config["max_episode_steps"]) // self._repeat,
        )
        self._xla_handle: np.ndarray | None = None
        self._xla_step_fn: Any = None
        self._xla_recv_fn: Any = None
        self._xla_send_fn: Any = None
        try:
            self._mask = observation_mask(env_id, self.spec.obs_shape, masked)
        except ConfigError:
            self._env.close()
            raise

    def _observe(self, obs: Any, xp: ModuleType) -> Any:
        obs = transform_obs(self._family, obs, xp)
        return obs if self._mask is None else obs * self._mask

    # ---- shared post-processing -------------------------------------------------------------

    def _prepare_action(self, actions: Any, xp: ModuleType) -> Any:
        if self.spec.discrete:
            return xp.asarray(actions).astype(xp.int32)
        return xp.clip(xp.asarray(actions, dtype=xp.float32), self.spec.action_low, self.spec.action_high)

    def _to_result(
        self, xp: ModuleType, obs: Any, reward: Any, terminated: Any, truncated: Any, info: Any
    ) -> StepResult:
        reward = xp.asarray(reward).astype(xp.float32)
        terminated = xp.asarray(terminated).astype(bool)
        truncated = xp.asarray(truncated).astype(bool)
        if self._family == "atari":
            # With episodic_life a lost life sets `terminated`; envpool's info['terminated'] is
            # the real game over (it stays 0 on life losses and on truncation).
            game_over = xp.asarray(info["terminated"]).astype(bool)
            episode_over = truncated | (terminated & game_over)
            raw_reward = xp.asarray(info["reward"]).astype(xp.float32)
        else:
            episode_over = terminated | truncated
            raw_reward = reward
        return StepResult(
            obs=self._observe(obs, xp),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            episode_over=episode_over,
            raw_reward=raw_reward,
        )

    def _x64_scope(self) -> contextlib.AbstractContextManager:
        return jax.enable_x64(True) if self._x64 else contextlib.nullcontext()

    # ---- host path ----------------------------------------------------------------------------

    @property
    def is_async(self) -> bool:
        """Whether ``recv`` returns fewer than all envs (envpool's asynchronous mode)."""
        return self.batch_size < self.spec.num_envs

    def _require_sync(self, call: str) -> None:
        if self.is_async:
            raise RuntimeError(f"{call}() steps every env at once; this pool is asynchronous "
                               f"(batch_size={self.batch_size} < num_envs={self.spec.num_envs}):"
                               " use xla_async_reset/xla_recv/xla_send.")

    def _require_async(self, call: str) -> None:
        if not self.is_async:
            raise RuntimeError(f"{call}() is for asynchronous pools (make_env(..., "
                               "batch_size=B) with B < num_envs); this one is synchronous.")

    def reset(self) -> StepResult:
        """Reset every env; reward 0 and all flags False."""
        self._require_sync("reset")
        obs, _ = self._env.reset()
        zeros = np.zeros(self.spec.num_envs, np.float32)
        falses = np.zeros(self.spec.num_envs, bool)
        return StepResult(
            obs=self._observe(obs, np),
            reward=zeros,
            terminated=falses,
            truncated=falses,
            episode_over=falses,
            raw_reward=zeros,
        )

    def step(self, actions: Any) -> StepResult:
        """Step every env with ``actions`` (shape ``[num_envs, *action_shape]``)."""
        self._require_sync("step")
        action = self._prepare_action(actions, np).astype(self._action_dtype)
        out = self._env.step(action)
        if self._repeat > 1 and not _is_reset_step(out[4], np):
            for _ in range(self._repeat - 1):
                out = _summed(out, self._env.step(action))
        return self._to_result(np, *out)

    @property
    def can_render(self) -> bool:
        """Whether this env's family can render (it renders only if built with
        ``render=True``; MuJoCo and DMC envs where EGL works, which building checks)."""
        return True

    def render(self) -> np.ndarray:
        """RGB frame (uint8 ``H x W x 3``) of env 0 from envpool's renderer, for videos
        (MuJoCo and DMC: ``mujoco_video.FRAME_SIZE``, through EGL)."""
        if not self._render:
            raise RuntimeError("This env was built without a renderer (training envs never "
                               "render): build it with make_env(..., render=True).")
        return np.asarray(self._env.render())[0]

    def close(self) -> None:
        self._env.close()

    # ---- XLA path -----------------------------------------------------------------------------

    def xla_reset(self) -> tuple[jax.Array, StepResult]:
        """Host call: reset every env and return the XLA handle and the first ``StepResult``.

        The handle must be threaded through ``xla_step`` (e.g. as part of a scan carry).
        """
        self._require_sync("xla_reset")
        self._build_xla()
        first = self.reset()
        return jnp.asarray(self._xla_handle), jax.tree.map(jnp.asarray, first)

    def _build_xla(self) -> None:
        if self._xla_step_fn is None:
            with self._x64_scope():  # the custom call's buffer dtypes are fixed here
                self._xla_handle, self._xla_recv_fn, self._xla_send_fn, self._xla_step_fn = \
                    self._env.xla()

    def xla_async_reset(self) -> jax.Array:
        """Host call, asynchronous pools: reset every env and return the XLA handle. Each
        env's first observation comes from a later ``xla_recv`` (reward 0, flags False)."""
        self._require_async("xla_async_reset")
        self._build_xla()
        self._env.async_reset()
        return jnp.asarray(self._xla_handle)

    def xla_recv(self, handle: jax.Array) -> tuple[jax.Array, jax.Array, StepResult]:
        """Asynchronous pools, jittable: waits for ``batch_size`` envs and returns
        ``(handle, env_ids [batch_size] int32, StepResult)``; each row is the result of that
        env's last action (``step``'s semantics, per env), or its first observation."""
        self._require_async("xla_recv")
        with self._x64_scope():
            handle, (obs, reward, terminated, truncated, info) = self._xla_recv_fn(handle)
            obs, reward = jax.tree.map(
                lambda x: x.astype(jnp.float32) if x.dtype == jnp.float64 else x, (obs, reward))
        env_ids = info["env_id"].astype(jnp.int32)
        return handle, env_ids, self._to_result(jnp, obs, reward, terminated, truncated, info)

    def xla_send(self, handle: jax.Array, actions: jax.Array, env_ids: jax.Array) -> jax.Array:
        """Asynchronous pools, jittable: sends ``actions`` to the envs ``env_ids`` (those the
        last ``xla_recv`` returned), which start stepping at once."""
        action = self._prepare_action(actions, jnp)
        with self._x64_scope():
            return self._xla_send_fn(handle, action.astype(self._action_dtype), env_ids)

    def xla_step(self, handle: jax.Array, actions: jax.Array) -> tuple[jax.Array, StepResult]:
        """Pure, jittable step: same semantics and outputs as ``step``, on jax arrays."""
        self._require_sync("xla_step")
        if self._xla_step_fn is None:
            raise RuntimeError("Call env.xla_reset() before env.xla_step().")
        action = self._prepare_action(actions, jnp)
        with self._x64_scope():
            action = action.astype(self._action_dtype)  # float64 needs the x64 scope
            handle, out = self._xla_step_fn(handle, action)
            if self._repeat > 1:
                def repeat(carry):
                    def one(carry, _):
                        handle, out = carry
                        handle, more = self._xla_step_fn(handle, action)
                        return (handle, _summed(out, more)), None

                    return jax.lax.scan(one, carry, None, self._repeat - 1)[0]

                handle, out = jax.lax.cond(_is_reset_step(out[4], jnp), lambda c: c, repeat,
                                           (handle, out))
            obs, reward, terminated, truncated, info = out
            obs, reward = jax.tree.map(
                lambda x: x.astype(jnp.float32) if x.dtype == jnp.float64 else x, (obs, reward)
            )
        return handle, self._to_result(jnp, obs, reward, terminated, truncated, info)
