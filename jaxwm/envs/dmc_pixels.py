"""DeepMind Control from pixels: dm_control's suite, rendered by MuJoCo, behind ``HostEnv``.

envpool steps DMC tasks (``dmc_proprio``) and renders them only for evaluation videos
(``jaxwm.envs.mujoco_video``, through EGL), so the pixel tasks of DreamerV3's ``dmc_vision``
(Hafner et al. 2023) come from dm_control (Tassa et al. 2018) on the host: ``env.id`` is
envpool's name (``WalkerWalk-v1``, ``CheetahRun-v1``, ``BallInCupCatch-v1``) and
``env.pixels=True`` asks for images. As the official
implementation (``embodied/envs/dmc.py`` and ``configs.yaml``, ``env.dmc``): only the image is
observed (no proprioception), 64x64 RGB from camera 0 (quadruped: 2), no action repeat by
default, episodes of the task's own limit (1000 steps for most). Observations are uint8
``(3, H, W)``, channels first like Atari's; actions are the task's box (mostly [-1, 1]).

Config keys (``dreamer:dmc_vision`` sets them): ``img_height``/``img_width``
(64), ``camera`` (-1: the default above), ``frame_skip`` (action repeat, rewards summed; 1),
``max_episode_steps`` (0: the task's limit divided by the repeat). dm_control's episodes never
terminate, so every episode ends ``truncated`` (discount 1), as in envpool's DMC.

Why dm_control: it is DeepMind's own suite, the same MJCF tasks as envpool's, and it renders
through MuJoCo's OpenGL contexts, EGL or OSMesa (envpool's renderer takes EGL only). It is
optional (``pip install -e '.[dmc]'``). Its 1.0.50 release breaks on MuJoCo 4.0's model struct
(``'MjModel' object has no attribute 'flex_vertedge'``), so the extra pins ``mujoco<4``.
The OpenGL backend is ``MUJOCO_GL``: ``egl`` (set when unset, as the official code does; on
a GPU machine the driver's EGL, on a CPU one Mesa's ``libegl1`` with ``libgl1-mesa-dri``,
software-rendered) or ``osmesa`` (``apt install libosmesa6``). Software rendering costs far
more than the physics (benchmarks/results/learning_cpu.md); a GPU driver's EGL should render
far faster (not measured here).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxwm.config import ConfigError
from jaxwm.envs.families import UnknownEnvError
from jaxwm.envs.host import HostEnv
from jaxwm.envs.types import EnvSpec

# MuJoCo 3.x warns through absl, once per env built, that dm_control's cheetah and walker XML
# use a deprecated compiler attribute; nothing a user can act on.
logging.getLogger("absl").addFilter(lambda record: "settotalmass" not in record.getMessage())

# dm_control's per-domain cameras that frame the agent (the official DMC wrapper's choice).
DEFAULT_CAMERAS = {"quadruped": 2}

INSTALL_HINT = ("pip install -e '.[dmc]' (dm_control with mujoco<4), and an OpenGL backend: "
                "MUJOCO_GL=egl (a GPU driver's EGL, or Mesa's: apt install libegl1 "
                "libgl1-mesa-dri) or MUJOCO_GL=osmesa (apt install libosmesa6)")


def _suite():
    # MUJOCO_GL is read when dm_control's renderer is first imported; without it dm_control
    # tries GLFW first, which needs an X display.
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        from dm_control import suite
    except ImportError as error:
        raise ConfigError(f"env.pixels=True (DMC from pixels) needs dm_control ({error}): "
                          f"{INSTALL_HINT}.") from None
    return suite


@functools.cache
def _task_names() -> dict[str, tuple[str, str]]:
    """envpool's DMC ids without version (``BallInCupCatch``) -> dm_control's (domain, task)."""
    camel = lambda name: "".join(part.capitalize() for part in name.split("_"))  # noqa: E731
    return {camel(domain) + camel(task): (domain, task) for domain, task in _suite().ALL_TASKS}


def dmc_task(env_id: str) -> tuple[str, str]:
    """``'CheetahRun-v1'`` -> ``('cheetah', 'run')``; ``UnknownEnvError`` listing the tasks."""
    names = _task_names()
    name = str(env_id).split("-v")[0]
    if name not in names:
        raise UnknownEnvError(f"{env_id!r} is not a DMC task dm_control knows; choose one of "
                              f"{sorted(n + '-v1' for n in names)}.")
    return names[name]


def check_available() -> None:
    """Raises a ``ConfigError`` saying what to install unless dm_control imports and MuJoCo
    can open an OpenGL context here (for validation, before anything is built)."""
    _suite()
    import mujoco

    try:
        context = mujoco.GLContext(8, 8)
        context.make_current()
        context.free()
    except Exception as error:  # the backends raise different types; all mean "no OpenGL"
        raise ConfigError(f"DMC from pixels renders with MuJoCo through OpenGL "
                          f"(MUJOCO_GL={os.environ.get('MUJOCO_GL')}), which failed here: "
                          f"{error}. Install {INSTALL_HINT}.") from None


class PixelTask:
    """One dm_control task with the old Gym API ``HostEnv`` steps: observations are rendered
    frames (``H x W x 3`` uint8), ``info["discount"]`` is dm_control's (1 at a time limit),
    and an episode also ends after ``limit`` agent steps (discount 1)."""

    def __init__(self, domain: str, task: str, seed: int, size: tuple[int, int],
                 camera: int, repeat: int, limit: int) -> None:
        self._env = _suite().load(domain, task, task_kwargs={"random": seed})
        self._size, self._camera, self._repeat, self._limit = size, camera, repeat, limit
        self._steps = 0
        # Make the OpenGL context now, before HostEnv registers its exit hook (see there).
        self._contexts = self._env.physics.contexts

    def close(self) -> None:
        """Frees the OpenGL context on this (the owner) thread."""
        self._env.physics.free()

    def _render(self) -> np.ndarray:
        return self._env.physics.render(*self._size, camera_id=self._camera)

    def reset(self) -> np.ndarray:
        self._env.reset()
        self._steps = 0
        return self._render()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, dict]:
        reward = 0.0
        for _ in range(self._repeat):
            step = self._env.step(action)
            reward += step.reward or 0.0
            if step.last():
                break
        self._steps += 1
        done = step.last() or self._steps >= self._limit
        discount = float(step.discount) if step.last() else 1.0
        return self._render(), reward, done, {"discount": discount}


def make_dmc_pixels(env_config: Mapping[str, Any], num_envs: int, seed: int) -> HostEnv:
    """``num_envs`` copies of the DMC task ``env_config.id`` from pixels, seeded ``seed + i``
    (see the module docstring for the keys it reads)."""
    check_available()
    domain, task = dmc_task(env_config["id"])
    size = (int(env_config.get("img_height", 64)), int(env_config.get("img_width", 64)))
    default_camera = DEFAULT_CAMERAS.get(domain, 0)
    camera = int(env_config.get("camera", -1))
    camera = default_camera if camera < 0 else camera
    repeat = int(env_config.get("frame_skip", 1))
    if repeat < 1:
        raise ConfigError(f"env.frame_skip (action repeat) must be >= 1, got {repeat}.")
    probe = _suite().load(domain, task)
    if camera >= probe.physics.model.ncam:
        raise ConfigError(f"env.camera={camera}: {env_config['id']} has cameras 0.."
                          f"{probe.physics.model.ncam - 1} (-1: the default, {default_camera}).")
    task_limit = math.ceil(probe._step_limit / repeat)  # the task's own limit; no public name
    limit = int(env_config.get("max_episode_steps", 0)) or task_limit
    action = probe.action_spec()
    spec = EnvSpec(env_id=str(env_config["id"]), family="dmc_pixels", num_envs=num_envs,
                   obs_shape=(3, *size), obs_dtype=np.dtype(np.uint8), discrete=False,
                   num_actions=None, action_shape=tuple(action.shape),
                   action_low=np.asarray(action.minimum, np.float32),
                   action_high=np.asarray(action.maximum, np.float32), max_episode_steps=limit)
    return HostEnv(spec, lambda s: PixelTask(domain, task, s, size, camera, repeat, limit), seed,
                   lambda frame: np.transpose(np.asarray(frame, np.uint8), (2, 0, 1)))
