"""Which envpool family an id belongs to, how to build it, and how to shape its observations.

The family is read from envpool's own registry rather than guessed from the id's spelling:
every registered id maps to the Python module that implements it (``envpool.atari``,
``envpool.mujoco.dmc``, ...), so ``Blackjack-v5`` is Atari while ``Blackjack-v1`` is toy-text.

Observation layouts returned by this library (per env, without the ``num_envs`` axis):

=========  =================================================================================
atari      uint8 ``(frame_stack * C, H, W)`` channels-first, as envpool returns it. ``C`` is 1
           for gray scale, 3 for RGB; frames run oldest to newest, so the newest frame is
           ``obs[-1]`` (gray) or ``obs[-3:]`` (RGB, in R, G, B order). Defaults: (4, 84, 84).
dmc        float32 ``(D,)``: envpool's dict observation flattened by concatenating the keys
           in sorted (alphabetical) order, each flattened row-major; e.g. CheetahRun is
           ``position (8) ++ velocity (9)``. Sorted order is not dm_control's own order
           (WalkerWalk: ours is height, orientations, velocity; dm_control's is orientations,
           height, velocity); it is used because it is fixed whatever order a dict arrives in.
mujoco     float32 ``(D,)``; envpool computes in float64, we cast.
minigrid   uint8 ``(3, 7, 7)``: the ``image`` key transposed HWC -> CHW so it feeds the same
           channels-first CNN as Atari. Its values are MiniGrid's symbolic codes (object, colour,
           state indices, all < 11), not intensities. ``direction`` and ``mission`` are dropped.
box2d      CarRacing: uint8 ``(3, 96, 96)`` (HWC -> CHW); the others float32 vectors.
classic    float32 vectors, as envpool returns them.
=========  =================================================================================

Every transform here takes the array module (``numpy`` or ``jax.numpy``) as an argument so the
host path and the XLA path run the *same* post-processing.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import envpool
import numpy as np
from envpool.registration import registry

from jaxwm.config import ConfigError

# envpool implementation module -> jaxwm family. Ids from any other module (procgen,
# vizdoom, myosuite, ...) are registered in envpool but not supported here yet.
FAMILY_BY_MODULE: dict[str, str] = {
    "envpool.atari": "atari",
    "envpool.mujoco.gym": "mujoco",
    "envpool.mujoco.dmc": "dmc",
    "envpool.minigrid": "minigrid",
    "envpool.classic_control": "classic",
    "envpool.box2d": "box2d",
}


DMC_EPISODE_STEPS = 1000  # dm_control's control-suite episodes, in physics steps


class UnknownEnvError(ValueError):
    """The env id is not registered in envpool, or its family is not wrapped here (raised
    before anything is built)."""


def infer_family(env_id: str) -> str:
    """Return the jaxwm family of ``env_id`` from envpool's registry.

    Raises ``UnknownEnvError`` naming close matches for an unregistered id, or naming the
    supported families for an id envpool knows but this library does not wrap.
    """
    all_ids = envpool.list_all_envs()
    if env_id not in all_ids:
        close = difflib.get_close_matches(env_id, all_ids, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownEnvError(f"Unknown env id {env_id!r}.{hint} See envpool.list_all_envs().")
    module = registry.specs[env_id][0]
    if module not in FAMILY_BY_MODULE:
        raise UnknownEnvError(
            f"Env id {env_id!r} comes from {module}, which jaxwm.envs does not wrap; "
            f"supported envpool modules: {', '.join(sorted(FAMILY_BY_MODULE))}."
        )
    return FAMILY_BY_MODULE[module]


def envpool_kwargs(family: str, env_config: Mapping[str, Any]) -> dict[str, Any]:
    """Family-specific keyword arguments for ``envpool.make``, read from ``env_config``.

    Fields (all optional): ``max_episode_steps`` (any family; 0 keeps envpool's registered
    limit; counted in agent steps, i.e. after Atari's frame skip). DMC: ``frame_skip``, the
    action repeat (1: each agent step is ``frame_skip`` control steps, their rewards summed,
    as dm_control's action-repeat wrappers do), with episodes of 1000 / frame_skip agent
    steps unless ``max_episode_steps`` says otherwise. Atari only: ``noop_max`` (30), ``frame_skip`` (4),
    ``episodic_life`` (True), ``use_fire_reset`` (True),
    ``reward_clip`` (True, sign of the reward), ``img_height``/``img_width`` (84),
    ``gray_scale`` (True), ``frame_stack`` (4), ``repeat_action_probability`` (0.0),
    ``full_action_space`` (False). Other families take no options here.

    Atari defaults follow the usual DQN/PPO preprocessing (Mnih et al. 2015), with sticky
    actions off unless ``repeat_action_probability`` is set (Machado et al. 2018 use 0.25).
    envpool itself defaults to ``episodic_life=False`` and ``reward_clip=False``, so every
    option is passed explicitly. Within one agent step envpool max-pools the last two of the
    ``frame_skip`` raw frames.
    """
    kwargs: dict[str, Any] = {}
    max_steps = int(env_config.get("max_episode_steps", 0))
    if family == "dmc":
        # Action repeat, done by jaxwm (``factory.EnvPoolEnv``, ``action_repeat``): envpool's
        # own frame_skip repeats the control but reports only the last step's reward (not the
        # sum dm_control's wrappers return), which halves returns at a repeat of 2. envpool
        # steps one control step at a time and counts DMC's 1000-step limit in them.
        repeat = int(env_config.get("frame_skip", 1))
        kwargs["action_repeat"] = repeat  # jaxwm's, not envpool's: EnvPoolEnv takes it out
        max_steps = (max_steps or DMC_EPISODE_STEPS // repeat) * repeat
    if max_steps > 0:  # envpool would store 0 as the limit itself, so only pass a real one
        kwargs["max_episode_steps"] = max_steps
    if family == "atari":
        kwargs.update(
            noop_max=int(env_config.get("noop_max", 30)),
            frame_skip=int(env_config.get("frame_skip", 4)),
            episodic_life=bool(env_config.get("episodic_life", True)),
            use_fire_reset=bool(env_config.get("use_fire_reset", True)),
            reward_clip=bool(env_config.get("reward_clip", True)),
            img_height=int(env_config.get("img_height", 84)),
            img_width=int(env_config.get("img_width", 84)),
            gray_scale=bool(env_config.get("gray_scale", True)),
            stack_num=int(env_config.get("frame_stack", 4)),
            repeat_action_probability=float(env_config.get("repeat_action_probability", 0.0)),
            full_action_space=bool(env_config.get("full_action_space", False)),
        )
    return kwargs


def transform_obs(family: str, obs: Any, xp: ModuleType) -> Any:
    """envpool's batched observation -> this library's layout (see module docstring)."""
    if family == "dmc":
        n = next(iter(obs.values())).shape[0]
        return xp.concatenate([xp.reshape(obs[k], (n, -1)).astype(xp.float32) for k in sorted(obs)], axis=1)
    if family == "minigrid":
        obs = obs["image"]
    if family in ("minigrid", "box2d") and obs.ndim == 4:  # HWC images -> CHW
        return xp.transpose(obs, (0, 3, 1, 2))
    if obs.dtype == xp.float64:
        return obs.astype(xp.float32)
    return obs


def dummy_obs(space: Any) -> Any:
    """A batch of one zero observation shaped like ``space`` (a gymnasium Box/Dict/Discrete).

    Used to derive the spec's obs shape/dtype by running the real transform, so the spec can
    never disagree with what ``step`` returns.
    """
    if hasattr(space, "spaces") and isinstance(space.spaces, Mapping):
        return {k: dummy_obs(s) for k, s in space.spaces.items()}
    return np.zeros((1, *space.shape), space.dtype)


def observation_mask(env_id: str, obs_shape: tuple[int, ...], masked) -> np.ndarray | None:
    """The multiplier of ``env.masked_indices`` (1, with 0 at each masked dim of a vector
    observation), or None when nothing is masked; a ``ConfigError`` for dims the
    observation does not have."""
    masked = tuple(int(i) for i in masked or ())
    if not masked:
        return None
    size = obs_shape[0] if len(obs_shape) == 1 else None
    if size is None or not all(0 <= i < size for i in masked):
        raise ConfigError(
            f"env.masked_indices={list(masked)}: {env_id} observations have shape "
            f"{obs_shape}; masking takes dims of a vector observation, in "
            f"[0, {size - 1 if size else '-'}].")
    mask = np.ones(size, np.float32)
    mask[list(masked)] = 0.0
    return mask
