"""Types shared by every environment family: the spec and one step's outputs.

Auto-reset convention (envpool's, kept as is): when a step returns ``terminated`` or
``truncated`` for an env, the observation it returns is the true final observation of that
episode. The *next* step of that env ignores its action and returns the first observation of
a new episode with ``reward == 0`` and both flags ``False``. Algorithms therefore see every
final observation (so truncation can be bootstrapped from ``V(final_obs)``) and must treat the
transition taken *from* a final observation as invalid ("reset transition"); PPO masks it.

``episode_over`` is the end of a *real* episode, used only for statistics: for Atari with
``episodic_life`` a lost life sets ``terminated`` (the value target is cut) but the game, and
so the reported episodic return, goes on until the last life or truncation.
``raw_reward`` is the reward before clipping, also for statistics.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of a vectorised environment, enough to build networks."""

    env_id: str
    family: str  # atari | mujoco | dmc | minigrid | classic | box2d
    num_envs: int
    obs_shape: tuple[int, ...]  # per env, without the num_envs axis
    obs_dtype: np.dtype
    discrete: bool
    num_actions: int | None  # discrete only
    action_shape: tuple[int, ...]  # () for discrete
    action_low: np.ndarray | None  # continuous only, shape action_shape
    action_high: np.ndarray | None
    max_episode_steps: int
    # What the env reports about each episode when it ends, beside its return and length
    # (``StepResult.outcomes``' names): Craftax's and Crafter's ``achievements/<name>``.
    outcomes: tuple[str, ...] = ()

    @property
    def is_pixels(self) -> bool:
        return len(self.obs_shape) == 3


@dataclasses.dataclass(frozen=True)
class ActionBox:
    """The affine map between an agent's [-1, 1] and an env's [low, high] action box."""

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, spec: EnvSpec) -> ActionBox:
        return cls(np.asarray(spec.action_low), np.asarray(spec.action_high))

    @property
    def center(self):
        return jnp.asarray((self.high + self.low) / 2, jnp.float32)

    @property
    def half_width(self):
        return jnp.asarray((self.high - self.low) / 2, jnp.float32)

    def to_env(self, action):
        """[-1, 1] -> the env's box."""
        return self.center + self.half_width * jnp.clip(action, -1.0, 1.0)

    def from_env(self, action):
        """The env's box -> [-1, 1] (``to_env``'s inverse)."""
        return (action - self.center) / self.half_width

    def uniform(self, key, shape):
        return jax.random.uniform(key, shape + self.low.shape, minval=self.low, maxval=self.high)


@struct.dataclass
class StepResult:
    """One vectorised step; every field has leading axis num_envs."""

    obs: jax.Array
    reward: jax.Array  # float32, after any clipping the config asked for
    terminated: jax.Array  # bool
    truncated: jax.Array  # bool
    episode_over: jax.Array  # bool, real end of episode (see module docstring)
    raw_reward: jax.Array  # float32, unclipped
    # ``EnvSpec.outcomes``: per env, float32 read at the step that ends an episode (0 at
    # every other step); e.g. ``achievements/collect_wood`` is 1 where that episode unlocked it.
    outcomes: dict = struct.field(default_factory=dict)

    @property
    def done(self) -> jax.Array:
        return self.terminated | self.truncated
