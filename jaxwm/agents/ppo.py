"""Proximal Policy Optimisation as agent pieces: ``policy``, ``init_learner``, ``make_finish``
(a collected rollout as PPO learns from it), ``make_update``; wired to envs by
``jaxwm.algos.ppo`` and reusable by any system that trains PPO (SimPLe inside a learned
simulator).

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
``scan`` (rolled ``lax.scan``: one dispatch, smallest program) or ``unroll``
(``lax.scan(unroll=True)``). XLA:CPU runs autodiff's convolution gradients many times slower
inside a rolled scan than under plain jit (benchmarks/results/conv_grad_cpu.md), which is why
CleanRL's scan PPO crawls on CPU;
``nets.conv`` writes them as canonical convolutions, after which the rolled scan is the
fastest form (benchmarks/results/ppo_throughput_cpu.md, the ``update_s`` column per form). So
``auto`` is ``scan`` on every backend; ``unroll`` stays for measurement.

Learning rate: annealed linearly to 0 over a number of optimiser updates (``make_optimizer``),
which the caller derives from whatever counter it plans in: env steps for PPO on real envs,
agent updates for PPO inside a learned simulator.

Data parallel: the update is jitted with the rollout sharded over the ``data`` mesh axis and
parameters replicated; each minibatch is constrained to the same sharding, so XLA computes
per-device gradients and all-reduces them (GSPMD). One device and N devices therefore run the
same mathematics and agree to float tolerance.

Asynchronous env pools (``make_finish``; ``acting.stream_transitions``): envpool returns ``B``
of its ``N`` envs per step, whichever finished first. The stream of ``T`` such batches is put
back into per-env time order by a stable sort on the env id; each record's successor in its
env supplies the reward, flags and ``V(s_{t+1})`` of its action, and the env's last record in
the rollout, whose action is still being executed, is masked out (one transition per env and
rollout).
GAE is cut at each env's last transition (bootstrapped from ``V`` of its pending
observation, like the end of a synchronous rollout) and at the end of each of the ``B`` rows
of ``T`` the sorted stream is cut into (bootstrapped likewise). Memoryless networks only: a
memory backbone would need each env's carry across the interleaving.

Envs written in JAX (``envs.native``): ``make_iterations`` scans whole iterations (collect,
then update) inside one program, as PureJaxRL's ``make_train`` does (Lu et al. 2022,
"Discovered Policy Optimisation"), so the host is visited once per ``iterations`` of them.

Minibatches are drawn over sequences: feed-forward networks see every step as its own
length-1 sequence (CleanRL's flat shuffle); recurrent backbones keep whole env trajectories
and shuffle environments, never time (as CleanRL's ``ppo_atari_lstm``), starting from the rollout's
first carry.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import struct

from jaxwm import parallel
from jaxwm.config import ConfigError
from jaxwm.envs import acting
from jaxwm.envs.stats import episode_metrics, merge_episode_metrics
from jaxwm.models import protocol
from jaxwm.nets.distributions import sample_at_temperature
from jaxwm.ops.normalize import RunningMeanStd
from jaxwm.ops.returns import gae

LOOP_FORMS = ("auto", "scan", "unroll")


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


def make_optimizer(cfg, anneal_updates: int,
                   backbone_scale: float = 1.0) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; lr linearly annealed to 0 over
    ``anneal_updates`` optimiser updates (= agent updates) if ``cfg.anneal_lr``. The rate in
    use is in the optimiser state (``inject_hyperparams``), so the update can report it.
    ``backbone_scale`` != 1 scales the steps of the memory backbone's parameters (the
    ``memory`` module): a learning rate of its own with the same schedule, as BenchNetRL gives
    its Mamba block."""
    if cfg.anneal_lr:
        lr = optax.linear_schedule(cfg.learning_rate, 0.0, anneal_updates)
    else:  # a schedule, not a number: inject_hyperparams would store a number in the state,
        # and a resume that lowers the rate (algos.Entry.resumable) would not apply it
        lr = optax.constant_schedule(cfg.learning_rate)
    adam = optax.inject_hyperparams(_clipped_adam, static_args="max_grad_norm")(
        learning_rate=lr, max_grad_norm=cfg.max_grad_norm)
    if backbone_scale == 1.0:
        return adam
    in_backbone = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda path, _: any(getattr(k, "key", None) == "memory" for k in path), params)
    return optax.chain(adam, optax.masked(optax.scale(backbone_scale), in_backbone))


def config_block(**overrides) -> ml_collections.ConfigDict:
    """The ``config.ppo`` block (CleanRL's Atari settings), shared by PPO on real envs and
    SimPLe's PPO inside its learned simulator."""
    p = ml_collections.ConfigDict()
    p.num_steps = 128
    p.learning_rate = 2.5e-4
    p.anneal_lr = True  # linearly to 0 over anneal_env_steps (set in get_config)
    p.gamma = 0.99
    p.gae_lambda = 0.95
    p.num_minibatches = 4
    p.update_epochs = 4
    p.clip_coef = 0.2
    p.clip_vloss = True
    p.ent_coef = 0.01
    p.vf_coef = 0.5
    p.max_grad_norm = 0.5
    p.norm_adv = True
    p.normalize_obs = False
    p.normalize_reward = False
    p.loop_form = "auto"  # auto | scan | unroll (see jaxwm/agents/ppo.py)
    # Collect the next rollout on a second thread while the update runs, acting with the
    # parameters from before it (a one-update lag; see jaxwm/algos/ppo.py). Off: exact PPO.
    p.async_collect = False
    # Memory backbones: reset the memory at episode starts inside training sequences too.
    # False reproduces BenchNetRL's Mamba update (state leaks across episodes), for comparison.
    p.update_resets = True
    p.update(overrides)
    return p


# ``config_block``'s settings: ``{key: (valid range, description)}`` (``jaxwm.config``).
FIELDS = {
    "num_steps": ("> 0", "Steps each env collects per rollout (one update per rollout)."),
    "learning_rate": ("> 0", "Adam's learning rate (eps 1e-5; Huang et al. 2022)."),
    "anneal_lr": (None, "Anneal the learning rate linearly to 0 (Huang et al. 2022)."),
    "gamma": ("[0, 1]", "Discount factor of the returns (GAE, reward normalisation)."),
    "gae_lambda": ("[0, 1]", "GAE's lambda: bias/variance trade-off of the advantages."),
    "num_minibatches": ("> 0", "Minibatches each epoch splits the rollout into."),
    "update_epochs": ("> 0", "Passes over each rollout per update."),
    "clip_coef": (">= 0", "Clip range of the PPO ratio (Schulman et al. 2017), and of values."),
    "clip_vloss": (None, "Clip the value loss around the rollout's values (CleanRL's)."),
    "ent_coef": (">= 0", "Weight of the entropy bonus (Schulman et al. 2017, eq. 9)."),
    "vf_coef": (">= 0", "Weight of the value loss (Schulman et al. 2017, eq. 9)."),
    "max_grad_norm": ("> 0", "Gradients clipped to this global norm."),
    "norm_adv": (None, "Normalise advantages per minibatch."),
    "normalize_obs": (None, "Normalise observations by running mean and std (CleanRL's)."),
    "normalize_reward": (None, "Divide rewards by the discounted return's std (CleanRL's)."),
    "loop_form": ("{auto, scan, unroll}", "How the gradient steps loop (lax.scan); auto: scan."),
    "async_collect": (None, "Collect the next rollout during the update (one-update lag)."),
    "update_resets": (None, "Memory backbones: reset memory at episode starts in updates too."),
}


# ----------------------------------------------------------------------------- acting


@struct.dataclass
class PPOCarry:
    """What PPO's policy keeps between steps: the network's ``memory`` (per env), the live
    observation statistics (updated with every observation acted on, as CleanRL's
    ``NormalizeObservation`` does; the learner holds the checkpointed copy, written back after
    every rollout) and each env's ``discounted`` return, for reward normalisation."""

    memory: Any
    obs_rms: RunningMeanStd
    discounted: jax.Array


def policy(network, hyper: PPOHyper) -> acting.Policy:
    """PPO's acting, with a ``Learner`` as parameters: observations normalised (statistics
    updated first), one step of the network, a sample at ``temperature``; extras are the
    log-probability and value (and the normalised observation, when normalising)."""

    def init_carry(learner: Learner, num_envs: int) -> PPOCarry:
        return PPOCarry(network.initialize_carry(num_envs), learner.obs_rms,
                        jnp.zeros(num_envs))

    def act(learner: Learner, carry: PPOCarry, obs, is_first, key, temperature=1.0):
        obs_rms = carry.obs_rms
        if hyper.normalize_obs:
            obs_rms = obs_rms.update(obs.astype(jnp.float32))
            obs = obs_rms.normalize(obs)
        memory, dist, value = network.apply(learner.params, carry.memory, obs[:, None],
                                            is_first[:, None])
        action = sample_at_temperature(dist, key, temperature)[:, 0]
        extras = {"log_prob": dist.log_prob(action[:, None])[:, 0], "value": value[:, 0]}
        if hyper.normalize_obs:
            extras["obs"] = obs
        return carry.replace(memory=memory, obs_rms=obs_rms), action, extras

    return acting.Policy(init_carry=init_carry, act=act)


def scale_rewards(hyper: PPOHyper, discounted, return_rms: RunningMeanStd, ids, is_first,
                  reward):
    """CleanRL's reward normalisation over rewards in the order they arrived, ``[T, B]``:
    each env's discounted return (restarted where the reward's action was taken at an
    episode's last observation, i.e. where the arriving observation ``is_first``) updates the
    running statistics, and the reward is divided by their std. ``ids``: the envs of each row
    (``None``: all, in order). Returns ``(discounted, return_rms, scaled rewards)``."""
    if not hyper.normalize_reward:
        return discounted, return_rms, reward

    def arrive(carry, row):
        discounted, return_rms = carry
        ids, is_first, reward = row
        mine = discounted if ids is None else discounted[ids]
        mine = mine * hyper.gamma * (1.0 - is_first) + reward
        return_rms = return_rms.update(mine)
        discounted = mine if ids is None else discounted.at[ids].set(mine)
        return (discounted, return_rms), return_rms.scale(reward)

    (discounted, return_rms), scaled = jax.lax.scan(arrive, (discounted, return_rms),
                                                    (ids, is_first, reward))
    return discounted, return_rms, scaled


def stream_rollout(steps: acting.Steps, initial_carry=()) -> Rollout:
    """An asynchronous pool's ``Steps`` ``[T, B]`` (extras: ``log_prob``, ``value``) as a
    ``Rollout`` ``[B, T]`` of per-env transitions (``acting.stream_transitions``)."""
    records = dict(obs=steps.obs, action=steps.action, log_prob=steps.extras["log_prob"],
                   value=steps.extras["value"], is_first=jnp.zeros_like(steps.done))
    out, valid = acting.stream_transitions(records, steps.ids, steps.done, steps.reward,
                                           steps.terminated, steps.truncated,
                                           carried=("value",))
    return Rollout(obs=out["obs"], action=out["action"], log_prob=out["log_prob"],
                   value=out["value"], reward=out["reward"], terminated=out["terminated"],
                   truncated=out["truncated"], valid=valid, is_first=out["is_first"],
                   next_value=out["next_value"], initial_carry=initial_carry)


def make_finish(network, hyper: PPOHyper):
    """``finish(learner, start, steps, final, completed) -> (carry, ((obs_rms, return_rms),
    rollout, metrics))`` for ``acting.Actor``: the rollout of one collect as PPO learns from it
    (one seed; the actor vmaps it over groups).

    Synchronous pools: transition t takes its reward and flags from row t+1, the last from
    the rows ``final`` holds, whose value under the final carry is the bootstrap. Rewards
    arriving with row 0 belong to the previous rollout, which scaled them already.
    Asynchronous pools: ``acting.stream_transitions`` (memoryless networks only)."""

    def finish(learner: Learner, start: acting.ActorState, steps: acting.Steps,
               final: acting.ActorState, completed):
        carry = final.carry
        obs = steps.extras["obs"] if hyper.normalize_obs else steps.obs
        if steps.ids is None:
            nxt = acting.successors(steps, final)
            discounted, return_rms, reward = scale_rewards(
                hyper, carry.discounted, learner.return_rms, None, nxt["is_first"],
                nxt["reward"])
            last_obs = final.pending.obs
            if hyper.normalize_obs:
                last_obs = carry.obs_rms.normalize(last_obs)
            _, _, last_value = network.apply(learner.params, carry.memory, last_obs[:, None],
                                             final.stats.after_done[:, None])
            value = steps.extras["value"]
            time_major = dict(
                obs=obs, action=steps.action, log_prob=steps.extras["log_prob"], value=value,
                reward=reward, terminated=nxt["terminated"], truncated=nxt["truncated"],
                valid=steps.valid, is_first=steps.is_first,
                next_value=jnp.concatenate([value[1:], last_value[None, :, 0]]))
            rollout = Rollout(**jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), time_major),
                              initial_carry=start.carry.memory)
        else:
            discounted, return_rms, reward = scale_rewards(
                hyper, carry.discounted, learner.return_rms, steps.ids, steps.is_first,
                steps.reward)
            rollout = stream_rollout(steps.replace(obs=obs, reward=reward),
                                     network.initialize_carry(steps.ids.shape[1]))
        carry = carry.replace(discounted=discounted)
        return carry, ((carry.obs_rms, return_rms), rollout, episode_metrics(completed))

    return finish


# ----------------------------------------------------------------------------- update


def rollout_in_model(policy: acting.Policy, model, model_params, learner, starts, env_key,
                     key, num_steps: int):
    """PPO acting ``num_steps`` steps inside any world model (``models.protocol``, as an env
    of the acting layer: SimPLe's simulator, a dream) from the model states ``starts`` [n, ...]
    (the model's steps drawing from ``env_key``), one ``acting.rollout``: ``(start, final,
    steps, completed)``, what ``make_finish`` and so ``make_update`` take as from a real
    env."""
    n = jax.tree.leaves(starts)[0].shape[0]
    env_state, first = protocol.env_start(model, model_params, starts, env_key)
    start = acting.ActorState.start(first, policy.init_carry(learner, n), n)
    final, _, steps, completed = acting.rollout(policy, protocol.as_env(model, model_params),
                                                learner, start, env_state, key, num_steps)
    return start, final, steps, completed


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


def init_learner(network, optimizer, spec, key, rows: int) -> Learner:
    """A fresh learner, initialised from example inputs of ``rows`` envs (only their shapes
    matter)."""
    obs = jnp.zeros((rows, 1, *spec.obs_shape), spec.obs_dtype)
    params = network.init(key, network.initialize_carry(rows), obs, jnp.ones((rows, 1), bool))
    return Learner(params=params, opt_state=optimizer.init(params),
                   obs_rms=RunningMeanStd.create(spec.obs_shape),
                   return_rms=RunningMeanStd.create(()))


def make_update(network, hyper: PPOHyper, optimizer, loop_form: str, mesh=None):
    """``update(learner, rollout, key) -> (learner, metrics)``: ``update_epochs x
    num_minibatches`` gradient steps. Not jitted here: the caller jits it, donating the
    learner, and vmaps it over seeds where it has several (as ``agents.sac.make_update``).

    With a ``mesh`` of several devices every minibatch is spread over its ``data`` axis.
    """
    constrain = (lambda tree: tree) if mesh is None else (
        lambda tree: parallel.constrain_batch(tree, mesh))

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

    unroll = True if loop_form == "unroll" else 1

    def update(learner, rollout, key):
        mbs = epoch_minibatches(prepare_batch(hyper, rollout), key)
        learner, metrics = jax.lax.scan(minibatch_step, learner, mbs, unroll=unroll)
        return learner, with_learning_rate(learner, jax.tree.map(jnp.mean, metrics))

    return update


def make_iterations(collect, update, iterations: int):
    """``iterate(learner, actor, key) -> (learner, actor, metrics)``: ``iterations`` whole
    PPO iterations as one ``lax.scan``, each a collect (``acting.Actor.collect_function``,
    PPO's ``make_finish`` compiled in; the env a JAX env whose state is in ``actor``), the
    statistics it updated written to the learner, then ``update`` (``make_update``'s,
    vmapped over seeds by the caller). Keys: ``key`` split into one per iteration (per seed
    where it has a seed axis), each into the collect's and the update's. Metrics: the
    episodes of every iteration merged (``stats.merge_episode_metrics``), the rest averaged
    over the iterations."""

    def one(carry, key):
        learner, actor = carry
        collect_key, update_key = acting.step_keys(key, 2)
        _, (actor, (statistics, rollout, metrics)) = collect(learner, actor, None, collect_key)
        learner = learner.replace(obs_rms=statistics[0], return_rms=statistics[1])
        learner, update_metrics = update(learner, rollout, update_key)
        return (learner, actor), {**metrics, **update_metrics}

    def iterate(learner, actor, key):
        (learner, actor), metrics = jax.lax.scan(one, (learner, actor),
                                                 acting.step_keys(key, iterations))
        return learner, actor, merge_episode_metrics(metrics)

    return iterate


def jax_env_checks(config, rows: int) -> list[tuple[bool, str]]:
    """``(ok, message)`` checks of a PPO config on an env written in JAX (``make_iterations``;
    ``rows`` envs per rollout), for ``jaxwm.config.require``."""
    p, k = config.ppo, config.iterations_per_call
    per_call = rows * p.num_steps * k
    return [
        (not p.async_collect, "ppo.async_collect overlaps collection with the update; with a "
         f"JAX env ({config.env.id}) both are one compiled program, with nothing to overlap. "
         "Set ppo.async_collect=False."),
        (not p.anneal_lr or k == 1 or config.total_env_steps % per_call == 0,
         f"total_env_steps={config.total_env_steps} is not a multiple of the {per_call:,} env "
         f"steps of one call (iterations_per_call={k}): the last call would run past the "
         f"annealed rate's end. Use total_env_steps="
         f"{-(-config.total_env_steps // per_call) * per_call} or another iterations_per_call."),
    ]


def merge_over_processes(start, statistics, metrics):
    """Every process's normalisation statistics and episode metrics, combined the same way
    in each (so the replicated learner stays identical): statistics as if one process had
    seen every sample (``RunningMeanStd.merge_updates``), the episode metrics as
    ``stats.merge_episode_metrics`` merges windows."""
    gathered_stats, gathered = parallel.allgather((statistics, metrics))
    statistics = tuple(RunningMeanStd.merge_updates(jax.device_get(s), g)
                       for s, g in zip(start, gathered_stats, strict=True))
    return statistics, merge_episode_metrics(gathered)


def resolve_loop_form(loop_form: str) -> str:
    """``auto`` -> ``scan`` (see the module docstring for the measurements)."""
    if loop_form not in LOOP_FORMS:
        raise ConfigError(f"ppo.loop_form must be one of {LOOP_FORMS}, got {loop_form!r}.")
    if loop_form != "auto":
        return loop_form
    return "scan"
