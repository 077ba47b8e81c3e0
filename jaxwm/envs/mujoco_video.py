"""Video frames of envpool's MuJoCo and DMC envs (``eval.video``), from envpool's own renderer.

What the frames show: env 0 of the evaluation pool, the env whose episodes are counted, drawn
from its own MuJoCo state by the MuJoCo build envpool links, after every step. Nothing is
rebuilt or replayed, so the video is the evaluated episode exactly, and the pool is the
training env's: same id, options (``families.envpool_kwargs``) and seeding (the evaluation
seed), with only envpool's renderer added. Rendering reads the state and changes nothing, so
an evaluation returns the same episodes with and without video.

Why not render a copy of the env with ``mujoco.Renderer`` (the other designs looked at):
envpool exposes neither its ``MjData`` nor ``qpos``/``qvel`` (a Gym-MuJoCo step's info holds
``x_position``, velocities and reward terms; a DMC step's only ``elapsed_step``), and the
observations do not hold the whole state: DMC's cheetah, hopper and walker leave out the x
position and quadruped, humanoid and dog observe egocentric features, so a model set from
observations cannot show every task. A gymnasium or dm_control twin stepped with the same
actions starts elsewhere (its reset noise comes from another generator) and, even started
from the same state, drifts apart: HalfCheetah-v4 with ``reset_noise_scale=0`` and the same
random actions differs from envpool's by 5e-5 in the observation after 100 steps and by 17
after 1000 (two MuJoCo builds, and chaos). Evaluating env 0 on such a twin would show a real
episode, but on another simulator than the one trained on.

How it renders: envpool 1.2.5 makes its own EGL context (through the libglvnd it bundles and
the system's EGL vendor: Mesa's ``libegl-mesa0``, software-rendered on a CPU, or a GPU
driver's, ``MUJOCO_EGL_DEVICE_ID`` choosing the GPU) on the thread that renders. Its MuJoCo
then loads the OpenGL functions through the system's EGL library, and ends the process
(``mju_error``: exit status 1, no Python exception) if none is loaded ("an OpenGL platform
library has not been loaded into this process"), which is why envpool's renderer was refused
here before. And the two must be one: envpool's extensions are linked ``BIND_NOW`` and all load
with ``import envpool``, so its EGL calls go to the system's ``libEGL.so.1`` only if that was
loaded, globally, before envpool was imported; loaded after, the context is made current in
envpool's bundled copy, MuJoCo finds no OpenGL there and ends the process ("gladLoadGL
error"). So this module, which ``jaxwm.envs`` imports before anything imports envpool, loads
the system's ``libEGL.so.1`` (Debian and Ubuntu: ``libegl1``) when it is imported, and
``check`` renders one frame of a one-env pool of the same id, so that a missing library or
driver, or envpool imported before ``jaxwm.envs``, is one ``ConfigError`` line before training
starts instead of a dead process in the first evaluation. envpool renders through EGL only:
``MUJOCO_GL`` (``egl``/``osmesa``/``glfw``, which dm_control's pixel tasks read,
``jaxwm.envs.dmc_pixels``) does not change it, and OSMesa alone cannot serve it.

Frames: ``FRAME_SIZE`` RGB; Gym-MuJoCo from envpool's default camera (gymnasium's views,
following the agent), DMC from camera 0 (quadruped 2), the cameras of
``jaxwm.envs.dmc_pixels`` and of the official DMC wrappers. Software rendering is slow (tens
of milliseconds a frame on one CPU core, more with the pool's stepping threads beside it), so
a 1000-step episode records in minutes on a CPU; the render time hardly depends on the frame
size.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Mapping
from typing import Any

from jaxwm.config import ConfigError

FAMILIES = ("mujoco", "dmc")  # envpool families this module renders
FRAME_SIZE = (240, 240)  # height, width of a video frame
EGL_LIBRARY = "libEGL.so.1"
# dm_control's per-domain cameras that frame the agent (as jaxwm.envs.dmc_pixels).
DMC_CAMERAS = {"Quadruped": 2}
INSTALL_HINT = ("install EGL and a driver for it (Debian/Ubuntu: apt install libegl1 "
                "libegl-mesa0 libgl1-mesa-dri, Mesa's software renderer, or a GPU driver's "
                "EGL, MUJOCO_EGL_DEVICE_ID picking the GPU; envpool renders through EGL only, "
                "so MUJOCO_GL=osmesa does not apply)")


def load_egl() -> tuple[str, str]:
    """Loads the system's EGL library into the process's global scope, which envpool's MuJoCo
    renders through if it was loaded before envpool was imported (module docstring); returns
    why it cannot be and what to do, ``("", "")`` where it is loaded."""
    if "envpool" in sys.modules:
        return (f"envpool was imported before jaxwm.envs, which must load {EGL_LIBRARY} first",
                "import jaxwm.envs before envpool")
    try:
        ctypes.CDLL(EGL_LIBRARY, mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        return f"{EGL_LIBRARY} is not installed: {error}", INSTALL_HINT
    return "", ""


EGL_PROBLEM, EGL_REMEDY = load_egl()  # now: jaxwm.envs imports this module before envpool


def render_kwargs(family: str, env_id: str) -> dict[str, Any]:
    """``envpool.make`` keywords that build ``env_id``'s renderer (``family`` in
    ``FAMILIES``): the frame size and, for DMC, the camera."""
    height, width = FRAME_SIZE
    kwargs: dict[str, Any] = {"render_mode": "rgb_array", "render_width": width,
                              "render_height": height}
    if family == "dmc":
        kwargs["render_camera_id"] = next(
            (cam for domain, cam in DMC_CAMERAS.items() if env_id.startswith(domain)), 0)
    return kwargs


def refusal(env_id: str, problem: str, remedy: str = INSTALL_HINT) -> ConfigError:
    """The one-line ``ConfigError`` of a video that cannot be rendered here."""
    problem = " ".join(str(problem).split())  # one line, whatever the library said
    return ConfigError(f"eval.video for {env_id}: envpool renders MuJoCo and DMC envs through "
                       f"EGL, which does not work here ({problem}); {remedy}; or set "
                       "--config.eval.video=False.")


def check(env_id: str, kwargs: Mapping[str, Any]) -> None:
    """Renders one frame of a one-env pool of ``env_id`` built with ``kwargs`` (its
    ``envpool.make`` options, ``render_kwargs`` included); a one-line ``ConfigError`` saying
    what to install if it fails. Once per id and options in a process."""
    if EGL_PROBLEM:  # rendering would end the process
        raise refusal(env_id, EGL_PROBLEM, EGL_REMEDY)
    _check(env_id, tuple(sorted(kwargs.items())))


@functools.cache
def _check(env_id: str, kwargs: tuple) -> None:
    import envpool
    import numpy as np

    env = envpool.make(env_id, env_type="gymnasium", num_envs=1, seed=0, **dict(kwargs))
    try:
        env.reset()
        frame = np.asarray(env.render())
    except RuntimeError as error:  # envpool's: "failed to initialize EGL", a device id, ...
        raise refusal(env_id, error) from None
    finally:
        env.close()
    height, width = FRAME_SIZE
    if frame.shape != (1, height, width, 3):
        raise refusal(env_id, f"a frame of shape {frame.shape}, not (1, {height}, {width}, 3)")
