"""Probabilistic dynamics ensemble with elites (PETS / MBPO / MOPO), as pure functions.

Chua et al. 2018 (PETS, sec. 4.1) and Janner et al. 2019 (MBPO, appendix C), with the details
of MOPO (Yu et al. 2020) as OfflineRL-Kit implements them (``modules/dynamics_module.py``, "Offline
model-based RL"):

* each member is a 4x200 Swish MLP mapping scaled (s, a) to a diagonal Gaussian over
  (s' - s, r); the log-variance is soft-clamped between learnable bounds,
  ``logvar = max - softplus(max - l)``, then ``min + softplus(logvar - min)`` (PETS,
  appendix A.1), with bounds initialised to 0.5 and -10;
* the loss per member is the Gaussian negative log-likelihood up to constants,
  ``mean((mu - y)^2 exp(-logvar)) + mean(logvar)``, plus ``0.01 (sum max - sum min)`` (which
  keeps the bounds tight) and per-layer L2 weight decay ``w_l / 2 * ||W_l||^2`` with
  ``w = [2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4]``;
* members see their own bootstrap resample of the training split, shuffled every epoch;
* a held-out split (``min(20%, 1000)`` transitions) scores each member by the MSE of its mean
  after every epoch; a member is snapshotted on a >1% improvement and training stops after
  5 epochs without any (``jaxwm.models.patience``); the elites are the members with the
  lowest snapshot MSE, and predictions use the snapshots.

Initial weights (``EnsembleSpec.weight_init``): "flax" (``nn.Dense``'s lecun normal, zero
bias) or "kit" (OfflineRL-Kit's ``EnsembleLinear``: normal with std 1 / (2 sqrt(fan_in)), a
quarter of flax's variance, zero bias; jaxwm/configs/mopo.py's default).

The log-variance bounds are one pair for the whole ensemble, as in OfflineRL-Kit's
``EnsembleDynamicsModel`` (and PETS' and MBPO's code): each member holds a copy (one member =
one network, so the ensemble is one ``vmap``), and ``tie_logvar_bounds`` gives every copy the
gradient of the shared pair, so the trained copies never part (per-member bounds, an earlier
departure, scored below the kit's MOPO: benchmarks/fidelity/README.md). A checkpoint saved
before that change resumes with its members' copies as saved: equal steps keep them apart.
Deviations: a member's snapshot keeps the bounds of its own snapshot epoch, so rollouts use
them per member, where the kit's use the pair as last trained (ablated with per-member
bounds over 5 seeds: finals within 2 points seed for seed); elites are chosen by the
snapshots' own held-out losses rather than by the last epoch's.

The input scaler (mean/std of (s, a)) is fit on the training split once and kept in the
state; targets are not scaled (as OfflineRL-Kit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.core
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm.models.dynamics import Normalizer
from jaxwm.models.patience import Patience, observe

WEIGHT_DECAY = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)
LOGVAR_LOSS_COEF = 0.01
KERNEL_INITS = {"flax": nn.linear.default_kernel_init,
                "kit": nn.initializers.variance_scaling(0.25, "fan_in", "normal")}


class GaussianMLP(nn.Module):
    """One member: x -> (mean, logvar) over ``out_dim``, logvar inside learnable bounds."""

    out_dim: int
    hidden: Sequence[int] = (200, 200, 200, 200)
    weight_init: str = "flax"  # a key of KERNEL_INITS

    @nn.compact
    def __call__(self, x):
        kernel_init = KERNEL_INITS[self.weight_init]
        for i, width in enumerate(self.hidden):
            x = nn.swish(nn.Dense(width, kernel_init=kernel_init, name=f"layer_{i}")(x))
        out = nn.Dense(2 * self.out_dim, kernel_init=kernel_init,
                       name=f"layer_{len(self.hidden)}")(x)
        mean, logvar = jnp.split(out, 2, -1)
        max_logvar = self.param("max_logvar", nn.initializers.constant(0.5), (self.out_dim,))
        min_logvar = self.param("min_logvar", nn.initializers.constant(-10.0), (self.out_dim,))
        logvar = max_logvar - jax.nn.softplus(max_logvar - logvar)
        logvar = min_logvar + jax.nn.softplus(logvar - min_logvar)
        return mean, logvar


@dataclasses.dataclass(frozen=True)
class EnsembleSpec:
    obs_dim: int
    action_dim: int
    num_members: int = 7
    num_elites: int = 5
    hidden: tuple[int, ...] = (200, 200, 200, 200)
    weight_decay: tuple[float, ...] = WEIGHT_DECAY
    learning_rate: float = 1e-3
    batch_size: int = 256
    min_improvement: float = 0.01
    weight_init: str = "flax"  # a key of KERNEL_INITS

    def __post_init__(self):
        if not 0 < self.num_elites <= self.num_members:
            raise ValueError(f"num_elites must be in [1, num_members={self.num_members}], got "
                             f"{self.num_elites}.")
        if len(self.weight_decay) != len(self.hidden) + 1:
            raise ValueError(f"weight_decay needs one value per layer ({len(self.hidden) + 1}), "
                             f"got {len(self.weight_decay)}.")
        if self.weight_init not in KERNEL_INITS:
            raise ValueError(f"Unknown ensemble weight_init {self.weight_init!r}; choose one "
                             f"of {tuple(KERNEL_INITS)}.")

    @property
    def member(self) -> GaussianMLP:
        return GaussianMLP(self.obs_dim + 1, self.hidden, self.weight_init)

    @property
    def optimizer(self):
        return optax.adam(self.learning_rate)


@struct.dataclass
class EnsembleState:
    params: dict  # every leaf [members, ...]
    opt_state: optax.OptState
    scaler: Normalizer  # over concat(obs, action), fit on the training split
    patience: Patience  # per-member snapshots and held-out MSE
    epochs: jax.Array  # int32 []

    def elite_indices(self, num_elites: int) -> jax.Array:
        """The ``num_elites`` members with the lowest snapshot held-out MSE."""
        return jnp.argsort(self.patience.best_loss)[:num_elites]


def inputs(obs, action):
    return jnp.concatenate([obs, action], -1)


def targets(batch):
    return jnp.concatenate([batch["next_obs"] - batch["obs"], batch["reward"][..., None]], -1)


def init(spec: EnsembleSpec, key, scaler: Normalizer) -> EnsembleState:
    x = jnp.zeros((1, spec.obs_dim + spec.action_dim))
    params = jax.vmap(spec.member.init, in_axes=(0, None))(
        jax.random.split(key, spec.num_members), x)
    return EnsembleState(params, spec.optimizer.init(params), scaler,
                         Patience.start(params, spec.num_members), jnp.zeros((), jnp.int32))


def apply(spec: EnsembleSpec, params, scaler: Normalizer, obs, action):
    """Every member's (mean, logvar) of (delta s, r) for the same inputs ``obs`` [..., D],
    ``action`` [..., A]: [members, ..., obs_dim + 1] each."""
    x = (inputs(obs, action) - scaler.mean) / scaler.std
    return jax.vmap(spec.member.apply, in_axes=(0, None))(params, x)


def member_loss(spec: EnsembleSpec, params, x, y):
    """One member's training loss on scaled inputs ``x`` [B, in] and targets ``y`` [B, out]."""
    mean, logvar = spec.member.apply(params, x)
    nll = jnp.mean((mean - y) ** 2 * jnp.exp(-logvar)) + jnp.mean(logvar)
    bounds = LOGVAR_LOSS_COEF * (jnp.sum(params["params"]["max_logvar"])
                                 - jnp.sum(params["params"]["min_logvar"]))
    decay = sum(wd * 0.5 * jnp.sum(params["params"][f"layer_{i}"]["kernel"] ** 2)
                for i, wd in enumerate(spec.weight_decay))
    return nll + bounds + decay, nll


def tie_logvar_bounds(grads: dict, members: int) -> dict:
    """Gives every member's copy of the log-variance bounds the gradient of one shared pair:
    the sum of the members' likelihood gradients, with the ``0.01 (sum max - sum min)``
    penalty counted once rather than once per member (``member_loss`` adds it to each).
    Copies that start equal (constant init) and take equal Adam steps stay equal."""
    g = grads["params"]
    tied = {name: jnp.broadcast_to(
        jnp.sum(g[name], 0) - (members - 1) * LOGVAR_LOSS_COEF * sign, g[name].shape)
        for name, sign in (("max_logvar", 1.0), ("min_logvar", -1.0))}
    return flax.core.copy(grads, {"params": flax.core.copy(g, tied)})  # dict or FrozenDict


def holdout_mse(spec: EnsembleSpec, params, scaler: Normalizer, batch) -> jax.Array:
    """Each member's mean squared error of its mean on ``batch``: [members]."""
    mean, _ = apply(spec, params, scaler, batch["obs"], batch["action"])
    return jnp.mean((mean - targets(batch)) ** 2, axis=(-2, -1))


def train_epoch(spec: EnsembleSpec, state: EnsembleState, data, train_index, bootstrap,
                holdout_index, key, constrain=lambda x: x):
    """One epoch: every member passes once over its bootstrap resample (``bootstrap``
    [members, n_train] positions into ``train_index``), shuffled, in minibatches of
    ``batch_size`` (the last one wrapping around); then held-out MSE and snapshots.
    ``data`` holds the dataset's transitions (obs, action, reward, next_obs). ``constrain``
    places each [members, batch, ...] minibatch (data parallel: split on the batch axis)."""
    members, n = bootstrap.shape
    num_batches = -(-n // spec.batch_size)
    order = jax.vmap(jax.random.permutation)(jax.random.split(key, members), bootstrap)
    order = jnp.concatenate([order, order], 1)[:, :num_batches * spec.batch_size]
    order = order.reshape(members, num_batches, spec.batch_size).swapaxes(0, 1)
    tx = spec.optimizer

    def step(carry, rows):  # rows [members, batch] positions into train_index
        params, opt_state = carry
        index = train_index[rows]
        batch = jax.tree.map(lambda v: v[index], data)
        x = (inputs(batch["obs"], batch["action"]) - state.scaler.mean) / state.scaler.std
        x, y = constrain(x), constrain(targets(batch))

        def total(p):
            loss, nll = jax.vmap(lambda pm, xm, ym: member_loss(spec, pm, xm, ym))(p, x, y)
            return jnp.sum(loss), nll  # members are independent: summing keeps their gradients

        (_, nll), grads = jax.value_and_grad(total, has_aux=True)(params)
        grads = tie_logvar_bounds(grads, members)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), jnp.mean(nll)

    (params, opt_state), nll = jax.lax.scan(step, (state.params, state.opt_state), order)
    holdout = jax.tree.map(lambda v: v[holdout_index], data)
    mse = holdout_mse(spec, params, state.scaler, holdout)
    patience = observe(state.patience, mse, params, spec.min_improvement)
    state = state.replace(params=params, opt_state=opt_state, patience=patience,
                          epochs=state.epochs + 1)
    elite_mse = jnp.sort(patience.best_loss)[:spec.num_elites]
    metrics = {"losses/model_nll": jnp.mean(nll), "model/holdout_mse": jnp.mean(mse),
               "model/elite_holdout_mse": jnp.mean(elite_mse),
               "model/epochs_since_improvement": patience.epochs_since_improvement}
    return state, metrics


def sample_step(spec: EnsembleSpec, state: EnsembleState, obs, action, key):
    """Model step for rollouts (MOPO): every member's Gaussian from the snapshots, a sample
    from a uniformly chosen elite per row. Returns (next_obs [B, D], reward [B], std of all
    members [members, B, D + 1])."""
    mean, logvar = apply(spec, state.patience.best_params, state.scaler, obs, action)
    std = jnp.exp(0.5 * logvar)
    k_member, k_noise = jax.random.split(key)
    batch = obs.shape[0]
    choice = jax.random.randint(k_member, (batch,), 0, spec.num_elites)
    member = state.elite_indices(spec.num_elites)[choice]
    rows = jnp.arange(batch)
    sample = mean[member, rows] + std[member, rows] * jax.random.normal(k_noise, mean.shape[1:])
    return obs + sample[:, :-1], sample[:, -1], std


def split_indices(num: int, rng, holdout_fraction: float = 0.2, max_holdout: int = 1000):
    """A random (train, holdout) split of ``range(num)``: holdout ``min(20%, 1000)``."""
    holdout = min(int(num * holdout_fraction), max_holdout)
    perm = rng.permutation(num)
    return perm[holdout:], perm[:holdout]


@dataclasses.dataclass(frozen=True)
class EnsembleModel:
    """The dynamics ensemble on the world-model protocol (``models.protocol``): the state is
    the observation vector; a step samples a uniformly chosen elite's Gaussian per row
    (``sample_step``, MOPO's rollouts), and the env's termination rule
    (``models.termination``) gives the continuation. Its parameters are an
    ``EnsembleState``. Actions arrive in [-1, 1] and reach the members in the env's units
    through ``to_env`` (the box the dataset's actions live in)."""

    spec: EnsembleSpec
    terminated_fn: object  # (obs, action, next_obs) -> bool [B]
    to_env: object  # [-1, 1] -> the env's actions
    discrete = False
    decodes = False
    differentiable = True  # reparameterised samples (the elite's pick has no gradient)

    @property
    def action_dim(self) -> int:
        return self.spec.action_dim

    def initial(self, params, batch: int):
        del params
        return jnp.zeros((batch, self.spec.obs_dim))

    def observe(self, params, state, action, obs, is_first, key):
        del params, state, action, is_first, key
        return jnp.asarray(obs, jnp.float32)

    def step(self, params, state, action, key):
        action = self.to_env(action)
        next_obs, reward, _ = sample_step(self.spec, params, state, action, key)
        ended = self.terminated_fn(state, action, next_obs)
        return next_obs, reward, 1.0 - ended.astype(jnp.float32)

    def features(self, params, state):
        del params
        return state

    def decode(self, params, state):
        raise NotImplementedError("The dynamics ensemble predicts vectors, not frames.")
