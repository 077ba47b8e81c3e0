"""Python environments behind the envpool interface: ``HostEnv``, and Crafter through it.

Some environments DreamerV3 is evaluated on exist only as Python packages (Crafter, Hafner
2021, "Benchmarking the Spectrum of Agent Capabilities"). ``HostEnv`` steps a list of them on
the host and offers what ``EnvPoolEnv`` offers: ``spec``, ``reset``/``step`` (numpy) and
``xla_reset``/``xla_step`` (jittable), with envpool's auto-reset convention
(``jaxwm.envs.types``): the step that ends an episode returns its final observation with
``terminated``/``truncated``; the env's next step ignores its action and returns the first
observation of a new episode, reward 0, flags False. So every algorithm, replay and
statistic built for envpool works unchanged.

``xla_step`` calls the host through ``jax.experimental.io_callback(ordered=True)``: inside a
jitted ``lax.scan`` the envs step once per iteration, in order, and the scan's ``handle``
(a step counter) threads the order through like envpool's. It cannot be vmapped (one host
pool) and the steps run one after another in Python, so such envs are much slower than
envpool's C++ threads. Every call into the envs runs
on one thread that owns them (``OwnerThread``), because a renderer's OpenGL context
(``jaxwm.envs.dmc_pixels``) works only on the thread that made it current.

Crafter (``env.id = "crafter"``, ``pip install crafter``; jaxwm's optional extra
``jaxwm[crafter]``): 64x64 RGB observations as uint8 ``(3, 64, 64)`` channels-first like
Atari's, 17 discrete actions, episodes of at most 10,000 steps (``env.max_episode_steps``
changes that). Death ends an episode with discount 0 (``terminated``), the length limit with
discount 1 (``truncated``). The reward is Crafter's: +1 per achievement unlocked for the
first time in the episode, and +-0.1 per unit of health gained or lost. An episode's outcomes
(``StepResult.outcomes``) are its 22 achievements, 1 where it unlocked one (Crafter's
``info["achievements"]`` counts at its last step), the success rates of Crafter's score.
Crafter 1.8.3 is not bit-reproducible from its seed: every 10 steps it balances creatures per
chunk by iterating a ``set`` of objects, whose order follows memory addresses, so two worlds
with one seed can differ in a few creatures.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jaxwm.config import ConfigError
from jaxwm.envs.types import EnvSpec, StepResult

CRAFTER_ACTIONS = 17


class OwnerThread:
    """One daemon thread that runs every call into a set of envs, so that they are made,
    used and freed on one thread: OpenGL contexts (dm_control's EGL renderer) belong to the
    thread that made them current, and ``io_callback`` runs its callbacks on XLA's threads.
    A daemon thread and not a ``ThreadPoolExecutor``: an executor refuses work once the
    interpreter starts shutting down, which is when unclosed envs are freed."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            function, args, result = item
            try:
                result.set_result(function(*args))
            except BaseException as error:  # handed to the caller
                result.set_exception(error)

    def call(self, function: Callable, *args: Any) -> Any:
        """``function(*args)`` on the owner thread; its result, or its exception raised here."""
        if not self._thread.is_alive():
            raise RuntimeError(f"{self._thread.name}: these envs were closed.")
        result: Future = Future()
        self._calls.put((function, args, result))
        return result.result()

    def stop(self) -> None:
        self._calls.put(None)
        self._thread.join()


def _release(owner: OwnerThread, envs: list) -> None:
    """Closes and drops the envs on their owner thread, then stops it."""
    def close_all():
        for env in envs:
            if hasattr(env, "close"):
                env.close()
        envs.clear()

    owner.call(close_all)
    owner.stop()


class HostEnv:
    """``num_envs`` Python envs with the old Gym API (``reset() -> obs``, ``step(a) -> (obs,
    reward, done, info)``, ``info["discount"]`` 0 at a termination), batched on the host.

    ``make_one(seed)`` builds one env; ``observe(obs)`` maps its observation to this
    library's layout; ``outcomes(info)`` reads ``spec.outcomes`` from the ``info`` of an
    episode's last step. Actions follow ``spec``: an int per env for a discrete space; for a
    continuous one a float32 vector, clipped to ``[action_low, action_high]`` as
    ``EnvPoolEnv`` does."""

    def __init__(self, spec: EnvSpec, make_one: Callable[[int], Any], seed: int,
                 observe: Callable[[np.ndarray], np.ndarray],
                 outcomes: Callable[[dict], Mapping[str, float]] | None = None) -> None:
        self.spec = spec
        self.batch_size = spec.num_envs
        self.is_async = False
        self._owner = OwnerThread(f"jaxwm-{spec.env_id}")
        self._envs = self._owner.call(lambda: [make_one(seed + i) for i in range(spec.num_envs)])
        # Closed on their thread at close(), when this env is collected, or at exit. The
        # exit hook is registered after the envs exist, so it runs before any exit hook they
        # registered themselves (atexit runs last in, first out): dm_control frees its OpenGL
        # contexts at exit from the main thread, which fails unless they were freed already.
        self._finalizer = weakref.finalize(self, _release, self._owner, self._envs)
        atexit.register(self._finalizer)
        self._observe = observe
        self._outcomes = outcomes
        self._needs_reset = np.ones(spec.num_envs, bool)
        self._last_obs: list[np.ndarray] = [None] * spec.num_envs

    # ---- host path ----------------------------------------------------------------------------

    def reset(self) -> StepResult:
        """Reset every env; reward 0 and all flags False."""
        return self._owner.call(self._reset)

    def step(self, actions: Any) -> StepResult:
        """Step every env with ``actions`` ``[num_envs]``; envs whose last step ended an
        episode reset instead (their action is ignored)."""
        return self._owner.call(self._step, actions)

    def _reset(self) -> StepResult:
        obs = np.stack([self._observe(env.reset()) for env in self._envs])
        self._needs_reset[:] = False
        self._last_obs = list(obs)
        zeros, falses = np.zeros(self.spec.num_envs, np.float32), np.zeros(self.spec.num_envs, bool)
        return StepResult(obs=obs, reward=zeros, terminated=falses, truncated=falses,
                          episode_over=falses, raw_reward=zeros, outcomes=self._no_outcomes())

    def _no_outcomes(self) -> dict[str, np.ndarray]:
        return {name: np.zeros(self.spec.num_envs, np.float32) for name in self.spec.outcomes}

    def _step(self, actions: Any) -> StepResult:
        actions = self._host_actions(actions)
        n = self.spec.num_envs
        reward = np.zeros(n, np.float32)
        terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
        outcomes = self._no_outcomes()
        for i, env in enumerate(self._envs):
            if self._needs_reset[i]:
                self._last_obs[i] = self._observe(env.reset())
                self._needs_reset[i] = False
                continue
            obs, r, done, info = env.step(actions[i])
            self._last_obs[i] = self._observe(obs)
            reward[i] = r
            terminated[i] = done and float(info.get("discount", 0.0)) == 0.0
            truncated[i] = done and not terminated[i]
            self._needs_reset[i] = done
            if done and self._outcomes is not None:
                for name, value in self._outcomes(info).items():
                    outcomes[name][i] = value
        over = terminated | truncated
        return StepResult(obs=np.stack(self._last_obs), reward=reward, terminated=terminated,
                          truncated=truncated, episode_over=over, raw_reward=reward.copy(),
                          outcomes=outcomes)

    def _host_actions(self, actions: Any) -> list:
        spec = self.spec
        if spec.discrete:
            return [int(a) for a in np.asarray(actions).reshape(spec.num_envs)]
        actions = np.asarray(actions, np.float32).reshape(spec.num_envs, *spec.action_shape)
        return list(np.clip(actions, spec.action_low, spec.action_high))

    @property
    def can_render(self) -> bool:
        return True

    def render(self) -> np.ndarray:
        """Env 0's current observation as an ``H x W x 3`` uint8 frame (for videos)."""
        return np.transpose(self._last_obs[0], (1, 2, 0))

    def close(self) -> None:
        self._finalizer()

    # ---- XLA path -----------------------------------------------------------------------------

    def _result_shapes(self) -> StepResult:
        n, spec = self.spec.num_envs, self.spec
        flag = jax.ShapeDtypeStruct((n,), jnp.bool_)
        value = jax.ShapeDtypeStruct((n,), jnp.float32)
        return StepResult(obs=jax.ShapeDtypeStruct((n, *spec.obs_shape), spec.obs_dtype),
                          reward=value, terminated=flag, truncated=flag, episode_over=flag,
                          raw_reward=value, outcomes={name: value for name in spec.outcomes})

    def xla_reset(self) -> tuple[jax.Array, StepResult]:
        """Host call: reset every env; the handle (a step counter) and the first result."""
        first = self.reset()
        return jnp.zeros((), jnp.int32), jax.tree.map(jnp.asarray, first)

    def xla_step(self, handle: jax.Array, actions: jax.Array) -> tuple[jax.Array, StepResult]:
        """Jittable ``step``: the host steps the envs through an ordered ``io_callback``."""
        def host_step(_, actions):
            return self.step(actions)

        dtype = jnp.int32 if self.spec.discrete else jnp.float32
        result = io_callback(host_step, self._result_shapes(), handle, actions.astype(dtype),
                             ordered=True)
        return handle + 1, result


def _import_crafter():
    try:
        import crafter
    except ImportError:
        raise ConfigError("env.id='crafter' needs the crafter package: pip install crafter "
                          "(or pip install -e '.[crafter]').") from None
    return crafter


def check_available(env_id: str) -> None:
    """Raises a ``ConfigError`` saying what to install if ``env_id`` is a host env whose
    package is missing (for validation, before anything is built)."""
    if str(env_id).lower() == "crafter":
        _import_crafter()


def make_crafter(env_config: Mapping[str, Any], num_envs: int, seed: int) -> HostEnv:
    """``num_envs`` Crafter worlds, seeded ``seed + i`` (see the module docstring)."""
    crafter = _import_crafter()
    length = int(env_config.get("max_episode_steps", 0)) or 10_000
    spec = EnvSpec(env_id="crafter", family="crafter", num_envs=num_envs,
                   obs_shape=(3, 64, 64), obs_dtype=np.dtype(np.uint8), discrete=True,
                   num_actions=CRAFTER_ACTIONS, action_shape=(), action_low=None,
                   action_high=None, max_episode_steps=length,
                   outcomes=tuple(f"achievements/{a}" for a in crafter.constants.achievements))
    return HostEnv(spec, lambda s: crafter.Env(length=length, seed=s), seed,
                   lambda obs: np.transpose(np.asarray(obs, np.uint8), (2, 0, 1)),
                   outcomes=lambda info: {f"achievements/{name}": float(count > 0)
                                          for name, count in info["achievements"].items()})


# Env ids provided by Python packages instead of envpool: id -> builder.
HOST_ENVS: dict[str, Callable[[Mapping[str, Any], int, int], HostEnv]] = {"crafter": make_crafter}
