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

import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxwm.agents import sac
from jaxwm.algos import Entry, continuous_control
from jaxwm.config import require
from jaxwm.data.replay import TransitionReplay
from jaxwm.envs import acting
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.compile import HookCompiler


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
    compiler = HookCompiler.for_config(config)
    policy = sac.policy(nets)
    actor = acting.Actor(env, policy, s.steps_per_collect, mesh=compiler.mesh,
                         groups=config.num_seeds, finish=finish,
                         warmup_transitions=s.learning_starts)
    update = sac.make_update(nets, hyper, lambda replay, key: replay.sample(key, hyper.batch_size),
                             updates_per_collect(config), compiler.mesh)

    def init_one(key):
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(box.low.shape),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim),
                   "terminated": jnp.zeros((), bool)}
        return SACState(sac.init_learner(nets, hyper, key, obs_dim),
                        TransitionReplay.create(s.capacity, example), None)

    def init(key):
        state = compiler.init(init_one)(key)
        return state.replace(actor=actor.init(state.learner))

    def update_agent(state, data, key):
        learner, metrics = update(state.learner, state.replay, key)
        return state.replace(learner=learner), {}, metrics

    counts = hook_counts(config)
    return Algorithm(
        name="SAC", init=init,
        hooks={"collect": Hook(actor.replay_hook(), counts=counts["collect"]),
               "update_agent": compiler.hook(update_agent, counts=counts["update_agent"])},
        policy=policy, close=actor.close)


ENTRY = Entry(name="sac", build=build, validate=validate, hook_counts=hook_counts,
              tiny="sac:tiny", tiny_more=("sac:playground_tiny",),
              capabilities=continuous_control("sac.batch_size"),
              resumable=("sac.actor_lr", "sac.critic_lr", "sac.alpha_lr"))
