"""Actor-critic network with a recurrent-carry interface shared by every backbone.

Every call takes ``(carry, obs [B, T, *obs_shape], reset [B, T])`` (time on axis 1, the
library convention) and returns ``(carry, distribution, value [B, T])``. Feed-forward
backbones have an empty carry and fold time into the batch; recurrent backbones (LSTM, GRU,
TrXL, Mamba, added later) scan over T and zero their state where ``reset`` is set. The
rollout calls it with T = 1, the update with the whole sequence, so PPO never reshapes per
backbone.

Layout follows CleanRL: pixels use one shared torso (Nature CNN) for both heads; vector
observations use separate actor and critic MLPs (``separate_critic``). Output layers use
orthogonal init with gain 0.01 (policy) and 1.0 (value).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import numpy as np

from jaxwm.config import ConfigError
from jaxwm.nets.distributions import Categorical, DiagGaussian
from jaxwm.nets.encoders import MLP, GridCNN, NatureCNN, orthogonal

ENCODERS = ("mlp", "nature_cnn", "grid_cnn")


def make_encoder(kind: str, hidden: Sequence[int], activation: str,
                 canonical_backward: bool | None = None) -> nn.Module:
    if kind == "mlp":
        return MLP(tuple(hidden), activation)
    if kind == "nature_cnn":
        return NatureCNN(canonical_backward=canonical_backward)
    if kind == "grid_cnn":
        return GridCNN()
    raise ConfigError(f"network.encoder={kind!r} is unknown; choose one of {ENCODERS} or 'auto'.")


class FeedForward(nn.Module):
    """The trivial backbone: no memory, so the carry is an empty tuple."""

    @staticmethod
    def initialize_carry(batch_size: int):
        del batch_size
        return ()

    @nn.compact
    def __call__(self, carry, features, reset):
        del reset
        return carry, features


BACKBONES = {"ff": FeedForward}


class ActorCritic(nn.Module):
    """Policy and value heads over an encoder and a (possibly recurrent) backbone."""

    discrete: bool
    action_dim: int
    encoder: str = "mlp"
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    backbone: str = "ff"
    separate_critic: bool = True
    canonical_backward: bool | None = None  # see nets.conv; None: on CPU only

    def initialize_carry(self, batch_size: int):
        return BACKBONES[self.backbone].initialize_carry(batch_size)

    @nn.compact
    def __call__(self, carry, obs, reset):
        batch, time = obs.shape[:2]
        flat_obs = obs.reshape((batch * time,) + obs.shape[2:])
        features = make_encoder(self.encoder, self.hidden, self.activation,
                                self.canonical_backward)(flat_obs)
        features = features.reshape((batch, time, -1))
        carry, features = BACKBONES[self.backbone]()(carry, features, reset)

        policy_out = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01))(features)
        if self.discrete:
            dist = Categorical(policy_out)
        else:
            log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
            dist = DiagGaussian(policy_out, log_std)

        if self.separate_critic:
            critic_in = MLP(tuple(self.hidden), self.activation)(flat_obs)
            critic_in = critic_in.reshape((batch, time, -1))
        else:
            critic_in = features
        value = nn.Dense(1, kernel_init=orthogonal(1.0))(critic_in)[..., 0]
        return carry, dist, value


def make_actor_critic(spec, net_config) -> ActorCritic:
    """Builds the network for an EnvSpec from a config's ``network`` block."""
    encoder = net_config.encoder
    if encoder == "auto":
        if not spec.is_pixels:
            encoder = "mlp"
        elif spec.family == "minigrid":
            encoder = "grid_cnn"
        else:
            encoder = "nature_cnn"
    return ActorCritic(
        discrete=spec.discrete,
        action_dim=spec.num_actions if spec.discrete else int(np.prod(spec.action_shape)),
        encoder=encoder,
        hidden=tuple(net_config.hidden),
        activation=net_config.activation,
        backbone=net_config.backbone,
        separate_critic=bool(net_config.separate_critic) and encoder == "mlp",
    )


