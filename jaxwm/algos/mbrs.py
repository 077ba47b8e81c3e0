"""Model-based random shooting ("mbrs"): the loop's model-based test case.

A small but complete model-based agent (Nagabandi et al. 2018) whose four hooks exercise
every model phase of the loop:

* ``collect``: the acting layer's jitted rollout (``jaxwm.envs.acting.Actor``): uniform
  random actions until the replay holds ``warmup_steps`` transitions, then MPC with the
  learned model (``agents.shooting.policy``). Adds the valid transitions (not envpool's reset
  transitions) to the replay and reports, before adding them, the model's one-step error on
  them: fresh data it has never seen.
* ``update_model``: ``model_updates_per_call`` Adam steps of the dynamics MLP on replay.
* ``imagine``: plans from a batch of replay states, imagining every candidate sequence in
  the model (a scan), and passes the elite sequences on (``writes=("elites",)``: data between
  hooks, not state); reports imagined returns of the best, mean and uniform candidates.
* ``update_agent``: the planner has no policy network, so its learnable part is the
  action-sequence prior: one cross-entropy-method step toward the imagined elites.

Every hook that changes the state donates it, so the replay buffer is written in place.
Devices as online SAC: the pool acts on the process's first device, the rest of the state is
replicated over the mesh and each model-training batch is split over its ``data`` axis.
Seeds (``num_seeds``): every part of the state gets a leading seed axis and the hooks are
vmapped over it. Continuous action spaces only (the planner samples in the action box);
evaluation plans greedily whatever ``eval.temperature`` says (planning has no temperature).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm import parallel
from jaxwm.agents import shooting
from jaxwm.algos import Entry, continuous_control
from jaxwm.config import require
from jaxwm.data.replay import TransitionReplay
from jaxwm.envs import acting
from jaxwm.envs.stats import episode_metrics
from jaxwm.envs.types import ActionBox
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.compile import HookCompiler
from jaxwm.models import dynamics


@struct.dataclass
class MBRSState:
    model: dynamics.DynamicsState
    replay: TransitionReplay
    prior: shooting.SequencePrior
    actor: acting.ActorState


def validate(config) -> None:
    """The planner's own settings (sizes > 0 and the env's spaces are checked for every
    algorithm by ``jaxwm.runner.validate``)."""
    m = config.mbrs
    require([(m.num_candidates >= 2, "mbrs.num_candidates must be >= 2."),
             (m.num_elites <= m.num_candidates, "mbrs.num_elites must be in [1, num_candidates]."),
             (m.capacity >= m.warmup_steps, "mbrs.capacity must be >= mbrs.warmup_steps."),
             (0.0 <= m.prior_momentum < 1.0, "mbrs.prior_momentum must be in [0, 1).")])


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    m = config.mbrs
    return {"collect": {"env_steps": config.env.num_envs * m.steps_per_collect},
            "update_model": {"model_updates": m.model_updates_per_call},
            "imagine": {}, "update_agent": {"agent_updates": 1}}


def build(config) -> Algorithm:
    m = config.mbrs
    env = acting.make_pool(config)
    (obs_dim,), (action_dim,) = env.spec.obs_shape, env.spec.action_shape
    low, high = jnp.asarray(env.spec.action_low), jnp.asarray(env.spec.action_high)
    model = dynamics.DynamicsMLP(obs_dim + 1, tuple(m.hidden))
    optimizer = optax.adam(m.learning_rate)
    compiler = HookCompiler.for_config(config)
    mesh = compiler.mesh

    def model_step(model_state):
        return lambda obs, action: dynamics.predict(model, model_state, obs, action)

    policy = shooting.policy(model_step, m.num_candidates, low, high)

    def finish(params, start, steps, final, completed):
        """One group's transitions, and the model's error on them before it sees them."""
        del start
        _, (model_state, _) = params  # (warm-up flag, (model, prior))
        flat, valid = acting.transitions(steps, final)
        metrics = {**episode_metrics(completed),
                   **dynamics.fresh_error(model, model_state, flat, valid)}
        kept = {k: flat[k] for k in ("obs", "action", "reward", "next_obs")}
        return final.carry, ((kept, valid), metrics)

    actor = acting.Actor(env, policy, m.steps_per_collect, mesh=mesh, groups=config.num_seeds,
                         finish=finish, warmup_transitions=m.warmup_steps)

    def init(key):
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(action_dim),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim)}
        state = compiler.init(lambda k: MBRSState(
            model=dynamics.init(model, optimizer, k, obs_dim, action_dim),
            replay=TransitionReplay.create(m.capacity, example),
            prior=shooting.SequencePrior.create(m.horizon, low, high), actor=None))(key)
        return state.replace(actor=actor.init((state.model, state.prior)))

    def update_model(state: MBRSState, data, key):
        k_fit, k_steps = jax.random.split(key)
        model_state, metrics = dynamics.fit(
            model, optimizer, state.model, lambda k: parallel.constrain_batch(
                state.replay.sample(k, m.batch_size), mesh), k_steps, m.model_updates_per_call,
            state.replay.sample(k_fit, m.normalizer_samples))
        return state.replace(model=model_state), {}, metrics

    def imagine(state: MBRSState, data, key):
        k_obs, k_plan = jax.random.split(key)
        elites, metrics = shooting.imagined_elites(
            model_step(state.model), state.replay.sample(k_obs, m.imagine_batch)["obs"], k_plan,
            state.prior, m.num_candidates, m.num_elites, low, high)
        return state, {"elites": elites}, metrics  # reads the state; changes nothing in it

    def update_agent(state: MBRSState, data, key):
        prior = shooting.refit_prior(state.prior, data["elites"], m.prior_momentum,
                                     m.prior_min_std)
        return state.replace(prior=prior), {}, {
            "agent/prior_std": jnp.mean(prior.std),
            "agent/prior_mean_abs": jnp.mean(jnp.abs(prior.mean))}

    counts = hook_counts(config)
    return Algorithm(
        name="MBRS",
        init=init,
        hooks={
            "collect": Hook(actor.replay_hook(lambda state: (state.model, state.prior)),
                            counts=counts["collect"]),
            "update_model": compiler.hook(update_model, counts=counts["update_model"]),
            "imagine": compiler.hook(imagine, writes=("elites",)),
            "update_agent": compiler.hook(update_agent, reads=("elites",),
                                          counts=counts["update_agent"]),
        },
        policy=policy,
        policy_params=lambda state: (state.model, state.prior),
        world_model=dynamics.DynamicsModel(model, action_dim, ActionBox.of(env.spec).to_env),
        world_model_params=lambda state: state.model,
        close=actor.close,
    )


ENTRY = Entry(name="mbrs", build=build, validate=validate, hook_counts=hook_counts,
              tiny="mbrs:tiny",
              # The planner samples in the action box and its model predicts vector states.
              capabilities=continuous_control("mbrs.batch_size"),
              resumable=("mbrs.learning_rate",))
