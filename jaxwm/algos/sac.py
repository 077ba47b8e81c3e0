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
from jaxwm.algos import Capabilities
from jaxwm.config import ConfigError
from jaxwm.data.replay import TransitionReplay
from jaxwm.envs import acting, make_env
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm, Hook


@struct.dataclass
class SACState:
    learner: sac.Learner
    replay: TransitionReplay
    actor: acting.ActorState


CAPABILITIES = Capabilities(actions=("continuous",), observations=("vector",),
                            device_batches=("sac.batch_size",))


def validate(config) -> None:
    s = config.sac
    if s.capacity < s.learning_starts:
        raise ConfigError("sac.learning_starts must be at most sac.capacity.")
    if not (0.0 < s.tau <= 1.0 and 0.0 <= s.gamma <= 1.0):
        raise ConfigError("sac.tau must be in (0, 1] and sac.gamma in [0, 1].")


def updates_per_collect(config) -> int:
    s = config.sac
    return max(1, round(s.updates_per_step * s.steps_per_collect * config.env.num_envs))


def finish(params, start, steps, final, completed):
    """One group's rollout as off-policy transitions (``acting.Actor``'s ``finish``)."""
    del params, start
    batch, valid = acting.transitions(steps, final)
    return final.carry, (batch, valid, episode_metrics(completed))


def build(config) -> Algorithm:
    s, num_seeds = config.sac, config.num_seeds
    env = make_env(config.env, num_envs=num_seeds * config.env.num_envs, seed=config.seed)
    spec = env.spec
    obs_dim = spec.obs_shape[0]
    box = sac.ActionBox(np.asarray(spec.action_low), np.asarray(spec.action_high))
    nets = sac.SACNets.create(box, s.actor_hidden, s.critic_hidden)
    hyper = sac.SACHyper.from_config(s)
    mesh = parallel.data_mesh(config.num_devices or None)
    num_updates = updates_per_collect(config)
    policy = sac.policy(nets)
    actor = acting.Actor(env, acting.warmup(policy, partial(acting.uniform_action, spec)),
                         s.steps_per_collect, mesh=mesh, groups=num_seeds, finish=finish)

    def sample(replay, key):
        return replay.sample(key, hyper.batch_size)

    over_seeds = partial(seeds.vmap, num_seeds=num_seeds)
    _update = backend.jit(over_seeds(sac.make_update(nets, hyper, sample, num_updates, mesh)),
                          donate_argnums=0)

    def acting_params(learner, replay):  # uniform actions until the replay holds enough
        return replay.size < s.learning_starts, learner.actor

    def init(key):
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(box.low.shape),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim),
                   "terminated": jnp.zeros((), bool)}
        learner, replay = over_seeds(lambda k: (
            sac.init_learner(nets, hyper, k, obs_dim),
            TransitionReplay.create(s.capacity, example)))(key)
        learner, replay = parallel.replicate((learner, replay), mesh)
        return SACState(learner, replay, actor.init(acting_params(learner, replay)))

    @partial(backend.jit, donate_argnums=0)
    def _add(replay, batch, valid):
        replay = over_seeds(lambda r, b, v: r.add(b, v))(replay, batch, valid)
        # A buffer of its own (float), not the replay's size, which the next add donates.
        return replay, replay.size.astype(jnp.float32)

    def collect_hook(state: SACState, data, key):
        del data
        actor_state, (batch, valid, metrics) = actor.collect(
            acting_params(state.learner, state.replay), state.actor, key)
        replay, size = _add(state.replay, *parallel.replicate((batch, valid), mesh))
        return state.replace(actor=actor_state, replay=replay), {}, {
            **metrics, "charts/replay_size": size}

    def update_hook(state: SACState, data, key):
        del data
        learner, metrics = _update(state.learner, state.replay, key)
        return state.replace(learner=learner), {}, metrics

    return Algorithm(
        name="SAC",
        init=init,
        hooks={
            "collect": Hook(collect_hook,
                            counts={"env_steps": config.env.num_envs * s.steps_per_collect}),
            "update_agent": Hook(update_hook, counts={"agent_updates": num_updates}),
        },
        policy=acting.grouped(policy, num_seeds),
        policy_params=lambda state: state.learner.actor,
        num_seeds=num_seeds,
        close=actor.close,
    )
