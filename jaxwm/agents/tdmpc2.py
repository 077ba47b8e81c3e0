"""TD-MPC2 as agent pieces (Hansen, Su and Wang 2024, ICLR; nicklashansen/tdmpc2
``tdmpc2.py``): ``init_learner``, ``make_update`` (K updates from any batch source) and
``planner`` (MPPI over the world model as an acting-layer policy), wired to envs and phases by
``jaxwm.algos.tdmpc2``.

One update (sec. 3.2-3.4, eq. 3-5), on sequences of ``horizon + 1`` observations
``s_0..s_H`` with the actions ``a_0..a_{H-1}`` taken at them, the rewards ``r_t`` and the
termination flags ``d_t`` of those transitions:

* targets (no gradient): ``z'_t = h(s_{t+1})`` from the online encoder (there is no target
  encoder) and ``q_t = r_t + gamma (1 - d_t) min(Q-bar_i, Q-bar_j)(z'_t, pi(z'_t))`` over two
  target Q heads drawn at random (the same two for the whole batch);
* the latent rollout ``z_0 = h(s_0)``, ``z_{t+1} = d(z_t, a_t)`` and the model loss
  ``sum_t rho^t [20 ||z_{t+1} - z'_t||^2 + 0.1 CE(R(z_t, a_t), r_t)
  + 0.1 / num_q sum_i CE(Q_i(z_t, a_t), q_t)] / H`` (cross-entropies of two-hot targets, Q
  heads with dropout) ``+ 1.0 BCE(termination(z_{t+1}), d_t)`` for episodic tasks; gradients
  clipped to a global norm of 20, Adam 3e-4 with the encoder at 0.3x;
* the policy prior on the rollout's latents (detached): ``sum_t rho^t mean(-(1e-4 *
  entropy + Q-avg(z_t, pi(z_t)) / S))`` averaged over the H + 1 steps, with ``Q-avg`` the mean
  of two random online heads (frozen, dropout on, as the reference) and S a running 5th-95th
  percentile range of the Q-values at t = 0 (``ops.normalize.RunningScale``); its own Adam
  (eps 1e-5), clipped at 20;
* Polyak averaging of the target Q heads, ``tau`` 0.01.

Episode boundaries, per step: a window of the replay may run past its episode's end (a reset
row, ``is_first``); every loss term of a transition beyond that point is masked out, and each
transition's own termination flag cuts its TD target. The reference's episodic branch used
only the window's last flag for all of its TD targets (issue #62, "only the last termination
flag"; its termination loss likewise saw only the last step) until April 2025, and its
episodic mode is still called experimental by its author (issue #73); the reference never
samples across an episode's end (its buffer stores whole episodes), which the masks here
reproduce for windows that would.

The planner's objective for a candidate sequence (``_estimate_value``): discounted rewards of
the model's rollout plus ``gamma^H`` times the mean of two random Q heads at the final latent
and a policy-prior action; for episodic tasks a rollout stops earning once the termination
head calls a latent terminal (p > 0.5). 24 of the 512 candidates are rollouts of the policy
prior (``mppi.plan``'s fixed sequences).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
import optax.losses
from flax import struct

from jaxwm import parallel
from jaxwm.agents import mppi
from jaxwm.envs import acting
from jaxwm.envs.types import ActionBox
from jaxwm.models import tdmpc2 as wm
from jaxwm.ops.normalize import RunningScale

PLANNER_FIELDS = {f.name for f in dataclasses.fields(mppi.MPPIHyper)}


def config_block(**overrides) -> ml_collections.ConfigDict:
    """The ``config.tdmpc2`` block: the reference's ``config.yaml`` defaults."""
    c = ml_collections.ConfigDict()
    c.model_size = 5  # millions of parameters: 1, 5, 19, 48 or 317 (models.tdmpc2.SIZES)
    c.batch_size = 256
    c.horizon = 3
    c.lr = 3e-4
    c.enc_lr_scale = 0.3
    c.grad_clip_norm = 20.0
    c.tau = 0.01
    c.rho = 0.5
    c.consistency_coef = 20.0
    c.reward_coef = 0.1
    c.value_coef = 0.1
    c.termination_coef = 1.0
    c.entropy_coef = 1e-4
    c.discount = 0.0  # 0: from the episode length L, clip(1 - 5 / L, 0.95, 0.995)
    c.episodic = False  # a termination head; True for tasks whose episodes end early
    # MPPI (jaxwm.agents.mppi); iterations + 2 where the action has >= 20 dimensions
    c.iterations = 6
    c.num_samples = 512
    c.num_elites = 64
    c.num_pi_trajs = 24
    c.temperature = 0.5
    c.min_std = 0.05
    c.max_std = 2.0
    c.envs_per_batch = 0  # envs planned at once, the rest in turn; 0: 1 on a CPU, all on a GPU
    c.seed_steps = 2500  # random env steps first: max(1000, 5 x episode length)
    c.capacity = 1_000_000
    c.steps_per_collect = 1  # per env
    c.updates_per_step = 1.0  # updates per env step once training
    c.update(overrides)
    return c


# ``config.tdmpc2``'s settings: ``{key: (range, description)}`` (``jaxwm.config``'s field
# rules; ``jaxwm/configs/tdmpc2.py`` composes them).
FIELDS = {
    "model_size": ("{" + ", ".join(map(str, wm.SIZES)) + "}",
                   "Model size, millions of parameters (the paper's table 8)."),
    "batch_size": ("> 0", "Replayed windows of horizon + 1 steps per update."),
    "horizon": ("> 0", "Steps of the latent rollout in training and of MPPI's plans."),
    "lr": ("> 0", "Adam learning rate of the model and the policy prior."),
    "enc_lr_scale": (">= 0", "The encoder's learning rate as a fraction of lr."),
    "grad_clip_norm": ("> 0", "Global gradient norm clip."),
    "tau": ("(0, 1]", "Polyak rate of the target Q heads per update."),
    "rho": ("(0, 1]", "Per-step decay of the rollout's loss weights (rho^t)."),
    "consistency_coef": (">= 0", "Weight of the latent consistency loss."),
    "reward_coef": (">= 0", "Weight of the reward loss."),
    "value_coef": (">= 0", "Weight of the Q-value loss."),
    "termination_coef": (">= 0", "Weight of the termination loss (episodic tasks)."),
    "entropy_coef": (">= 0", "Entropy bonus of the policy prior."),
    "discount": ("[0, 1)", "Discount; 0: from the episode length, clip(1 - 5/L, 0.95, 0.995)."),
    "episodic": (None, "A termination head, TD targets cut at terminations (tasks that end)."),
    "iterations": ("> 0", "MPPI rounds per step (+2 where the action has >= 20 dims)."),
    "num_samples": ("> 0", "MPPI candidate action sequences per round."),
    "num_elites": ("> 0", "MPPI elites refitting the sampling distribution."),
    "num_pi_trajs": ("> 0", "Candidates that are rollouts of the policy prior."),
    "temperature": (">= 0", "MPPI's elite weights: softmax(temperature * value)."),
    "min_std": (">= 0", "MPPI's minimum sampling std (actions in [-1, 1])."),
    "max_std": ("> 0", "MPPI's maximum and initial sampling std."),
    "envs_per_batch": (">= 0", "Envs planned at once, the rest in turn; 0: 1 on CPU, all on GPU."),
    "seed_steps": ("> 0", "Random env steps first, then as many pretraining updates."),
    "capacity": ("> 0", "Replay capacity, transitions over all envs."),
    "steps_per_collect": ("> 0", "Env steps of each env per collect call."),
    "updates_per_step": ("> 0", "Updates per env step once training."),
}


def discount(episode_length: int) -> float:
    """The reference's heuristic: ``(L/5 - 1) / (L/5)`` clipped to [0.95, 0.995]."""
    frac = episode_length / 5
    return float(min(max((frac - 1) / frac, 0.95), 0.995))


@dataclasses.dataclass(frozen=True)
class Hyper:
    batch_size: int = 256
    horizon: int = 3
    lr: float = 3e-4
    enc_lr_scale: float = 0.3
    grad_clip_norm: float = 20.0
    tau: float = 0.01
    rho: float = 0.5
    consistency_coef: float = 20.0
    reward_coef: float = 0.1
    value_coef: float = 0.1
    termination_coef: float = 1.0
    entropy_coef: float = 1e-4
    discount: float = 0.99

    @classmethod
    def from_config(cls, cfg, episode_length: int) -> Hyper:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in cfg.items() if k in fields}
        values["discount"] = cfg.discount or discount(episode_length)
        return cls(**values)


def planner_hyper(cfg, action_dim: int) -> mppi.MPPIHyper:
    values = {k: v for k, v in cfg.items() if k in PLANNER_FIELDS}
    values["iterations"] = cfg.iterations + 2 * int(action_dim >= 20)
    if not cfg.envs_per_batch:  # MPPIHyper.envs_per_batch says why one env at a time on a CPU
        values["envs_per_batch"] = 1 if jax.default_backend() == "cpu" else 0
    return mppi.MPPIHyper(**values)


@struct.dataclass
class Learner:
    params: Any  # the world model, the policy prior and the Q heads
    target_qs: Any  # Polyak-averaged Q heads
    model_opt: optax.OptState
    pi_opt: optax.OptState
    scale: RunningScale


@dataclasses.dataclass(frozen=True)
class Agent:
    """The model and its settings: what ``init_learner``, ``make_update`` and ``planner``
    need."""

    model: wm.WorldModel
    hyper: Hyper
    planning: mppi.MPPIHyper
    box: ActionBox
    obs_dim: int

    @property
    def action_dim(self) -> int:
        return self.model.action_dim

    def optimizers(self):
        h = self.hyper
        # One clip over all of a loss's gradients before the groups split, as the reference's
        # clip_grad_norm_(model.parameters()): encoder and dynamics share one norm.
        clipped = lambda groups: optax.chain(  # noqa: E731
            optax.clip_by_global_norm(h.grad_clip_norm),
            optax.multi_transform(groups, wm.param_groups))
        model = clipped({"encoder": optax.adam(h.lr * h.enc_lr_scale),
                         "model": optax.adam(h.lr), "policy": optax.set_to_zero()})
        # The policy prior's own optimiser, over its own parameters only (wm.policy_params).
        policy = optax.chain(optax.clip_by_global_norm(h.grad_clip_norm),
                             optax.adam(h.lr, eps=1e-5))
        return model, policy

    # ------------------------------------------------------------------ model calls

    def encode(self, params, obs):
        return self.model.apply(params, obs, method=wm.WorldModel.encode)

    def next(self, params, z, a):
        return self.model.apply(params, z, a, method=wm.WorldModel.next)

    def reward(self, params, z, a):
        return wm.decode(self.model.apply(params, z, a, method=wm.WorldModel.reward))

    def pi(self, params, z, key):
        return self.model.apply(params, z, key, method=wm.WorldModel.pi)

    def q_pair(self, qs, z, a, key, train=False):
        """Two random heads' Q-values ``[2, ...]`` (the same two for every element) of the
        ensemble ``qs`` (online, frozen or target parameters), with dropout when ``train``."""
        k_pick, k_drop = jax.random.split(key)
        pick = jax.random.permutation(k_pick, self.model.sizes.num_q)[:2]
        return wm.decode(wm.q_heads(qs, z, a, pick, k_drop, train, self.model.centred))

    # ------------------------------------------------------------------ learning

    def init_learner(self, key) -> Learner:
        params = wm.init(self.model, key, self.obs_dim)
        model_tx, pi_tx = self.optimizers()
        # A copy, not the same buffers: updates donate the learner.
        target = jax.tree.map(jnp.copy, wm.q_params(params))
        return Learner(params, target, model_tx.init(params), pi_tx.init(wm.policy_params(params)),
                       RunningScale.create())

    def td_target(self, params, target_qs, next_z, reward, terminated, key):
        """``r + gamma (1 - d) min(Q-bar_i, Q-bar_j)(z', pi(z'))`` per transition (no
        gradient): each transition's own termination flag cuts its bootstrap."""
        k_pi, k_q = jax.random.split(key)
        next_action, _ = self.pi(params, next_z, k_pi)
        q = self.q_pair(target_qs, next_z, next_action, k_q).min(0)
        return jax.lax.stop_gradient(reward + self.hyper.discount * (1.0 - terminated) * q)

    def update_step(self, learner: Learner, batch, key):
        """One update on ``batch`` (leaves ``[B, H + 1, ...]``: ``obs``, ``action`` in [-1, 1]
        taken at ``obs``, and what arrived with ``obs``: ``reward``, ``terminated``,
        ``is_first``; the module docstring)."""
        h, model_tx, pi_tx = self.hyper, *self.optimizers()
        horizon = h.horizon
        tm = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731  -> time-major
        obs, action = tm(batch["obs"]), tm(batch["action"])[:horizon]
        reward = tm(batch["reward"])[1:].astype(jnp.float32)
        terminated = tm(batch["terminated"])[1:].astype(jnp.float32)
        # Transition t stays inside the episode of s_0: no reset row among s_1..s_{t+1}.
        inside = jnp.cumprod(1.0 - tm(batch["is_first"])[1:].astype(jnp.float32), axis=0)
        k_target, k_loss, k_pi, k_pi_q = jax.random.split(key, 4)
        params = learner.params

        next_z = jax.lax.stop_gradient(self.encode(params, obs[1:]))  # [H, B, L]
        td_target = self.td_target(params, learner.target_qs, next_z, reward, terminated,
                                   k_target)
        rho = h.rho ** jnp.arange(horizon, dtype=jnp.float32)

        def model_loss(params):
            zs, losses = wm.rollout_terms(self.model, params, obs, action, reward, terminated,
                                          inside, next_z, rho)
            q_logits = self.model.apply(params, zs[:-1], action, True, method=wm.WorldModel.q,
                                        rngs={"dropout": k_loss})
            value_ce = jnp.sum(wm.soft_cross_entropy(
                q_logits, jnp.broadcast_to(td_target, q_logits.shape[:-1])), 0)
            losses["value"] = jnp.sum(rho * wm.masked_mean(value_ce, inside)) / (
                horizon * q_logits.shape[0])
            total = (h.consistency_coef * losses["consistency"] + h.reward_coef
                     * losses["reward"] + h.value_coef * losses["value"])
            if self.model.episodic:
                total = total + h.termination_coef * losses["termination"]
            return total, (zs, losses)

        (total, (zs, losses)), grads = jax.value_and_grad(model_loss, has_aux=True)(params)
        updates, model_opt = model_tx.update(grads, learner.model_opt, params)
        params = optax.apply_updates(params, updates)

        zs = jax.lax.stop_gradient(zs)
        # The latent at step t is valid while its transitions so far stayed in the episode.
        valid = jnp.concatenate([jnp.ones_like(inside[:1]), inside])  # [H + 1, B]
        frozen_qs = jax.lax.stop_gradient(wm.q_params(params))
        rho_pi = h.rho ** jnp.arange(horizon + 1, dtype=jnp.float32)

        def pi_loss(pi_params):
            a, info = self.pi(wm.with_policy(params, pi_params), zs, k_pi)
            q = self.q_pair(frozen_qs, zs, a, k_pi_q, train=True).mean(0)
            scale = learner.scale.update(q[0], h.tau)
            objective = h.entropy_coef * info["scaled_entropy"] + q / scale.value
            loss = jnp.mean(rho_pi * wm.masked_mean(-objective, valid))
            return loss, (scale, info)

        pi_params = wm.policy_params(params)
        (loss_pi, (scale, info)), grads = jax.value_and_grad(pi_loss, has_aux=True)(pi_params)
        updates, pi_opt = pi_tx.update(grads, learner.pi_opt, pi_params)
        params = wm.with_policy(params, optax.apply_updates(pi_params, updates))
        target_qs = optax.incremental_update(wm.q_params(params), learner.target_qs, h.tau)

        metrics = {**{f"losses/{k}": v for k, v in losses.items()}, "losses/total": total,
                   "losses/pi": loss_pi, "agent/pi_scale": scale.value,
                   "agent/pi_entropy": jnp.mean(info["entropy"]),
                   "agent/pi_log_std": jnp.mean(info["log_std"]),
                   "agent/td_target": jnp.mean(td_target),
                   "agent/inside_episode": jnp.mean(inside)}
        return Learner(params, target_qs, model_opt, pi_opt, scale), metrics

    def make_update(self, sample: Callable[[Any, jax.Array], Any], num_updates: int,
                    mesh=None):
        """``update(learner, source, key) -> (learner, metrics)``: ``num_updates`` updates in
        one ``lax.scan``, each on ``sample(source, key)`` (split over ``mesh``'s ``data``
        axis); metrics are means over the updates. The caller jits (and vmaps over seeds)."""

        def update(learner, source, key):
            def body(learner, k):
                k_sample, k_step = jax.random.split(k)
                batch = sample(source, k_sample)
                if mesh is not None:
                    batch = parallel.constrain_batch(batch, mesh)
                return self.update_step(learner, batch, k_step)

            learner, metrics = jax.lax.scan(body, learner, jax.random.split(key, num_updates))
            return learner, jax.tree.map(jnp.mean, metrics)

        return update

    # ------------------------------------------------------------------ planning

    @property
    def latent(self) -> wm.LatentModel:
        """The world model on the protocol (``models.protocol``)."""
        return wm.LatentModel(self.model)

    def prior_sequences(self, params, z, key):
        """``num_pi_trajs`` rollouts [P, H, A] of the policy prior from one latent (MPPI's
        fixed candidates), or ``None``."""
        p = self.planning
        if not p.num_pi_trajs:
            return None

        def prior_rollout(key):
            def body(z, k):
                a, _ = self.pi(params, z, k)
                return self.next(params, z, a), a

            _, actions = jax.lax.scan(body, z, jax.random.split(key, p.horizon))
            return actions

        return jax.vmap(prior_rollout)(jax.random.split(key, p.num_pi_trajs))

    def terminal_value(self, params, final, key):
        """The mean of two random Q heads at the final latents and a policy-prior action."""
        k_pi, k_q = jax.random.split(key)
        a_final, _ = self.pi(params, final, k_pi)
        return self.q_pair(wm.q_params(params), final, a_final, k_q).mean(0)

    def planner(self) -> acting.Policy:
        """MPPI over the model as an acting-layer policy of a ``Learner``, in env units
        (``mppi.model_objective`` of the latent model, from each observation's encoding). It
        plans with the model's weights centred (``wm.centre_weights``: the same function,
        fewer passes over the 512 samples' activations)."""
        centred = dataclasses.replace(self, model=self.model.clone(centred=True))
        params_of = lambda learner: wm.centre_weights(learner.params)  # noqa: E731
        inner = mppi.policy(mppi.model_objective(
            centred.latent, params_of,
            lambda learner, final, key: centred.terminal_value(params_of(learner), final, key),
            self.hyper.discount,
            prior=lambda learner, z, key: centred.prior_sequences(params_of(learner), z, key),
            start=lambda learner, obs: centred.encode(params_of(learner), obs)),
            self.planning, self.action_dim)

        def act(learner, carry, obs, is_first, key, temperature=1.0):
            carry, action, extras = inner.act(learner, carry, jnp.asarray(obs, jnp.float32),
                                              is_first, key, temperature)
            return carry, self.box.to_env(action), extras

        return acting.Policy(init_carry=inner.init_carry, act=act)


def make(spec, cfg) -> Agent:
    """The agent for an ``EnvSpec`` with vector observations and a box of actions, from a
    ``config.tdmpc2`` block."""
    action_dim = int(spec.action_shape[0])
    model = wm.WorldModel(action_dim, wm.SIZES[cfg.model_size], cfg.episodic)
    return Agent(model, Hyper.from_config(cfg, spec.max_episode_steps),
                 planner_hyper(cfg, action_dim), ActionBox.of(spec), int(spec.obs_shape[0]))
