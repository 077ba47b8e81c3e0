"""The suites of envs written in JAX that ``jaxwm.envs.native`` pools: gymnax (Lange 2022;
classic control and MinAtar), Craftax (Matthews et al. 2024; Craftax-Classic and Craftax,
symbolic and pixels) and MuJoCo Playground's DM Control Suite tasks (Zakka et al. 2025; state
observations, in MJX).

Each suite turns a name into a ``Task``: one env as pure functions, without auto-reset or a
time limit (the suite's own limit lifted), and ``observe``, jaxwm's layout of its
observations. The pool (``native.NativeEnv``) adds jaxwm's conventions on top. ``task(env_id,
env_config)`` is the one entry: an unknown suite or name, or a suite whose optional extra is
not installed, stops there with one line saying what to type instead.
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

from jaxwm.config import ConfigError
from jaxwm.envs.families import UnknownEnvError

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
    # ``outcomes(state) -> {name: float32 scalar}`` of one env, read at an episode's last
    # step (``StepResult.outcomes``); ``outcome_names`` its keys.
    outcomes: Callable | None = None
    outcome_names: tuple[str, ...] = ()


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


def craftax_achievements(name: str) -> list[str]:
    """The achievements of a Craftax env (Craftax-Classic's 22, Crafter's; Craftax's 67), in
    Craftax's order, lower case as Craftax logs them (``collect_wood``)."""
    if "Classic" in name:
        from craftax.craftax_classic.constants import Achievement
    else:
        from craftax.craftax.constants import Achievement
    return [a.name.lower() for a in sorted(Achievement, key=lambda a: a.value)]


def _craftax_task(name: str, env_config: Mapping[str, Any]) -> Task:
    """Craftax's pixels are resized (bilinear, ``jax.image.resize``) to ``env.img_height`` x
    ``env.img_width`` where both are set: DreamerV3's encoder takes 64 x 64, Craftax-Classic
    renders 63 x 63. An episode's outcomes are its achievements (``state.achievements``, 1
    where unlocked: the success rates behind Crafter's score)."""
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name(name, auto_reset=False)
    params = env.default_params
    unlimited = params.replace(max_timesteps=UNLIMITED)
    pixels = "Pixels" in name
    size = (env_config.get("img_height"), env_config.get("img_width"))
    achievements = [f"achievements/{a}" for a in craftax_achievements(name)]

    def observe(obs):
        if not pixels:
            return obs.astype(jnp.float32)
        if all(size) and tuple(obs.shape[:2]) != size:
            obs = jax.image.resize(obs, size + obs.shape[2:], "bilinear")
        return (jnp.transpose(obs, (2, 0, 1)) * 255).round().clip(0, 255).astype(jnp.uint8)

    def step(key, state, action):
        obs, state, reward, done, _ = env.step_env(key, state, action, unlimited)
        return obs, state, reward, done

    return Task(family="craftax", reset=lambda key: env.reset_env(key, unlimited), step=step,
                observe=observe, discrete=True, num_actions=int(env.action_space(params).n),
                action_low=None, action_high=None,
                max_episode_steps=int(params.max_timesteps),
                outcomes=lambda state: dict(zip(achievements, state.achievements.astype(
                    jnp.float32), strict=True)),
                outcome_names=tuple(achievements))

# ----------------------------------------------------------------------------- playground


def _playground_registry():
    """MuJoCo Playground's registry, with Warp's start-up banner off (Playground imports
    MuJoCo Warp; jaxwm steps its envs with MJX's JAX implementation, ``impl="jax"``)."""
    import warp
    warp.config.quiet = True
    from mujoco_playground import registry
    return registry


def _playground_ids() -> list[str]:
    return list(_playground_registry().dm_control_suite.ALL_ENVS)


def _playground_task(name: str, env_config: Mapping[str, Any]) -> Task:
    """A DM Control Suite task of MuJoCo Playground (Zakka et al. 2025) from its state
    observations, in MJX (``impl="jax"``: pure JAX, so it runs on CPU and vmaps). Playground's
    ``step`` is one control step; ``env.frame_skip`` repeats an action that many control
    steps and sums their rewards (dm_control's action repeat, as jaxwm does for envpool's DMC
    tasks), and the default limit is Playground's 1000 control steps in agent steps."""
    registry = _playground_registry()
    env = registry.load(name, config_overrides={"impl": "jax"})
    repeat = int(env_config.get("frame_skip", 1))
    if repeat < 1:
        raise ConfigError(f"env.frame_skip={repeat} must be >= 1 (1: no action repeat).")
    if isinstance(env.observation_size, Mapping):  # e.g. {"state": ..., "privileged_state"}
        raise ConfigError(f"playground:{name} observes a dict ({', '.join(env.observation_size)}); "
                          "jaxwm takes Playground's tasks with one state vector.")

    def step(key, state, action):
        del key  # Playground keeps its own key in the state (state.info["rng"])

        def control_step(carry, _):
            state, reward, done = carry
            new = env.step(state, action)
            state = jax.tree.map(lambda old, new: jnp.where(done, old, new), state, new)
            return (state, reward + jnp.where(done, 0.0, new.reward), done | (new.done > 0)), None

        (state, reward, done), _ = jax.lax.scan(
            control_step, (state, jnp.float32(0.0), jnp.bool_(False)), None, length=repeat)
        return state.obs, state, reward, done

    def reset(key):
        state = env.reset(key)
        return state.obs, state

    ones = np.ones(env.action_size, np.float32)
    episode = int(registry.get_default_config(name).episode_length)
    return Task(family="dmc", reset=reset, step=step,
                observe=lambda obs: obs.astype(jnp.float32).reshape(-1), discrete=False,
                num_actions=None, action_low=-ones, action_high=ones,
                max_episode_steps=max(1, episode // repeat))


SUITES = {
    "gymnax": Suite("gymnax", "gymnax", "gymnax", _gymnax_ids, _gymnax_task),
    "craftax": Suite("craftax", "craftax", "craftax", lambda: list(CRAFTAX_IDS), _craftax_task),
    "playground": Suite("playground", "mujoco_playground", "playground", _playground_ids,
                        _playground_task),
}


def task(env_id: str, env_config: Mapping[str, Any]) -> tuple[str, Task]:
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
    close = difflib.get_close_matches(name, ids, n=3)
    matches = f"{', '.join(f'{suite_name}:{c}' for c in close)}?"
    if name in envpool.list_all_envs():
        return f" It is an envpool id: {name} (no prefix)" + (
            f"; or did you mean {matches}" if close else ".")
    if close:
        return f" Did you mean: {matches}"
    return f" Its envs: {', '.join(ids)}."
