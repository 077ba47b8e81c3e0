"""Proximal Policy Optimisation as pure functions: rollout, advantages, loss, update.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms": clipped surrogate (eq. 7),
value loss with optional clipping and entropy bonus (eq. 9). Implementation details follow
Huang et al. 2022, "The 37 Implementation Details of PPO" (CleanRL): per-minibatch advantage
normalisation, global-norm gradient clipping, Adam eps 1e-5, linear learning-rate annealing.

Differences from CleanRL, on purpose:
* Truncation bootstraps from V(final observation); termination does not (``ops.returns``).
* The transition taken *from* a final observation is envpool's auto-reset step (action
  ignored, reward 0). It is stored with ``valid = False`` and masked out of every loss term
  and of advantage normalisation, instead of being learned from as a real transition.

Loop form. The update runs ``epochs x minibatches`` gradient steps. ``loop_form`` picks how:
``scan`` (rolled ``lax.scan``: one dispatch, smallest program), ``unroll``
(``lax.scan(unroll=True)``) or ``host`` (a Python loop of jitted minibatch steps). XLA:CPU runs
autodiff's convolution gradients ~40x slower inside a rolled scan than under plain jit, which
is why CleanRL's scan PPO crawls on CPU; ``nets.conv`` writes them as canonical convolutions,
after which the rolled scan is the fastest form. Measured on 2 CPU cores, Breakout, 8 envs
(benchmarks/results/ppo_throughput_cpu.md): see the ``update_s`` column per form. So ``auto``
is ``scan`` on every backend; the other forms stay for measurement.

Data parallel: the update is jitted with the rollout sharded over the ``data`` mesh axis and
parameters replicated; each minibatch is constrained to the same sharding, so XLA computes
per-device gradients and all-reduces them (GSPMD). One device and N devices therefore run the
same mathematics and agree to float tolerance.

Asynchronous env pools (``collect_from_pool``): envpool returns ``B`` of its ``N`` envs per
step, whichever finished first. The stream of ``T`` such batches is put back into per-env
time order by a stable sort on the env id; each record's successor in its env supplies the
reward, flags and ``V(s_{t+1})`` of its action, and the env's last record in the rollout,
whose action is still being executed, is masked out (one transition per env and rollout).
GAE is cut at each env's last transition (bootstrapped from ``V`` of its pending
observation, like the end of a synchronous rollout) and at the end of each of the ``B`` rows
of ``T`` the sorted stream is cut into (bootstrapped likewise). Memoryless networks only: a
memory backbone would need each env's carry across the interleaving.

Minibatches are drawn over sequences: feed-forward networks see every step as its own
length-1 sequence (CleanRL's flat shuffle); recurrent backbones keep whole env trajectories
and shuffle environments, never time (REFERENCE.md), starting from the rollout's first carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm import backend
from jaxwm.config import ConfigError
from jaxwm.envs.stats import EpisodeStats, episode_metrics
from jaxwm.ops.normalize import RunningMeanStd
from jaxwm.ops.returns import gae

LOOP_FORMS = ("auto", "scan", "unroll", "host")


@struct.dataclass
class Rollout:
    """One collected batch, time on axis 1: every field is [num_envs, num_steps, ...]."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    valid: jax.Array  # False for envpool's reset transitions
    is_first: jax.Array  # obs starts an episode: recurrent carries reset here
    next_value: jax.Array  # V(s_{t+1}), including the bootstrap after the last step
    initial_carry: Any  # network carry at the start of the rollout, per env


@struct.dataclass
class Learner:
    """Everything the update changes."""

    params: Any
    opt_state: Any
    obs_rms: RunningMeanStd
    return_rms: RunningMeanStd


@struct.dataclass
class Actor:
    """Per-env state that carries across rollouts (obs, flags, carry, statistics)."""

    obs: jax.Array
    is_first: jax.Array
    prev_done: jax.Array
    carry: Any
    discounted_return: jax.Array  # for reward normalisation
    stats: Any  # envs.EpisodeStats


@struct.dataclass
class PoolActor:
    """Per-env state of ``collect_from_pool``, indexed by env id, ``[num_envs]``: the flags
    and statistics ``Actor`` keeps, without an observation (each ``recv`` brings its own)."""

    prev_done: jax.Array
    discounted_return: jax.Array
    stats: Any  # envs.EpisodeStats

    @classmethod
    def create(cls, num_envs: int) -> PoolActor:
        return cls(prev_done=jnp.zeros(num_envs, bool), discounted_return=jnp.zeros(num_envs),
                   stats=EpisodeStats.create(num_envs))


@struct.dataclass
class PPOHyper:
    """Static hyperparameters (hashable; not traced)."""

    num_steps: int = struct.field(pytree_node=False)
    gamma: float = struct.field(pytree_node=False)
    gae_lambda: float = struct.field(pytree_node=False)
    num_minibatches: int = struct.field(pytree_node=False)
    update_epochs: int = struct.field(pytree_node=False)
    clip_coef: float = struct.field(pytree_node=False)
    clip_vloss: bool = struct.field(pytree_node=False)
    ent_coef: float = struct.field(pytree_node=False)
    vf_coef: float = struct.field(pytree_node=False)
    norm_adv: bool = struct.field(pytree_node=False)
    normalize_obs: bool = struct.field(pytree_node=False)
    normalize_reward: bool = struct.field(pytree_node=False)
    recurrent: bool = struct.field(pytree_node=False)
    # False: BenchNetRL's Mamba update, whose memory leaks across episodes (comparison only).
    update_resets: bool = struct.field(pytree_node=False, default=True)

    @classmethod
    def from_config(cls, cfg, recurrent: bool) -> PPOHyper:
        names = [f for f in cls.__dataclass_fields__ if f != "recurrent"]
        return cls(**{n: cfg[n] for n in names}, recurrent=recurrent)


def _clipped_adam(learning_rate, max_grad_norm):
    return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                       optax.adam(learning_rate, eps=1e-5))


def make_optimizer(cfg, num_iterations: int,
                   backbone_scale: float = 1.0) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; lr linearly annealed to 0 over
    ``num_iterations`` if asked. The rate in use is in the optimiser state
    (``inject_hyperparams``), so the update can report it. ``backbone_scale`` != 1 scales the
    steps of the memory backbone's parameters (the ``memory`` module): a learning rate of its
    own with the same schedule, as BenchNetRL gives its Mamba block."""
    updates_per_iteration = cfg.update_epochs * cfg.num_minibatches
    if cfg.anneal_lr:
        lr = optax.linear_schedule(cfg.learning_rate, 0.0, num_iterations * updates_per_iteration)
    else:
        lr = cfg.learning_rate
    adam = optax.inject_hyperparams(_clipped_adam, static_args="max_grad_norm")(
        learning_rate=lr, max_grad_norm=cfg.max_grad_norm)
    if backbone_scale == 1.0:
        return adam
    in_backbone = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda path, _: any(getattr(k, "key", None) == "memory" for k in path), params)
    return optax.chain(adam, optax.masked(optax.scale(backbone_scale), in_backbone))


# ----------------------------------------------------------------------------- rollout


def collect(
    network,
    hyper: PPOHyper,
    env_step: Callable,
    learner: Learner,
    actor: Actor,
    env_state: Any,
    key: jax.Array,
):
    """Runs ``num_steps`` steps of every env under the current policy, as one ``lax.scan``.

    ``env_step(env_state, action) -> (env_state, StepResult)`` is envpool's XLA step (or any
    pure simulated environment, e.g. a learned world model). Returns
    ``(actor, env_state, rollout, metrics)``.
    """
    initial_carry = actor.carry

    def step(carry, step_key):
        actor, env_state, obs_rms, return_rms = carry
        obs_rms, obs, net_carry, action, log_prob, value = _act(
            network, hyper, learner.params, actor.carry, actor.obs, actor.is_first, obs_rms,
            step_key)
        env_state, res = env_step(env_state, action)
        discounted, return_rms, reward = _scale_reward(
            hyper, actor.discounted_return, actor.prev_done, res.reward, return_rms)
        stats, completed = actor.stats.update(res)
        transition = dict(
            obs=obs, action=action, log_prob=log_prob, value=value, reward=reward,
            terminated=res.terminated, truncated=res.truncated, valid=~actor.prev_done,
            is_first=actor.is_first,
        )
        actor = Actor(
            obs=res.obs, is_first=actor.prev_done, prev_done=res.done, carry=net_carry,
            discounted_return=discounted, stats=stats,
        )
        return (actor, env_state, obs_rms, return_rms), (transition, completed)

    keys = jax.random.split(key, hyper.num_steps)
    init = (actor, env_state, learner.obs_rms, learner.return_rms)
    (actor, env_state, obs_rms, return_rms), (steps, completed) = jax.lax.scan(step, init, keys)

    last_obs = obs_rms.normalize(actor.obs) if hyper.normalize_obs else actor.obs
    _, _, last_value = network.apply(
        learner.params, actor.carry, last_obs[:, None], actor.is_first[:, None]
    )
    steps = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), steps)  # [T, N] -> [N, T]
    next_value = jnp.concatenate([steps["value"][:, 1:], last_value], axis=1)
    rollout = Rollout(**steps, next_value=next_value, initial_carry=initial_carry)

    learner = learner.replace(obs_rms=obs_rms, return_rms=return_rms)
    return learner, actor, env_state, rollout, episode_metrics(completed)


def _act(network, hyper: PPOHyper, params, carry, raw_obs, is_first, obs_rms, key):
    """One acting step on a batch: ``(obs_rms, obs as the network saw it, carry, action,
    log_prob, value)``, the statistics updated with ``raw_obs`` first."""
    if hyper.normalize_obs:
        obs_rms = obs_rms.update(raw_obs.astype(jnp.float32))
        obs = obs_rms.normalize(raw_obs)
    else:
        obs = raw_obs
    carry, dist, value = network.apply(params, carry, obs[:, None], is_first[:, None])
    action = dist.sample(key)[:, 0]
    log_prob = dist.log_prob(action[:, None])[:, 0]
    return obs_rms, obs, carry, action, log_prob, value[:, 0]


def _scale_reward(hyper: PPOHyper, discounted, prev_done, reward, return_rms):
    """CleanRL's reward normalisation: ``reward`` divided by the running std of each env's
    discounted return (restarted after ``prev_done``). ``(discounted, return_rms, reward)``."""
    if not hyper.normalize_reward:
        return discounted, return_rms, reward
    discounted = discounted * hyper.gamma * (1.0 - prev_done) + reward
    return_rms = return_rms.update(discounted)
    return discounted, return_rms, return_rms.scale(reward)


def collect_from_pool(
    network,
    hyper: PPOHyper,
    recv: Callable,
    send: Callable,
    learner: Learner,
    actor: PoolActor,
    handle: Any,
    key: jax.Array,
):
    """``collect`` for an asynchronous env pool: ``num_steps`` rounds of ``recv`` (a batch of
    ``B`` ready envs), act, ``send``, as one ``lax.scan``; the stream becomes a ``Rollout`` of
    ``B`` rows by ``rollout_from_stream`` (module docstring). ``recv(handle) -> (handle,
    env_ids, StepResult)`` and ``send(handle, action, env_ids) -> handle`` are
    ``EnvPoolEnv.xla_recv``/``xla_send``. Memoryless networks only. Returns ``(learner,
    actor, handle, rollout, metrics)`` like ``collect``."""

    def step(carry, step_key):
        actor, handle, obs_rms, return_rms = carry
        handle, ids, res = recv(handle)
        # The row is the result of env ``ids``'s previous action: its bookkeeping, per env...
        discounted, return_rms, reward = _scale_reward(
            hyper, actor.discounted_return[ids], actor.prev_done[ids], res.reward, return_rms)
        stats, completed = jax.tree.map(lambda x: x[ids], actor.stats).update(res)
        # ... and the observation to act on now.
        n = ids.shape[0]
        obs_rms, obs, _, action, log_prob, value = _act(
            network, hyper, learner.params, network.initialize_carry(n), res.obs,
            jnp.zeros(n, bool), obs_rms, step_key)
        handle = send(handle, action, ids)
        scatter = lambda every, these: every.at[ids].set(these)  # noqa: E731
        actor = PoolActor(prev_done=scatter(actor.prev_done, res.done),
                          discounted_return=scatter(actor.discounted_return, discounted),
                          stats=jax.tree.map(scatter, actor.stats, stats))
        record = dict(env_id=ids, obs=obs, action=action, log_prob=log_prob, value=value,
                      reward=reward, terminated=res.terminated, truncated=res.truncated,
                      done=res.done)
        return (actor, handle, obs_rms, return_rms), (record, completed)

    keys = jax.random.split(key, hyper.num_steps)
    init = (actor, handle, learner.obs_rms, learner.return_rms)
    (actor, handle, obs_rms, return_rms), (records, completed) = jax.lax.scan(step, init, keys)
    rows = records["env_id"].shape[1]
    rollout = rollout_from_stream(records, network.initialize_carry(rows))
    learner = learner.replace(obs_rms=obs_rms, return_rms=return_rms)
    return learner, actor, handle, rollout, episode_metrics(completed)


def rollout_from_stream(records: dict[str, jax.Array], initial_carry: Any = ()) -> Rollout:
    """An asynchronous pool's records ``[T, B]`` (time-major; each has ``env_id``, the
    ``obs``/``action``/``log_prob``/``value`` of acting, and ``reward``/``terminated``/
    ``truncated``/``done`` of the env's previous action) -> a ``Rollout`` ``[B, T]`` of
    transitions in per-env time order.

    Record ``k``'s transition takes its reward, flags and ``next_value`` from the env's next
    record; it is valid when that record is in the stream and record ``k`` was not an
    episode's final observation (envpool's reset transition). GAE is cut after the env's
    last transition with a result and at every row end (``truncated``: bootstrapped, not
    terminal); ``gae`` restarts at row ends by itself.
    """
    steps, rows = records["env_id"].shape
    flat = jax.tree.map(lambda x: x.reshape((steps * rows,) + x.shape[2:]), records)
    order = jnp.argsort(flat["env_id"], stable=True)  # per env, still in time order
    s = jax.tree.map(lambda x: x[order], flat)

    def following(x, fill):  # the next record's x; ``fill`` after the last
        return jnp.concatenate([x[1:], jnp.full((1,) + x.shape[1:], fill, x.dtype)])

    has_result = following(s["env_id"], -1) == s["env_id"]
    cut = ~has_result | ~following(has_result, False)  # no result, or the next has none
    transitions = dict(
        obs=s["obs"], action=s["action"], log_prob=s["log_prob"], value=s["value"],
        reward=jnp.where(has_result, following(s["reward"], 0), 0.0),
        terminated=has_result & following(s["terminated"], False),
        truncated=(has_result & following(s["truncated"], False)) | cut,
        valid=has_result & ~s["done"],
        is_first=jnp.zeros_like(has_result),
        next_value=jnp.where(has_result, following(s["value"], 0), 0.0),
    )
    transitions = jax.tree.map(lambda x: x.reshape((rows, steps) + x.shape[1:]), transitions)
    return Rollout(**transitions, initial_carry=initial_carry)


# ----------------------------------------------------------------------------- update


def _masked_mean(x, mask):
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def loss_fn(params, network, hyper: PPOHyper, batch):
    """PPO loss on a minibatch of sequences [M, L]; returns (loss, metrics)."""
    # Resets apply inside the sequence as they did when acting, so no memory leaks across
    # episodes; update_resets=False reproduces BenchNetRL's Mamba update, which leaks.
    reset = batch["is_first"] if hyper.update_resets else jnp.zeros_like(batch["is_first"])
    _, dist, value = network.apply(params, batch["initial_carry"], batch["obs"], reset)
    mask = batch["valid"].astype(jnp.float32)
    new_log_prob = dist.log_prob(batch["action"])
    log_ratio = new_log_prob - batch["log_prob"]
    ratio = jnp.exp(log_ratio)

    advantages = batch["advantages"]
    if hyper.norm_adv:
        mean = _masked_mean(advantages, mask)
        std = jnp.sqrt(_masked_mean((advantages - mean) ** 2, mask))
        advantages = (advantages - mean) / (std + 1e-8)

    pg_loss = _masked_mean(
        jnp.maximum(-advantages * ratio,
                    -advantages * jnp.clip(ratio, 1 - hyper.clip_coef, 1 + hyper.clip_coef)),
        mask,
    )
    if hyper.clip_vloss:
        v_clipped = batch["value"] + jnp.clip(value - batch["value"], -hyper.clip_coef, hyper.clip_coef)
        v_loss = 0.5 * _masked_mean(
            jnp.maximum((value - batch["returns"]) ** 2, (v_clipped - batch["returns"]) ** 2), mask)
    else:
        v_loss = 0.5 * _masked_mean((value - batch["returns"]) ** 2, mask)
    entropy = _masked_mean(dist.entropy(), mask)
    loss = pg_loss - hyper.ent_coef * entropy + hyper.vf_coef * v_loss
    metrics = {
        "losses/policy_loss": pg_loss,
        "losses/value_loss": v_loss,
        "losses/entropy": entropy,
        "losses/approx_kl": _masked_mean((ratio - 1) - log_ratio, mask),
        "losses/clipfrac": _masked_mean((jnp.abs(ratio - 1) > hyper.clip_coef).astype(jnp.float32), mask),
    }
    return loss, metrics


def prepare_batch(hyper: PPOHyper, rollout: Rollout):
    """Computes advantages and arranges the rollout into sequences for minibatching.

    Feed-forward: [N, T] -> N*T sequences of length 1. Recurrent: N sequences of length T.
    """
    advantages, returns = jax.vmap(gae, in_axes=(0, 0, 0, 0, 0, None, None))(
        rollout.reward, rollout.value, rollout.next_value, rollout.terminated,
        rollout.truncated, hyper.gamma, hyper.gae_lambda,
    )
    batch = dict(
        obs=rollout.obs, action=rollout.action, log_prob=rollout.log_prob, value=rollout.value,
        valid=rollout.valid, is_first=rollout.is_first, advantages=advantages, returns=returns,
    )
    if not hyper.recurrent:
        batch = jax.tree.map(lambda x: x.reshape((-1, 1) + x.shape[2:]), batch)
    # Without memory the carry has no leaves, so it fits any sequence layout unchanged.
    batch["initial_carry"] = rollout.initial_carry
    return batch


def _minibatches(hyper, batch, key):
    """[S, ...] -> [num_minibatches, S / num_minibatches, ...] after a random permutation."""
    num_sequences = jax.tree.leaves(batch)[0].shape[0]
    perm = jax.random.permutation(key, num_sequences)
    shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=0), batch)
    return jax.tree.map(
        lambda x: x.reshape((hyper.num_minibatches, -1) + x.shape[1:]), shuffled)


def make_update(network, hyper: PPOHyper, optimizer, loop_form: str, data_sharding=None,
                over_seeds: bool = False):
    """Returns ``update(learner, rollout, key) -> (learner, metrics)``, already jitted; it
    donates ``learner`` (updated in place). ``over_seeds``: every argument and result has a
    leading seed axis (``loop.seeds``), one independent update per seed.

    ``data_sharding`` (a NamedSharding over the batch axis) spreads every minibatch over the
    mesh; ``None`` leaves placement to XLA (single device).
    """
    constrain = (lambda x: x) if data_sharding is None else (
        lambda tree: jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, data_sharding), tree))

    def minibatch_step(learner: Learner, minibatch):
        minibatch = constrain(minibatch)
        grads, metrics = jax.grad(loss_fn, has_aux=True)(learner.params, network, hyper, minibatch)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        params = optax.apply_updates(learner.params, updates)
        return learner.replace(params=params, opt_state=opt_state), metrics

    def epoch_minibatches(batch, key):
        keys = jax.random.split(key, hyper.update_epochs)
        mbs = jax.vmap(lambda k: _minibatches(hyper, batch, k))(keys)  # [E, M, ...]
        return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), mbs)  # [E*M, ...]

    def with_learning_rate(learner, metrics):  # make_optimizer's inject_hyperparams state
        state = learner.opt_state
        state = state[0] if isinstance(state, tuple) and not hasattr(state, "hyperparams") \
            else state  # chained with a backbone scale
        hyperparams = getattr(state, "hyperparams", {})
        if "learning_rate" not in hyperparams:
            return metrics
        return {**metrics, "charts/learning_rate": hyperparams["learning_rate"]}

    if loop_form == "host":
        if over_seeds:
            raise ConfigError("ppo.loop_form='host' cannot be vmapped over seeds.")
        prepare = backend.jit(lambda rollout, key: epoch_minibatches(prepare_batch(hyper, rollout), key))
        step = backend.jit(minibatch_step, donate_argnums=0)

        def update(learner, rollout, key):
            mbs = prepare(rollout, key)
            num = hyper.update_epochs * hyper.num_minibatches
            metrics = []
            for i in range(num):
                learner, m = step(learner, jax.tree.map(lambda x, i=i: x[i], mbs))
                metrics.append(m)
            metrics = jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *metrics)
            return learner, with_learning_rate(learner, metrics)

        return update

    unroll = True if loop_form == "unroll" else 1

    def update(learner, rollout, key):
        mbs = epoch_minibatches(prepare_batch(hyper, rollout), key)
        learner, metrics = jax.lax.scan(minibatch_step, learner, mbs, unroll=unroll)
        return learner, with_learning_rate(learner, jax.tree.map(jnp.mean, metrics))

    return backend.jit(jax.vmap(update) if over_seeds else update, donate_argnums=0)


def resolve_loop_form(loop_form: str) -> str:
    """``auto`` -> ``scan`` (see the module docstring for the measurements)."""
    if loop_form not in LOOP_FORMS:
        raise ConfigError(f"ppo.loop_form must be one of {LOOP_FORMS}, got {loop_form!r}.")
    if loop_form != "auto":
        return loop_form
    return "scan"
