"""PPO wired to envpool and the loop: hooks ``collect`` and ``update_agent``.

``collect`` runs the whole rollout as one jitted ``lax.scan`` carrying envpool's XLA handle
(on one device: the env lives on the host, and a replicated computation would step it once
per device). ``update_agent`` runs epochs x minibatches in one jitted call on the batch
sharded over every device (``jaxwm.parallel``). The state is
``PPOState(learner, actor, rollout)``; the rollout of the last collect is part of it, so the
two hooks stay pure ``(state, key) -> (state, metrics)`` functions.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import ppo
from jaxwm.config import ConfigError
from jaxwm.envs import EpisodeStats, make_env
from jaxwm.loop.algorithm import Algorithm, Hook, Policy
from jaxwm.nets.actor_critic import make_actor_critic
from jaxwm.ops.normalize import RunningMeanStd


@struct.dataclass
class PPOState:
    learner: ppo.Learner
    actor: ppo.Actor
    rollout: ppo.Rollout


def iterations(config) -> int:
    return math.ceil(config.total_env_steps / (config.env.num_envs * config.ppo.num_steps))


def validate(config) -> None:
    """PPO-specific checks, run on the host before anything is built or compiled."""
    p, num_envs = config.ppo, config.env.num_envs
    recurrent = config.network.backbone != "ff"
    sequences = num_envs if recurrent else num_envs * p.num_steps
    what = "env.num_envs (recurrent backbones shuffle whole envs)" if recurrent else \
        "env.num_envs * ppo.num_steps"
    if p.num_steps <= 0 or p.num_minibatches <= 0 or p.update_epochs <= 0:
        raise ConfigError("ppo.num_steps, ppo.num_minibatches and ppo.update_epochs must be > 0.")
    if sequences % p.num_minibatches:
        raise ConfigError(f"ppo.num_minibatches={p.num_minibatches} must divide {what} = "
                         f"{sequences}.")
    num_devices = config.num_devices or jax.device_count()
    if (sequences // p.num_minibatches) % num_devices:
        raise ConfigError(f"A minibatch holds {sequences // p.num_minibatches} sequences, which "
                         f"does not split over {num_devices} devices; change ppo.num_minibatches"
                         " or env.num_envs, or set --config.num_devices.")
    ppo.resolve_loop_form(p.loop_form)  # raises on an unknown form


def build(config) -> Algorithm:
    env = make_env(config.env, num_envs=config.env.num_envs, seed=config.seed)
    spec = env.spec
    network = make_actor_critic(spec, config.network)
    hyper = ppo.PPOHyper.from_config(config.ppo, recurrent=network.backbone != "ff")
    optimizer = ppo.make_optimizer(config.ppo, iterations(config))
    loop_form = ppo.resolve_loop_form(config.ppo.loop_form)

    mesh = parallel.data_mesh(config.num_devices or None)
    collect_device = jax.sharding.SingleDeviceSharding(mesh.devices.flat[0])
    multi_device = mesh.size > 1
    update = ppo.make_update(network, hyper, optimizer, loop_form,
                             parallel.batch_sharding(mesh) if multi_device else None)
    env_handle = {"handle": None}  # the one host-held, non-checkpointed piece (see loop docs)

    def fresh_actor():
        env_handle["handle"], first = env.xla_reset()
        n = spec.num_envs
        return ppo.Actor(obs=first.obs, is_first=jnp.ones(n, bool), prev_done=jnp.zeros(n, bool),
                         carry=network.initialize_carry(n), discounted_return=jnp.zeros(n),
                         stats=EpisodeStats.create(n))

    @backend.jit
    def _collect(state, handle, key):
        learner, actor, handle, rollout, metrics = ppo.collect(
            network, hyper, env.xla_step, state.learner, state.actor, handle, key)
        return PPOState(learner, actor, rollout), handle, metrics

    def init(key):
        actor = fresh_actor()
        obs, reset = actor.obs[:, None], actor.is_first[:, None]
        params = network.init(key, actor.carry, obs, reset)
        learner = ppo.Learner(params=params, opt_state=optimizer.init(params),
                              obs_rms=RunningMeanStd.create(spec.obs_shape),
                              return_rms=RunningMeanStd.create(()))
        # The rollout's shapes come from tracing one collect; it starts as zeros.
        empty = PPOState(learner, actor, None)
        _, _, _, rollout_shape, _ = jax.eval_shape(
            lambda s, h, k: ppo.collect(network, hyper, env.xla_step, s.learner, s.actor, h, k),
            empty, env_handle["handle"], key)
        rollout = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), rollout_shape)
        return PPOState(learner, actor, rollout)

    def collect_hook(state, key):
        if multi_device:
            state = jax.device_put(state, collect_device)
        state, env_handle["handle"], metrics = _collect(state, env_handle["handle"], key)
        return state, metrics

    def update_hook(state, key):
        learner, rollout = state.learner, state.rollout
        if multi_device:
            learner = jax.device_put(learner, parallel.replicated(mesh))
            rollout = jax.device_put(rollout, parallel.batch_sharding(mesh))
        learner, metrics = update(learner, rollout, key)
        return state.replace(learner=learner), metrics

    @partial(backend.jit, static_argnums=5)
    def act(state, carry, obs, is_first, key, greedy):
        learner = state.learner
        if hyper.normalize_obs:
            obs = learner.obs_rms.normalize(obs)
        carry, dist, _ = network.apply(learner.params, carry, obs[:, None], is_first[:, None])
        action = dist.mode() if greedy else dist.sample(key)
        return carry, action[:, 0]

    def on_restore(state):
        return state.replace(actor=fresh_actor())

    steps_per_collect = spec.num_envs * hyper.num_steps
    return Algorithm(
        name="PPO",
        init=init,
        hooks={
            "collect": Hook(collect_hook, env_steps=steps_per_collect),
            "update_agent": Hook(update_hook,
                                 updates=hyper.update_epochs * hyper.num_minibatches),
        },
        policy=Policy(init_carry=lambda state, n: network.initialize_carry(n), act=act),
        on_restore=on_restore,
        close=env.close,
    )
