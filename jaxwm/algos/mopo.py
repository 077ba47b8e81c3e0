"""Offline model-based RL: MOPO and GORMPO on a fixed dataset (``config.algo`` mopo | gormpo).

MOPO (Yu et al. 2020, "MOPO: Model-based Offline Policy Optimization", algorithm 2) as
OfflineRL-Kit runs it, and GORMPO (seed 002), which swaps MOPO's uncertainty penalty for a
RealNVP density penalty. Hooks:

* ``update_model``: one epoch of the dynamics ensemble (``jaxwm.models.ensemble``) on the
  dataset's training split; the ``model`` phase ends early through the loop
  (``until=model_converged``) once no member has improved its held-out MSE for
  ``mopo.model_patience`` epochs.
* ``imagine``: one batch of model rollouts (``branch_rollout``: the acting layer's one scan,
  SAC's policy acting in the ensemble as an env, ``ensemble_env``; ``mopo.rollout_batch``
  starts drawn from the dataset, ``mopo.horizon`` steps, the current actor's sampled
  actions, a uniformly chosen elite per row and sampled predictions), stopping each row where
  the env's termination rule (``jaxwm.models.termination``) says the episode ended. Rewards
  are penalised: ``r - lambda * u`` with ``u`` MOPO's ``max over members of ||sigma||``
  (eq. 7 with the "max aleatoric" estimator) or, for GORMPO, the density penalty of
  ``penalty`` shape on the RealNVP log-probability. The transitions go to a model buffer that
  keeps the last ``mopo.retain_epochs`` rollout batches.
* ``update_agent``: ``mopo.updates_per_epoch`` SAC updates in one scan
  (``jaxwm.agents.sac.make_update``) on batches of ``real_ratio`` dataset transitions and the
  rest from the model buffer.

One policy epoch is thus two compiled calls (rollout, then K updates); the host only
schedules them. The dataset's transitions are a phase artifact (``jaxwm.loop.artifacts``): the
run imports them into its directory when it starts, and a resume checks that the dataset file
still holds them; hooks read all of them, on the device once (sharded over the mesh when
large). The train/holdout split and bootstraps are read-only data. The ensemble, SAC learner
and model buffer are the state, all of it checkpointed, so a resumed run continues exactly.

Seeds (``num_seeds`` N): every part of the state gets a leading seed axis; seed k's split is
drawn from the seed a one-seed run would have (``seeds.run_seeds``). With several seeds the
model phase goes on until every seed's ensemble has converged, a converged one kept as it is.

GORMPO's density model is fit once per dataset before training (``fit_density``: shuffled
epochs, validation early stopping through ``jaxwm.models.patience``), cached on disk under
``gormpo.cache_dir`` keyed by the dataset's contents, the density settings and
``gormpo.density_seed``, and reused by later runs, resumes and every seed; it is read-only
data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization, struct
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from jaxwm import backend, parallel
from jaxwm.agents import sac
from jaxwm.algos import continuous_control
from jaxwm.config import require
from jaxwm.data.datasets import load_configured
from jaxwm.data.replay import TransitionReplay
from jaxwm.envs import acting
from jaxwm.envs.types import StepResult
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm, Hook, learner_update
from jaxwm.loop.artifacts import Artifact
from jaxwm.models import ensemble, realnvp, termination
from jaxwm.models.dynamics import Normalizer

UNCERTAINTY = "uncertainty"  # MOPO's penalty
# Above this coefficient the (unbounded) inverse density penalty gets a warning.
INVERSE_COEF_WARN = 0.1
ALGOS = ("mopo", "gormpo")


CAPABILITIES = continuous_control("sac.batch_size", "mopo.rollout_batch", "mopo.model_batch")


@struct.dataclass
class MOPOState:
    model: ensemble.EnsembleState
    learner: sac.Learner
    buffer: TransitionReplay  # model rollouts


def penalty_shape(config) -> str:
    """The penalty in use: ``config.penalty``, or the algorithm's own when left empty."""
    return config.penalty or (UNCERTAINTY if config.algo == "mopo" else "linear")


def validate(config) -> None:
    m, shape = config.mopo, penalty_shape(config)
    valid = (UNCERTAINTY,) if config.algo == "mopo" else realnvp.PENALTY_SHAPES
    checks = [
        (config.algo in ALGOS, f"algo must be one of {ALGOS} for configs/mopo.py."),
        (shape in valid,
         f"Unknown penalty {shape!r} for {config.algo}; valid: {list(valid)}"
         + (" (the density shapes are GORMPO's: set --config.algo=gormpo)."
            if config.algo == "mopo" and shape in realnvp.PENALTY_SHAPES else ".")),
        (config.penalty_coef >= 0, "penalty_coef must be >= 0."),
        (bool(config.dataset), "Set --config.dataset to a D4RL-format HDF5 file or a Minari "
                               "dataset (python -m jaxwm.tools.make_dataset makes one)."),
        (m.num_elites <= m.num_members, "mopo.num_elites must be in [1, num_members]."),
        (0.0 <= m.real_ratio <= 1.0, "mopo.real_ratio must be in [0, 1]."),
        *sac.config_checks(config.sac),
        (m.model_init in ensemble.KERNEL_INITS,
         f"Unknown mopo.model_init {m.model_init!r}; choose one of "
         f"{tuple(ensemble.KERNEL_INITS)}."),
    ]
    require(checks)
    if shape == "inverse" and config.penalty_coef > INVERSE_COEF_WARN:
        warnings.warn(
            f"jaxwm: the inverse penalty e^(tau - logp) is unbounded; at penalty_coef "
            f"{config.penalty_coef} far out-of-distribution samples swamp the reward (on "
            f"pendulum_tiny 1.0 diverged, 0.01 learned on one dataset and not on another, "
            f"0.001 learned). Try --config.penalty_coef=0.001.",
            stacklevel=2)


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


def fit_density(config, x: np.ndarray) -> tuple[realnvp.DensitySpec, dict, Normalizer, float]:
    """GORMPO's RealNVP on the dataset's (s, a) or (s', a) rows ``x``: loaded from the cache
    when a model for the same data, settings and ``gormpo.density_seed`` is there; otherwise
    trained (a progress bar per epoch) and saved. One density per dataset, shared by every
    seed of a run and by every run on it (it describes the data, not an agent). Returns
    (spec, params of the best epoch, scaler, threshold tau)."""
    spec = density_spec(config, x.shape[1])
    seed = config.gormpo.density_seed
    digest = hashlib.sha1(np.ascontiguousarray(x, np.float32).tobytes())
    digest.update(json.dumps({**dataclasses.asdict(spec), "seed": seed}).encode())
    cache = os.path.join(os.path.expanduser(config.gormpo.cache_dir),
                         f"realnvp-{digest.hexdigest()[:16]}.msgpack")
    if os.path.exists(cache):
        template = realnvp.init_density(spec, jax.random.key(0), Normalizer.identity(spec.dim))
        try:
            with open(cache, "rb") as f:
                saved = serialization.from_bytes(
                    {"params": template.params, "scaler": template.scaler, "tau": template.tau},
                    f.read())
        except Exception as e:  # noqa: BLE001 -- any unreadable cache is rebuilt, not fatal
            aside = f"{cache}.unreadable"
            try:
                os.replace(cache, aside)
            except FileNotFoundError:  # another run sharing the cache moved it first
                pass
            tqdm.write(f"GORMPO density cache {cache} cannot be read ({type(e).__name__}: "
                       f"{str(e)[:120]}); moved to {aside} and training the density again.")
        else:
            tqdm.write(f"GORMPO density model loaded from {cache}.")
            return spec, saved["params"], saved["scaler"], float(saved["tau"])

    rng = np.random.default_rng(seed)
    train, val, _ = realnvp.split_indices(len(x), rng)
    xs = jnp.asarray(x)
    state = realnvp.init_density(spec, jax.random.key(seed), Normalizer.fit(xs[train]))
    epoch = backend.jit(partial(realnvp.train_density_epoch, spec), donate_argnums=0)
    key = jax.random.key(seed + 1)
    with tqdm(range(spec.max_epochs), desc="GORMPO density (RealNVP)", unit="epoch",
              disable=not config.log.progress) as bar:
        for _ in bar:
            key, k = jax.random.split(key)
            state, metrics = epoch(state, xs, jnp.asarray(train), jnp.asarray(val), k)
            bar.set_postfix(val_nll=f"{float(metrics['density/val_nll']):.3f}")
            if not np.isfinite(float(metrics["density/val_nll"])):
                raise FloatingPointError("The RealNVP density's validation NLL is not finite; "
                                         "lower --config.gormpo.learning_rate.")
            if bool(state.patience.exhausted(spec.patience)):
                break
    saved = {"params": state.patience.best_params, "scaler": state.scaler, "tau": state.tau}
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache + ".partial", "wb") as f:
        f.write(serialization.to_bytes(saved))
    os.replace(cache + ".partial", cache)
    tqdm.write(f"GORMPO density model: {int(state.epochs)} epochs, best validation NLL "
               f"{float(state.patience.best_loss):.3f}, tau {float(state.tau):.3f}; saved to "
               f"{cache}.")
    return spec, saved["params"], saved["scaler"], float(state.tau)


def model_split(config, num: int, seed: int) -> dict[str, np.ndarray]:
    """A run's train/holdout split of the dataset's ``num`` transitions and each member's
    bootstrap resample of the training split, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    train_index, holdout_index = ensemble.split_indices(num, rng)
    bootstrap = rng.integers(0, len(train_index),
                             size=(config.mopo.num_members, len(train_index)))
    return {"train": train_index.astype(np.int32), "bootstrap": bootstrap.astype(np.int32),
            "holdout": holdout_index.astype(np.int32)}


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
    """MOPO's model rollouts (Yu et al. 2020, algorithm 2, lines 5-9): ``horizon`` steps of
    ``policy`` (with ``params``) in ``ensemble_env`` from the start states ``obs`` ``[N, d]``,
    one ``acting.rollout``. Returns ``(transitions, valid, metrics)``: the transitions
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


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    return {"update_model": {"model_epochs": 1}, "imagine": {"model_rollouts": 1},
            "update_agent": {"agent_updates": config.mopo.updates_per_epoch}}


def build(config) -> Algorithm:
    m, s = config.mopo, config.sac
    dataset, spec = load_configured(config)
    box = sac.ActionBox(np.asarray(spec.action_low), np.asarray(spec.action_high))
    obs_dim, action_dim = dataset.obs_dim, dataset.action_dim
    terminated_fn = termination.termination_fn(config.env.id)
    model_spec = ensemble_spec(config, obs_dim, action_dim)
    nets = sac.SACNets.from_config(box, s)
    policy = sac.policy(nets)
    hyper = sac_hyper(config)
    shape, coef = penalty_shape(config), float(config.penalty_coef)
    over_seeds = partial(seeds.vmap, num_seeds=config.num_seeds)

    mesh = parallel.data_mesh(config.num_devices or None)
    constrain = partial(parallel.constrain_batch, mesh=mesh)
    member_batches = NamedSharding(mesh, PartitionSpec(None, parallel.DATA_AXIS))
    constrain_members = (lambda x: jax.lax.with_sharding_constraint(x, member_batches)) \
        if mesh.size > 1 else (lambda x: x)

    # The transitions: a phase artifact the run imports when it starts and keeps (a resume
    # trains on the rows the run began with); hooks read all of it, on the device.
    arrays = {k: np.asarray(v, np.float32) for k, v in dataset.transitions.items()}
    artifacts = {"dataset": Artifact(example={k: v[0] for k, v in arrays.items()},
                                     source=lambda: arrays,
                                     place=partial(parallel.put_readonly, mesh=mesh))}
    # Read-only data: each seed's train/holdout split and bootstraps (seed k draws them as a
    # run with seed + k * env.num_envs would).
    splits = [model_split(config, len(dataset), seed) for seed in seeds.run_seeds(config)]
    split = seeds.stack(splits)
    scaler = seeds.stack([Normalizer.fit(jnp.asarray(ensemble.inputs(
        arrays["obs"][sp["train"]], arrays["action"][sp["train"]]))) for sp in splits])
    data = {"model_split": parallel.replicate(jax.tree.map(jnp.asarray, split), mesh)}
    if config.algo == "gormpo":
        # The density describes the rows it scores: (s', a) where the penalty scores the
        # predicted next state (GORMPO's code fits its RealNVP on next_observations), else (s, a).
        states = arrays["next_obs"] if config.gormpo.score_next_state else arrays["obs"]
        d_spec, d_params, d_scaler, tau = fit_density(
            config, np.concatenate([states, arrays["action"]], 1))
        data["density"] = parallel.replicate({"params": d_params, "scaler": d_scaler,
                                              "tau": jnp.float32(tau)}, mesh)

    def reward_penalty(std, obs, action, next_obs, density):
        if shape == UNCERTAINTY:  # max over members of the std's norm (MOPO eq. 7)
            return jnp.max(jnp.linalg.norm(std, axis=-1), 0)
        scored = next_obs if config.gormpo.score_next_state else obs
        logp = realnvp.log_prob(d_spec, density["params"], density["scaler"],
                                jnp.concatenate([scored, action], -1))
        return realnvp.penalty(shape, logp, density["tau"])

    def init(key):
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(action_dim),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim),
                   "terminated": jnp.zeros((), bool)}

        def one(key, scaler):
            k_model, k_agent = jax.random.split(key)
            return MOPOState(
                model=ensemble.init(model_spec, k_model, scaler),
                learner=sac.init_learner(nets, hyper, k_agent, obs_dim),
                buffer=TransitionReplay.create(m.rollout_batch * m.horizon * m.retain_epochs,
                                               example))

        return parallel.replicate(over_seeds(one)(key, scaler), mesh)

    def model_epoch(state: MOPOState, dataset_arrays, split, key):
        model, metrics = ensemble.train_epoch(model_spec, state.model, dataset_arrays,
                                              split["train"], split["bootstrap"],
                                              split["holdout"], key, constrain_members)
        # A seed whose ensemble has converged keeps it: with several seeds the phase goes on
        # until all have (a seed's model is then the one its own run would have kept).
        done = state.model.patience.exhausted(m.model_patience)
        model = jax.tree.map(lambda old, new: jnp.where(done, old, new), state.model, model)
        return state.replace(model=model), metrics

    def rollout(state: MOPOState, dataset_arrays, density, key):
        k_start, k_rollout = jax.random.split(key)
        starts = jax.random.randint(k_start, (m.rollout_batch,), 0,
                                    dataset_arrays["obs"].shape[0])
        batch, valid, metrics = branch_rollout(
            model_spec, state.model, policy, state.learner,
            constrain(dataset_arrays["obs"][starts]), k_rollout, m.horizon,
            lambda *rows: reward_penalty(*rows, density), terminated_fn, coef)
        buffer = state.buffer.add(batch, valid)
        metrics["rollout/buffer_size"] = buffer.size.astype(jnp.float32)
        return state.replace(buffer=buffer), metrics

    real_batch = int(round(s.batch_size * m.real_ratio))

    def mixed_batch(source, key):
        buffer, dataset_arrays = source
        k_real, k_model = jax.random.split(key)
        real_index = jax.random.randint(k_real, (real_batch,), 0,
                                        dataset_arrays["obs"].shape[0])
        real = {k: dataset_arrays[k][real_index] for k in buffer.data}
        model = buffer.sample(k_model, s.batch_size - real_batch)
        return jax.tree.map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)]), real, model)

    sac_updates = sac.make_update(nets, hyper, mixed_batch, m.updates_per_epoch, mesh)
    # Per seed: the state, its split and key; the dataset and density are shared.
    _model_epoch = backend.jit(over_seeds(model_epoch, in_axes=(0, None, 0, 0)),
                               donate_argnums=0)
    _rollout = backend.jit(over_seeds(rollout, in_axes=(0, None, None, 0)), donate_argnums=0)
    _sac_updates = backend.jit(over_seeds(lambda learner, buffer, arrays, key: sac_updates(
        learner, (buffer, arrays), key), in_axes=(0, 0, None, 0)), donate_argnums=0)

    def update_model_hook(state, data, key):
        state, metrics = _model_epoch(state, data["dataset"], data["model_split"], key)
        return state, {}, metrics

    def imagine_hook(state, data, key):
        state, metrics = _rollout(state, data["dataset"], data.get("density"), key)
        return state, {}, metrics

    rollout_reads = ("dataset", "density") if "density" in data else ("dataset",)
    counts = hook_counts(config)
    return Algorithm(
        name=config.algo.upper(),
        init=init,
        hooks={
            "update_model": Hook(update_model_hook, counts=counts["update_model"],
                                 reads=("dataset", "model_split")),
            "imagine": Hook(imagine_hook, counts=counts["imagine"], reads=rollout_reads),
            "update_agent": Hook(learner_update(_sac_updates, lambda state, data: (
                state.buffer, data["dataset"])), reads=("dataset",),
                                 counts=counts["update_agent"]),
        },
        data=data,
        artifacts=artifacts,
        predicates={"model_converged": lambda state: jnp.all(
            state.model.patience.exhausted(m.model_patience))},
        policy=policy,
        score_reference=dataset.reference_returns,
    )
