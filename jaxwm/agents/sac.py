"""Soft Actor-Critic as agent pieces: networks, ``policy`` (acting), ``init_learner``,
``make_update`` (K updates from any batch source); wired to envs by ``jaxwm.algos.sac`` and to
model rollouts by ``jaxwm.algos.mopo``.

Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications" (arXiv:1812.05905):
twin Q-functions with target networks updated by Polyak averaging (sec. 5, eq. 5-6 with the
clipped double-Q minimum of Fujimoto et al. 2018), a tanh-squashed Gaussian actor trained by
reparameterisation (eq. 7-9, log-likelihood correction of appendix C), and automatic
temperature adjustment toward a target entropy of -|A| (sec. 5, eq. 18).

The same update serves online SAC (``jaxwm.algos.sac``, replay of env transitions) and offline
model-based RL (MOPO / GORMPO, batches mixed from the dataset and model rollouts): it takes a
``sample(source, key) -> batch`` function and runs K updates in one ``lax.scan``, so where
the batches come from is the caller's business and ``source`` is a jit argument (never a
compiled constant). A batch is a dict with ``obs``, ``action`` (env scale), ``reward``,
``next_obs`` and ``terminated`` (1 where the episode really ended: no bootstrap; truncation
bootstraps).

Choices the reference codes differ on, as switches: the initial weights (``weight_init``:
"flax", ``nn.Dense``'s lecun normal with zero biases; "torch", ``torch.nn.Linear``'s default,
weights and biases uniform in +-1/sqrt(fan_in), a third of flax's weight variance:
OfflineRL-Kit's), the actor's log-std (``log_std``: "tanh", CleanRL's smooth squash into
[-5, 2], starting near std 0.22; "clip", OfflineRL-Kit's hard clamp of the linear output,
starting near std 1) and the temperature's cap (``max_alpha``: OfflineRL-Kit clamps alpha to
[0, 1]). The actor's learning rate can be cosine-annealed to zero (``actor_lr_decay_steps``
schedule steps of ``actor_lr_step_every`` updates each: OfflineRL-Kit's ``CosineAnnealingLR``
stepped once per epoch).

Actions: the actor's tanh output in [-1, 1] is mapped affinely onto the env's [low, high]
box, and the log-probability includes that map's log-determinant (CleanRL's
``action_scale``), so the entropy target means the same for every box.

Data parallel: with a ``mesh`` of several devices, each sampled batch is constrained to be
split over its ``data`` axis while parameters stay replicated, so XLA computes per-device
gradients and all-reduces them (as PPO, ``jaxwm.agents.ppo``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import struct

from jaxwm import parallel
from jaxwm.envs import acting
from jaxwm.envs.types import ActionBox  # noqa: F401 -- sac.ActionBox for its callers

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # CleanRL's and OfflineRL-Kit's bounds
LOG_STD_BOUNDS = ("tanh", "clip")  # how the bounds are kept: see the module docstring
INITS = ("flax", "torch")  # initial weights: see the module docstring


def dense(features: int, fan_in: int, init: str = "flax") -> nn.Dense:
    """A dense layer initialised as ``init`` says (one of INITS)."""
    if init == "flax":
        return nn.Dense(features)
    bound = 1.0 / np.sqrt(fan_in)  # torch.nn.Linear.reset_parameters

    def bias_init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return nn.Dense(features, bias_init=bias_init,
                    kernel_init=nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"))


class TanhGaussianActor(nn.Module):
    """obs -> (mean, log_std) of the pre-tanh Gaussian."""

    action_dim: int
    hidden: Sequence[int] = (256, 256)
    log_std: str = "tanh"  # one of LOG_STD_BOUNDS
    weight_init: str = "flax"  # one of INITS

    @nn.compact
    def __call__(self, obs):
        x = obs
        for width in self.hidden:
            x = nn.relu(dense(width, x.shape[-1], self.weight_init)(x))
        mean = dense(self.action_dim, x.shape[-1], self.weight_init)(x)
        raw = dense(self.action_dim, x.shape[-1], self.weight_init)(x)
        if self.log_std == "clip":  # zero gradient outside the bounds, as torch.clamp
            return mean, jnp.clip(raw, LOG_STD_MIN, LOG_STD_MAX)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw) + 1)
        return mean, log_std


class QNetwork(nn.Module):
    hidden: Sequence[int] = (256, 256)
    weight_init: str = "flax"  # one of INITS

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs, action], -1)
        for width in self.hidden:
            x = nn.relu(dense(width, x.shape[-1], self.weight_init)(x))
        return dense(1, x.shape[-1], self.weight_init)(x)[..., 0]


class Critics(nn.Module):
    """``num`` independent Q-networks evaluated together: output [num, batch]."""

    num: int = 2
    hidden: Sequence[int] = (256, 256)
    weight_init: str = "flax"  # one of INITS

    @nn.compact
    def __call__(self, obs, action):
        ensemble = nn.vmap(QNetwork, variable_axes={"params": 0}, split_rngs={"params": True},
                           in_axes=None, out_axes=0, axis_size=self.num)
        return ensemble(self.hidden, self.weight_init)(obs, action)


def squashed_sample(mean, log_std, box: ActionBox, key, temperature=1.0):
    """A reparameterised sample a = center + half * tanh(mean + T * std * eps) and its
    log-probability (appendix C: log N(u) - sum log(1 - tanh(u)^2), plus -sum log(half)).
    ``temperature`` 0 gives tanh(mean), the mode used for deterministic evaluation."""
    std = jnp.exp(log_std)
    eps = jax.random.normal(key, mean.shape)
    u = mean + temperature * std * eps
    gaussian = -0.5 * eps**2 - log_std - 0.5 * np.log(2 * np.pi)
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|.
    squash = 2.0 * (np.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    log_prob = jnp.sum(gaussian - squash - jnp.log(box.half_width), -1)
    return box.center + box.half_width * jnp.tanh(u), log_prob


@dataclasses.dataclass(frozen=True)
class SACHyper:
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    auto_alpha: bool = True
    initial_alpha: float = 1.0
    target_entropy: float | None = None  # None: -action_dim
    max_alpha: float | None = None  # None: no cap (OfflineRL-Kit: 1.0)
    # Cosine annealing of the actor's lr to 0 over this many steps of ``actor_lr_step_every``
    # updates each (0: constant), e.g. one step per epoch of 1000 updates.
    actor_lr_decay_steps: int = 0
    actor_lr_step_every: int = 1

    @classmethod
    def from_config(cls, cfg) -> SACHyper:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in fields})


@struct.dataclass
class Learner:
    actor: Any
    critic: Any
    target_critic: Any
    log_alpha: jax.Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any


@dataclasses.dataclass(frozen=True)
class SACNets:
    actor: TanhGaussianActor
    critics: Critics
    box: ActionBox

    @classmethod
    def create(cls, box: ActionBox, actor_hidden=(256, 256), critic_hidden=(256, 256),
               num_critics: int = 2, log_std: str = "tanh",
               weight_init: str = "flax") -> SACNets:
        actor = TanhGaussianActor(int(np.prod(box.low.shape)), tuple(actor_hidden), log_std,
                                  weight_init)
        return cls(actor, Critics(num_critics, tuple(critic_hidden), weight_init), box)

    @classmethod
    def from_config(cls, box: ActionBox, s) -> SACNets:
        """From the ``config.sac`` block."""
        return cls.create(box, s.actor_hidden, s.critic_hidden, log_std=s.log_std,
                          weight_init=s.weight_init)

    def act(self, actor_params, obs, key, temperature=1.0):
        mean, log_std = self.actor.apply(actor_params, obs)
        return squashed_sample(mean, log_std, self.box, key, temperature)


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
    s.log_std = "tanh"  # or "clip" (OfflineRL-Kit): LOG_STD_BOUNDS
    s.weight_init = "flax"  # or "torch" (OfflineRL-Kit's torch.nn.Linear defaults): INITS
    s.max_alpha = ml_collections.FieldReference(None, field_type=float)  # None: no cap
    s.capacity = 1_000_000
    s.learning_starts = 5_000
    s.steps_per_collect = 8  # per env
    s.updates_per_step = 1.0  # updates per env step
    s.update(overrides)
    return s


# ``config_block``'s settings: ``{key: (valid range, description)}`` (``jaxwm.config``).
# The last four are online SAC's (jaxwm/algos/sac.py); MOPO / GORMPO leave them unused.
FIELDS = {
    "actor_hidden": ("> 0", "Widths of the actor's ReLU layers (Haarnoja et al. 2018)."),
    "critic_hidden": ("> 0", "Widths of each Q-network's ReLU layers (two Q-networks)."),
    "gamma": ("[0, 1]", "Discount factor of the soft Q targets."),
    "tau": ("(0, 1]", "Polyak rate of the target Q-networks per update."),
    "batch_size": ("> 0", "Transitions per update."),
    "actor_lr": ("> 0", "Adam's learning rate of the actor."),
    "critic_lr": ("> 0", "Adam's learning rate of the Q-networks."),
    "alpha_lr": ("> 0", "Adam's learning rate of log alpha, the temperature."),
    "auto_alpha": (None, "Tune the temperature toward the target entropy (Haarnoja et al. 2018)."),
    "initial_alpha": ("> 0", "The temperature alpha at the start."),
    "target_entropy": (None, "Entropy the tuned temperature aims for; None: -|A|."),
    "log_std": ("{tanh, clip}",
                "Actor's log-std kept in [-5, 2] by tanh (CleanRL) or clamp (OfflineRL-Kit)."),
    "weight_init": ("{flax, torch}",
                    "Initial weights: nn.Dense's, or torch.nn.Linear's (OfflineRL-Kit)."),
    "max_alpha": ("> 0", "Cap on the temperature (OfflineRL-Kit's 1.0); None: no cap."),
    "capacity": ("> 0", "Online SAC: transitions the replay holds."),
    "learning_starts": ("> 0", "Online SAC: env steps of random actions before learning."),
    "steps_per_collect": ("> 0", "Online SAC: steps each env takes per collect."),
    "updates_per_step": (">= 0", "Online SAC: updates per env step (at least one per collect)."),
}


def config_checks(s) -> list[tuple[bool, str]]:
    """(holds, message) for the ``config.sac`` block's own settings, for ``config.require``
    (every algorithm that takes the block: online SAC, MOPO / GORMPO)."""
    return [(0.0 < s.tau <= 1.0 and 0.0 <= s.gamma <= 1.0,
             "sac.tau must be in (0, 1] and sac.gamma in [0, 1]."),
            (s.log_std in LOG_STD_BOUNDS,
             f"Unknown sac.log_std {s.log_std!r}; choose one of {LOG_STD_BOUNDS}."),
            (s.weight_init in INITS,
             f"Unknown sac.weight_init {s.weight_init!r}; choose one of {INITS}."),
            (s.max_alpha is None or s.max_alpha > 0,
             "sac.max_alpha must be positive (or None: no cap).")]


def policy(nets: SACNets) -> acting.Policy:
    """Acting with a ``Learner``'s actor: temperature 0 is tanh(mean), 1 the policy as
    trained."""
    return acting.stateless(lambda learner, obs, key, temperature: nets.act(
        learner.actor, jnp.asarray(obs, jnp.float32), key, temperature)[0])


def actor_learning_rate(hyper: SACHyper):
    """A constant, or OfflineRL-Kit's ``CosineAnnealingLR(T_max=decay_steps)`` stepped every
    ``actor_lr_step_every`` updates: lr * (1 + cos(pi * min(n, T) / T)) / 2 after n steps."""
    if not hyper.actor_lr_decay_steps:
        return hyper.actor_lr
    steps, every = hyper.actor_lr_decay_steps, hyper.actor_lr_step_every

    def schedule(count):
        n = jnp.minimum(count // every, steps)
        return hyper.actor_lr * 0.5 * (1.0 + jnp.cos(jnp.pi * n / steps))

    return schedule


def optimizers(hyper: SACHyper):
    return (optax.adam(actor_learning_rate(hyper)), optax.adam(hyper.critic_lr),
            optax.adam(hyper.alpha_lr))


def init_learner(nets: SACNets, hyper: SACHyper, key, obs_dim: int) -> Learner:
    k_actor, k_critic = jax.random.split(key)
    obs = jnp.zeros((1, obs_dim))
    action = jnp.zeros((1,) + nets.box.low.shape)
    actor = nets.actor.init(k_actor, obs)
    critic = nets.critics.init(k_critic, obs, action)
    log_alpha = jnp.asarray(np.log(hyper.initial_alpha), jnp.float32)
    actor_tx, critic_tx, alpha_tx = optimizers(hyper)
    # A copy, not the same buffers: updates donate the learner.
    target_critic = jax.tree.map(jnp.copy, critic)
    return Learner(actor=actor, critic=critic, target_critic=target_critic, log_alpha=log_alpha,
                   actor_opt=actor_tx.init(actor), critic_opt=critic_tx.init(critic),
                   alpha_opt=alpha_tx.init(log_alpha))


def update_step(nets: SACNets, hyper: SACHyper, learner: Learner, batch, key):
    """One SAC update: critics, then actor (on the updated critics), temperature, targets."""
    actor_tx, critic_tx, alpha_tx = optimizers(hyper)
    target_entropy = (-float(np.prod(nets.box.low.shape)) if hyper.target_entropy is None
                      else hyper.target_entropy)
    k_next, k_pi = jax.random.split(key)
    alpha = jnp.exp(learner.log_alpha)
    if hyper.max_alpha is not None:
        alpha = jnp.minimum(alpha, hyper.max_alpha)

    next_action, next_log_prob = nets.act(learner.actor, batch["next_obs"], k_next)
    next_q = jnp.min(nets.critics.apply(learner.target_critic, batch["next_obs"], next_action), 0)
    not_done = 1.0 - batch["terminated"].astype(jnp.float32)
    target = batch["reward"] + hyper.gamma * not_done * (next_q - alpha * next_log_prob)
    target = jax.lax.stop_gradient(target)

    def critic_loss(params):
        q = nets.critics.apply(params, batch["obs"], batch["action"])
        return jnp.sum(jnp.mean((q - target) ** 2, -1)), q

    (q_loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(learner.critic)
    updates, critic_opt = critic_tx.update(grads, learner.critic_opt, learner.critic)
    critic = optax.apply_updates(learner.critic, updates)

    def actor_loss(params):
        action, log_prob = nets.act(params, batch["obs"], k_pi)
        q_pi = jnp.min(nets.critics.apply(critic, batch["obs"], action), 0)
        return jnp.mean(alpha * log_prob - q_pi), log_prob

    (pi_loss, log_prob), grads = jax.value_and_grad(actor_loss, has_aux=True)(learner.actor)
    updates, actor_opt = actor_tx.update(grads, learner.actor_opt, learner.actor)
    actor = optax.apply_updates(learner.actor, updates)

    log_alpha, alpha_opt, alpha_loss = learner.log_alpha, learner.alpha_opt, jnp.zeros(())
    if hyper.auto_alpha:
        entropy_gap = jax.lax.stop_gradient(log_prob + target_entropy)
        alpha_loss_fn = lambda la: -jnp.mean(la * entropy_gap)  # noqa: E731
        alpha_loss, grad = jax.value_and_grad(alpha_loss_fn)(learner.log_alpha)
        updates, alpha_opt = alpha_tx.update(grad, learner.alpha_opt, learner.log_alpha)
        log_alpha = optax.apply_updates(learner.log_alpha, updates)

    target_critic = optax.incremental_update(critic, learner.target_critic, hyper.tau)
    metrics = {"losses/q_loss": q_loss, "losses/actor_loss": pi_loss,
               "losses/alpha_loss": alpha_loss, "agent/alpha": alpha,
               "agent/q_mean": jnp.mean(q), "agent/entropy": -jnp.mean(log_prob)}
    return Learner(actor, critic, target_critic, log_alpha, actor_opt, critic_opt,
                   alpha_opt), metrics


def make_update(nets: SACNets, hyper: SACHyper, sample: Callable[[Any, jax.Array], Any],
                num_updates: int, mesh=None):
    """``update(learner, source, key) -> (learner, metrics)``: ``num_updates`` SAC updates in
    one ``lax.scan``, each on ``sample(source, key)``; metrics are means over the updates.
    Not jitted here: the caller jits it with its own donation and placement (and vmaps it
    over seeds where it has several)."""

    def update(learner, source, key):
        def body(learner, k):
            k_sample, k_step = jax.random.split(k)
            batch = sample(source, k_sample)
            if mesh is not None:
                batch = parallel.constrain_batch(batch, mesh)
            return update_step(nets, hyper, learner, batch, k_step)

        learner, metrics = jax.lax.scan(body, learner, jax.random.split(key, num_updates))
        return learner, jax.tree.map(jnp.mean, metrics)

    return update
