"""DreamerV3 on the phase loop (Hafner et al. 2023, arXiv 2301.04104), and any pairing of a
world model with an agent that learns, plans or evolves in it (``jaxwm/configs/pairing.py``): the
wiring of the components a config names (``config.components``, ``agents.components``;
DreamerV3's are the RSSM and the imagination actor-critic) to envs, a replay and the loop.

* ``collect``: the acting layer's rollout of ``dreamer.steps_per_collect`` steps under the
  agent's policy (each observation filtered into the model's state; uniformly random while
  the replay holds fewer than ``dreamer.prefill`` steps per env), every step into the
  sequence replay as ``{obs, action, reward, is_first, is_terminal}`` in DreamerV3's
  convention (``reward`` and ``is_terminal`` arrived with ``obs``, ``action`` was taken at
  it, envpool's reset observation after an episode's last one is ``is_first``);
* ``update_model``: one training step of the world model and, unless CMA-ES, the
  actor-critic in its imagination (``DreamerAgent.make_update``); every ``report_every``
  updates also open-loop predictions;
* ``evolve`` (``components.agent=cmaes``): one CMA-ES generation of a linear controller on
  the model's features inside the model, from ``population x episodes`` states of replayed
  sequences (``agents.cma_es.generation_in_model``); the policy acts at the search's mean.
  With ``mppi`` the actor-critic learns as DreamerV3's and the policy plans in the model
  (``DreamerAgent.planner``).
* ``iterate`` (a JAX env and an agent that learns, ``one_program``): the train phase's
  ``collect:M, update_model:K`` ``iterations_per_call`` times in one compiled program
  (``HookCompiler.replay_iterations_hook``), the host visited once a call.

``train_ratio`` (replayed steps per env step) is met by the train phase's ``collect:M,
update_model:K`` (``loop.ratio.TrainRatio``: derived when the config leaves the hooks out,
refused when they miss it by over 1%), the achieved ratio logged as ``replay/train_ratio``.
Seeds (``num_seeds`` N): every part of the state gets a leading seed axis, one pool of N x
``env.num_envs`` envs acts in groups. Discrete actions enter the model one-hot; continuous
ones, produced in [-1, 1], are mapped to the env's box.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxwm.agents import cma_es, components, dreamer
from jaxwm.algos import NO_ASYNC_POOL, Capabilities, Entry, whole_calls
from jaxwm.config import require
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting
from jaxwm.envs.native import is_native
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm, Hook, drop_actors
from jaxwm.loop.compile import HookCompiler
from jaxwm.loop.ratio import TrainRatio
from jaxwm.models import protocol


@struct.dataclass
class DreamerState:
    learner: dreamer.Learner
    replay: SequenceReplay
    updates: jax.Array
    actor: acting.ActorState
    evolution: Any = None  # CMA-ES's state (components.agent=cmaes)


def train_ratio(config) -> TrainRatio:
    d = config.dreamer
    return TrainRatio(d.train_ratio, config.env.num_envs * d.steps_per_collect,
                      d.batch_size * d.batch_length, name="dreamer.train_ratio")


def phase_hooks(config) -> dict[str, tuple[str, ...]]:
    """The train phase's ``collect:M, update_model:K`` derived from ``dreamer.train_ratio``
    (or ``iterate``, ``one_program``), for a config that leaves ``phases.train.hooks`` empty
    (``Algorithm.phase_hooks``)."""
    if one_program(config):
        return {"train": ("iterate",)}
    hooks = train_ratio(config).phase_hooks()
    return {"train": hooks + (("evolve",) if evolves(config) else ())}


def evolves(config) -> bool:
    """Whether the agent is a controller evolved in the model (the ``evolve`` hook)."""
    return components.AGENTS[config.components.agent].evolves


def one_program(config) -> bool:
    """Whether the train phase is ``iterate``: a JAX env and an agent that learns (CMA-ES's
    generations stay a hook of their own)."""
    return is_native(config.env.id) and not evolves(config)


def validate(config) -> None:
    require(dreamer.config_checks(config.dreamer, config.env.num_envs))
    components.check(config, None)
    n, train_steps = config.iterations_per_call, (config.total_env_steps
                                                  - config.dreamer.prefill * config.env.num_envs)
    require([(n == 1 or one_program(config), f"iterations_per_call={n}: CMA-ES's generations "
              "(components.agent=cmaes) are a hook of their own, between collects; use 1."),
             whole_calls(config, train_steps, hook_counts(config),
                         "total_env_steps - dreamer.prefill x env.num_envs")])
    train_ratio(config).check(tuple(getattr(config.phases.get("train"), "hooks", ())))


def validate_env(config, spec) -> None:
    """The observation and action spaces the configured components can take."""
    components.check(config, spec)


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    counts = {"collect": {"env_steps": config.env.num_envs * config.dreamer.steps_per_collect},
              "update_model": {"model_updates": 1}}
    if one_program(config):  # collect:M, update_model:K, iterations_per_call times a call
        (m, k), n = train_ratio(config).repeats(), config.iterations_per_call
        counts["iterate"] = {"env_steps": n * m * counts["collect"]["env_steps"],
                             "model_updates": n * k}
    return {**counts, "evolve": {"generations": 1}} if evolves(config) else counts


def build(config) -> Algorithm:
    d, num_envs = config.dreamer, config.env.num_envs  # envs per seed
    env = acting.make_pool(config)
    spec = env.spec
    agent, policy, policy_params, search = components.make_agent(config, spec)
    # Data parallel as online SAC: acting runs on the process's first device; parameters,
    # optimiser and replay are replicated over the mesh, and each update's sequences are
    # split over its ``data`` axis.
    compiler = HookCompiler.for_config(config)

    def finish(params, start, steps, final, completed):
        """One group's steps as replay records, in DreamerV3's convention: ``reward`` and
        ``is_terminal`` arrived with ``obs``, ``action`` (the model's units) was taken at
        it; the reset observation after an episode's last one is ``is_first``."""
        del params, start
        records = {"obs": steps.obs, "action": agent.model_action(steps.action),
                   "reward": steps.reward, "is_first": steps.is_first,
                   "is_terminal": steps.terminated}
        return final.carry, ((records,), episode_metrics(completed))

    # Random actions until the replay holds the prefill.
    actor = acting.Actor(env, policy, d.steps_per_collect, mesh=compiler.mesh,
                         groups=config.num_seeds, finish=finish,
                         warmup_transitions=d.prefill * num_envs)

    def init_one(key):
        k_learner, k_es = jax.random.split(key)
        example_obs = jnp.zeros((1,) + tuple(spec.obs_shape), spec.obs_dtype)
        action = jnp.zeros((), jnp.int32) if spec.discrete else jnp.zeros(agent.action_dim)
        example = {"obs": example_obs[0], "action": action, "reward": jnp.zeros(()),
                   "is_first": jnp.zeros((), bool), "is_terminal": jnp.zeros((), bool)}
        return DreamerState(agent.init(key if search is None else k_learner, example_obs),
                            SequenceReplay.create(d.capacity, example, num_envs),
                            jnp.zeros((), jnp.int32), None,
                            None if search is None else search.evolution.init(k_es))

    def init(key):
        state = compiler.init(init_one)(key)
        return state.replace(actor=actor.init(policy_params(state)))

    hooks = {"collect": Hook(actor.replay_hook(policy_params), counts=hook_counts(config)["collect"]),
             **update_hooks(config, agent, compiler, actor, policy_params)}
    if search is not None:
        hooks["evolve"] = evolve_hook(config, agent, search, compiler)
    return Algorithm(name="DreamerV3" if config.algo == "dreamer" else
                     "{world_model} + {agent}".format(**config.components), init=init,
                     hooks=hooks, policy=policy, policy_params=policy_params,
                     world_model=agent.world_model,
                     world_model_params=lambda state: state.learner.params["model"],
                     phase_hooks=phase_hooks(config), close=actor.close)


def update_hooks(config, agent, compiler, actor, policy_params) -> dict[str, Hook]:
    """``update_model`` and, on a JAX env, ``iterate`` (the module's docstring); either
    reports the model's open-loop predictions every ``report_every`` updates."""
    d, num_envs = config.dreamer, config.env.num_envs
    update = agent.make_update(compiler.mesh)

    def train(state, data, key):
        k_batch, k_loss = jax.random.split(key)
        batch = state.replay.sample(k_batch, d.batch_size, d.batch_length)
        learner, metrics = update(state.learner, batch, k_loss)
        updates = state.updates + 1
        trained_steps = jnp.maximum(state.replay.added - d.prefill * num_envs, 1)
        return state.replace(learner=learner, updates=updates), {}, {
            **metrics, "replay/train_ratio": updates * d.batch_size * d.batch_length
            / trained_steps}

    def report(state, data, key):
        k_batch, k_model = jax.random.split(key)
        batch = state.replay.sample(k_batch, d.report_batch, d.report_length)
        return state, {}, agent.report(state.learner.params, batch, d.report_context, k_model)
    _report = compiler.step(report, donate=False)
    seen = {"count": None}  # host copy of state.updates for both hooks: read once, counted

    def reporting(hook: Hook) -> Hook:
        per_call = hook.counts["model_updates"]

        def fn(state, data, key):
            state, outputs, metrics = hook.fn(state, data, key)
            if d.report_every > 0:
                now = seen["count"] = (int(jnp.ravel(state.updates)[0]) if seen["count"] is None
                                       else seen["count"] + per_call)  # read on a first call
                if now // d.report_every > (now - per_call) // d.report_every:
                    _, _, report_metrics = _report(drop_actors(state), {}, seeds.fold_in(key, 1))
                    metrics = {**metrics, **report_metrics}
            return state, outputs, metrics

        return dataclasses.replace(hook, fn=fn)

    counts = hook_counts(config)
    hooks = {"update_model": reporting(compiler.hook(train, counts=counts["update_model"]))}
    if "iterate" in counts and actor.env_step.in_state:
        m, k = train_ratio(config).repeats()
        hooks["iterate"] = reporting(compiler.replay_iterations_hook(
            actor, train, config.iterations_per_call, counts["iterate"], collects=m,
            updates=k, params_of=policy_params))
    return hooks


def evolve_hook(config, agent, search: components.Search, compiler) -> Hook:
    """One CMA-ES generation in the world model, from states of replayed sequences."""
    c, model = config.cmaes, agent.world_model
    generation = cma_es.generation_in_model(search.evolution, search.controller, model,
                                            c.episodes, c.max_steps)

    def evolve(state, data, key):
        k_starts, k_env, k_run = jax.random.split(key, 3)
        params = state.learner.params["model"]
        starts = protocol.replay_starts(model, params, state.replay, k_starts, c.start_batch,
                                        config.dreamer.batch_length, c.population * c.episodes)
        es, metrics = generation(state.evolution, params, starts, k_env, k_run)
        return state.replace(evolution=es), {}, metrics

    return compiler.hook(evolve, counts=hook_counts(config)["evolve"],
                         frees_donated=True)  # what CMA-ES's eigh could not update in place


ENTRY = Entry(
    name="dreamer", build=build, validate=validate, hook_counts=hook_counts,
    validate_env=validate_env, phase_hooks=phase_hooks, tiny="dreamer:tiny",
    capabilities=Capabilities(  # iterations_per_call: on JAX envs (one_program)
        device_batches=lambda c: {"dreamer.batch_size": c.dreamer.batch_size},
        cannot={"async_pool": NO_ASYNC_POOL}),
    resumable=("dreamer.learning_rate", "dreamer.agc"),
    zero_means={"dreamer.report_every": "never", "dreamer.warmup": "no warm-up"})
# The pairings of pairing: the same wiring, other components.
PAIRING = dataclasses.replace(
    ENTRY, name="pairing", tiny="pairing:tiny_rssm_mppi",
    tiny_more=("pairing:tiny_tdmpc2_imagination", "pairing:tiny_rssm_cmaes"),
    zero_means={**ENTRY.zero_means, "mppi.envs_per_batch": "every env at once"})
