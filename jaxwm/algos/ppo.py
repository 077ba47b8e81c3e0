"""PPO wired to envs and the loop: hooks ``collect`` and ``update_agent``, or ``iterate``.

``collect`` is the acting layer's jitted rollout (``jaxwm.envs.acting.Actor``) under PPO's
policy, with PPO's ``finish`` compiled into it, and passes the rollout to ``update_agent``
through the loop (``writes=("rollout",)``); the rollout is never part of the state,
``PPOState(learner, actor)``, of which checkpoints hold the learner (envpool's envs restart on
resume). ``update_agent`` runs epochs x minibatches in one jitted call. Both donate what they
change, so nothing is copied per iteration. With an env written in JAX (``envs.native``) the
one hook is ``iterate``: ``iterations_per_call`` whole iterations as one program
(``agents.ppo.make_iterations``), the env state in the actor's and in checkpoints.

Devices: envpool's custom call must run once, so ``collect`` runs on the process's first
device and the actor's state stays there. The learner is replicated over the mesh at ``init``;
``collect`` reads the replica on its device, and only the rollout moves, sharded over the
``data`` axis for the update (``jaxwm.parallel``), with the small statistics it updates.

Asynchronous collection (``ppo.async_collect=True``; ``acting.Actor``'s ``background``):
``collect`` hands back the rollout a second thread collected during the previous update and
starts the next one at once, with the parameters as they are before this iteration's update,
so env stepping and acting overlap the learner. The lag is one update: rollout k+1 is
collected by the policy that rollout k updated *from*. PPO needs no further correction,
because its ratio uses the log-probabilities of the policy that acted (stored in the
rollout), and the clipping bounds the step from that policy. The first collect after a start
or a resume runs in the foreground (nothing is in flight yet), so a resumed async run is not
bit-identical to an uninterrupted one; the synchronous default is.

Asynchronous env pool (``env.batch_size`` = B < ``env.num_envs``): envpool steps every env
on its own and each collect step acts on the B that are ready (``acting.envpool``), so slow
envs do not hold up the batch. A rollout is ``num_steps`` such batches (B rows for
minibatching and sharding); memoryless networks, one process and one seed. It combines with
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

import math

import jax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

from jaxwm import backend, parallel
from jaxwm.agents import ppo
from jaxwm.algos import Capabilities, Entry
from jaxwm.config import ConfigError, pool_is_async, require
from jaxwm.envs import acting
from jaxwm.envs.native import is_native
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.compile import HookCompiler
from jaxwm.nets import backbones
from jaxwm.nets.actor_critic import make_actor_critic
from jaxwm.nets.actor_critic import validate as validate_network


@struct.dataclass
class PPOState:
    learner: ppo.Learner
    actor: acting.ActorState


def rollout_rows(config) -> int:
    """Env rows per rollout (over all processes): the envs, or an async pool's batch."""
    return config.env.batch_size if pool_is_async(config) else config.env.num_envs


def anneal_updates(config) -> int:
    """Agent updates over which the learning rate anneals (if it does): those of the
    iterations ``ppo.anneal_env_steps`` env steps take."""
    p = config.ppo
    iterations = max(1, math.ceil(p.anneal_env_steps / (rollout_rows(config) * p.num_steps)))
    return iterations * p.update_epochs * p.num_minibatches


def minibatch_sequences(config) -> tuple[int, bool]:
    """(sequences per minibatch's worth of data, whether the network has memory): memory
    backbones shuffle whole env rows, feed-forward ones every step."""
    recurrent = config.network.backbone != "ff" or config.network.frames > 1
    rows = rollout_rows(config)
    return (rows if recurrent else rows * config.ppo.num_steps), recurrent


def device_batches(config) -> dict[str, int]:
    sequences, _ = minibatch_sequences(config)
    batches = {"a minibatch's sequences (rows * ppo.num_steps / ppo.num_minibatches, rows for "
               "memory backbones)": sequences // config.ppo.num_minibatches}
    if pool_is_async(config):
        batches["env.batch_size"] = config.env.batch_size
    return batches


def validate_env(config, spec) -> None:
    """The network against the env's observations (an image encoder on vectors, ...)."""
    validate_network(spec, config.network)


def validate(config) -> None:
    """PPO's own checks, run on the host before anything is built or compiled."""
    backbones.validate(config.network)
    p, num_envs = config.ppo, config.env.num_envs
    sequences, recurrent = minibatch_sequences(config)
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
    if p.anneal_lr and p.anneal_env_steps < config.total_env_steps:
        raise ConfigError(
            f"ppo.anneal_env_steps={p.anneal_env_steps} < total_env_steps="
            f"{config.total_env_steps}: the annealed learning rate would be 0 for the last "
            f"{config.total_env_steps - p.anneal_env_steps} steps, which would learn nothing. "
            "An annealed run cannot be extended past its schedule: start a new run with the "
            "longer total_env_steps (or use ppo.anneal_lr=False for runs you mean to extend).")
    if sequences % p.num_minibatches:
        hint = " (MuJoCo with a memory backbone: ppo:mujoco_memory)" \
            if recurrent and num_envs == 1 else ""
        raise ConfigError(f"ppo.num_minibatches={p.num_minibatches} must divide {what} = "
                          f"{sequences}{hint}.")
    ppo.resolve_loop_form(p.loop_form)
    if is_native(config.env.id):
        require(ppo.jax_env_checks(config, rollout_rows(config)))


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    # Counted per seed: each agent's own experience (loop.seeds), over all processes.
    rows = rollout_rows(config)
    p, k = config.ppo, config.iterations_per_call
    counts = {"collect": {"env_steps": rows * p.num_steps},
              "update_agent": {"agent_updates": p.update_epochs * p.num_minibatches}}
    if is_native(config.env.id):  # both in one program, k iterations a call
        return {"iterate": {c: n * k for hook in counts.values() for c, n in hook.items()}}
    return counts


def phase_hooks(config) -> dict[str, tuple[str, ...]]:
    """The train phase's hooks: ``collect, update_agent``, or with a JAX env ``iterate``."""
    return {"train": tuple(hook_counts(config))}


def build(config) -> Algorithm:
    env = acting.make_pool(config)
    rows = env.batch_size if env.is_async else config.env.num_envs // jax.process_count()
    spec = env.spec
    network = make_actor_critic(spec, config.network)
    hyper = ppo.PPOHyper.from_config(config.ppo, recurrent=network.has_memory)
    optimizer = ppo.make_optimizer(config.ppo, anneal_updates(config),
                                   backbones.learning_rate_scale(config.network))
    compiler = HookCompiler.for_config(config)
    actor = acting.Actor(env, ppo.policy(network, hyper), hyper.num_steps, mesh=compiler.mesh,
                         groups=config.num_seeds, finish=ppo.make_finish(network, hyper),
                         background=config.ppo.async_collect)
    update = ppo.make_update(network, hyper, optimizer,
                             ppo.resolve_loop_form(config.ppo.loop_form), compiler.mesh)

    def init(key):
        learner = compiler.init(lambda k: ppo.init_learner(network, optimizer, spec, k, rows))(
            key)
        return PPOState(learner, actor.init(learner))

    hooks = iterate_hooks if actor.env_step.in_state else host_hooks
    return Algorithm(name="PPO", init=init, hooks=hooks(config, actor, update, compiler),
                     phase_hooks=phase_hooks(config), policy=ppo.policy(network, hyper),
                     close=actor.close)


def iterate_hooks(config, actor, update, compiler) -> dict[str, Hook]:
    """With a JAX env: ``iterate``, ``iterations_per_call`` whole iterations (collect and
    update) as one compiled program donating the state (``agents.ppo.make_iterations``)."""
    iterate = ppo.make_iterations(actor.collect_function, compiler.vmap(update),
                                  config.iterations_per_call)

    def iterate_hook(state, data, key):
        del data
        learner, actor_state, metrics = iterate(state.learner, state.actor, key)
        return PPOState(learner, actor_state), {}, metrics

    return {"iterate": Hook(backend.jit(iterate_hook, donate_argnums=0),
                            counts=hook_counts(config)["iterate"])}


def host_hooks(config, actor, update, compiler) -> dict[str, Hook]:
    """With a host-stepped env: ``collect`` (the acting layer's program around the env's,
    passing its rollout on) and ``update_agent`` (compiled over seeds and the mesh)."""
    processes, mesh = jax.process_count(), compiler.mesh
    # Rollouts are [envs, ...], or [seeds, envs, ...]: either way sharded over the envs.
    env_axis = PartitionSpec(*([None] if config.num_seeds > 1 else []), parallel.DATA_AXIS)
    rollout_sharding = NamedSharding(mesh, env_axis)

    def collect_hook(state, data, key):
        del data
        if config.ppo.async_collect:  # the rollout a second thread collected meanwhile
            learner, (actor_state, (statistics, rollout, metrics)) = actor.collect(
                state.learner, state.actor, key)
        else:
            learner = state.learner
            actor_state, (statistics, rollout, metrics) = actor.collect(learner, state.actor,
                                                                        key)
        if processes > 1:
            statistics, metrics = ppo.merge_over_processes(
                (actor.local(learner.obs_rms), actor.local(learner.return_rms)), statistics,
                metrics)
            actor_state = actor_state.replace(
                carry=actor_state.carry.replace(obs_rms=statistics[0]))
        if config.ppo.async_collect:  # the next rollout, while this one trains the learner
            current = state.learner.replace(obs_rms=statistics[0], return_rms=statistics[1])
            actor.start_next(current, actor_state, jax.random.fold_in(key, 1))
        if mesh.size > 1:
            statistics = parallel.replicate(statistics, mesh)
        learner = state.learner.replace(obs_rms=statistics[0], return_rms=statistics[1])
        return PPOState(learner, actor_state), {"rollout": rollout}, metrics

    def update_agent(state, data, key):
        learner, metrics = update(state.learner, data["rollout"], key)
        return state.replace(learner=learner), {}, metrics

    def place(data):  # each process's rollout: its slice of the global batch
        return {"rollout": parallel.global_batch(data["rollout"], rollout_sharding)}

    counts = hook_counts(config)
    return {"collect": Hook(collect_hook, counts=counts["collect"], writes=("rollout",)),
            "update_agent": compiler.hook(update_agent, counts=counts["update_agent"],
                                          reads=("rollout",),
                                          place=place if mesh.size > 1 else None)}


ENTRY = Entry(
    name="ppo", build=build, validate=validate, hook_counts=hook_counts,
    validate_env=validate_env, phase_hooks=phase_hooks, tiny="ppo:tiny",
    # Every capability: seeds, several processes, envpool's asynchronous pools.
    capabilities=Capabilities(device_batches=device_batches, cannot={}),
    resumable=("ppo.learning_rate", "ppo.max_grad_norm"),
    zero_means={"ppo.anneal_env_steps": "no annealing"})
