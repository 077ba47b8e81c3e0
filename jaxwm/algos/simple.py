"""SimPLe / MBARC on the phase loop (Kaiser et al. 2020, "Model-Based Reinforcement Learning
for Atari"; MBARC, thomas-schillaci/mbarc_atari): a pixel next-frame world model
(``jaxwm.models.nextframe``) learned from real Atari play, a reward head trained on balanced
samples (``jaxwm.ops.reward_balance``), and PPO (``jaxwm.agents.ppo``, the same pieces as
``configs/ppo.py``) trained only inside the learned simulator.

Hooks:

* ``collect``: the acting layer's rollout of PPO's policy at temperature 1 in the real env
  (uniformly random actions until ``simple.random_steps`` transitions are in), recorded into a
  ``SequenceReplay`` that keeps every step of the run: the newest frame (uint8), the action,
  the clipped reward as a class {0, 1, 2}, ``is_first``/``done``, and each step's discounted
  return ``value`` (gamma 0.99), filled in once its episode has ended (``fill_values``; the
  episode's last reward included, which the reference drops). Frame stacks are rebuilt from
  consecutive frames, repeating an episode's first frame as envpool's stack does.
* ``report_model``: before the world model trains on the newest data, open-loop predictions of
  it (``report_length`` steps from real frame stacks, the model fed its own frames): pixel
  accuracy, perfect-frame rate, accuracy on the pixels that change, the copy-last-frame
  baseline of each, reward recall per class, and a GIF of imagined next to real frames.
* ``update_model``: one ``rollout_length``-step training rollout of the world model, one
  optimiser step per step as the reference (batch 4, scheduled sampling, clipped pixel loss,
  value MSE, the latent's LSTM loss; the reward loss too for ``online``).
* ``update_reward``: ``reward_steps_per_call`` steps of the reward head alone (batch 32) on
  transitions drawn by the strategy's weights; the trunk is frozen and runs without dropout.
  ``reward/prior_loss`` beside ``reward/loss``: the loss of a head that knows only the class
  mix it is sampled, which a head that has learned nothing yet sits at.
* ``update_agent``: one PPO iteration in the simulator: ``sim.num_agents`` agents start from
  real frame stacks of the buffer (one of them from an episode's first frame), step the
  world model for ``ppo.num_steps`` steps (``acting.rollout`` over ``acting.sync`` of the
  model's step; frames by argmax or sampled, reward by the reward head), and PPO updates on
  that rollout, bootstrapping from its critic at the end (the reference's simulator never
  ends an episode and adds the world model's value to the 50th reward as well: counted twice).
  Metrics go under ``sim/`` and never mix with the real env's; ``sim/real_*`` are the real
  buffer's reward rates, to hold the simulator's against.

The schedule (``phase_hooks``): phase ``random`` collects ``random_steps`` random transitions;
each of ``epochs`` phases ``epoch_XX`` then runs ``collect:C, report_model, update_model:W,
update_reward:R, update_agent:P, evaluate`` once, with W larger in epoch 0 and P multiplied at
the epochs of ``agent_multipliers`` (SimPLe's x2 at epochs 7 and 11, x3 at 14). Evaluation is
the loop's evaluator in the real env at ``eval.temperature`` 0.5, with the human-normalised score
for the 26 Atari 100k games.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import ppo
from jaxwm.algos import Capabilities
from jaxwm.config import ConfigError, require
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting
from jaxwm.envs.stats import episode_metrics
from jaxwm.envs.types import StepResult
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.media import Video
from jaxwm.models import nextframe
from jaxwm.nets.actor_critic import make_actor_critic
from jaxwm.nets.actor_critic import validate as validate_network
from jaxwm.ops import reward_balance
from jaxwm.scores import ATARI_RANDOM_HUMAN, atari_game


def device_batches(config) -> dict[str, int]:
    s, p = config.simple, config.ppo
    return {"simple.batch_size": s.batch_size, "simple.reward_batch_size": s.reward_batch_size,
            "simple.sim.num_agents": s.sim.num_agents,
            "a PPO minibatch (simple.sim.num_agents * ppo.num_steps / ppo.num_minibatches)":
                s.sim.num_agents * p.num_steps // p.num_minibatches}


# Seeds: each keeps its own replay of every frame (2.6 GB at full size), so several fit on a
# large host or accelerator; the tiny config runs them anywhere.
CAPABILITIES = Capabilities(actions=("discrete",), observations=("pixels",),
                            device_batches=device_batches)
CHANNELS = 3  # RGB


@struct.dataclass
class ModelLearner:
    params: dict
    opt_state: optax.OptState
    reward_opt_state: optax.OptState
    updates: jax.Array  # world-model optimiser steps so far (scheduled sampling's clock)
    reward_updates: jax.Array


@struct.dataclass
class SimPLeState:
    model: ModelLearner
    agent: ppo.Learner
    replay: SequenceReplay
    actor: acting.ActorState


# ----------------------------------------------------------------------------- schedule


def strategy_steps(config) -> int:
    """Reward-head steps per epoch of the configured strategy (0 for ``online``)."""
    s = config.simple
    return 0 if s.strategy == "online" else int(s.reward_steps[s.strategy])


def epoch_hooks(config, epoch: int) -> tuple[str, ...]:
    s = config.simple
    per_env = config.env.num_envs * s.collect_steps
    model_steps = s.model_steps_first if epoch == 0 else s.model_steps
    agent = s.agent_iterations * int(s.agent_multipliers.get(str(epoch), 1))
    hooks = [f"collect:{s.collect_per_epoch // per_env}", "report_model",
             f"update_model:{model_steps // s.rollout_length}"]
    if strategy_steps(config):
        hooks.append(f"update_reward:{strategy_steps(config) // s.reward_steps_per_call}")
    hooks.append(f"update_agent:{agent}")
    return tuple(hooks + (["evaluate"] if s.evaluate_each_epoch else []))


def phase_names(epochs: int) -> tuple[str, ...]:
    return ("random",) + tuple(f"epoch_{e:02d}" for e in range(epochs))


def phase_hooks(config) -> dict[str, tuple[str, ...]]:
    """The hooks of ``random`` and of every ``epoch_XX`` phase, from ``config.simple``."""
    hooks = {"random": ("collect",)}
    for epoch, name in enumerate(phase_names(config.simple.epochs)[1:]):
        hooks[name] = epoch_hooks(config, epoch)
    return hooks


# ----------------------------------------------------------------------------- validation


def validate(config) -> None:
    s = config.simple
    game = config.env.id.split("-")[0]
    per_env = config.env.num_envs * s.collect_steps
    require([
        (atari_game(config.env.id) is not None,
         f"env.id={config.env.id!r} is not one of the 26 Atari 100k games SimPLe is defined "
         f"on ({game!r} unknown); choose one of {sorted(ATARI_RANDOM_HUMAN)} as '<Game>-v5'."),
        (s.strategy in reward_balance.STRATEGIES,
         f"simple.strategy={s.strategy!r} is unknown; choose one of "
         f"{list(reward_balance.STRATEGIES)}."),
        (s.model_size in nextframe.SIZES,
         f"simple.model_size={s.model_size!r} does not exist; choose one of "
         f"{list(nextframe.SIZES)}."),
        (s.reward_head in nextframe.REWARD_HEADS,
         f"simple.reward_head={s.reward_head!r}: choose one of {list(nextframe.REWARD_HEADS)}."),
        (s.frames == config.env.frame_stack, f"simple.frames={s.frames} must equal "
                                             f"env.frame_stack={config.env.frame_stack}."),
        (not config.env.gray_scale, "SimPLe predicts RGB frames: set env.gray_scale=False."),
        (s.random_steps % per_env == 0 and s.collect_per_epoch % per_env == 0,
         f"simple.random_steps={s.random_steps} and collect_per_epoch={s.collect_per_epoch} "
         f"must be multiples of env.num_envs * simple.collect_steps = {per_env}."),
        (s.model_steps_first % s.rollout_length == 0 and s.model_steps % s.rollout_length == 0,
         f"simple.model_steps_first={s.model_steps_first} and model_steps={s.model_steps} must "
         f"be multiples of rollout_length={s.rollout_length} (one update per rollout step)."),
        (all(int(v) % s.reward_steps_per_call == 0 for v in s.reward_steps.values()),
         f"simple.reward_steps {dict(s.reward_steps)} must be multiples of "
         f"reward_steps_per_call={s.reward_steps_per_call}."),
        (set(s.reward_steps) == set(reward_balance.STRATEGIES[1:]),
         f"simple.reward_steps must name {list(reward_balance.STRATEGIES[1:])}."),
        (all(k.isdigit() and int(k) < s.epochs for k in s.agent_multipliers),
         f"simple.agent_multipliers keys {list(s.agent_multipliers)} must be epoch numbers "
         f"below simple.epochs={s.epochs}."),
        (s.frame_mode in ("argmax", "sample"),
         f"simple.frame_mode={s.frame_mode!r}: choose 'argmax' or 'sample'."),
        (len(s.mbarc_masses) == 3 and abs(sum(s.mbarc_masses) - 1.0) < 1e-6,
         f"simple.mbarc_masses={tuple(s.mbarc_masses)} must be three masses summing to 1."),
        ((s.sim.num_agents * config.ppo.num_steps) % config.ppo.num_minibatches == 0,
         f"ppo.num_minibatches={config.ppo.num_minibatches} must divide simple.sim.num_agents"
         f" * ppo.num_steps = {s.sim.num_agents * config.ppo.num_steps}."),
        (-(-s.report_batch // config.env.num_envs) * (s.report_length + s.frames)
         <= s.collect_per_epoch // config.env.num_envs,
         f"simple.report_batch={s.report_batch} windows of report_length={s.report_length} + "
         f"{s.frames} frames must fit in one epoch's new steps of the "
         f"{config.env.num_envs} env(s) ({s.collect_per_epoch // config.env.num_envs} each): "
         "the report is on data the model has not trained on."),
    ])
    expected = phase_names(s.epochs)
    if tuple(config.phase_order) != expected:
        raise ConfigError(f"phase_order {tuple(config.phase_order)} must be {expected} for "
                          f"simple.epochs={s.epochs} (configs/simple.py builds both).")


def validate_env(config, spec) -> None:
    validate_network(spec, config.network)
    frames, size = config.simple.frames, nextframe.SIZES[config.simple.model_size]
    if spec.obs_shape[0] != frames * CHANNELS:
        raise ConfigError(f"{spec.env_id}: observations {spec.obs_shape}; SimPLe needs "
                          f"{frames} RGB frames stacked ({frames * CHANNELS} channels).")
    height, width = spec.obs_shape[1:]
    if config.network.encoder in ("nature_cnn", "auto") and min(height, width) < 36:
        raise ConfigError(f"{height}x{width} frames are too small for the policy's Nature CNN "
                          "(8/4, 4/2, 3/1 convolutions need 36 pixels a side): set "
                          "env.img_height and env.img_width to 36 or more.")
    if min(height, width) >> size.compress_steps < 1:
        raise ConfigError(f"{height}x{width} frames are too small for {size.compress_steps} "
                          f"stride-2 steps of model_size={config.simple.model_size!r}.")


# ----------------------------------------------------------------------------- data


def fill_values(replay: SequenceReplay, gamma: float) -> SequenceReplay:
    """Every step's discounted return to its episode's end, ``value`` (clipped rewards), and
    ``value_known`` once that end is in the buffer. The buffer never wraps (``validate``)."""
    d = replay.data
    rows = jnp.arange(replay.steps)
    reward = d["reward"].astype(jnp.float32) - 1.0
    reward_next = jnp.concatenate([reward[1:], jnp.zeros_like(reward[:1])])
    has_next = (rows + 1 < replay.size)[:, None]

    def back(carry, x):
        value_next, known_next = carry
        done, r, nxt = x
        value = jnp.where(done, 0.0, r + gamma * value_next)
        known = done | (known_next & nxt)
        return (value, known), (value, known)

    init = (jnp.zeros(replay.num_envs), jnp.zeros(replay.num_envs, bool))
    _, (value, known) = jax.lax.scan(back, init, (d["done"], reward_next, has_next),
                                     reverse=True)
    known &= (rows < replay.size)[:, None]
    return replay.replace(data={**d, "value": value, "value_known": known})


def stack_rows(is_first: jax.Array, row: jax.Array, frames: int) -> jax.Array:
    """``[n, frames]``: the rows, oldest first, of the frame stacks that end at ``row`` [n] in
    ``is_first`` [T, n] (time first, one column per stack): each earlier row, except before an
    episode's first row (or row 0), which repeats, as envpool's stack repeats a first frame."""
    rows = [row]
    for _ in range(frames - 1):
        newest = rows[0]
        starts = jnp.take_along_axis(is_first, newest[None], 0)[0]
        rows.insert(0, jnp.where(starts | (newest == 0), newest, newest - 1))
    return jnp.stack(rows, -1)


def to_hwc(stack_chw: jax.Array) -> jax.Array:
    """``[B, F * 3, H, W]`` (envpool) or ``[B, F, 3, H, W]`` -> ``[B, H, W, F * 3]``."""
    if stack_chw.ndim == 5:
        stack_chw = stack_chw.reshape((stack_chw.shape[0], -1) + stack_chw.shape[3:])
    return jnp.moveaxis(stack_chw, 1, -1)


def median_noise(key, frames_u8: jax.Array, rate: float) -> jax.Array:
    """SimPLe's input noise: each element replaced by its sample's median with prob ``rate``."""
    flat = frames_u8.reshape(frames_u8.shape[0], -1)
    median = jnp.sort(flat, axis=1)[:, (flat.shape[1] - 1) // 2]  # the lower median (torch)
    noisy = jax.random.uniform(key, flat.shape) < rate
    return jnp.where(noisy, median[:, None], flat).reshape(frames_u8.shape)


def transitions(replay: SequenceReplay):
    """Per step ``[steps, envs]``: ``valid`` (its action was executed and its outcome is in
    the buffer), the class of the reward it earned, and whether the next step continues it."""
    d = replay.data
    rows = jnp.arange(replay.steps)[:, None]
    valid = ~d["done"] & (rows + 1 < replay.size)
    classes = jnp.concatenate([d["reward"][1:], jnp.ones_like(d["reward"][:1])]).astype(
        jnp.int32)
    continues = valid & jnp.concatenate([valid[1:], jnp.zeros_like(valid[:1])])
    return valid, classes, continues


def real_reward_rates(replay: SequenceReplay):
    """The buffer's mean reward per executed step and its share of rewarded steps: the real
    game's rates, logged beside the simulator's (``sim/real_*`` beside ``sim/*``)."""
    valid, classes, _ = transitions(replay)
    count = jnp.maximum(jnp.sum(valid), 1)
    zero = reward_balance.ZERO
    return jnp.sum(valid * (classes - zero)) / count, jnp.sum(valid & (classes != zero)) / count


def scheduled_epsilon(step, decay_steps: int):
    """Probability of feeding the real next frame at world-model step ``step`` (MBARC's
    ``trainer.py``): 1 at the start, 0 from ``decay_steps`` on."""
    step = jnp.asarray(step, jnp.float32)
    quarter = max(decay_steps // 4, 1)
    warm = 0.01 ** (jnp.maximum(quarter - step, 0.0) / quarter)
    progress = jnp.minimum(step / max(decay_steps, 1), 1.0) * 0.99 + 0.01
    return 1.0 - warm * progress


# ----------------------------------------------------------------------------- the model


def make_apply(net: nextframe.NextFramePredictor, num_actions: int):
    """``apply(params, stack_u8 [B, H, W, F * 3], action [B], key, target_u8=None, epsilon=0,
    train=False, features_only=False, reward_train=False)``: the network on uint8 frames and
    integer actions (``NextFramePredictor``'s outputs)."""

    def apply(params, stack_u8, action, key, target_u8=None, epsilon=0.0, train=False,
              features_only=False, reward_train=False):
        k_drop, k_latent = jax.random.split(key)
        target = None if target_u8 is None else target_u8.astype(jnp.float32) / 255.0
        return net.apply(params, stack_u8.astype(jnp.float32) / 255.0,
                         jax.nn.one_hot(action, num_actions), target, epsilon, train,
                         reward_features_only=features_only, reward_train=reward_train,
                         rngs={"dropout": k_drop, "latent": k_latent})

    return apply


def simulator_step(apply, frame_mode: str = "argmax"):
    """The learned simulator as an env step for ``acting.sync``: ``step(params, (stack [n, F *
    3, H, W] uint8, key), action [n]) -> ((stack, key), StepResult)``. The next frame is the
    argmax of each pixel's 256 classes (or a sample, ``frame_mode="sample"``), the reward the
    reward head's class minus 1; episodes never end (PPO bootstraps at the rollout's end)."""

    def step(params, env_state, action):
        stack, key = env_state
        key, k_model, k_frame = jax.random.split(key, 3)
        logits, reward_logits, _, _ = apply(params, to_hwc(stack), action, k_model)
        if frame_mode == "sample":
            frame = jax.random.categorical(k_frame, logits).astype(jnp.uint8)
        else:
            frame = jnp.argmax(logits, -1).astype(jnp.uint8)
        stack = jnp.concatenate([stack[:, CHANNELS:], jnp.moveaxis(frame, -1, 1)], 1)
        reward = (jnp.argmax(reward_logits, -1) - 1).astype(jnp.float32)
        no = jnp.zeros(stack.shape[0], bool)
        return (stack, key), StepResult(obs=stack, reward=reward, terminated=no, truncated=no,
                                        episode_over=no, raw_reward=reward)

    return step


def simulate(policy: acting.Policy, step, params, policy_params, stack, sim_key, key,
             num_steps: int):
    """``num_steps`` steps of ``policy`` in the learned simulator (``simulator_step``'s
    ``step``) from the frame stacks ``stack`` [n, F * 3, H, W]: ``acting.rollout`` over
    ``acting.sync``. Returns ``(start, final, steps, completed)``, the start and final
    ``ActorState`` and ``rollout``'s records."""
    n = stack.shape[0]
    no = jnp.zeros(n, bool)
    first = StepResult(obs=stack, reward=jnp.zeros(n), terminated=no, truncated=no,
                       episode_over=no, raw_reward=jnp.zeros(n))
    start = acting.ActorState.start(first, policy.init_carry(policy_params, n), n)
    final, _, steps, completed = acting.rollout(
        policy, acting.sync(partial(step, params)), policy_params, start, (stack, sim_key),
        key, num_steps)
    return start, final, steps, completed


# ----------------------------------------------------------------------------- build


def adafactor(clip: float = 1.0) -> optax.GradientTransformation:
    """SimPLe's optimiser: Adafactor with the relative step ``min(1e-2, 1/sqrt(t))`` scaled by
    each parameter's RMS (Shazeer & Stern 2018; fairseq's defaults, which MBARC uses), decay
    ``1 - t^-0.8``, update clipping 1, after global-norm gradient clipping ``clip``. optax
    factors the two largest dimensions of every matrix (fairseq: the last two)."""
    relative = lambda count: jnp.minimum(1e-2, jax.lax.rsqrt(count + 1.0))  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(clip), optax.adafactor(
        learning_rate=relative, min_dim_size_to_factor=1, decay_rate=0.8,
        multiply_by_parameter_scale=True, clipping_threshold=1.0))


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    s, p = config.simple, config.ppo
    return {"collect": {"env_steps": config.env.num_envs * s.collect_steps},
            "report_model": {},
            "update_model": {"model_updates": s.rollout_length},
            "update_reward": {"reward_updates": s.reward_steps_per_call},
            "update_agent": {"agent_updates": p.update_epochs * p.num_minibatches,
                             "sim_steps": s.sim.num_agents * p.num_steps}}


def build(config) -> Algorithm:
    s, p = config.simple, config.ppo
    env = acting.make_pool(config)
    spec = env.spec
    frames, num_actions = s.frames, spec.num_actions
    height, width = spec.obs_shape[1:]
    online = s.strategy == "online"
    net = nextframe.NextFramePredictor(nextframe.SIZES[s.model_size], s.reward_head,
                                       s.stochastic, detach_reward=not online)
    # The reward head has an optimiser of its own unless it trains jointly (``online``).
    model_opt = optax.multi_transform(
        {"model": adafactor(), "reward": adafactor() if online else optax.set_to_zero()},
        lambda params: nextframe.reward_head_labels(params))
    reward_opt = optax.multi_transform({"model": optax.set_to_zero(), "reward": adafactor()},
                                       lambda params: nextframe.reward_head_labels(params))

    network = make_actor_critic(spec, config.network)
    hyper = ppo.PPOHyper.from_config(p, recurrent=network.has_memory)
    agent_opt = ppo.make_optimizer(p, anneal_updates(config))
    policy = ppo.policy(network, hyper)
    ppo_finish = ppo.make_finish(network, hyper)
    # Data parallel as Dreamer: parameters, optimisers and the replay replicated over the
    # mesh; every batch (world-model windows, reward samples, simulated agents) split over its
    # ``data`` axis. The real envs act on the process's first device (``acting.Actor``).
    mesh = parallel.data_mesh(config.num_devices or None)
    split = partial(parallel.constrain_batch, mesh=mesh)
    ppo_update = ppo.make_update(network, hyper, agent_opt, ppo.resolve_loop_form(p.loop_form),
                                 mesh)
    n_agents = s.sim.num_agents

    apply = make_apply(net, num_actions)

    # ---- real env: PPO's policy records into the replay (random during the first phase)

    def record(params, start, steps, final, completed):
        del params, start
        reward_class = (jnp.sign(steps.reward) + 1).astype(jnp.int8)
        records = {"frame": steps.obs[:, :, -CHANNELS:], "action": steps.action,
                   "reward": reward_class, "is_first": steps.is_first, "done": steps.done,
                   "value": jnp.zeros(steps.reward.shape), "value_known": jnp.zeros_like(
                       steps.done)}
        return final.carry, ((records,), episode_metrics(completed))

    collect_policy = acting.without_extras(policy)
    num_seeds = config.num_seeds
    over_seeds = partial(seeds.vmap, num_seeds=num_seeds)
    actor = acting.Actor(env, collect_policy, s.collect_steps, mesh=mesh, groups=num_seeds,
                         finish=record, warmup_transitions=s.random_steps)
    capacity = s.random_steps + s.epochs * s.collect_per_epoch

    def init_one(key):
        k_model, k_agent = jax.random.split(key)
        stack = jnp.zeros((1, height, width, frames * CHANNELS))
        params = net.init({"params": k_model, "dropout": k_model, "latent": k_model}, stack,
                          jnp.zeros((1, num_actions)), jnp.zeros((1, height, width, CHANNELS)),
                          1.0, True)
        model = ModelLearner(params, model_opt.init(params), reward_opt.init(params),
                             jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
        agent = ppo.init_learner(network, agent_opt, spec, k_agent, n_agents)
        example = {"frame": jnp.zeros((CHANNELS, height, width), jnp.uint8),
                   "action": jnp.zeros((), jnp.int32), "reward": jnp.zeros((), jnp.int8),
                   "is_first": jnp.zeros((), bool), "done": jnp.zeros((), bool),
                   "value": jnp.zeros(()), "value_known": jnp.zeros((), bool)}
        replay = SequenceReplay.create(capacity, example, config.env.num_envs)
        return model, agent, replay

    def init(key):
        model, agent, replay = parallel.replicate(over_seeds(init_one)(key), mesh)
        return SimPLeState(model, agent, replay, actor.init(agent))

    fill = backend.jit(over_seeds(partial(fill_values, gamma=s.value_gamma)), donate_argnums=0)

    def collect_hook(state, data, key):
        del data
        actor_state, replay, metrics = actor.collect_into(state.replay, state.agent,
                                                          state.actor, key)
        return state.replace(actor=actor_state, replay=fill(replay)), {}, metrics

    # ---- world model

    window = frames + s.rollout_length

    def initial_stack(w):
        rows = stack_rows(w["is_first"].T, jnp.full((w["frame"].shape[0],), frames - 1),
                          frames)  # [B, F]
        gathered = jnp.take_along_axis(w["frame"], rows[:, :, None, None, None], 1)
        return to_hwc(gathered)

    def hwc(frame_chw):
        return jnp.moveaxis(frame_chw, -3, -1)

    def model_losses(params, stack, action, target, reward_class, value, value_known, valid,
                     epsilon, key, counts):
        logits, reward_logits, predicted_value, lstm_loss = apply(
            params, stack, action, key, target, epsilon, train=True)
        weight = valid.astype(jnp.float32)
        denominator = jnp.maximum(jnp.sum(weight), 1.0)
        pixel = jnp.sum(nextframe.pixel_loss(logits, target) * weight) / denominator
        value_weight = weight * value_known
        value_loss = jnp.sum((predicted_value - value) ** 2 * value_weight) / jnp.maximum(
            jnp.sum(value_weight), 1.0)
        loss = pixel + value_loss + lstm_loss
        metrics = {"model/pixel_loss": pixel, "model/value_loss": value_loss,
                   "model/lstm_loss": lstm_loss}
        if online:
            per = nextframe.class_balanced_focal(reward_logits, reward_class, counts) \
                if s.focal_loss else nextframe.reward_cross_entropy(reward_logits, reward_class)
            reward_loss = jnp.sum(per * weight) / denominator
            loss = loss + reward_loss
            metrics["model/reward_loss"] = reward_loss
        return loss, (logits, metrics)

    def train_model(model: ModelLearner, replay: SequenceReplay, key):
        k_window, k_noise, k_steps = jax.random.split(key, 3)
        w = split(replay.sample(k_window, s.batch_size, window))
        stack = median_noise(k_noise, initial_stack(w), s.input_noise)
        acting_rows = slice(frames - 1, window - 1)
        valid = jnp.cumprod(~w["done"][:, acting_rows], axis=1).astype(bool)
        epsilon = scheduled_epsilon(model.updates, s.scheduled_sampling_steps)
        valid_t, classes, _ = transitions(replay)
        counts = reward_balance.class_counts(classes, valid_t)
        xs = (w["action"][:, acting_rows], hwc(w["frame"][:, frames:]),
              w["reward"][:, frames:].astype(jnp.int32), w["value"][:, acting_rows],
              w["value_known"][:, acting_rows], valid)
        xs = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), xs)

        def step(carry, x):
            params, opt_state, stack, key = carry
            action, target, reward_class, value, known, ok = x
            key, k_loss, k_feed, k_noise = jax.random.split(key, 4)
            (_, (logits, metrics)), grads = jax.value_and_grad(model_losses, has_aux=True)(
                params, stack, action, target, reward_class, value, known, ok, epsilon,
                k_loss, counts)
            updates, opt_state = model_opt.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            predicted = jnp.argmax(logits, -1).astype(jnp.uint8)
            real = jax.random.uniform(k_feed, (stack.shape[0], 1, 1, 1)) < epsilon
            fed = median_noise(k_noise, jnp.where(real, target, predicted), s.input_noise)
            stack = jnp.concatenate([stack[..., CHANNELS:], fed], -1)
            return (params, opt_state, stack, key), metrics

        (params, opt_state, _, _), metrics = jax.lax.scan(
            step, (model.params, model.opt_state, stack, k_steps), xs)
        model = model.replace(params=params, opt_state=opt_state,
                              updates=model.updates + s.rollout_length)
        return model, {**jax.tree.map(jnp.mean, metrics), "model/epsilon": epsilon}

    _train_model = backend.jit(over_seeds(train_model), donate_argnums=0)

    def update_model_hook(state, data, key):
        del data
        model, metrics = _train_model(state.model, state.replay, key)
        return state.replace(model=model), {}, metrics

    # ---- reward model

    def sample_stacks(replay, flat_index):
        """Frame stacks ``[n, F * 3, H, W]`` and actions at flat ``[steps * envs]`` indices."""
        row, env_id = flat_index // replay.num_envs, flat_index % replay.num_envs
        is_first = replay.data["is_first"][:, env_id]  # [steps, n]
        rows = stack_rows(is_first, row, frames)  # [n, F]
        stack = replay.data["frame"][rows, env_id[:, None]]  # [n, F, 3, H, W]
        return stack.reshape((stack.shape[0], -1) + stack.shape[3:]), \
            replay.data["action"][row, env_id]

    steps_per_epoch = max(strategy_steps(config), 1)

    def train_reward(model: ModelLearner, replay: SequenceReplay, key):
        valid, classes, continues = transitions(replay)
        stage = jnp.floor(s.balance_stages * (model.reward_updates % steps_per_epoch)
                          / steps_per_epoch)
        weights = reward_balance.transition_weights(
            s.strategy, classes, valid, continues, stage, s.balance_stages,
            tuple(s.mbarc_masses)).reshape(-1)
        logits_w = jnp.log(weights)
        # The loss of a head that knows only the class mix it is sampled: a reward/loss near
        # it means the head has not yet learned which frames are rewarded.
        shares = reward_balance.sampled_class_shares(weights, classes.reshape(-1))
        prior_loss = -jnp.sum(shares * jnp.log(jnp.maximum(shares, 1e-30)))

        def step(carry, key):
            params, opt_state = carry
            k_idx, k_fwd = jax.random.split(key)
            index = jax.random.categorical(k_idx, logits_w, shape=(s.reward_batch_size,))
            stack, action, label = split((*sample_stacks(replay, index),
                                          classes.reshape(-1)[index]))

            def loss_fn(params):
                _, logits, _, _ = apply(params, to_hwc(stack), action, k_fwd,
                                        features_only=True, reward_train=True)
                return jnp.mean(nextframe.reward_cross_entropy(logits, label))

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = reward_opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), \
                {"reward/loss": loss, "reward/sampled_rewarded": jnp.mean(label != 1)}

        (params, opt_state), metrics = jax.lax.scan(
            step, (model.params, model.reward_opt_state),
            jax.random.split(key, s.reward_steps_per_call))
        model = model.replace(params=params, reward_opt_state=opt_state,
                              reward_updates=model.reward_updates + s.reward_steps_per_call)
        # Every strategy takes all three classes; with one class seen so far, balancing
        # degenerates to uniform sampling, which this metric makes visible.
        seen = jnp.sum(reward_balance.class_counts(classes, valid) > 0)
        return model, {**jax.tree.map(jnp.mean, metrics), "reward/stage": stage,
                       "reward/classes_seen": seen, "reward/prior_loss": prior_loss}

    _train_reward = backend.jit(over_seeds(train_reward), donate_argnums=0)

    def update_reward_hook(state, data, key):
        del data
        model, metrics = _train_reward(state.model, state.replay, key)
        return state.replace(model=model), {}, metrics

    # ---- the learned simulator and PPO inside it

    sim_step = simulator_step(apply, s.frame_mode)

    def start_stacks(replay, key):
        """Real frame stacks to start the simulated agents from: uniformly among the buffer's
        executed steps, agent 0 at an episode's first frame (any step while none is in)."""
        valid, _, _ = transitions(replay)
        firsts = valid & replay.data["is_first"]
        firsts = jnp.where(jnp.any(firsts), firsts, valid)
        k_any, k_first = jax.random.split(key)
        logits = lambda mask: jnp.log(mask.reshape(-1).astype(jnp.float32))  # noqa: E731
        index = jax.random.categorical(k_any, logits(valid), shape=(n_agents,))
        index = index.at[0].set(jax.random.categorical(k_first, logits(firsts)))
        return sample_stacks(replay, index)[0]

    def train_agent(agent: ppo.Learner, params, replay, key):
        k_start, k_sim, k_roll, k_update = jax.random.split(key, 4)
        stack = split(start_stacks(replay, k_start))
        start, final, steps, completed = simulate(policy, sim_step, params, agent, stack,
                                                  k_sim, k_roll, p.num_steps)
        _, ((obs_rms, return_rms), rollout, _) = ppo_finish(agent, start, steps, final,
                                                            completed)
        agent = agent.replace(obs_rms=obs_rms, return_rms=return_rms)
        agent, metrics = ppo_update(agent, rollout, k_update)
        rewards = acting.successors(steps, final)["reward"]  # [T, n]
        # The real data's rates beside the simulator's: a reward head that calls rewards far
        # more often than the game pays them (a balanced strategy's prior) shows here.
        real_per_step, real_rewarded = real_reward_rates(replay)
        return agent, {**metrics, "sim/reward_per_step": jnp.mean(rewards),
                       "sim/rollout_return": jnp.mean(jnp.sum(rewards, 0)),
                       "sim/rewarded_steps": jnp.mean(rewards != 0),
                       "sim/real_reward_per_step": real_per_step,
                       "sim/real_rewarded_steps": real_rewarded}

    _train_agent = backend.jit(over_seeds(train_agent), donate_argnums=0)

    def update_agent_hook(state, data, key):
        del data
        agent, metrics = _train_agent(state.agent, state.model.params, state.replay, key)
        return state.replace(agent=agent), {}, metrics

    # ---- what the world model has learned, on data it has not trained on yet

    def report(params, replay, key):
        steps = frames + s.report_length
        # Back-to-back windows over the newest steps of every env (the epoch's collection,
        # not trained on yet), newest first, the first report_batch of them.
        per_env = min(report_windows, replay.steps // steps)
        starts = jnp.maximum(replay.size - steps * (1 + jnp.arange(per_env)), 0)
        rows = starts[:, None] + jnp.arange(steps)  # [windows, steps]
        w = jax.tree.map(lambda x: jnp.swapaxes(x[rows], 1, 2).reshape(
            (-1, steps) + x.shape[2:])[:s.report_batch], replay.data)
        stack = initial_stack(w)
        acting_rows = slice(frames - 1, steps - 1)
        valid = jnp.cumprod(~w["done"][:, acting_rows], axis=1).astype(bool)
        targets = hwc(w["frame"][:, frames:])
        last_real = hwc(w["frame"][:, frames - 1])

        def step(carry, x):
            stack, teacher_stack, key = carry
            action, target = x
            key, k_open, k_teacher = jax.random.split(key, 3)
            logits, _, _, _ = apply(params, stack, action, k_open)
            _, reward_logits, _, _ = apply(params, teacher_stack, action, k_teacher,
                                           features_only=True)
            frame = jnp.argmax(logits, -1).astype(jnp.uint8)
            stack = jnp.concatenate([stack[..., CHANNELS:], frame], -1)
            teacher_stack = jnp.concatenate([teacher_stack[..., CHANNELS:], target], -1)
            return (stack, teacher_stack, key), (frame, jnp.argmax(reward_logits, -1))

        xs = (jnp.swapaxes(w["action"][:, acting_rows], 0, 1), jnp.swapaxes(targets, 0, 1))
        _, (predicted, reward_pred) = jax.lax.scan(step, (stack, stack, key), xs)
        predicted, reward_pred = jnp.swapaxes(predicted, 0, 1), jnp.swapaxes(reward_pred, 0, 1)
        return frame_metrics(predicted, targets, last_real, valid) | reward_recall(
            reward_pred, w["reward"][:, frames:].astype(jnp.int32), valid) | {
            "model/report_video": Video(jnp.concatenate([predicted[0], targets[0]], 2),
                                        fps=8)}

    report_windows = max(1, -(-s.report_batch // config.env.num_envs))

    @backend.jit
    def _report(params, replay, key):
        metrics = over_seeds(report)(params, replay, key)
        if num_seeds > 1:  # one video (seed 0's); the numbers per seed
            metrics = {k: jax.tree.map(lambda x: x[0], v) if isinstance(v, Video) else v
                       for k, v in metrics.items()}
        return metrics

    def report_hook(state, data, key):
        del data
        return state, {}, _report(state.model.params, state.replay, key)

    counts = hook_counts(config)
    return Algorithm(
        name="SimPLe",
        init=init,
        hooks={
            "collect": Hook(collect_hook, counts=counts["collect"]),
            "report_model": Hook(report_hook),
            "update_model": Hook(update_model_hook, counts=counts["update_model"]),
            "update_reward": Hook(update_reward_hook, counts=counts["update_reward"]),
            "update_agent": Hook(update_agent_hook, counts=counts["update_agent"]),
        },
        policy=policy,
        policy_params=lambda state: state.agent,
        phase_hooks=phase_hooks(config),
        close=actor.close,
    )


def anneal_updates(config) -> int:
    """Agent updates over which PPO's learning rate anneals, if it does: the whole schedule's
    (SimPLe's learning rate counts agent updates, not env steps)."""
    s, p = config.simple, config.ppo
    iterations = sum(s.agent_iterations * int(s.agent_multipliers.get(str(e), 1))
                     for e in range(s.epochs))
    return max(1, iterations * p.update_epochs * p.num_minibatches)


def frame_metrics(predicted, target, last_real, valid) -> dict:
    """Pixel accuracy (all three channels right), perfect-frame rate and accuracy on the
    pixels that changed since the last real frame, of ``predicted`` and of copying the last
    real frame, over the ``valid`` steps ``[B, T]``."""
    weight = valid.astype(jnp.float32)
    total = jnp.maximum(jnp.sum(weight), 1.0)
    changed = jnp.any(target != last_real[:, None], -1)  # [B, T, H, W]

    def scores(frames):
        right = jnp.all(frames == target, -1)
        accuracy = jnp.sum(jnp.mean(right, (2, 3)) * weight) / total
        perfect = jnp.sum(jnp.all(right, (2, 3)) * weight) / total
        on_changed = jnp.sum(jnp.sum(right & changed, (2, 3)) * weight) / jnp.maximum(
            jnp.sum(jnp.sum(changed, (2, 3)) * weight), 1.0)
        return accuracy, perfect, on_changed

    model, copy = scores(predicted), scores(jnp.broadcast_to(last_real[:, None], target.shape))
    names = ("pixel_accuracy", "perfect_frames", "changed_pixel_accuracy")
    return {**{f"model/{n}": v for n, v in zip(names, model, strict=True)},
            **{f"model/copy_last_{n}": v for n, v in zip(names, copy, strict=True)}}


def reward_recall(predicted, actual, valid) -> dict:
    """Recall of each reward class (-1, 0, +1) over the ``valid`` steps; NaN for a class
    that never occurred."""
    out = {}
    for cls, name in enumerate(("negative", "zero", "positive")):
        mask = valid & (actual == cls)
        hits = jnp.sum(mask & (predicted == cls))
        out[f"model/reward_recall_{name}"] = jnp.where(
            jnp.sum(mask) > 0, hits / jnp.maximum(jnp.sum(mask), 1), jnp.nan)
    return out
