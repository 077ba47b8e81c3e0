"""Actor-critic network: observation window -> encoder -> memory backbone -> policy and value.

Every call takes ``(carry, obs [B, T, *obs_shape], reset [B, T])`` (time on axis 1, the
library convention) and returns ``(carry, distribution, value [B, T])``. The carry is
``(frames, memory)``: the last ``frames - 1`` vector observations (``network.frames``, the
"4 frames" agent; empty for 1) and the backbone's memory (``nets.backbones``). Both reset
where ``reset`` is set. The rollout calls the network with T = 1, the update with whole
sequences, so PPO never reshapes per backbone.

Layout follows CleanRL: pixels use one shared torso (Nature CNN) for both heads; with the
feed-forward backbone, vector observations may use separate actor and critic MLPs
(``separate_critic``). With a memory backbone both heads always read the backbone's output,
so the critic sees the memory too (BenchNetRL's agents do the same). Each head may have its
own hidden layers (``ff.head_hidden``, ``rnn.head_hidden``; BenchNetRL's FF agent has two of
512, its memory agents none, Craftax_Baselines' GRU agent two of 512). Output layers use
orthogonal init with gain 0.01 (policy) and 1.0 (value).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import ml_collections
import numpy as np

from jaxwm.config import ConfigError
from jaxwm.nets import backbones
from jaxwm.nets.backbones.window import empty_window
from jaxwm.nets.distributions import Categorical, DiagGaussian
from jaxwm.nets.encoders import MLP, GridCNN, MinAtarCNN, NatureCNN, orthogonal

ENCODERS = ("mlp", "nature_cnn", "grid_cnn", "minatar_cnn")


def config_block(**overrides) -> ml_collections.ConfigDict:
    """The ``config.network`` block: encoder, memory backbone and their sizes."""
    n = ml_collections.ConfigDict()
    n.encoder = "auto"  # auto | mlp | nature_cnn | grid_cnn | minatar_cnn
    n.hidden = (64, 64)  # the MLP encoder's layers (vector observations)
    n.activation = "tanh"
    # ff | lstm | gru | trxl | gtrxl | mamba | mamba2 (jaxwm/nets/backbones); each reads its
    # block below. Sizes are BenchNetRL's Atari settings (its run scripts); variants adjust them.
    n.backbone = "ff"
    n.frames = 1  # > 1: the last `frames` vector observations, concatenated ("PPO-4")
    n.separate_critic = True  # ff only: the critic gets its own MLP on the observation
    n.ff = ml_collections.ConfigDict(dict(head_hidden=()))  # BenchNetRL's FF heads: (512, 512)
    n.rnn = ml_collections.ConfigDict(dict(hidden=256, head_hidden=()))  # lstm, gru
    n.trxl = ml_collections.ConfigDict(dict(dim=512, layers=1, heads=2, memory=64))  # trxl, gtrxl
    # BenchNetRL trains the Mamba block at lr 1e-4 with the rest at 2.5e-4: a scale of 0.4.
    # scan: auto (sequential on CPU, associative on accelerators) | associative | sequential
    n.mamba = ml_collections.ConfigDict(dict(dim=450, state=64, conv=4, expand=1, scan="auto",
                                             learning_rate_scale=0.4))
    n.mamba2 = ml_collections.ConfigDict(dict(dim=512, state=64, conv=4, expand=1, headdim=64,
                                              chunk=64, learning_rate_scale=0.4))
    n.update(overrides)
    return n


# ``config_block``'s settings: ``{key: (valid range, description)}`` (``jaxwm.config``).
FIELDS = {
    "encoder": ("{auto, mlp, nature_cnn, grid_cnn, minatar_cnn}",
                "Observation encoder; auto: MLP on vectors, a CNN on pixels."),
    "hidden": ("> 0", "Layer widths of the MLP encoder (and of a separate critic's MLP)."),
    "activation": ("{tanh, relu, silu}", "Activation of the MLP encoder's layers."),
    "backbone": ("{ff, lstm, gru, trxl, gtrxl, mamba, mamba2}",
                 "Memory backbone after the encoder (BenchNetRL's set); ff: none."),
    "frames": ("> 0", "Last vector observations concatenated as input (PPO-4: 4)."),
    "separate_critic": (None, "ff on vectors: the critic gets an MLP of its own (CleanRL's)."),
    "ff.head_hidden": ("> 0", "ff: hidden ReLU layers of each head (BenchNetRL's: 512, 512)."),
    "rnn.hidden": ("> 0", "lstm, gru: hidden state size."),
    "rnn.head_hidden": ("> 0", "lstm, gru: hidden ReLU layers of each head (Craftax_Baselines': "
                        "512, 512)."),
    "trxl.dim": ("> 0", "trxl, gtrxl: model width (divisible by heads)."),
    "trxl.layers": ("> 0", "trxl, gtrxl: transformer blocks (Dai et al. 2019)."),
    "trxl.heads": ("> 0", "trxl, gtrxl: attention heads."),
    "trxl.memory": ("> 0", "trxl, gtrxl: earlier steps of the episode each step attends to."),
    "mamba.dim": ("> 0", "mamba: width the block projects its input to (Gu & Dao 2023)."),
    "mamba.state": ("> 0", "mamba: SSM state size per channel (N)."),
    "mamba.conv": ("> 0", "mamba: kernel width of the causal depthwise convolution."),
    "mamba.expand": ("> 0", "mamba: the mixer's inner width is expand x dim."),
    "mamba.scan": ("{auto, associative, sequential}",
                   "mamba: selective scan; auto: sequential on CPU, associative elsewhere."),
    "mamba.learning_rate_scale": (">= 0", "mamba: factor on its learning rate (BenchNetRL's 0.4)."),
    "mamba2.dim": ("> 0", "mamba2: width the block projects its input to (Dao & Gu 2024)."),
    "mamba2.state": ("> 0", "mamba2: SSM state size (N)."),
    "mamba2.conv": ("> 0", "mamba2: kernel width of the causal depthwise convolution."),
    "mamba2.expand": ("> 0", "mamba2: the mixer's inner width is expand x dim."),
    "mamba2.headdim": ("> 0", "mamba2: width of each SSD head (divides expand x dim)."),
    "mamba2.chunk": ("> 0", "mamba2: chunk length of the chunked SSD scan."),
    "mamba2.learning_rate_scale": (">= 0",
                                   "mamba2: factor on its learning rate (BenchNetRL's 0.4)."),
}


def make_encoder(kind: str, hidden: Sequence[int], activation: str,
                 canonical_backward: bool | None = None) -> nn.Module:
    if kind == "mlp":
        return MLP(tuple(hidden), activation)
    if kind == "nature_cnn":
        return NatureCNN(canonical_backward=canonical_backward)
    if kind == "grid_cnn":
        return GridCNN()
    if kind == "minatar_cnn":
        return MinAtarCNN()
    raise ConfigError(f"network.encoder={kind!r} is unknown; choose one of {ENCODERS} or 'auto'.")


class ActorCritic(nn.Module):
    """Policy and value heads over an encoder and a (possibly memory) backbone."""

    discrete: bool
    action_dim: int
    encoder: str = "mlp"
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    memory: backbones.Backbone | None = None  # None: feed-forward
    frames: int = 1  # > 1: the last `frames` vector observations, concatenated
    obs_size: int = 0  # vector observation size, for the frame window's empty carry
    head_hidden: Sequence[int] = ()  # hidden layers of each head (ReLU)
    separate_critic: bool = True
    canonical_backward: bool | None = None  # see nets.conv; None: on the CPU backend only

    @property
    def has_memory(self) -> bool:
        """Whether anything is carried between steps (PPO then trains on whole sequences)."""
        return self.frames > 1 or self.memory is not None

    def initialize_carry(self, batch_size: int):
        window = ()
        if self.frames > 1:
            window = empty_window(batch_size, self.frames, self.obs_size)
        memory = self.memory.initialize_carry(batch_size) if self.memory is not None else ()
        return window, memory

    @nn.compact
    def __call__(self, carry, obs, reset):
        window_carry, memory_carry = carry
        if self.frames > 1:
            window_carry, obs = backbones.FrameStack(self.frames, self.obs_size, name="frames")(
                window_carry, obs, reset)
        batch, time = obs.shape[:2]
        flat_obs = obs.reshape((batch * time,) + obs.shape[2:])
        features = make_encoder(self.encoder, self.hidden, self.activation,
                                self.canonical_backward)(flat_obs)
        features = features.reshape((batch, time, -1))
        if self.memory is not None:
            memory_carry, features = self.memory(memory_carry, features, reset)

        head = lambda: MLP(tuple(self.head_hidden), "relu")  # noqa: E731
        policy_out = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01))(head()(features))
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
        value = nn.Dense(1, kernel_init=orthogonal(1.0))(head()(critic_in))[..., 0]
        return (window_carry, memory_carry), dist, value


def resolve_encoder(spec, encoder: str) -> str:
    if encoder != "auto":
        return encoder
    if not spec.is_pixels:
        return "mlp"
    return {"minigrid": "grid_cnn", "minatar": "minatar_cnn"}.get(spec.family, "nature_cnn")


def validate(spec, net_config) -> None:
    """Checks the network config against the env before anything is built: the backbone's
    settings, and the encoder against the observations (an image encoder on vectors, or an
    MLP on images, would fail deep inside the first trace)."""
    backbones.validate(net_config)
    encoder = resolve_encoder(spec, net_config.encoder)
    if encoder not in ENCODERS:
        raise ConfigError(f"network.encoder={encoder!r} is unknown; choose one of {ENCODERS} "
                          "or 'auto'.")
    takes_pixels = encoder != "mlp"
    if takes_pixels != spec.is_pixels:
        kind = "images" if spec.is_pixels else "vectors"
        raise ConfigError(
            f"network.encoder={encoder!r} takes {'images' if takes_pixels else 'vectors'}; "
            f"{spec.env_id} observes {kind} of shape {spec.obs_shape}. Use a config made for "
            f"this env family (ppo: cartpole, mujoco, atari, minigrid) or "
            f"--config.network.encoder=auto.")
    if net_config.frames > 1 and spec.is_pixels:
        raise ConfigError(f"network.frames={net_config.frames} stacks vector observations; "
                          f"{spec.env_id} has pixels: set env.frame_stack instead (Atari).")


def head_layers(net_config) -> tuple[int, ...]:
    """The hidden layers of each head: the backbone's own setting (ff, lstm and gru have
    one; the others' heads read the backbone directly)."""
    block = {"ff": "ff", "lstm": "rnn", "gru": "rnn"}.get(net_config.backbone)
    return tuple(net_config[block].head_hidden) if block else ()


def make_actor_critic(spec, net_config) -> ActorCritic:
    """Builds the network for an EnvSpec from a config's ``network`` block."""
    validate(spec, net_config)
    encoder = resolve_encoder(spec, net_config.encoder)
    feed_forward = net_config.backbone == "ff"
    return ActorCritic(
        discrete=spec.discrete,
        action_dim=spec.num_actions if spec.discrete else int(np.prod(spec.action_shape)),
        encoder=encoder,
        hidden=tuple(net_config.hidden),
        activation=net_config.activation,
        memory=None if feed_forward else backbones.make(net_config),
        frames=int(net_config.frames),
        obs_size=int(np.prod(spec.obs_shape)) if not spec.is_pixels else 0,
        head_hidden=head_layers(net_config),
        # A memory backbone's critic reads the backbone: a separate MLP would bypass the memory.
        separate_critic=bool(net_config.separate_critic) and encoder == "mlp" and feed_forward,
    )

