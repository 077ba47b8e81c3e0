"""SimPLe / MBARC's learning as pieces (Kaiser et al. 2020, "Model-Based Reinforcement
Learning for Atari"; MBARC, thomas-schillaci/mbarc_atari): the next-frame world model trained
on real play, its reward head trained on balanced samples, and PPO trained only inside the
learned simulator. ``make`` builds the agent from an env spec and a config; each method is a
pure per-seed function that ``jaxwm.algos.simple`` wires to envs, the replay and the loop.

The replay (``data.replay.SequenceReplay``) keeps every step of the run: the newest frame
(uint8), the action, the clipped reward as a class {0, 1, 2}, ``is_first``/``done``, and each
step's discounted return ``value`` (gamma 0.99), filled in once its episode has ended
(``fill_values``; the episode's last reward included, which the reference drops). Frame
stacks are rebuilt from consecutive frames (``data.frames``).

* ``train_model``: one ``rollout_length``-step training rollout of the world model, one
  optimiser step per step as the reference (batch 4, scheduled sampling, clipped pixel loss,
  value MSE, the latent's LSTM loss; the reward loss too for ``online``).
* ``train_reward``: ``reward_steps_per_call`` steps of the reward head alone (batch 32) on
  transitions drawn by the strategy's weights (``ops.reward_balance``); the trunk is frozen
  and runs without dropout. ``reward/prior_loss`` beside ``reward/loss``: the loss of a head
  that knows only the class mix it is sampled, which a head that has learned nothing sits at.
* ``train_agent``: one PPO iteration in the simulator: ``sim.num_agents`` agents start from
  real frame stacks of the replay (one from an episode's first frame), act for
  ``ppo.num_steps`` steps in the world model as an env of the acting layer
  (``protocol.as_env`` of ``models.nextframe.FrameModel``: frames by argmax or sampled,
  reward by the reward head), and PPO (``agents.ppo``) updates on that rollout, bootstrapping
  from its critic at the end (the reference's simulator never ends an episode and adds the
  world model's value to the 50th reward as well: counted twice). Metrics go under ``sim/``;
  ``sim/real_*`` are the real replay's reward rates, to hold the simulator's against.
* ``report``: open-loop predictions on the newest steps, not trained on yet: pixel accuracy,
  perfect-frame rate, accuracy on the pixels that change, the copy-last-frame baseline of
  each, reward recall per class from the real frames and from its own open-loop frames, and
  a GIF of imagined next to real frames.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm import parallel
from jaxwm.agents import ppo
from jaxwm.data import frames as fr
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting
from jaxwm.media import Video
from jaxwm.models import nextframe
from jaxwm.nets.actor_critic import make_actor_critic
from jaxwm.ops import reward_balance

CHANNELS = fr.CHANNELS


@struct.dataclass
class ModelLearner:
    params: dict
    opt_state: optax.OptState
    reward_opt_state: optax.OptState
    updates: jax.Array  # world-model optimiser steps so far (scheduled sampling's clock)
    reward_updates: jax.Array


def adafactor(clip: float = 1.0) -> optax.GradientTransformation:
    """SimPLe's optimiser: Adafactor with the relative step ``min(1e-2, 1/sqrt(t))`` scaled by
    each parameter's RMS (Shazeer & Stern 2018; fairseq's defaults, which MBARC uses), decay
    ``1 - t^-0.8``, update clipping 1, after global-norm gradient clipping ``clip``. optax
    factors the two largest dimensions of every matrix (fairseq: the last two)."""
    relative = lambda count: jnp.minimum(1e-2, jax.lax.rsqrt(count + 1.0))  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(clip), optax.adafactor(
        learning_rate=relative, min_dim_size_to_factor=1, decay_rate=0.8,
        multiply_by_parameter_scale=True, clipping_threshold=1.0))


def scheduled_epsilon(step, decay_steps: int):
    """Probability of feeding the real next frame at world-model step ``step`` (MBARC's
    ``trainer.py``): 1 at the start, 0 from ``decay_steps`` on."""
    step = jnp.asarray(step, jnp.float32)
    quarter = max(decay_steps // 4, 1)
    warm = 0.01 ** (jnp.maximum(quarter - step, 0.0) / quarter)
    progress = jnp.minimum(step / max(decay_steps, 1), 1.0) * 0.99 + 0.01
    return 1.0 - warm * progress


# ----------------------------------------------------------------------------- the replay


def replay_example(height: int, width: int, channels: int = CHANNELS) -> dict:
    """One step of SimPLe's replay (module docstring); a frame has ``channels``."""
    return {"frame": jnp.zeros((channels, height, width), jnp.uint8),
            "action": jnp.zeros((), jnp.int32), "reward": jnp.zeros((), jnp.int8),
            "is_first": jnp.zeros((), bool), "done": jnp.zeros((), bool),
            "value": jnp.zeros(()), "value_known": jnp.zeros((), bool)}


def records(steps: acting.Steps, channels: int = CHANNELS) -> dict:
    """A collect's steps as replay rows, the newest frame (its last ``channels``) of each
    stack (values filled in later by ``fill_values``)."""
    return {"frame": steps.obs[:, :, -channels:], "action": steps.action,
            "reward": (jnp.sign(steps.reward) + 1).astype(jnp.int8),
            "is_first": steps.is_first, "done": steps.done,
            "value": jnp.zeros(steps.reward.shape), "value_known": jnp.zeros_like(steps.done)}


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


# ----------------------------------------------------------------------------- the agent


@dataclasses.dataclass(frozen=True)
class SimPLeAgent:
    """The world model, its reward head and PPO in the simulator (module docstring); ``cfg``
    is ``config.simple``, ``constrain`` splits a batch over the devices."""

    cfg: object
    net: nextframe.NextFramePredictor
    simulator: nextframe.FrameModel
    model_opt: optax.GradientTransformation
    reward_opt: optax.GradientTransformation
    network: object  # PPO's actor-critic network
    ppo_hyper: ppo.PPOHyper
    agent_opt: optax.GradientTransformation
    ppo_update: Callable
    constrain: Callable
    height: int
    width: int

    @property
    def channels(self) -> int:
        """Channels of one frame: 3 (Atari's RGB) or MinAtar's object channels."""
        return self.simulator.channels

    @property
    def apply(self):
        return self.simulator.apply

    @property
    def policy(self) -> acting.Policy:
        return ppo.policy(self.network, self.ppo_hyper)

    @property
    def online(self) -> bool:
        return self.cfg.strategy == "online"

    def init(self, key, spec, num_envs: int, capacity: int):
        """``(ModelLearner, ppo.Learner, replay)`` of one seed."""
        k_model, k_agent = jax.random.split(key)
        frames, num_actions = self.cfg.frames, self.simulator.action_dim
        stack = jnp.zeros((1, self.height, self.width, frames * self.channels))
        params = self.net.init({"params": k_model, "dropout": k_model, "latent": k_model},
                               stack, jnp.zeros((1, num_actions)),
                               jnp.zeros((1, self.height, self.width, self.channels)), 1.0,
                               True)
        model = ModelLearner(params, self.model_opt.init(params), self.reward_opt.init(params),
                             jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
        agent = ppo.init_learner(self.network, self.agent_opt, spec, k_agent,
                                 self.cfg.sim.num_agents)
        replay = SequenceReplay.create(
            capacity, replay_example(self.height, self.width, self.channels), num_envs)
        return model, agent, replay

    # ------------------------------------------------------------------ world model

    def model_losses(self, params, stack, action, target, reward_class, value, value_known,
                     valid, epsilon, key, counts):
        logits, reward_logits, predicted_value, lstm_loss = self.apply(
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
        if self.online:
            per = nextframe.class_balanced_focal(reward_logits, reward_class, counts) \
                if self.cfg.focal_loss else nextframe.reward_cross_entropy(reward_logits,
                                                                           reward_class)
            reward_loss = jnp.sum(per * weight) / denominator
            loss = loss + reward_loss
            metrics["model/reward_loss"] = reward_loss
        return loss, (logits, metrics)

    def train_model(self, model: ModelLearner, replay: SequenceReplay, key):
        """One training rollout of the world model (module docstring)."""
        s, frames = self.cfg, self.cfg.frames
        k_window, k_noise, k_steps = jax.random.split(key, 3)
        w = self.constrain(replay.sample(k_window, s.batch_size, frames + s.rollout_length))
        stack = fr.median_noise(k_noise, fr.window_stack(w, frames), s.input_noise)
        acting_rows = slice(frames - 1, frames + s.rollout_length - 1)
        valid = jnp.cumprod(~w["done"][:, acting_rows], axis=1).astype(bool)
        epsilon = scheduled_epsilon(model.updates, s.scheduled_sampling_steps)
        valid_t, classes, _ = transitions(replay)
        counts = reward_balance.class_counts(classes, valid_t)
        xs = (w["action"][:, acting_rows], fr.frame_hwc(w["frame"][:, frames:]),
              w["reward"][:, frames:].astype(jnp.int32), w["value"][:, acting_rows],
              w["value_known"][:, acting_rows], valid)
        xs = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), xs)

        def step(carry, x):
            params, opt_state, stack, key = carry
            action, target, reward_class, value, known, ok = x
            key, k_loss, k_feed, k_noise = jax.random.split(key, 4)
            (_, (logits, metrics)), grads = jax.value_and_grad(self.model_losses, has_aux=True)(
                params, stack, action, target, reward_class, value, known, ok, epsilon,
                k_loss, counts)
            updates, opt_state = self.model_opt.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            predicted = nextframe.pixel_values(logits)
            real = jax.random.uniform(k_feed, (stack.shape[0], 1, 1, 1)) < epsilon
            fed = fr.median_noise(k_noise, jnp.where(real, target, predicted), s.input_noise)
            stack = jnp.concatenate([stack[..., self.channels:], fed], -1)
            return (params, opt_state, stack, key), metrics

        (params, opt_state, _, _), metrics = jax.lax.scan(
            step, (model.params, model.opt_state, stack, k_steps), xs)
        model = model.replace(params=params, opt_state=opt_state,
                              updates=model.updates + s.rollout_length)
        return model, {**jax.tree.map(jnp.mean, metrics), "model/epsilon": epsilon}

    # ------------------------------------------------------------------ reward head

    def train_reward(self, model: ModelLearner, replay: SequenceReplay, key):
        """``reward_steps_per_call`` steps of the reward head alone (module docstring)."""
        s = self.cfg
        steps_per_epoch = max(int(s.reward_steps.get(s.strategy, 0)), 1)
        valid, classes, continues = transitions(replay)
        stage = jnp.floor(s.balance_stages * (model.reward_updates % steps_per_epoch)
                          / steps_per_epoch)
        weights = reward_balance.transition_weights(
            s.strategy, classes, valid, continues, stage, s.balance_stages,
            tuple(s.mbarc_masses)).reshape(-1)
        logits_w = jnp.log(weights)
        shares = reward_balance.sampled_class_shares(weights, classes.reshape(-1))
        prior_loss = -jnp.sum(shares * jnp.log(jnp.maximum(shares, 1e-30)))

        def step(carry, key):
            params, opt_state = carry
            k_idx, k_fwd = jax.random.split(key)
            index = jax.random.categorical(k_idx, logits_w, shape=(s.reward_batch_size,))
            row, env = fr.rows_at(replay, index)
            stack, action, label = self.constrain((fr.stacks_at(replay, index, s.frames),
                                                   replay.data["action"][row, env],
                                                   classes.reshape(-1)[index]))

            def loss_fn(params):
                _, logits, _, _ = self.apply(params, fr.to_hwc(stack), action, k_fwd,
                                             features_only=True, reward_train=True)
                return jnp.mean(nextframe.reward_cross_entropy(logits, label))

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = self.reward_opt.update(grads, opt_state, params)
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

    # ------------------------------------------------------------------ PPO in the simulator

    def simulate(self, agent: ppo.Learner, params, stack, sim_key, key):
        """PPO acting for ``ppo.num_steps`` steps in the simulator from frame stacks ``stack``
        [n, F * 3, H, W] (``ppo.rollout_in_model``; the simulator draws from ``sim_key``)."""
        return ppo.rollout_in_model(self.policy, self.simulator, params, agent, stack, sim_key,
                                    key, self.ppo_hyper.num_steps)

    def train_agent(self, agent: ppo.Learner, params, replay: SequenceReplay, key):
        """One PPO iteration in the simulator (module docstring)."""
        s = self.cfg
        k_start, k_sim, k_roll, k_update = jax.random.split(key, 4)
        valid, _, _ = transitions(replay)
        index = fr.start_indices(k_start, valid, replay.data["is_first"], s.sim.num_agents)
        stack = self.constrain(fr.stacks_at(replay, index, s.frames))
        start, final, steps, completed = self.simulate(agent, params, stack, k_sim, k_roll)
        _, ((obs_rms, return_rms), rollout, _) = ppo.make_finish(self.network, self.ppo_hyper)(
            agent, start, steps, final, completed)
        agent = agent.replace(obs_rms=obs_rms, return_rms=return_rms)
        agent, metrics = self.ppo_update(agent, rollout, k_update)
        rewards = acting.successors(steps, final)["reward"]  # [T, n]
        # The real data's rates beside the simulator's: a reward head that calls rewards far
        # more often than the game pays them (a balanced strategy's prior) shows here.
        real_per_step, real_rewarded = real_reward_rates(replay)
        return agent, {**metrics, "sim/reward_per_step": jnp.mean(rewards),
                       "sim/rollout_return": jnp.mean(jnp.sum(rewards, 0)),
                       "sim/rewarded_steps": jnp.mean(rewards != 0),
                       "sim/real_reward_per_step": real_per_step,
                       "sim/real_rewarded_steps": real_rewarded}

    # ------------------------------------------------------------------ report

    def report(self, params, replay: SequenceReplay, key, windows_per_env: int):
        """Open-loop predictions on the newest steps, not trained on yet (module docstring):
        back-to-back windows over each env's newest steps, newest first, ``report_batch``."""
        s, frames = self.cfg, self.cfg.frames
        steps = frames + s.report_length
        per_env = min(windows_per_env, replay.steps // steps)
        starts = jnp.maximum(replay.size - steps * (1 + jnp.arange(per_env)), 0)
        rows = starts[:, None] + jnp.arange(steps)  # [windows, steps]
        w = jax.tree.map(lambda x: jnp.swapaxes(x[rows], 1, 2).reshape(
            (-1, steps) + x.shape[2:])[:s.report_batch], replay.data)
        stack = fr.window_stack(w, frames)
        acting_rows = slice(frames - 1, steps - 1)
        valid = jnp.cumprod(~w["done"][:, acting_rows], axis=1).astype(bool)
        targets = fr.frame_hwc(w["frame"][:, frames:])
        last_real = fr.frame_hwc(w["frame"][:, frames - 1])

        def step(carry, x):
            stack, teacher_stack, key = carry
            action, target = x
            key, k_open, k_teacher = jax.random.split(key, 3)
            logits, open_reward_logits, _, _ = self.apply(params, stack, action, k_open)
            _, reward_logits, _, _ = self.apply(params, teacher_stack, action, k_teacher,
                                                features_only=True)
            frame = nextframe.pixel_values(logits)
            stack = jnp.concatenate([stack[..., self.channels:], frame], -1)
            teacher_stack = jnp.concatenate([teacher_stack[..., self.channels:], target], -1)
            return (stack, teacher_stack, key), (frame, jnp.argmax(reward_logits, -1),
                                                 jnp.argmax(open_reward_logits, -1))

        xs = (jnp.swapaxes(w["action"][:, acting_rows], 0, 1), jnp.swapaxes(targets, 0, 1))
        _, outputs = jax.lax.scan(step, (stack, stack, key), xs)
        predicted, reward_pred, open_reward_pred = (jnp.swapaxes(x, 0, 1) for x in outputs)
        actual = w["reward"][:, frames:].astype(jnp.int32)
        return frame_metrics(predicted, targets, last_real, valid) | reward_recall(
            reward_pred, actual, valid) | reward_recall(
            open_reward_pred, actual, valid, "model/open_loop_reward_recall") | {
            "model/report_video": Video(fr.as_rgb(jnp.concatenate([predicted[0], targets[0]],
                                                                  2)), fps=8)}


def make(spec, config, anneal_updates: int, mesh) -> SimPLeAgent:
    """The agent for a pixel ``EnvSpec`` (Atari's RGB stacks or MinAtar's channels, the
    stack's channels ``simple.frames`` frames' worth) from a config's ``simple``, ``ppo`` and
    ``network`` blocks, PPO's rate annealed over ``anneal_updates`` (if at all), batches split
    over ``mesh``."""
    s = config.simple
    online = s.strategy == "online"
    channels = spec.obs_shape[0] // s.frames
    net = nextframe.NextFramePredictor(nextframe.SIZES[s.model_size], s.reward_head,
                                       s.stochastic, detach_reward=not online,
                                       channels=channels, pixel_classes=s.pixel_classes)
    # The reward head has an optimiser of its own unless it trains jointly (``online``).
    labels = lambda params: nextframe.reward_head_labels(params)  # noqa: E731
    model_opt = optax.multi_transform(
        {"model": adafactor(), "reward": adafactor() if online else optax.set_to_zero()}, labels)
    reward_opt = optax.multi_transform({"model": optax.set_to_zero(), "reward": adafactor()},
                                       labels)
    network = make_actor_critic(spec, config.network)
    hyper = ppo.PPOHyper.from_config(config.ppo, recurrent=network.has_memory)
    agent_opt = ppo.make_optimizer(config.ppo, anneal_updates)
    update = ppo.make_update(network, hyper, agent_opt,
                             ppo.resolve_loop_form(config.ppo.loop_form), mesh)
    simulator = nextframe.FrameModel(nextframe.make_apply(net, spec.num_actions),
                                     spec.num_actions, tuple(spec.obs_shape), s.frame_mode,
                                     channels)
    height, width = spec.obs_shape[1:]
    return SimPLeAgent(s, net, simulator, model_opt, reward_opt, network, hyper, agent_opt,
                       update, lambda tree: parallel.constrain_batch(tree, mesh), height, width)


def frame_metrics(predicted, target, last_real, valid) -> dict:
    """Pixel accuracy (all of a pixel's channels right), perfect-frame rate and accuracy on the
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


def reward_recall(predicted, actual, valid, prefix: str = "model/reward_recall") -> dict:
    """Recall of each reward class (-1, 0, +1) over the ``valid`` steps; NaN for a class
    that never occurred. ``report`` logs it from the real frames (``model/reward_recall_*``,
    the reward head alone) and from the model's own open-loop frames
    (``model/open_loop_reward_recall_*``: what the simulator pays, drift included)."""
    out = {}
    for cls, name in enumerate(("negative", "zero", "positive")):
        mask = valid & (actual == cls)
        hits = jnp.sum(mask & (predicted == cls))
        out[f"{prefix}_{name}"] = jnp.where(
            jnp.sum(mask) > 0, hits / jnp.maximum(jnp.sum(mask), 1), jnp.nan)
    return out
