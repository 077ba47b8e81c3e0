"""DreamerV3's actor-critic, learned purely from trajectories imagined by the world model
(Hafner et al. 2023, sec. 2 "Critic learning" and "Actor learning"; the official
danijar/dreamerv3 ``agent.py::imag_loss``).

From every posterior state of a replayed batch (the starts, gradients stopped) the world
model imagines H = 15 steps under the actor (``models.protocol.imagine``, any model of the
protocol). Then:

* rewards r_t and continue flags c_t come from the model's heads at the states reached
  (the start's continue flag is the data's); the discount is gamma = 1 - 1/333;
* lambda-returns R_t (eq. 7, ``ops.returns.lambda_return``, lambda 0.95) bootstrap from the
  critic's value of the last state;
* the critic is a two-hot distribution over 255 bins (zero-initialised output layer; bins
  and prediction in raw space as the official code, or in symlog space as the paper:
  ``ops.twohot.Regression``), trained toward sg(R_t) plus a regulariser toward the slow
  critic's prediction (an EMA of its parameters, rate 0.02, regulariser scale 1.0);
* returns are normalised by S = max(1, P95 - P5) of the batch's returns, an EMA with rate
  0.01 (eq. 11, ``ops.normalize.PercentileScale``), so small returns are not amplified;
* actor loss (eq. 11): discrete actions use REINFORCE, -sg((R_t - v_t) / S) log pi(a_t),
  continuous ones backpropagate the normalised return through the imagined dynamics (the
  paper's choice, ``actor_grad_cont="backprop"``) or use REINFORCE too
  (``"reinforce"``, as the newest official release does; it needs no gradient through the
  model); both add eta H[pi] with eta = 3e-4;
* every step is weighted by the imagined probability of still being in the episode,
  prod_{i<=t} gamma c_i / gamma (gradients stopped).

The critic also learns on the replayed states themselves (``replay_value_loss``, the
official ``repl_loss``, scale 0.3; the paper does not describe it): lambda-returns of the real
rewards and terminals, bootstrapped from the imagined return of each replayed state. Its
gradients reach the world model too (official ``repval_grad``). With it, and the raw-space
two-hot, jaxwm's critic values on CartPole track the official code's (benchmarks/fidelity/);
without them they rose far more slowly.

The actor's categorical has no uniform mix by default (the official code's categorical policy
head ignores ``unimix``; the paper says 1%: ``actor_unimix``); continuous actions are a normal
with mean tanh(mu) and std in [0.1, 1] (``bounded_normal``), in the env's [-1, 1] box.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.envs import acting
from jaxwm.models import protocol
from jaxwm.models.rssm import MLP, dense_block, unimix_logits
from jaxwm.nets.distributions import Categorical, DiagGaussian, sample_at_temperature
from jaxwm.ops import twohot
from jaxwm.ops.returns import lambda_return


@dataclasses.dataclass(frozen=True)
class ActorCriticHyper:
    horizon: int = 15
    gamma: float = 1.0 - 1.0 / 333
    lambda_: float = 0.95
    entropy: float = 3e-4
    actor_unimix: float = 0.0
    min_std: float = 0.1
    max_std: float = 1.0
    slow_rate: float = 0.02
    slow_reg: float = 1.0
    return_rate: float = 0.01
    return_limit: float = 1.0
    num_bins: int = 255
    twohot: str = "symexp"  # the critic's two-hot space (ops.twohot.Regression)
    repval: float = 0.3  # the replay value loss's scale (0: off)
    actor_grad_cont: str = "backprop"  # continuous actions: "backprop" | "reinforce"

    @property
    def value_head(self) -> twohot.Regression:
        return twohot.Regression(self.twohot, self.num_bins)

    @classmethod
    def from_config(cls, c) -> ActorCriticHyper:
        return cls(**{f.name: c[f.name] for f in dataclasses.fields(cls) if f.name in c})


class Actor(nn.Module):
    action_dim: int
    discrete: bool
    units: int
    layers: int = 3
    unimix: float = 0.0
    min_std: float = 0.1
    max_std: float = 1.0
    dtype: jnp.dtype = jnp.float32  # compute dtype; the distribution's parameters are float32

    @nn.compact
    def __call__(self, feat):
        x = dense_block(feat, self.units, self.layers, "mlp", self.dtype)
        # Small outputs (official outscale 0.01 on the std): the initial policy is near
        # uniform / mean 0.
        init = nn.initializers.variance_scaling(0.01 ** 2, "fan_in", "truncated_normal")
        if self.discrete:
            logits = nn.Dense(self.action_dim, kernel_init=init, dtype=self.dtype, name="out")(x)
            logits = logits.astype(jnp.float32)
            return Categorical(unimix_logits(logits, self.unimix) if self.unimix else logits)
        out = nn.Dense(2 * self.action_dim, kernel_init=init, dtype=self.dtype, name="out")(x)
        mean, std = jnp.split(out.astype(jnp.float32), 2, -1)
        return bounded_normal(mean, std, self.min_std, self.max_std)


def bounded_normal(mean, std, min_std: float, max_std: float) -> DiagGaussian:
    """Normal(tanh(mean), (max - min) sigmoid(std + 2) + min) (official ``bounded_normal``)."""
    std = (max_std - min_std) * jax.nn.sigmoid(std + 2.0) + min_std
    return DiagGaussian(jnp.tanh(mean), jnp.log(std))


def critic(units: int, layers: int = 3, num_bins: int = 255, dtype=jnp.float32) -> MLP:
    """The two-hot critic: an MLP with a zero-initialised output layer (values start at 0)."""
    return MLP(units, layers, num_bins, out_init=nn.initializers.zeros, dtype=dtype)


@dataclasses.dataclass(frozen=True)
class ActorCritic:
    actor: Actor
    critic: MLP
    hyper: ActorCriticHyper

    def init(self, key, feat_dim: int):
        """{actor, critic} parameters (the algorithm starts its slow critic as a copy of the
        critic: ``algos.dreamer``)."""
        k_actor, k_critic = jax.random.split(key)
        feat = jnp.zeros((1, feat_dim))
        return {"actor": self.actor.init(k_actor, feat), "critic": self.critic.init(k_critic, feat)}

    def policy(self, actor_params, feat):
        return self.actor.apply(actor_params, feat)

    def model_action(self, world_model, actor_params):
        """``act(feat, key) -> action`` in the model's agent units for ``protocol.imagine``;
        samples are reparameterised for continuous actions (gradients reach the actor)."""

        def act(feat, key):
            return protocol.agent_action(world_model, self.policy(actor_params, feat).sample(key))

        return act

    def acting_policy(self, world_model, actor_params: Callable,
                      model_params: Callable) -> acting.Policy:
        """The actor as a policy over ``world_model``'s states (``protocol.through_model``'s
        ``inner``): a sample at ``temperature`` from the state's features, in agent units.
        ``actor_params(params)`` and ``model_params(params)`` pick each part's parameters."""

        def act(params, carry, state, is_first, key, temperature=1.0):
            del is_first
            feat = world_model.features(model_params(params), state)
            dist = self.policy(actor_params(params), feat)
            return carry, protocol.agent_action(
                world_model, sample_at_temperature(dist, key, temperature)), {}

        return acting.Policy(init_carry=lambda params, num_envs: (), act=act)

    def slow_update(self, slow_critic, critic):
        """The slow critic's EMA step (official ``slowvalue``, rate 0.02 every update)."""
        rate = self.hyper.slow_rate
        return jax.tree.map(lambda s, c: (1 - rate) * s + rate * c, slow_critic, critic)

    def loss(self, params, slow_critic, world_model, model_params, starts, start_cont, retnorm,
             key):
        """Actor and critic losses from imagined rollouts.

        ``params``: {actor, critic}; ``slow_critic``: the critic's EMA (no gradient);
        ``model_params``: the world model's (gradients stopped); ``starts``: model states
        [N, ...] (stopped); ``start_cont``: [N] 1 - is_terminal of the starts; ``retnorm``:
        a ``PercentileScale``. Returns (loss, (metrics, updated retnorm)).
        """
        h = self.hyper
        sg = jax.lax.stop_gradient
        value_head = h.value_head
        model_params, starts = sg(model_params), sg(starts)
        trajectory = protocol.imagine(world_model, model_params, starts,
                                      self.model_action(world_model, params["actor"]),
                                      h.horizon, key)
        feat = world_model.features(model_params, trajectory.states)  # [N, H + 1, F]
        actions, reward, cont = trajectory.actions, trajectory.rewards, trajectory.conts
        reinforce = world_model.discrete or h.actor_grad_cont == "reinforce"
        if reinforce:  # the trajectory itself carries no gradient
            feat, actions, reward, cont = sg(feat), sg(actions), sg(reward), sg(cont)
        cont = jnp.concatenate([start_cont[:, None], cont], 1)
        critic_logits = self.critic.apply(params["critic"], sg(feat))
        # Values inside the returns see the trajectory (continuous actions: gradients reach
        # the actor through them) but never train the critic.
        values = value_head.predict(self.critic.apply(sg(params["critic"]), feat))  # [N, H + 1]
        returns = jax.vmap(lambda r, v, c, b: lambda_return(r, v, c, b, h.gamma, h.lambda_))(
            reward, values[:, 1:], cont[:, 1:], values[:, -1])  # [N, H]
        # The probability of still being in the episode at step t (a stopped weight).
        weight = sg(jnp.cumprod(h.gamma * cont, 1) / h.gamma)

        retnorm = retnorm.update(returns, h.return_rate)
        scale = retnorm.scale(h.return_limit)
        advantage = (returns - sg(values[:, :-1])) / scale
        dist = self.policy(params["actor"], sg(feat[:, :-1]))
        if reinforce:
            taken = jnp.argmax(actions, -1) if world_model.discrete else actions
            objective = dist.log_prob(taken) * sg(advantage)
        else:  # dynamics backpropagation; the baseline only shifts, so it is stopped
            objective = (returns - sg(values[:, :-1])) / scale
        entropy = dist.entropy()
        actor_loss = jnp.mean(weight[:, :-1] * -(objective + h.entropy * entropy))

        critic_loss = jnp.mean(weight[:, :-1] * self.critic_loss(
            critic_logits[:, :-1], slow_critic, sg(feat[:, :-1]), sg(returns)))
        metrics = {
            "agent/actor_loss": actor_loss, "agent/critic_loss": critic_loss,
            "agent/entropy": jnp.mean(entropy), "agent/return_scale": scale,
            "agent/imagined_return": jnp.mean(returns), "agent/value": jnp.mean(values),
            "agent/imagined_reward": jnp.mean(reward), "agent/advantage": jnp.mean(advantage),
        }
        return actor_loss + critic_loss, (metrics, retnorm, returns[:, 0])

    def critic_loss(self, critic_logits, slow_critic, feat, targets):
        """Two-hot cross-entropy to ``targets`` plus ``slow_reg`` times that to the slow
        critic's prediction at ``feat`` (official ``imag_loss``/``repl_loss``), per element."""
        head = self.hyper.value_head
        slow = jax.lax.stop_gradient(head.predict(self.critic.apply(slow_critic, feat)))
        return head.loss(critic_logits, targets) + self.hyper.slow_reg * head.loss(critic_logits,
                                                                                   slow)

    def replay_value_loss(self, critic_params, slow_critic, feat, batch, boot):
        """The critic on replayed states (official ``repl_loss``; module docstring).

        ``feat`` [B, T, F]: the posterior features (gradients reach the world model);
        ``batch``: the replayed ``reward``, ``is_terminal``, ``is_first`` [B, T]; ``boot``
        [B, T]: the imagined lambda-return from each replayed state. Returns (loss, mean
        target).
        """
        h = self.hyper
        targets = jax.vmap(lambda r, t, f, b: replay_returns(r, t, f, b, h.gamma, h.lambda_))(
            batch["reward"], batch["is_terminal"], batch["is_first"],
            jax.lax.stop_gradient(boot))  # [B, T - 1]
        logits = self.critic.apply(critic_params, feat[:, :-1])
        loss = self.critic_loss(logits, slow_critic, jax.lax.stop_gradient(feat[:, :-1]),
                                targets)
        # A state that ends its episode has no return within this sequence (the next one is
        # a reset): not trained, as the official weight 1 - is_last.
        weight = 1.0 - batch["is_first"][:, 1:].astype(jnp.float32)
        return jnp.mean(weight * loss), jnp.mean(targets)


def replay_returns(reward, is_terminal, is_first, boot, gamma: float, lambda_: float):
    """Lambda-returns [T - 1] along ONE replayed sequence [T] in the replay's convention
    (``reward`` and ``is_terminal`` arrived with each observation, ``is_first`` marks a reset
    observation), bootstrapped from ``boot`` [T], the imagined return of each state (official
    ``repl_loss``'s ``lambda_return``):

        R_t = r_{t+1} + gamma (1 - term_{t+1}) ((1 - l_t) boot_{t+1} + l_t R_{t+1}),
        R_{T-1} = boot_{T-1},

    with l_t = lambda, or 0 where state t+1 is its episode's last (state t+2 is a reset), so
    that no return runs into the next episode.
    """
    is_last = jnp.concatenate([is_first[2:], jnp.zeros((1,), bool)])  # of states 1 .. T-1
    lambdas = jnp.where(is_last, 0.0, lambda_)
    return lambda_return(reward[1:], boot[1:], 1.0 - is_terminal[1:].astype(jnp.float32),
                         boot[-1], gamma, lambdas)
