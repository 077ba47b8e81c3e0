"""MOPO's and GORMPO's learning as pieces (Yu et al. 2020, "MOPO: Model-based Offline Policy
Optimization", algorithm 2, as OfflineRL-Kit runs it; GORMPO, seed 002, which swaps MOPO's
uncertainty penalty for a RealNVP density penalty). ``jaxwm.algos.mopo`` wires them to the
dataset, the phases and SAC's update.

* ``model_split``: a run's train/holdout split of the dataset and each member's bootstrap.
* ``ensemble_env`` / ``branch_rollout``: the model rollouts (algorithm 2, lines 5-9):
  ``horizon`` steps of SAC's policy in the dynamics ensemble as an env of the acting layer
  (one ``acting.rollout``), a random elite per row and sampled predictions, each row stopped
  where the env's termination rule (``models.termination``) ends it; rewards penalised,
  ``r - lambda * u``, with ``u`` MOPO's ``max over members of ||sigma||`` (eq. 7, "max
  aleatoric") or GORMPO's density penalty (``models.realnvp.penalty``) of the RealNVP
  log-probability of ``(s, a)`` (or the predicted ``(s', a)``, ``score_next_state``).
* ``density_rows``: the rows GORMPO's density is fit on (and scores).
* ``mixed_batch``: SAC's batches of ``real_ratio`` dataset transitions and the rest from the
  model buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.agents import sac
from jaxwm.data.replay import TransitionReplay
from jaxwm.envs import acting
from jaxwm.envs.types import StepResult
from jaxwm.models import ensemble, realnvp

UNCERTAINTY = "uncertainty"  # MOPO's penalty


def sac_hyper(config) -> sac.SACHyper:
    """SAC's settings; with ``mopo.actor_lr_cosine`` the actor's lr follows OfflineRL-Kit's
    ``CosineAnnealingLR(T_max=epochs)``, stepped once per epoch of ``updates_per_epoch``."""
    m, hyper = config.mopo, sac.SACHyper.from_config(config.sac)
    if not m.actor_lr_cosine:
        return hyper
    epochs = max(1, config.phases.policy.duration // m.updates_per_epoch)
    return dataclasses.replace(hyper, actor_lr_decay_steps=epochs,
                               actor_lr_step_every=m.updates_per_epoch)


def ensemble_spec(config, obs_dim: int, action_dim: int) -> ensemble.EnsembleSpec:
    m = config.mopo
    return ensemble.EnsembleSpec(obs_dim, action_dim, m.num_members, m.num_elites,
                                 tuple(m.model_hidden), tuple(m.weight_decay), m.model_lr,
                                 m.model_batch, weight_init=m.model_init)


def density_spec(config, dim: int) -> realnvp.DensitySpec:
    g = config.gormpo
    return realnvp.DensitySpec(dim, g.num_couplings, tuple(g.hidden), g.learning_rate,
                               g.batch_size, g.max_epochs, g.patience, g.threshold_quantile)


def model_split(num: int, members: int, seed: int) -> dict[str, np.ndarray]:
    """A run's train/holdout split of the dataset's ``num`` transitions and each of the
    ``members``' bootstrap resample of the training split, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    train_index, holdout_index = ensemble.split_indices(num, rng)
    bootstrap = rng.integers(0, len(train_index), size=(members, len(train_index)))
    return {"train": train_index.astype(np.int32), "bootstrap": bootstrap.astype(np.int32),
            "holdout": holdout_index.astype(np.int32)}


def density_rows(dataset, score_next_state: bool):
    """``[N, obs + action]``: the rows the density describes, (s', a) where the penalty scores
    the predicted next state (GORMPO's code fits its RealNVP on next_observations), else
    (s, a)."""
    states = dataset["next_obs"] if score_next_state else dataset["obs"]
    return jnp.concatenate([states, dataset["action"]], -1)


def reward_penalty(shape: str, density_spec: realnvp.DensitySpec | None, density,
                   score_next_state: bool) -> Callable:
    """``u(std, obs, action, next_obs)`` [n]: MOPO's uncertainty or GORMPO's density
    penalty of ``shape`` with ``density`` (a ``realnvp.DensityState``: its best parameters,
    scaler and threshold)."""

    def penalty(std, obs, action, next_obs):
        if shape == UNCERTAINTY:  # max over members of the std's norm (MOPO eq. 7)
            return jnp.max(jnp.linalg.norm(std, axis=-1), 0)
        scored = next_obs if score_next_state else obs
        logp = realnvp.log_prob(density_spec, density.patience.best_params, density.scaler,
                                jnp.concatenate([scored, action], -1))
        return realnvp.penalty(shape, logp, density.tau)

    return penalty


def ensemble_env(model_spec: ensemble.EnsembleSpec, model, penalty: Callable,
                 terminated_fn: Callable, coef: float) -> acting.EnvStep:
    """The dynamics ensemble as an env (``acting.sync``), the acting layer's learned-model
    case. Its state is ``(obs, alive, key, totals)``; each step samples a random elite's
    prediction (``ensemble.sample_step``) and returns the reward penalised by ``coef * u``,
    ``u = penalty(std, obs, action, next_obs)``, the raw reward as ``raw_reward``.

    A row that the termination rule ends stays ended (``terminated`` on every later row): MOPO
    stops a rollout there rather than starting another, so each of its later steps is a reset
    transition that ``acting.transitions`` marks invalid. ``totals`` sums the raw reward and
    ``u`` over the rows still alive, for the metrics."""

    def step(env_state, action):
        obs, alive, key, totals = env_state
        key, k_model = jax.random.split(key)
        next_obs, reward, std = ensemble.sample_step(model_spec, model, obs, action, k_model)
        u = penalty(std, obs, action, next_obs)
        ended = alive & terminated_fn(obs, action, next_obs)
        live = lambda x: jnp.sum(jnp.where(alive, x, 0.0))  # noqa: E731
        totals = totals + jnp.stack([live(reward), live(u)])
        rows = StepResult(obs=next_obs, reward=reward - coef * u, terminated=~alive | ended,
                          truncated=jnp.zeros_like(alive), episode_over=ended,
                          raw_reward=reward)
        return (next_obs, alive & ~ended, key, totals), rows

    return acting.sync(step)


def branch_rollout(model_spec: ensemble.EnsembleSpec, model, policy: acting.Policy, params,
                   obs: jax.Array, key: jax.Array, horizon: int, penalty: Callable,
                   terminated_fn: Callable, coef: float):
    """MOPO's model rollouts (module docstring): ``horizon`` steps of ``policy`` (with
    ``params``) in ``ensemble_env`` from the start states ``obs`` ``[N, d]``, one
    ``acting.rollout``. Returns ``(transitions, valid, metrics)``: the transitions
    ``[horizon * N]`` (time-major, rewards penalised), ``valid`` False from a row's
    termination on, and the means over valid transitions of the raw reward, ``u`` and the
    penalised reward, with the mean rollout length."""
    n = obs.shape[0]
    k_model, k_act = jax.random.split(key)
    zeros, alive = jnp.zeros(n, jnp.float32), jnp.ones(n, bool)
    first = StepResult(obs=obs, reward=zeros, terminated=~alive, truncated=~alive,
                       episode_over=~alive, raw_reward=zeros)
    start = acting.ActorState.start(first, policy.init_carry(params, n), n)
    env_state = (obs, alive, k_model, jnp.zeros(2, jnp.float32))
    env = ensemble_env(model_spec, model, penalty, terminated_fn, coef)
    final, (_, _, _, totals), steps, _ = acting.rollout(policy, env, params, start, env_state,
                                                          k_act, horizon)
    batch, valid = acting.transitions(steps, final)
    count = jnp.maximum(jnp.sum(valid), 1)
    metrics = {"rollout/raw_reward": totals[0] / count, "rollout/penalty": totals[1] / count,
               "rollout/penalised_reward": jnp.sum(jnp.where(valid, batch["reward"], 0.0))
               / count,
               "rollout/length": jnp.sum(valid).astype(jnp.float32) / n}
    return batch, valid, metrics


def model_epoch(spec: ensemble.EnsembleSpec, model: ensemble.EnsembleState, dataset, split,
                key, patience: int, constrain_members: Callable):
    """One epoch of every member over its bootstrap of the training split, then the held-out
    MSE and snapshots (``ensemble.train_epoch``). A model whose patience has run out is kept
    as it is: with several seeds the phase goes on until all have converged (a seed's model
    is then the one its own run would have kept)."""
    new, metrics = ensemble.train_epoch(spec, model, dataset, split["train"],
                                        split["bootstrap"], split["holdout"], key,
                                        constrain_members)
    done = model.patience.exhausted(patience)
    return jax.tree.map(lambda old, x: jnp.where(done, old, x), model, new), metrics


def imagine_into(buffer: TransitionReplay, model_spec: ensemble.EnsembleSpec, model, policy,
                 params, dataset, key, batch: int, horizon: int, penalty: Callable,
                 terminated_fn: Callable, coef: float, constrain: Callable):
    """One batch of ``branch_rollout`` from ``batch`` dataset states drawn uniformly, added to
    the model ``buffer`` (its valid transitions)."""
    k_start, k_rollout = jax.random.split(key)
    starts = jax.random.randint(k_start, (batch,), 0, dataset["obs"].shape[0])
    rows, valid, metrics = branch_rollout(model_spec, model, policy, params,
                                          constrain(dataset["obs"][starts]), k_rollout,
                                          horizon, penalty, terminated_fn, coef)
    buffer = buffer.add(rows, valid)
    return buffer, {**metrics, "rollout/buffer_size": buffer.size.astype(jnp.float32)}


def mixed_batch(buffer: TransitionReplay, dataset, batch_size: int, real: int, key):
    """``real`` dataset transitions and ``batch_size - real`` from the model ``buffer``."""
    k_real, k_model = jax.random.split(key)
    real_index = jax.random.randint(k_real, (real,), 0, dataset["obs"].shape[0])
    rows = {k: dataset[k][real_index] for k in buffer.data}
    model = buffer.sample(k_model, batch_size - real)
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)]), rows, model)
