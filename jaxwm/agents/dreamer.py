"""The DreamerV3 agent as pieces (Hafner et al. 2023, arXiv 2301.04104): ``make`` builds it
from an env spec and a ``config.dreamer`` block; ``init``, ``policy``, ``make_update`` and
``report`` are what ``jaxwm.algos.dreamer`` wires to envs, a sequence replay and the loop.

* ``policy``: the posterior step on each new observation (``models.rssm``'s ``obs_step``),
  then an action from the actor; the carry is the RSSM state and the last action in the
  model's input form, reset where ``is_first``. Actions leave in the env's units: continuous
  actions, produced in [-1, 1], are mapped onto the env's box (``env_action``); the replay
  stores them in the model's units again (``model_action``).
* ``make_update``: one training step as the official agent's ``train``: the world model's loss
  on a ``[batch, length]`` sequence batch, imagination from every posterior state and the
  actor-critic's losses (``agents.imagination``), the critic's replay value loss on the
  posterior states (into the world model too), one optimiser over all of it
  (``agents.optim.dreamer_optimizer``: AGC -> RMS -> momentum), then the slow critic's EMA.
* ``report``: open-loop predictions on replayed sequences (``rssm.open_loop``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm import parallel
from jaxwm.agents import imagination, optim
from jaxwm.envs import acting
from jaxwm.media import Video
from jaxwm.models import rssm
from jaxwm.nets.distributions import sample_at_temperature
from jaxwm.ops.normalize import PercentileScale


@struct.dataclass
class Learner:
    params: dict  # {model, actor, critic}: what the optimiser trains
    slow_critic: dict
    opt_state: object
    retnorm: PercentileScale


@dataclasses.dataclass(frozen=True)
class DreamerAgent:
    world_model: rssm.WorldModel
    actor_critic: imagination.ActorCritic
    optimizer: optax.GradientTransformation
    feat_dim: int
    action_dim: int
    discrete: bool
    low: jax.Array | None  # the env's box (continuous actions)
    high: jax.Array | None

    def init(self, key, example_obs) -> Learner:
        """A fresh learner from an example observation batch ``[B, *obs_shape]``."""
        k_model, k_ac = jax.random.split(key)
        params = {"model": self.world_model.init(k_model, example_obs),
                  **self.actor_critic.init(k_ac, self.feat_dim)}
        slow_critic = jax.tree.map(jnp.copy, params["critic"])  # own buffers: donated apart
        return Learner(params, slow_critic, self.optimizer.init(params),
                       PercentileScale.create())

    def env_action(self, action):
        """The actor's action in the env's units: [-1, 1] mapped onto the box."""
        if self.discrete:
            return action
        return self.low + (jnp.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)

    def model_action(self, action):
        """An env action in the actor's [-1, 1] units (``env_action``'s inverse)."""
        if self.discrete:
            return action
        return (action - self.low) / (0.5 * (self.high - self.low)) - 1.0

    def policy(self) -> acting.Policy:
        """Acting with a ``Learner``: filter the observation into the posterior, then sample
        the actor at ``temperature``."""
        wm, ac = self.world_model, self.actor_critic

        def init_carry(learner, num_envs):
            del learner
            return wm.initial(num_envs), jnp.zeros((num_envs, self.action_dim))

        def act(learner, carry, obs, is_first, key, temperature=1.0):
            params = learner.params
            model_state, prev_action = carry
            k_obs, k_act = jax.random.split(key)
            embed = wm.net.apply(params["model"], obs, method=rssm.WorldModelNet.encode)
            model_state, _ = wm.obs_step(params["model"], model_state, prev_action, embed,
                                         is_first, k_obs)
            dist = ac.policy(params["actor"], rssm.features(model_state))
            action = sample_at_temperature(dist, k_act, temperature)
            return (model_state, wm.action_input(action)), self.env_action(action), {}

        return acting.Policy(init_carry=init_carry, act=act)

    def losses(self, params, slow_critic, retnorm, batch, key):
        k_model, k_ac = jax.random.split(key)
        model_loss, (metrics, post) = self.world_model.loss(params["model"], batch, k_model)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        start_cont = 1.0 - flat(batch["is_terminal"]).astype(jnp.float32)
        ac_loss, (ac_metrics, retnorm, start_returns) = self.actor_critic.loss(
            {"actor": params["actor"], "critic": params["critic"]}, slow_critic,
            self.world_model, params["model"], jax.tree.map(flat, post), start_cont, retnorm,
            k_ac)
        loss, metrics = model_loss + ac_loss, {**metrics, **ac_metrics}
        repval = self.actor_critic.hyper.repval
        if repval:
            repval_loss, target = self.actor_critic.replay_value_loss(
                params["critic"], slow_critic, rssm.features(post), batch,
                start_returns.reshape(batch["reward"].shape))
            loss += repval * repval_loss
            metrics.update({"agent/replay_value_loss": repval_loss,
                            "agent/replay_return": target})
        return loss, (metrics, retnorm)

    def make_update(self, mesh=None):
        """``update(learner, batch, key) -> (learner, metrics)``: one training step on a
        ``[batch, length]`` sequence batch, split over ``mesh``'s devices where it has
        several. Not jitted here: the caller jits it, donating the learner."""

        def update(learner: Learner, batch, key):
            if mesh is not None:  # each device takes its share of the sequences
                batch = parallel.constrain_batch(batch, mesh)
            grads, (metrics, retnorm) = jax.grad(self.losses, has_aux=True)(
                learner.params, learner.slow_critic, learner.retnorm, batch, key)
            updates, opt_state = self.optimizer.update(grads, learner.opt_state,
                                                       learner.params)
            params = jax.tree.map(lambda p, u: p + u, learner.params, updates)
            slow = self.actor_critic.slow_update(learner.slow_critic, params["critic"])
            metrics = {**metrics, "optim/grad_norm": optax.tree.norm(grads),
                       "optim/update_norm": optax.tree.norm(updates)}
            return Learner(params, slow, opt_state, retnorm), metrics

        return update

    def report(self, params, batch, context: int, key, pixels: bool):
        """Open-loop predictions on ``batch``: ``context`` observed steps, then the model
        alone under the replayed actions; MSEs, and a side-by-side video for pixels."""
        target, recon = rssm.open_loop(self.world_model, params["model"], batch, context, key)
        axes = tuple(range(2, target.ndim))
        error = jnp.mean(jnp.sum((recon - target) ** 2, axes), 0)  # [T]
        metrics = {"report/observed_mse": jnp.mean(error[:context]),
                   "report/openloop_mse": jnp.mean(error[context:])}
        if pixels:
            metrics["report/openloop"] = Video(rssm.video_frames(target[0], recon[0]))
        return metrics


def make(spec, d) -> DreamerAgent:
    """The agent for an ``EnvSpec`` from a ``config.dreamer`` block."""
    action_dim = spec.num_actions if spec.discrete else spec.action_shape[0]
    dtype = jnp.dtype(d.compute_dtype)
    world_model = rssm.make(spec.obs_shape, action_dim, spec.discrete, d.model_size,
                            num_bins=d.num_bins, unimix=d.unimix, dtype=dtype,
                            twohot_space=d.twohot,
                            **dict(d.size_overrides))
    sizes = {**rssm.SIZES[d.model_size], **dict(d.size_overrides)}
    hyper = imagination.ActorCriticHyper.from_config(d)
    actor_critic = imagination.ActorCritic(
        imagination.Actor(action_dim, spec.discrete, sizes["units"], unimix=hyper.actor_unimix,
                          min_std=hyper.min_std, max_std=hyper.max_std, dtype=dtype),
        imagination.critic(sizes["units"], num_bins=hyper.num_bins, dtype=dtype), hyper)
    low = high = None
    if not spec.discrete:
        low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
    return DreamerAgent(
        world_model, actor_critic,
        optim.dreamer_optimizer(d.learning_rate, agc=d.agc, warmup=d.warmup),
        feat_dim=sizes["deter"] + world_model.net.stoch * sizes["classes"],
        action_dim=action_dim, discrete=spec.discrete, low=low, high=high)
