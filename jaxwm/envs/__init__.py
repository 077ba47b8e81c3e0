"""Environments: envpool batches with a host (numpy) and an XLA (jit/scan) path.

See ``factory`` for the step semantics, ``families`` for observation layouts per family and
``stats`` for how episode returns and lengths are counted, ``acting`` for the one policy
interface and env-stepping scan every algorithm acts through, ``host`` for Python-package
envs (Crafter) behind the same interface, ``dmc_pixels`` for DMC tasks from pixels
(dm_control's renderer) through it, and ``mujoco_video`` for the video frames of envpool's
MuJoCo and DMC envs (envpool's renderer, through EGL).
"""

# First: mujoco_video loads the system's EGL before anything imports envpool (see there).
from jaxwm.envs import mujoco_video  # noqa: F401
from jaxwm.envs.factory import EnvPoolEnv, check_available, make_env, probe_spec
from jaxwm.envs.families import UnknownEnvError
from jaxwm.envs.stats import EpisodeStats, episode_metrics
from jaxwm.envs.types import EnvSpec, StepResult

__all__ = [
    "EnvPoolEnv",
    "EnvSpec",
    "EpisodeStats",
    "StepResult",
    "UnknownEnvError",
    "check_available",
    "episode_metrics",
    "make_env",
    "probe_spec",
]
