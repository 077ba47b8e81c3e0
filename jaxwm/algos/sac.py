"""Online SAC wired to envpool and the loop: hooks ``collect`` and ``update_agent``.

``collect`` is the acting layer's jitted rollout (``jaxwm.envs.acting.Actor``) of
``sac.steps_per_collect`` steps under SAC's policy, uniformly random until the replay holds
``sac.learning_starts`` transitions (``acting.warmup``), and adds the valid transitions (not
envpool's reset transitions, ``jaxwm.envs.types``) to a device-resident replay
(``jaxwm.data.replay.TransitionReplay``). ``update_agent`` runs ``sac.updates_per_step``
updates per collected env step in one jitted scan (``jaxwm.agents.sac.make_update``).
Truncated episodes bootstrap; terminated ones do not.

Seeds (``num_seeds`` N): the learner and the replay get a leading seed axis and every
jitted function is vmapped over it; one pool of N x ``env.num_envs`` envs acts in groups.

Devices: the pool's programs run on the process's first device and return the new
transitions; the replay and the learner are replicated over the mesh (one device: left where
JAX puts them), the transitions are broadcast to it, and each update's batch is split over
the ``data`` axis (gradients all-reduced by XLA).
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import sac
from jaxwm.algos import continuous_control
from jaxwm.config import require
from jaxwm.data.replay import TransitionReplay
from jaxwm.envs import acting
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm, Hook, learner_update

CAPABILITIES = continuous_control("sac.batch_size")


@struct.dataclass
class SACState:
    learner: sac.Learner
    replay: TransitionReplay
    actor: acting.ActorState


def validate(config) -> None:
    """SAC's own settings."""
    require([(config.sac.capacity >= config.sac.learning_starts,
              "sac.learning_starts must be at most sac.capacity."),
             *sac.config_checks(config.sac)])


def updates_per_collect(config) -> int:
    s = config.sac
    return max(1, round(s.updates_per_step * s.steps_per_collect * config.env.num_envs))


def finish(params, start, steps, final, completed):
    """One group's rollout as off-policy transitions for the replay (``Actor.collect_into``)."""
    del params, start
    return final.carry, (acting.transitions(steps, final), episode_metrics(completed))


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    return {"collect": {"env_steps": config.env.num_envs * config.sac.steps_per_collect},
            "update_agent": {"agent_updates": updates_per_collect(config)}}


def build(config) -> Algorithm:
    env = acting.make_pool(config)
    s = config.sac
    obs_dim = env.spec.obs_shape[0]
    box = sac.ActionBox(np.asarray(env.spec.action_low), np.asarray(env.spec.action_high))
    nets = sac.SACNets.from_config(box, s)
    hyper = sac.SACHyper.from_config(s)
    mesh = parallel.data_mesh(config.num_devices or None)
    num_updates = updates_per_collect(config)
    policy = sac.policy(nets)
    actor = acting.Actor(env, policy, s.steps_per_collect, mesh=mesh, groups=config.num_seeds,
                         finish=finish, warmup_transitions=s.learning_starts)

    def sample(replay, key):
        return replay.sample(key, hyper.batch_size)

    over_seeds = partial(seeds.vmap, num_seeds=config.num_seeds)
    _update = backend.jit(over_seeds(sac.make_update(nets, hyper, sample, num_updates, mesh)),
                          donate_argnums=0)

    def init(key):
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(box.low.shape),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim),
                   "terminated": jnp.zeros((), bool)}
        learner, replay = over_seeds(lambda k: (
            sac.init_learner(nets, hyper, k, obs_dim),
            TransitionReplay.create(s.capacity, example)))(key)
        learner, replay = parallel.replicate((learner, replay), mesh)
        return SACState(learner, replay, actor.init(learner))

    return Algorithm(
        name="SAC",
        init=init,
        hooks={
            "collect": Hook(actor.replay_hook(), counts=hook_counts(config)["collect"]),
            "update_agent": Hook(learner_update(_update, lambda state, data: (state.replay,)),
                                 counts=hook_counts(config)["update_agent"]),
        },
        policy=policy,
        close=actor.close,
    )
