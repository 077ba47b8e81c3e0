"""Model-based random shooting ("mbrs"): the loop's model-based test case.

A small but complete model-based agent (Nagabandi et al. 2018) whose four hooks exercise
every model phase of the loop:

* ``collect``: one jitted ``lax.scan`` stepping envpool's XLA handle; uniform random actions
  until the replay holds ``warmup_steps`` transitions, then MPC with the learned model. Adds
  the valid transitions (not envpool's reset transitions) to the replay buffer and reports,
  before adding them, the model's one-step error on them: fresh data it has never seen.
* ``update_model``: ``model_updates_per_call`` Adam steps of the dynamics MLP on replay.
* ``imagine``: plans from a batch of replay states, imagining every candidate sequence in
  the model (a scan), and passes the elite sequences on (``writes=("elites",)``: data between
  hooks, not state); reports imagined returns of the best, mean and uniform candidates.
* ``update_agent``: the planner has no policy network, so its learnable part is the
  action-sequence prior: one cross-entropy-method step toward the imagined elites.

Every hook that changes the state donates it, so the replay buffer is written in place.
Continuous action spaces only (the planner samples in the action box); evaluation plans
greedily whatever ``eval.temperature`` says (planning has no temperature).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm import backend
from jaxwm.agents import shooting
from jaxwm.config import ConfigError
from jaxwm.data import replay
from jaxwm.envs import episode_metrics, make_env, require_continuous_vectors, transitions
from jaxwm.loop.algorithm import Algorithm, Hook, Policy
from jaxwm.models import dynamics


@struct.dataclass
class MBRSState:
    model: dynamics.DynamicsState
    replay: replay.ReplayState
    prior: shooting.SequencePrior
    actor: transitions.Cursor


def validate(config) -> None:
    m = config.mbrs
    checks = [
        (config.num_seeds == 1, "num_seeds > 1 is not supported by mbrs yet (PPO has it): "
                                "run one process per seed."),
        (m.horizon > 0, "mbrs.horizon must be > 0."),
        (m.num_candidates >= 2, "mbrs.num_candidates must be >= 2."),
        (0 < m.num_elites <= m.num_candidates, "mbrs.num_elites must be in [1, num_candidates]."),
        (m.capacity >= m.warmup_steps, "mbrs.capacity must be >= mbrs.warmup_steps."),
        (m.steps_per_collect > 0 and m.batch_size > 0 and m.imagine_batch > 0,
         "mbrs.steps_per_collect, batch_size and imagine_batch must be > 0."),
        (0.0 <= m.prior_momentum < 1.0, "mbrs.prior_momentum must be in [0, 1)."),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def build(config) -> Algorithm:
    m = config.mbrs
    env = require_continuous_vectors(
        make_env(config.env, num_envs=config.env.num_envs, seed=config.seed), "mbrs")
    spec = env.spec
    obs_dim, action_dim = spec.obs_shape[0], spec.action_shape[0]
    low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
    model = dynamics.DynamicsMLP(obs_dim + 1, tuple(m.hidden))
    optimizer = optax.adam(m.learning_rate)
    env_handle = {"handle": None}

    def model_step(model_state):
        return lambda obs, action: dynamics.predict(model, model_state, obs, action)

    def plan_batch(state: MBRSState, obs, key):
        keys = jax.random.split(key, obs.shape[0])
        action, _, _ = jax.vmap(
            lambda o, k: shooting.plan(model_step(state.model), o, k, state.prior,
                                       m.num_candidates, low, high))(obs, keys)
        return action

    def fresh_actor():
        env_handle["handle"], first = env.xla_reset()
        return transitions.Cursor.start(first.obs)

    def init(key):
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(action_dim),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim)}
        return MBRSState(
            model=dynamics.init(model, optimizer, key, obs_dim, action_dim),
            replay=replay.init(m.capacity, example),
            prior=shooting.SequencePrior.create(m.horizon, low, high),
            actor=fresh_actor(),
        )

    @partial(backend.jit, donate_argnums=0)
    def _collect(state: MBRSState, handle, key):
        warm = state.replay.size >= m.warmup_steps

        def choose(obs, step_key):
            k_random, k_plan = jax.random.split(step_key)
            return jax.lax.cond(
                warm, lambda: plan_batch(state, obs, k_plan),
                lambda: jax.random.uniform(k_random, (spec.num_envs, action_dim), minval=low,
                                           maxval=high))

        actor, handle, flat, valid, completed = transitions.collect(
            env.xla_step, state.actor, handle, choose, key, m.steps_per_collect)

        predicted, _ = dynamics.predict(model, state.model, flat["obs"], flat["action"])
        weights = valid / jnp.maximum(jnp.sum(valid), 1)
        sq = lambda x: jnp.sum(x**2, -1)  # noqa: E731
        metrics = {
            **episode_metrics(completed),
            "model/fresh_one_step_mse": jnp.sum(weights * sq(predicted - flat["next_obs"])),
            "model/zero_delta_mse": jnp.sum(weights * sq(flat["obs"] - flat["next_obs"])),
            "charts/planning": warm.astype(jnp.float32),
        }
        kept = {k: flat[k] for k in state.replay.data}  # the model needs no `terminated`
        state = state.replace(actor=actor, replay=replay.add(state.replay, kept, valid))
        return state, handle, metrics

    def collect_hook(state, data, key):
        del data
        state, env_handle["handle"], metrics = _collect(state, env_handle["handle"], key)
        return state, {}, metrics

    @partial(backend.jit, donate_argnums=0)
    def _update_model(state: MBRSState, key):
        k_fit, k_steps = jax.random.split(key)
        model_state = dynamics.refit_normalizers(
            state.model, replay.sample(state.replay, k_fit, m.normalizer_samples))

        def step(model_state, k):
            batch = replay.sample(state.replay, k, m.batch_size)
            return dynamics.train_step(model, optimizer, model_state, batch)

        model_state, losses = jax.lax.scan(
            step, model_state, jax.random.split(k_steps, m.model_updates_per_call))
        return state.replace(model=model_state), {"losses/model_loss": jnp.mean(losses),
                                                  "losses/model_loss_last": losses[-1]}

    @backend.jit
    def _imagine(state: MBRSState, key):
        k_obs, k_plan = jax.random.split(key)
        starts = replay.sample(state.replay, k_obs, m.imagine_batch)["obs"]
        step_fn = model_step(state.model)
        _, candidates, returns = jax.vmap(
            lambda o, k: shooting.plan(step_fn, o, k, state.prior, m.num_candidates, low, high)
        )(starts, jax.random.split(k_plan, m.imagine_batch))
        elite = jax.vmap(shooting.elites, in_axes=(0, 0, None))(candidates, returns, m.num_elites)
        n_uniform = m.num_candidates - m.num_candidates // 2
        metrics = {
            "imagine/best_return": jnp.mean(jnp.max(returns, -1)),
            "imagine/mean_return": jnp.mean(returns),
            "imagine/uniform_best_return": jnp.mean(jnp.max(returns[:, :n_uniform], -1)),
            "imagine/prior_best_return": jnp.mean(jnp.max(returns[:, n_uniform:], -1)),
        }
        return elite.reshape((-1,) + elite.shape[2:]), metrics  # [batch * elites, H, A]

    @partial(backend.jit, donate_argnums=0)
    def _update_agent(state: MBRSState, elites):
        prior = shooting.refit_prior(state.prior, elites, m.prior_momentum, m.prior_min_std)
        return state.replace(prior=prior), {"agent/prior_std": jnp.mean(prior.std),
                                            "agent/prior_mean_abs": jnp.mean(jnp.abs(prior.mean))}

    def update_model_hook(state, data, key):
        del data
        state, metrics = _update_model(state, key)
        return state, {}, metrics

    def imagine_hook(state, data, key):
        del data
        elites, metrics = _imagine(state, key)
        return state, {"elites": elites}, metrics  # reads the state; changes nothing in it

    def update_agent_hook(state, data, key):
        del key
        state, metrics = _update_agent(state, data["elites"])
        return state, {}, metrics

    @backend.jit
    def act(state, carry, obs, is_first, key, temperature):
        del is_first, temperature  # planning is deterministic given the key; no carry
        return carry, plan_batch(state, jnp.asarray(obs, jnp.float32), key)

    return Algorithm(
        name="MBRS",
        init=init,
        hooks={
            "collect": Hook(collect_hook, counts={"env_steps": spec.num_envs * m.steps_per_collect}),
            "update_model": Hook(update_model_hook,
                                 counts={"model_updates": m.model_updates_per_call}),
            "imagine": Hook(imagine_hook, writes=("elites",)),
            "update_agent": Hook(update_agent_hook, reads=("elites",),
                                 counts={"agent_updates": 1}),
        },
        policy=Policy(init_carry=lambda state, n: (), act=act),
        # The actor's state belongs to the live envs, which restart on resume.
        persistent=lambda state: state.replace(actor=None),
        on_restore=lambda fresh, saved: saved.replace(actor=fresh.actor),
        close=env.close,
    )
