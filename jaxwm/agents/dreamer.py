"""The DreamerV3 agent as pieces (Hafner et al. 2023, arXiv 2301.04104): ``make`` builds it
from an env spec and a ``config.dreamer`` block; ``init``, ``policy``, ``make_update`` and
``report`` are what ``jaxwm.algos.dreamer`` wires to envs, a sequence replay and the loop.

* ``policy``: each new observation filtered into the world model's state
  (``protocol.through_model``: the RSSM's posterior step), then an action from the actor;
  the carry is the model's state and the last action in the model's input form, reset where
  ``is_first``. Actions leave in the env's units: continuous
  actions, produced in [-1, 1], are mapped onto the env's box (``env_action``); the replay
  stores them in the model's units again (``model_action``).
* ``make_update``: one training step as the official agent's ``train``: the world model's loss
  on a ``[batch, length]`` sequence batch, imagination from every posterior state and the
  actor-critic's losses (``agents.imagination``), the critic's replay value loss on the
  posterior states (into the world model too), one optimiser over all of it
  (``agents.optim.dreamer_optimizer``: AGC -> RMS -> momentum), then the slow critic's EMA.
* ``report``: open-loop predictions on replayed sequences (the world model's ``report``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import struct

from jaxwm import parallel
from jaxwm.agents import imagination, mppi, optim
from jaxwm.envs import acting
from jaxwm.models import protocol, rssm
from jaxwm.ops import twohot
from jaxwm.ops.normalize import PercentileScale


@struct.dataclass
class Learner:
    params: dict  # {model, actor, critic}: what the optimiser trains
    slow_critic: dict
    opt_state: object
    retnorm: PercentileScale


@dataclasses.dataclass(frozen=True)
class DreamerAgent:
    """A trainable world model (on ``models.protocol``, with ``init``, ``loss`` and
    ``report``) and the actor-critic learned in its imagination, one optimiser over both;
    ``actor_critic`` None trains the model alone."""

    world_model: object
    actor_critic: imagination.ActorCritic | None
    optimizer: optax.GradientTransformation
    feat_dim: int
    action_dim: int
    discrete: bool
    low: jax.Array | None  # the env's box (continuous actions)
    high: jax.Array | None

    def init(self, key, example_obs) -> Learner:
        """A fresh learner from an example observation batch ``[B, *obs_shape]``."""
        k_model, k_ac = jax.random.split(key)
        params = {"model": self.world_model.init(k_model, example_obs)}
        slow_critic = {}
        if self.actor_critic is not None:
            params.update(self.actor_critic.init(k_ac, self.feat_dim))
            slow_critic = jax.tree.map(jnp.copy, params["critic"])  # donated apart
        return Learner(params, slow_critic, self.optimizer.init(params),
                       PercentileScale.create())

    def env_action(self, action):
        """An action in agent units (one-hot; [-1, 1]) in the env's: an index, or the box."""
        if self.discrete:
            return jnp.argmax(action, -1)
        return self.low + (jnp.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)

    def model_action(self, action):
        """An env action as the replay keeps it: an index, or the box mapped to [-1, 1]."""
        if self.discrete:
            return action
        return (action - self.low) / (0.5 * (self.high - self.low)) - 1.0

    def policy(self) -> acting.Policy:
        """Acting with a ``Learner``: filter the observation into the world model's state
        (``protocol.through_model``), then sample the actor at ``temperature``."""
        model_params = lambda learner: learner.params["model"]  # noqa: E731
        actor = self.actor_critic.acting_policy(
            self.world_model, lambda learner: learner.params["actor"], model_params)
        return protocol.through_model(self.world_model, model_params, actor, self.env_action)

    def planner(self, hyper: mppi.MPPIHyper) -> acting.Policy:
        """Acting by MPPI in the world model (``agents.mppi``) from the state each observation
        is filtered into (``protocol.through_model``): candidates scored by their imagined
        rewards and the critic's value at their last state, the actor's rollouts among
        them (TD-MPC2's way with its Q and policy prior)."""
        wm, ac = self.world_model, self.actor_critic
        model_params = lambda learner: learner.params["model"]  # noqa: E731

        def terminal_value(learner, final, key):
            del key
            feat = wm.features(model_params(learner), final)
            return ac.hyper.value_head.predict(ac.critic.apply(learner.params["critic"], feat))

        def prior(learner, state, key):
            if not hyper.num_pi_trajs:
                return None
            starts = jax.tree.map(lambda x: jnp.broadcast_to(x, (hyper.num_pi_trajs,)
                                                             + x.shape), state)
            return protocol.imagine(wm, model_params(learner), starts, ac.model_action(
                wm, learner.params["actor"]), hyper.horizon, key).actions

        objective = mppi.model_objective(wm, model_params, terminal_value, ac.hyper.gamma,
                                         prior)
        return protocol.through_model(wm, model_params,
                                      mppi.policy(objective, hyper, self.action_dim),
                                      self.env_action)

    def losses(self, params, slow_critic, retnorm, batch, key):
        k_model, k_ac = jax.random.split(key)
        model_loss, (metrics, post) = self.world_model.loss(params["model"], batch, k_model)
        if self.actor_critic is None:  # the model alone (an agent that learns elsewhere)
            return model_loss, (metrics, retnorm)
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
                params["critic"], slow_critic, self.world_model.features(params["model"], post),
                batch,
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
            slow = self.actor_critic.slow_update(learner.slow_critic, params["critic"]) \
                if self.actor_critic is not None else learner.slow_critic
            metrics = {**metrics, "optim/grad_norm": optax.tree.norm(grads),
                       "optim/update_norm": optax.tree.norm(updates)}
            return Learner(params, slow, opt_state, retnorm), metrics

        return update

    def report(self, params, batch, context: int, key) -> dict:
        """The world model's open-loop predictions on ``batch``: ``context`` observed steps,
        then the model alone under the replayed actions."""
        return self.world_model.report(params["model"], batch, context, key)


def config_block(**overrides) -> ml_collections.ConfigDict:
    """The ``config.dreamer`` block: the official ``configs.yaml`` defaults (jaxwm/configs/dreamer.py
    says where jaxwm differs)."""
    d = ml_collections.ConfigDict()
    d.model_size = "12m"
    d.size_overrides = ml_collections.ConfigDict()  # e.g. {"deter": 64}: debug sizes
    d.batch_size = 16
    d.batch_length = 64
    d.train_ratio = 32.0
    d.steps_per_collect = 1  # per env
    d.prefill = 64  # steps per env of random actions before the first update
    d.capacity = 1_000_000  # transitions over all envs (capacity // num_envs steps of each)
    d.learning_rate = 4e-5
    d.agc = 0.3
    d.warmup = 1000
    d.horizon = 15
    d.gamma = 1.0 - 1.0 / 333
    d.lambda_ = 0.95
    d.entropy = 3e-4
    d.unimix = 0.01  # the world model's latents
    # The actor's categorical: the official code mixes in none (its categorical policy head
    # ignores unimix); the paper says 1%.
    d.actor_unimix = 0.0
    # Reward head and critic two-hot (jaxwm/ops/twohot.py): "symexp" bins in raw space as the
    # official code, "symlog" as the paper.
    d.twohot = "symexp"
    # The critic's loss on replayed states (official repval, scale 0.3; 0: off).
    d.repval = 0.3
    # The actor's gradient for continuous actions: "backprop" through the imagined dynamics
    # (the paper's), or "reinforce" (the newest official release's; any world model).
    d.actor_grad_cont = "backprop"
    d.min_std = 0.1
    d.max_std = 1.0
    d.slow_rate = 0.02
    d.slow_reg = 1.0
    d.return_rate = 0.01
    d.return_limit = 1.0
    d.num_bins = 255
    # float32 | bfloat16: the networks' compute (official: bfloat16 on accelerators);
    # parameters, the recurrent state, logits and losses stay float32.
    d.compute_dtype = "float32"
    # Open-loop predictions every report_every updates (0: never): report_context observed
    # steps, then the model alone (official report_length 32; 5 context frames as the paper's
    # video predictions), as a GIF for image observations and an MSE for all.
    d.report_every = 500
    d.report_batch = 6
    d.report_length = 32
    d.report_context = 5
    d.update(overrides)
    return d


def _choices(values) -> str:
    return "{" + ", ".join(map(str, values)) + "}"


# ``config.dreamer``'s settings: ``{key: (range, description)}`` (``jaxwm.config``'s field
# rules; ``jaxwm/configs/dreamer.py`` composes them).
FIELDS = {
    "model_size": (_choices(rssm.SIZES), "DreamerV3's model size (official default 200m)."),
    "size_overrides.*": ("> 0", "Overrides one of model_size's sizes (deter, hidden, classes, ...)."),
    "batch_size": ("> 0", "Replayed sequences per update."),
    "batch_length": ("> 1", "Steps per replayed sequence."),
    "train_ratio": ("> 0", "Replayed steps trained on per env step (batch_size x batch_length)."),
    "steps_per_collect": ("> 0", "Env steps of each env per collect call."),
    "prefill": ("> 0", "Random-action steps per env before the first update."),
    "capacity": ("> 0", "Replay capacity, transitions over all envs (official 5e6)."),
    "learning_rate": ("> 0", "Learning rate of the one optimiser (world model and actor-critic)."),
    "agc": (">= 0", "Adaptive gradient clipping: max grad/param norm ratio per tensor; 0: off."),
    "warmup": (">= 0", "Updates of linear learning-rate warm-up; 0: none."),
    "horizon": ("> 0", "Imagination steps of the actor-critic."),
    "gamma": ("(0, 1]", "Discount of imagined returns (official 1 - 1/333)."),
    "lambda_": ("[0, 1]", "lambda of the lambda-returns."),
    "entropy": (">= 0", "Actor entropy bonus scale."),
    "unimix": ("[0, 1]", "Uniform mix into the world model's latent categoricals."),
    "actor_unimix": ("[0, 1)", "Uniform mix into the actor's categorical (official code: 0)."),
    "twohot": (_choices(twohot.SPACES),
               "Reward and critic two-hot bins: symexp (official code), symlog (paper)."),
    "repval": (">= 0", "Scale of the critic's loss on replayed states (official 0.3); 0: off."),
    "actor_grad_cont": ("{backprop, reinforce}",
                        "Continuous actor's gradient: through the dynamics, or REINFORCE."),
    "min_std": (">= 0", "Continuous actor's minimum std."),
    "max_std": ("> 0", "Continuous actor's maximum std."),
    "slow_rate": ("[0, 1]", "EMA rate of the slow critic per update."),
    "slow_reg": (">= 0", "Scale of the critic's loss towards the slow critic."),
    "return_rate": ("[0, 1]", "EMA rate of the 5th-95th return percentiles (advantage scale)."),
    "return_limit": ("> 0", "Advantage scale's floor: max(limit, P95 - P5)."),
    "num_bins": ("> 1", "Two-hot bins of the reward head and the critic."),
    "compute_dtype": ("{float32, bfloat16}",
                      "Networks' compute dtype (official: bfloat16 on accelerators)."),
    "report_every": (">= 0", "Updates between open-loop prediction reports; 0: never."),
    "report_batch": ("> 0", "Replayed sequences per report."),
    "report_length": ("> 0", "Steps per report sequence (official 32)."),
    "report_context": ("> 0", "Observed steps before the model predicts alone (paper: 5)."),
}


def config_checks(d, num_envs: int) -> list[tuple[bool, str]]:
    """``(ok, message)`` checks of a ``config.dreamer`` block for ``num_envs`` envs."""
    return [
        (d.model_size in rssm.SIZES, f"dreamer.model_size={d.model_size!r} does not exist; "
                                     f"choose one of {list(rssm.SIZES)}."),
        (d.batch_length > 1, "dreamer.batch_length must be > 1."),
        (d.train_ratio > 0, f"dreamer.train_ratio must be > 0, got {d.train_ratio}."),
        (d.capacity // num_envs >= max(d.prefill, d.batch_length),
         f"dreamer.capacity={d.capacity} transitions hold {d.capacity // num_envs} "
         f"steps of each of the {num_envs} envs; they must hold dreamer.prefill "
         f"({d.prefill}) and batch_length ({d.batch_length}) steps."),
        (d.prefill >= d.batch_length, f"dreamer.prefill={d.prefill} must be >= batch_length "
                                      f"{d.batch_length}: the first update samples sequences."),
        (d.compute_dtype in ("float32", "bfloat16"),
         f"dreamer.compute_dtype={d.compute_dtype!r}: choose 'float32' or 'bfloat16' "
         "(bfloat16 pays off on accelerators; on a CPU it is slower)."),
        (0 < d.report_context < d.report_length <= d.prefill,
         "dreamer.report_context must be in (0, report_length) and report_length <= prefill."),
        (d.twohot in twohot.SPACES, f"dreamer.twohot={d.twohot!r}: choose one of "
                                    f"{twohot.SPACES} (symexp: the official code's bins)."),
        (d.repval >= 0 and 0 <= d.actor_unimix < 1,
         "dreamer.repval must be >= 0 and dreamer.actor_unimix in [0, 1)."),
        (d.actor_grad_cont in ("backprop", "reinforce"),
         f"dreamer.actor_grad_cont={d.actor_grad_cont!r}: choose backprop or reinforce."),
    ]


def make(spec, d, world_model=None, learns_in_imagination: bool = True) -> DreamerAgent:
    """The agent for an ``EnvSpec`` from a ``config.dreamer`` block: DreamerV3's RSSM, or
    another trainable world model on the protocol (``agents.components``); with
    ``learns_in_imagination`` False the model alone (no actor-critic)."""
    action_dim = spec.num_actions if spec.discrete else spec.action_shape[0]
    dtype = jnp.dtype(d.compute_dtype)
    if world_model is None:
        world_model = rssm.for_spec(spec, d)
    units = {**rssm.SIZES[d.model_size], **dict(d.size_overrides)}["units"]
    hyper = imagination.ActorCriticHyper.from_config(d)
    actor_critic = imagination.ActorCritic(
        imagination.Actor(action_dim, spec.discrete, units, unimix=hyper.actor_unimix,
                          min_std=hyper.min_std, max_std=hyper.max_std, dtype=dtype),
        imagination.critic(units, num_bins=hyper.num_bins, dtype=dtype), hyper) \
        if learns_in_imagination else None
    low = high = None
    if not spec.discrete:
        low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
    feat = jax.eval_shape(lambda: world_model.features(None, world_model.initial(None, 1)))
    return DreamerAgent(
        world_model, actor_critic,
        optim.dreamer_optimizer(d.learning_rate, agc=d.agc, warmup=d.warmup),
        feat_dim=feat.shape[-1], action_dim=action_dim, discrete=spec.discrete, low=low,
        high=high)
