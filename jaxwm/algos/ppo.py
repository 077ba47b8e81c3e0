"""PPO wired to envpool and the loop: hooks ``collect`` and ``update_agent``.

``collect`` runs the whole rollout as one jitted ``lax.scan`` carrying envpool's XLA handle
and passes the rollout to ``update_agent`` through the loop (``writes=("rollout",)``); the
rollout is never part of the state, ``PPOState(learner, actor)``, of which checkpoints hold
the learner (the actor's per-env state belongs to the envs, which restart on resume).
``update_agent`` runs epochs x minibatches in one jitted call. Both donate what they change
(the actor's per-env state; the learner), so nothing is copied per iteration.

Devices: the envs live on the host and the envpool custom call must run once, so ``collect``
runs on one device (the first of the mesh) and the actor's state stays there. The learner is
replicated over the mesh once, at ``init``; ``collect`` reads the replica already on its
device (no transfer), and only the rollout moves, sharded over the ``data`` axis for the
update (``jaxwm.parallel``), plus the small observation/return statistics ``collect`` updates.

Asynchronous collection (``ppo.async_collect=True``, Sebulba-style; Hessel et al. 2021,
"Podracer architectures"): ``collect`` hands back the rollout a second thread collected
during the previous update and starts the next one at once, with the parameters as they are
before this iteration's update, so env stepping and acting overlap the learner. The lag is
one update: rollout k+1 is collected by the policy that rollout k updated *from*. PPO needs
no further correction, because its ratio uses the log-probabilities of the policy that
acted (stored in the rollout), and the clipping bounds the step from that policy. The first
collect after a start or a resume runs in the foreground (nothing is in flight yet), so a
resumed async run is not bit-identical to an uninterrupted one; the synchronous default is.

Asynchronous env pool (``env.batch_size`` = B < ``env.num_envs``): envpool steps every env
on its own and each collect step acts on the B that are ready (``ppo.collect_from_pool``), so
slow envs do not hold up the batch and env stepping overlaps acting. A rollout is
``num_steps`` such batches (B x ``num_steps`` env steps, B rows for minibatching and
sharding); memoryless networks, one process and one seed. It combines with
``ppo.async_collect``, which overlaps collection with the update instead.

The learning rate anneals to 0 over ``ppo.anneal_env_steps`` (by default the run's
``total_env_steps``, fixed when the run starts), never over the budget of a resumed run: a
resume with another ``total_env_steps`` is refused where that would move the schedule (the
saved config differs in ``ppo.anneal_env_steps``, ``jaxwm.loop.checkpoint``) unless the key is
pinned to its saved value, and pinning it below ``total_env_steps`` is refused too (the rate
would sit at 0). So an annealed run can be shortened or resumed, not extended; with
``anneal_lr=False`` the key is 0 and any extension is allowed.
"""

from __future__ import annotations

import concurrent.futures
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

from jaxwm import backend, parallel
from jaxwm.agents import ppo
from jaxwm.config import ConfigError, pool_is_async
from jaxwm.envs import EpisodeStats, make_env
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm, Hook, Policy
from jaxwm.loop.metrics import PerSeed
from jaxwm.nets import backbones
from jaxwm.nets.actor_critic import make_actor_critic
from jaxwm.nets.distributions import sample_at_temperature
from jaxwm.ops.normalize import RunningMeanStd

ASYNC_ENVS = True  # steps envpool's asynchronous pools (jaxwm.runner checks)


@struct.dataclass
class PPOState:
    learner: ppo.Learner
    actor: ppo.Actor


def rollout_rows(config) -> int:
    """Env rows per rollout (over all processes): the envs, or an async pool's batch."""
    return config.env.batch_size if pool_is_async(config) else config.env.num_envs


def anneal_iterations(config) -> int:
    """Iterations over which the learning rate anneals (if it does)."""
    return max(1, math.ceil(config.ppo.anneal_env_steps /
                            (rollout_rows(config) * config.ppo.num_steps)))


def validate(config) -> None:
    """PPO-specific checks, run on the host before anything is built or compiled."""
    backbones.validate(config.network)
    p, num_envs = config.ppo, config.env.num_envs
    recurrent = config.network.backbone != "ff" or config.network.frames > 1
    rows = rollout_rows(config)
    sequences = rows if recurrent else rows * p.num_steps
    envs = "env.batch_size" if pool_is_async(config) else "env.num_envs"
    what = f"{envs} (memory backbones shuffle whole envs, never time)" if recurrent else \
        f"{envs} * ppo.num_steps"
    if pool_is_async(config):
        if recurrent:
            raise ConfigError(
                f"env.batch_size={config.env.batch_size} < env.num_envs={num_envs} (envpool's "
                "asynchronous mode) interleaves the envs, which a memory backbone "
                f"({config.network.backbone}, frames={config.network.frames}) cannot follow: "
                "use network.backbone=ff with frames=1, or env.batch_size=0.")
        if config.num_seeds > 1 or jax.process_count() > 1:
            raise ConfigError("An asynchronous env pool (env.batch_size < env.num_envs) runs "
                              "one seed in one process; set env.batch_size=0 for num_seeds > 1 "
                              "or several processes.")
    if p.num_steps <= 0 or p.num_minibatches <= 0 or p.update_epochs <= 0:
        raise ConfigError("ppo.num_steps, ppo.num_minibatches and ppo.update_epochs must be > 0.")
    if p.anneal_lr and p.anneal_env_steps < config.total_env_steps:
        raise ConfigError(
            f"ppo.anneal_env_steps={p.anneal_env_steps} < total_env_steps="
            f"{config.total_env_steps}: the annealed learning rate would be 0 for the last "
            f"{config.total_env_steps - p.anneal_env_steps} steps, which would learn nothing. "
            "An annealed run cannot be extended past its schedule: start a new run with the "
            "longer total_env_steps (or use ppo.anneal_lr=False for runs you mean to extend).")
    if sequences % p.num_minibatches:
        hint = " (MuJoCo with a memory backbone: configs/ppo.py:mujoco_memory)" \
            if recurrent and num_envs == 1 else ""
        raise ConfigError(f"ppo.num_minibatches={p.num_minibatches} must divide {what} = "
                          f"{sequences}{hint}.")
    processes = jax.process_count()
    if num_envs % processes:
        raise ConfigError(f"env.num_envs={num_envs} does not split over {processes} processes "
                          "(each steps its own share of the envs); make it a multiple.")
    if processes > 1 and config.num_seeds > 1:
        raise ConfigError("num_seeds > 1 runs in one process; with several processes use "
                          "num_seeds=1 (or launch one run per seed).")
    if processes > 1 and config.num_devices not in (0, jax.device_count()):
        raise ConfigError(f"num_devices={config.num_devices}: a multi-process run uses every "
                          f"device of every process ({jax.device_count()}); leave it at 0.")
    num_devices = config.num_devices or jax.device_count()
    if pool_is_async(config) and rows % num_devices:
        raise ConfigError(f"env.batch_size={rows} rows do not shard over {num_devices} devices;"
                          " make it a multiple, or set --config.num_devices.")
    if (sequences // p.num_minibatches) % num_devices:
        raise ConfigError(f"A minibatch holds {sequences // p.num_minibatches} sequences, which "
                          f"does not split over {num_devices} devices; change ppo.num_minibatches"
                          " or env.num_envs, or set --config.num_devices.")
    if ppo.resolve_loop_form(p.loop_form) == "host" and config.num_seeds > 1:
        raise ConfigError("ppo.loop_form='host' runs minibatches from Python and cannot be "
                          "vmapped over seeds: use scan or unroll with num_seeds > 1.")


class BackgroundCollect:
    """One rollout collected on a second thread while the learner updates (see the module
    docstring). JAX releases the GIL while a program runs, so the thread's collection and
    the main thread's update run at the same time."""

    def __init__(self, collect):
        self._collect = collect
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxwm-collect")
        self._pending = None

    def result(self, learner, actor, handle, key):
        """``(learner the rollout started from, collect's outputs)`` of the rollout in flight,
        or of one collected now in the foreground if none is."""
        if self._pending is None:
            return learner, self._collect(learner, actor, handle, key)
        pending, self._pending = self._pending, None
        return pending.result()

    def start(self, learner, actor, handle, key):
        """Starts the next rollout. The learner is copied: the update donates its buffers
        while the thread still reads them."""
        snapshot = jax.tree.map(jnp.copy, learner)
        self._pending = self._pool.submit(lambda: (snapshot, jax.block_until_ready(
            self._collect(snapshot, actor, handle, key))))

    def close(self):
        if self._pending is not None:
            self._pending.result()
        self._pool.shutdown()


def merge_over_processes(start, statistics, metrics):
    """Every process's normalisation statistics and episode metrics, combined the same way
    in each (so the replicated learner stays identical): statistics as if one process had
    seen every sample (``RunningMeanStd.merge_updates``), episode means weighted by the
    episodes each process finished."""
    gathered_stats, gathered = parallel.allgather((statistics, metrics))
    statistics = tuple(RunningMeanStd.merge_updates(jax.device_get(s), g)
                       for s, g in zip(start, gathered_stats, strict=True))
    episodes = gathered["charts/episodes"]
    merged = {"charts/episodes": jnp.asarray(episodes.sum())}
    for name in ("charts/episodic_return", "charts/episodic_length"):
        finished = episodes > 0
        merged[name] = jnp.asarray(
            np.sum(np.where(finished, gathered[name], 0.0) * episodes) / episodes.sum()
            if finished.any() else np.nan, jnp.float32)
    return statistics, {**{k: jnp.asarray(v[0]) for k, v in gathered.items()}, **merged}


def build(config) -> Algorithm:
    num_seeds = config.num_seeds
    # Several processes: each steps its own share of the envs, seeded so that together they
    # are the one-process pool (envpool seeds env i with seed + i).
    processes, process = jax.process_count(), jax.process_index()
    num_envs = config.env.num_envs // processes
    # With several seeds, one pool holds every seed's envs in turn (``loop.seeds``).
    env = make_env(config.env, num_envs=num_seeds * num_envs, seed=config.seed + process * num_envs,
                   batch_size=config.env.batch_size, num_threads=config.env.num_threads)
    rows = env.batch_size if env.is_async else num_envs
    spec = env.spec
    network = make_actor_critic(spec, config.network)
    hyper = ppo.PPOHyper.from_config(config.ppo, recurrent=network.has_memory)
    optimizer = ppo.make_optimizer(config.ppo, anneal_iterations(config),
                                   backbones.learning_rate_scale(config.network))
    loop_form = ppo.resolve_loop_form(config.ppo.loop_form)

    mesh = parallel.data_mesh(config.num_devices or None)
    env_device = parallel.local_device(mesh)
    multi_device = mesh.size > 1
    # Rollouts are [envs, ...], or [seeds, envs, ...]: either way sharded over the envs.
    env_axis = PartitionSpec(*([None] if num_seeds > 1 else []), parallel.DATA_AXIS)
    rollout_sharding = NamedSharding(mesh, env_axis)
    # With seeds, every per-agent function gets a seed axis; the pool stays one.
    update = ppo.make_update(network, hyper, optimizer, loop_form,
                             parallel.batch_sharding(mesh) if multi_device else None,
                             over_seeds=num_seeds > 1)
    env_step = env.xla_step
    if num_seeds > 1:
        env_step = seeds.env_step_over_seeds(env.xla_step, num_seeds)
    over_seeds = (lambda f, **kw: jax.vmap(f, **kw)) if num_seeds > 1 else (lambda f, **kw: f)
    env_handle = {"handle": None}  # the one host-held, non-checkpointed piece (see loop docs)

    def fresh_actor():
        if env.is_async:
            env_handle["handle"] = env.xla_async_reset()
            actor = ppo.PoolActor.create(num_envs)
            return jax.device_put(actor, env_device) if multi_device else actor
        env_handle["handle"], first = env.xla_reset()
        n = num_envs
        actor = over_seeds(lambda obs: ppo.Actor(
            obs=obs, is_first=jnp.ones(n, bool), prev_done=jnp.zeros(n, bool),
            carry=network.initialize_carry(n), discounted_return=jnp.zeros(n),
            stats=EpisodeStats.create(n)))(
            seeds.split_pool(first.obs, num_seeds) if num_seeds > 1 else first.obs)
        # One device: left uncommitted, like everything else, so that every jitted hook sees
        # the same placement on every call and compiles once.
        return jax.device_put(actor, env_device) if multi_device else actor

    def collect_one(learner, actor, handle, key):
        if env.is_async:
            learner, actor, handle, rollout, metrics = ppo.collect_from_pool(
                network, hyper, env.xla_recv, env.xla_send, learner, actor, handle, key)
        else:
            learner, actor, handle, rollout, metrics = ppo.collect(
                network, hyper, env_step, learner, actor, handle, key)
        return (learner.obs_rms, learner.return_rms), actor, handle, rollout, metrics

    collect_vmapped = over_seeds(collect_one, in_axes=(0, 0, None, 0), out_axes=(0, 0, None, 0, 0))
    _collect = backend.jit(collect_vmapped, donate_argnums=1)
    # The background collection keeps its input actor: the state still refers to it.
    background = BackgroundCollect(backend.jit(collect_vmapped)) \
        if config.ppo.async_collect else None

    def new_learner(key):  # from example inputs: only their shapes matter
        obs = jnp.zeros((rows, 1, *spec.obs_shape), spec.obs_dtype)
        params = network.init(key, network.initialize_carry(rows), obs, jnp.ones((rows, 1), bool))
        return ppo.Learner(params=params, opt_state=optimizer.init(params),
                           obs_rms=RunningMeanStd.create(spec.obs_shape),
                           return_rms=RunningMeanStd.create(()))

    def per_seed(metrics):
        return {k: PerSeed(v) for k, v in metrics.items()} if num_seeds > 1 else metrics

    def init(key):
        actor = fresh_actor()
        learner = over_seeds(new_learner)(key)
        if multi_device:
            learner = parallel.replicate(learner, mesh)
        return PPOState(learner, actor)

    def collect_hook(state, data, key):
        del data
        if processes > 1:  # independent action noise in each process's envs
            key = jax.random.fold_in(key, process)
        current = learner = parallel.local_replica(state.learner, env_device)
        if background is None:
            statistics, actor, env_handle["handle"], rollout, metrics = _collect(
                learner, state.actor, env_handle["handle"], key)
        else:  # ``learner``: the (older) one the finished rollout started from
            learner, (statistics, actor, env_handle["handle"], rollout, metrics) = \
                background.result(learner, state.actor, env_handle["handle"], key)
        if processes > 1:
            statistics, metrics = merge_over_processes(
                (learner.obs_rms, learner.return_rms), statistics, metrics)
        if background is not None:  # the next rollout, while this one trains the learner
            background.start(current.replace(obs_rms=statistics[0], return_rms=statistics[1]),
                             actor, env_handle["handle"], jax.random.fold_in(key, 1))
        if multi_device:
            statistics = parallel.replicate(statistics, mesh)
        learner = state.learner.replace(obs_rms=statistics[0], return_rms=statistics[1])
        return PPOState(learner, actor), {"rollout": rollout}, per_seed(metrics)

    def update_hook(state, data, key):
        rollout = data["rollout"]
        if multi_device:  # each process's rollout is its slice of the global batch
            rollout = parallel.global_batch(rollout, rollout_sharding)
        learner, metrics = update(state.learner, rollout, key)
        return state.replace(learner=learner), {}, per_seed(metrics)

    def act_one(learner, carry, obs, is_first, key, temperature):
        if hyper.normalize_obs:
            obs = learner.obs_rms.normalize(obs)
        carry, dist, _ = network.apply(learner.params, carry, obs[:, None], is_first[:, None])
        return carry, sample_at_temperature(dist, key, temperature)[:, 0]

    @backend.jit
    def act(state, carry, obs, is_first, key, temperature):
        if num_seeds == 1:
            return act_one(state.learner, carry, obs, is_first, key, temperature)
        carry, action = jax.vmap(act_one, in_axes=(0, 0, 0, 0, 0, None))(
            state.learner, carry, *seeds.split_pool((obs, is_first), num_seeds), key,
            temperature)
        return carry, seeds.merge_pool(action)

    def init_carry(state, n):
        del state
        if n % num_seeds:
            raise ValueError(f"{n} evaluation envs do not split over {num_seeds} seeds.")
        return over_seeds(lambda _: network.initialize_carry(n // num_seeds))(
            jnp.arange(num_seeds))

    return Algorithm(
        name="PPO",
        init=init,
        hooks={
            # Counted per seed: each agent's own experience (loop.seeds).
            "collect": Hook(collect_hook, counts={"env_steps": rows * hyper.num_steps},
                            writes=("rollout",)),
            "update_agent": Hook(update_hook, reads=("rollout",), counts={
                "agent_updates": hyper.update_epochs * hyper.num_minibatches}),
        },
        policy=Policy(init_carry=init_carry, act=act, num_seeds=num_seeds),
        # The actor's state belongs to the live envs, which restart on resume.
        persistent=lambda state: state.learner,
        on_restore=lambda fresh, learner: fresh.replace(learner=learner),
        close=(lambda: (background.close(), env.close())) if background else env.close,
    )
