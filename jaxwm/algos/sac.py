"""Online SAC wired to envpool and the loop: hooks ``collect`` and ``update_agent``.

``collect`` steps the envs ``sac.steps_per_collect`` times in one jitted ``lax.scan`` through
envpool's XLA handle, acting uniformly at random until the replay holds
``sac.learning_starts`` transitions and with the current actor after, and adds the valid
transitions (not envpool's reset transitions, ``jaxwm.envs.types``) to a device-resident
replay (``jaxwm.data.replay``). ``update_agent`` runs ``sac.updates_per_step`` updates per
collected env step in one jitted scan (``jaxwm.agents.sac.make_update``). Truncated episodes
bootstrap; terminated ones do not.

Devices: envpool's custom call runs once, on the mesh's first device, so ``collect`` runs
there and returns the new transitions; the replay and the learner are replicated over the
mesh (with one device: left where JAX puts them), the transitions are broadcast to it, and
each update's batch is split over the ``data`` axis (gradients all-reduced by XLA).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import sac
from jaxwm.config import ConfigError
from jaxwm.data import replay
from jaxwm.envs import episode_metrics, make_env, require_continuous_vectors, transitions
from jaxwm.loop.algorithm import Algorithm, Hook, Policy


@struct.dataclass
class SACState:
    learner: sac.Learner
    replay: replay.ReplayState
    actor: transitions.Cursor


def config_block(**overrides) -> ml_collections.ConfigDict:
    """The ``config.sac`` block (Haarnoja et al. 2018 sizes), shared by online SAC and MOPO."""
    s = ml_collections.ConfigDict()
    s.actor_hidden = (256, 256)
    s.critic_hidden = (256, 256)
    s.gamma = 0.99
    s.tau = 0.005
    s.batch_size = 256
    s.actor_lr = 3e-4
    s.critic_lr = 3e-4
    s.alpha_lr = 3e-4
    s.auto_alpha = True
    s.initial_alpha = 1.0
    s.target_entropy = ml_collections.FieldReference(None, field_type=float)  # None: -|A|
    s.capacity = 1_000_000
    s.learning_starts = 5_000
    s.steps_per_collect = 8  # per env
    s.updates_per_step = 1.0  # updates per env step
    s.update(overrides)
    return s


def validate(config) -> None:
    s = config.sac
    num_devices = config.num_devices or jax.device_count()
    checks = [
        (config.num_seeds == 1, "num_seeds > 1 is not supported by SAC yet (PPO has it): run "
                                "one process per seed."),
        (s.steps_per_collect > 0, "sac.steps_per_collect must be > 0."),
        (s.updates_per_step > 0, "sac.updates_per_step must be > 0."),
        (s.capacity >= s.learning_starts > 0,
         "sac.learning_starts must be > 0 and at most sac.capacity."),
        (s.batch_size > 0 and s.batch_size % num_devices == 0,
         f"sac.batch_size={s.batch_size} must be > 0 and split over {num_devices} devices."),
        (0.0 < s.tau <= 1.0 and 0.0 <= s.gamma <= 1.0, "sac.tau must be in (0, 1] and "
                                                       "sac.gamma in [0, 1]."),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def actor_policy(nets: sac.SACNets, score_reference=None) -> Policy:
    """Evaluation acting with the SAC actor of any state that has ``state.learner`` (online
    SAC, MOPO / GORMPO): temperature 0 is tanh(mean), 1 the policy as trained."""

    @backend.jit
    def act(state, carry, obs, is_first, key, temperature):
        del is_first
        action, _ = nets.act(state.learner.actor, jnp.asarray(obs, jnp.float32), key,
                             temperature)
        return carry, action

    return Policy(init_carry=lambda state, n: (), act=act, score_reference=score_reference)


def updates_per_collect(config) -> int:
    s = config.sac
    return max(1, round(s.updates_per_step * s.steps_per_collect * config.env.num_envs))


def build(config) -> Algorithm:
    s = config.sac
    env = require_continuous_vectors(
        make_env(config.env, num_envs=config.env.num_envs, seed=config.seed), "SAC")
    spec = env.spec
    obs_dim = spec.obs_shape[0]
    box = sac.ActionBox(np.asarray(spec.action_low), np.asarray(spec.action_high))
    nets = sac.SACNets.create(box, s.actor_hidden, s.critic_hidden)
    hyper = sac.SACHyper.from_config(s)
    mesh = parallel.data_mesh(config.num_devices or None)
    multi_device = mesh.size > 1
    replicate = (lambda tree: jax.device_put(tree, parallel.replicated(mesh))) if multi_device \
        else (lambda tree: tree)
    env_device = mesh.devices.flat[0]
    num_updates = updates_per_collect(config)
    env_handle = {"handle": None}

    def sample(replay_state, key):
        return replay.sample(replay_state, key, hyper.batch_size)

    update = sac.make_update(nets, hyper, sample, num_updates,
                             parallel.batch_sharding(mesh) if multi_device else None)
    _update = backend.jit(update, donate_argnums=0)

    def fresh_actor():
        env_handle["handle"], first = env.xla_reset()
        actor = transitions.Cursor.start(first.obs)
        return jax.device_put(actor, env_device) if multi_device else actor

    def init(key):
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(box.low.shape),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim),
                   "terminated": jnp.zeros((), bool)}
        learner = sac.init_learner(nets, hyper, key, obs_dim)
        return SACState(replicate(learner), replicate(replay.init(s.capacity, example)),
                        fresh_actor())

    @partial(backend.jit, donate_argnums=1)
    def _collect(actor_params, actor: transitions.Cursor, handle, random, key):
        def choose(obs, step_key):
            k_random, k_policy = jax.random.split(step_key)
            return jax.lax.cond(random, lambda: box.uniform(k_random, (spec.num_envs,)),
                                lambda: nets.act(actor_params, obs, k_policy)[0])

        actor, handle, batch, valid, completed = transitions.collect(
            env.xla_step, actor, handle, choose, key, s.steps_per_collect)
        return actor, handle, (batch, valid), episode_metrics(completed)

    @partial(backend.jit, donate_argnums=0)
    def _add(buffer, batch, valid):
        buffer = replay.add(buffer, batch, valid)
        # A buffer of its own (float), not the replay's size, which the next add donates.
        return buffer, buffer.size.astype(jnp.float32)

    def collect_hook(state: SACState, data, key):
        del data
        random = state.replay.size < s.learning_starts  # a device scalar: no host sync
        actor, env_handle["handle"], (batch, valid), metrics = _collect(
            parallel.local_replica(state.learner.actor, env_device), state.actor, env_handle["handle"],
            parallel.local_replica(random, env_device), key)
        buffer, size = _add(state.replay, *replicate((batch, valid)))
        metrics = {**metrics, "charts/replay_size": size}
        return state.replace(actor=actor, replay=buffer), {}, metrics

    def update_hook(state: SACState, data, key):
        del data
        learner, metrics = _update(state.learner, state.replay, key)
        return state.replace(learner=learner), {}, metrics

    return Algorithm(
        name="SAC",
        init=init,
        hooks={
            "collect": Hook(collect_hook, counts={"env_steps": spec.num_envs * s.steps_per_collect}),
            "update_agent": Hook(update_hook, counts={"agent_updates": num_updates}),
        },
        policy=actor_policy(nets),
        # Learner and replay continue exactly on resume; the live envs restart their episodes.
        persistent=lambda state: state.replace(actor=None),
        on_restore=lambda fresh, saved: saved.replace(actor=fresh.actor),
        close=env.close,
    )
