"""Offline model-based RL: MOPO and GORMPO on a fixed dataset (``config.algo`` mopo | gormpo),
the wiring of ``jaxwm.agents.mopo``'s pieces, the dynamics ensemble (``models.ensemble``),
GORMPO's density (``models.realnvp``) and SAC's update (``agents.sac``). Hooks:

* ``fit_density`` (GORMPO only, phase ``density``): one epoch of the RealNVP density on the
  dataset's rows (shuffled minibatches, then the validation NLL and the snapshot/patience
  rule); the phase ends early (``until=density_converged``) once it stops improving. The
  density's split and key come from ``gormpo.density_seed`` alone, so every seed and every
  run on the same data fits the same density; it is part of the state, checkpointed by the
  loop like any other (MOPO leaves the phase out: ``phase_hooks``).
* ``update_model``: one epoch of the dynamics ensemble on the dataset's training split; the
  ``model`` phase ends early (``until=model_converged``) once no member has improved its
  held-out MSE for ``mopo.model_patience`` epochs.
* ``imagine``: one batch of penalised model rollouts (``agents.mopo.branch_rollout``) into a
  model buffer that keeps the last ``mopo.retain_epochs`` batches.
* ``update_agent``: ``mopo.updates_per_epoch`` SAC updates in one scan on batches of
  ``real_ratio`` dataset transitions and the rest from the model buffer.

What the hooks read besides the state is in ``offline_data``. The density, ensemble, SAC
learner and model buffer are the state, all of it checkpointed: a resume continues exactly.

Seeds (``num_seeds`` N): every part of the state gets a leading seed axis; seed k's split is
drawn from the seed a one-seed run would have (``seeds.run_seeds``). With several seeds the
model phase goes on until every seed's ensemble has converged, a converged one kept as it is.
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxwm import parallel
from jaxwm.agents import mopo, sac
from jaxwm.agents.mopo import UNCERTAINTY
from jaxwm.algos import DEFAULT_CANNOT, NO_JAX_ENVS_OFFLINE, Entry, continuous_control
from jaxwm.config import require
from jaxwm.data.datasets import load_configured
from jaxwm.data.replay import TransitionReplay
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm
from jaxwm.loop.artifacts import Artifact
from jaxwm.loop.compile import HookCompiler
from jaxwm.models import ensemble, realnvp, termination
from jaxwm.models.dynamics import Normalizer

# Above this coefficient the (unbounded) inverse density penalty gets a warning.
INVERSE_COEF_WARN = 0.1
ALGOS = ("mopo", "gormpo")


@struct.dataclass
class MOPOState:
    model: ensemble.EnsembleState
    learner: sac.Learner
    buffer: TransitionReplay  # model rollouts
    density: realnvp.DensityState | None  # GORMPO's
    density_key: jax.Array | None


def fits_density(config) -> bool:
    """GORMPO fits a density and penalises by it; MOPO penalises by the ensemble's spread."""
    return config.algo == "gormpo"


def penalty_shape(config) -> str:
    """The penalty in use: ``config.penalty``, or the algorithm's own when left empty."""
    return config.penalty or ("linear" if fits_density(config) else UNCERTAINTY)


def validate(config) -> None:
    m, shape = config.mopo, penalty_shape(config)
    valid = realnvp.PENALTY_SHAPES if fits_density(config) else (UNCERTAINTY,)
    checks = [
        (config.algo in ALGOS, f"algo must be one of {ALGOS} for jaxwm/configs/mopo.py."),
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


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    counts = {"update_model": {"model_epochs": 1}, "imagine": {"model_rollouts": 1},
              "update_agent": {"agent_updates": config.mopo.updates_per_epoch}}
    return {"fit_density": {"density_epochs": 1}, **counts} if fits_density(config) else counts


def phase_hooks(config) -> dict[str, tuple[str, ...]]:
    """GORMPO fits its density in phase ``density``; MOPO, which has none, leaves it out."""
    return {"density": ("fit_density",) if fits_density(config) else ()}


def offline_data(config, dataset, mesh):
    """What the hooks read besides the state: the dataset's transitions, a phase artifact the
    run imports when it starts and keeps (a resume trains on the rows the run began with),
    read whole on the device; each seed's train/holdout split and bootstraps (seed k draws
    them as a run with seed + k * env.num_envs would) and, for GORMPO, the density's split
    (from its own seed), read-only data. Also each seed's ensemble input scaler and the
    density's (``None`` for MOPO)."""
    g = config.gormpo
    arrays = {k: np.asarray(v, np.float32) for k, v in dataset.transitions.items()}
    artifacts = {"dataset": Artifact(example={k: v[0] for k, v in arrays.items()},
                                     source=lambda: arrays,
                                     place=partial(parallel.put_readonly, mesh=mesh))}
    splits = [mopo.model_split(len(dataset), config.mopo.num_members, seed)
              for seed in seeds.run_seeds(config)]
    scaler = seeds.stack([Normalizer.fit(jnp.asarray(ensemble.inputs(
        arrays["obs"][sp["train"]], arrays["action"][sp["train"]]))) for sp in splits])
    data = {"model_split": parallel.replicate(jax.tree.map(jnp.asarray, seeds.stack(splits)),
                                              mesh)}
    if not fits_density(config):
        return artifacts, data, scaler, None
    train, val, _ = realnvp.split_indices(len(dataset), np.random.default_rng(g.density_seed))
    data["density_split"] = parallel.replicate({"train": jnp.asarray(train),
                                                "val": jnp.asarray(val)}, mesh)
    rows = np.asarray(mopo.density_rows(arrays, g.score_next_state))
    return artifacts, data, scaler, Normalizer.fit(jnp.asarray(rows[train]))


def predicates(m, d_spec, gormpo: bool) -> dict:
    """The phases' early ends: every ensemble member stopped improving (and, for GORMPO, the
    density model)."""
    ends = {"model_converged": lambda state: jnp.all(
        state.model.patience.exhausted(m.model_patience))}
    if gormpo:
        ends["density_converged"] = lambda state: jnp.all(
            state.density.patience.exhausted(d_spec.patience))
    return ends


def build(config) -> Algorithm:
    m, s, g = config.mopo, config.sac, config.gormpo
    dataset, spec = load_configured(config, batches=("sac.batch_size", "mopo.model_batch"))
    box = sac.ActionBox(np.asarray(spec.action_low), np.asarray(spec.action_high))
    obs_dim, action_dim = dataset.obs_dim, dataset.action_dim
    model_spec = mopo.ensemble_spec(config, obs_dim, action_dim)
    nets = sac.SACNets.from_config(box, s)
    hyper = mopo.sac_hyper(config)
    shape, gormpo = penalty_shape(config), fits_density(config)
    compiler = HookCompiler.for_config(config)
    mesh = compiler.mesh
    constrain_members = parallel.batch_on_axis(mesh, 1)  # [members, batch]
    artifacts, data, scaler, d_scaler = offline_data(config, dataset, mesh)
    d_spec = mopo.density_spec(config, obs_dim + action_dim)

    def init_one(key, scaler):
        k_model, k_agent = jax.random.split(key)
        example = {"obs": jnp.zeros(obs_dim), "action": jnp.zeros(action_dim),
                   "reward": jnp.zeros(()), "next_obs": jnp.zeros(obs_dim),
                   "terminated": jnp.zeros((), bool)}
        density = None if d_scaler is None else realnvp.init_density(
            d_spec, jax.random.PRNGKey(g.density_seed), d_scaler)
        return MOPOState(
            ensemble.init(model_spec, k_model, scaler),
            sac.init_learner(nets, hyper, k_agent, obs_dim),
            TransitionReplay.create(m.rollout_batch * m.horizon * m.retain_epochs, example),
            density, jax.random.PRNGKey(g.density_seed + 1) if gormpo else None)

    def init(key):
        return compiler.init(init_one)(key, scaler)

    def fit_density(state, data, key):
        del key  # the density's own key: one density per dataset and density_seed
        density_key, k = jax.random.split(state.density_key)
        split = data["density_split"]
        density, metrics = realnvp.train_density_epoch(
            d_spec, state.density, mopo.density_rows(data["dataset"], g.score_next_state),
            split["train"], split["val"], k)
        return state.replace(density=density, density_key=density_key), {}, metrics

    def update_model(state, data, key):
        model, metrics = mopo.model_epoch(model_spec, state.model, data["dataset"],
                                          data["model_split"], key, m.model_patience,
                                          constrain_members)
        return state.replace(model=model), {}, metrics

    policy = sac.policy(nets)
    terminated_fn = termination.termination_fn(config.env.id)

    def imagine(state, data, key):
        penalty = mopo.reward_penalty(shape, d_spec, state.density, g.score_next_state)
        buffer, metrics = mopo.imagine_into(
            state.buffer, model_spec, state.model, policy, state.learner, data["dataset"],
            key, m.rollout_batch, m.horizon, penalty, terminated_fn,
            float(config.penalty_coef), partial(parallel.constrain_batch, mesh=mesh))
        return state.replace(buffer=buffer), {}, metrics

    real = int(round(s.batch_size * m.real_ratio))
    sac_updates = sac.make_update(nets, hyper, lambda source, key: mopo.mixed_batch(
        *source, s.batch_size, real, key), m.updates_per_epoch, mesh)

    def update_agent(state, data, key):
        learner, metrics = sac_updates(state.learner, (state.buffer, data["dataset"]), key)
        return state.replace(learner=learner), {}, metrics

    counts, shared = hook_counts(config), ("dataset", "density_split")
    reads = {"fit_density": ("dataset", "density_split"), "update_model": ("dataset",
             "model_split"), "imagine": ("dataset",), "update_agent": ("dataset",)}
    hooks = {name: compiler.hook(fn, counts=counts[name], reads=reads[name], shared=shared)
             for name, fn in (("fit_density", fit_density), ("update_model", update_model),
                              ("imagine", imagine), ("update_agent", update_agent))
             if name in counts}
    return Algorithm(name=config.algo.upper(), init=init, hooks=hooks, data=data,
                     artifacts=artifacts, predicates=predicates(m, d_spec, gormpo), policy=policy,
                     phase_hooks=phase_hooks(config), score_reference=dataset.reference_returns,
                     world_model=ensemble.EnsembleModel(model_spec, terminated_fn, box.to_env),
                     world_model_params=lambda state: state.model)


# The configs of both hold GORMPO's block (``jaxwm/configs/mopo.py``); MOPO leaves it unused.
_SHARED = dict(
    build=build, validate=validate, hook_counts=hook_counts, phase_hooks=phase_hooks,
    offline=True,
    capabilities=continuous_control("sac.batch_size", "mopo.rollout_batch", "mopo.model_batch",
                                    cannot={**DEFAULT_CANNOT, "jax_envs": NO_JAX_ENVS_OFFLINE}),
    resumable=("sac.actor_lr", "sac.critic_lr", "sac.alpha_lr", "mopo.model_lr"),
    fixed={"gormpo.learning_rate": "GORMPO's density is fit once, in its phase before the "
                                   "rest, and scores every rollout of the run; another rate "
                                   "would fit another density (start a new run)"},
    zero_means={"gormpo.density_seed": "a seed"})
MOPO = Entry(name="mopo", tiny="mopo:tiny", **_SHARED)
GORMPO = Entry(name="gormpo", tiny="mopo:tiny_gormpo", **_SHARED)
