"""DreamerV3's world model: encoder, recurrent state-space model (RSSM), decoder, reward and
continue heads, and their loss (Hafner et al. 2023, "Mastering Diverse Domains through World
Models", arXiv 2301.04104, sec. 2 "World model learning" and appendix; the official
danijar/dreamerv3 ``rssm.py``).

The model state is ``{"deter": h [B, D], "stoch": z [B, S, K]}``: a block GRU state h
(``nets.backbones.recurrent.BlockGRU``) and S = 32 one-hot categorical latents of K classes.

* sequence model   h_t = f(h_{t-1}, z_{t-1}, a_{t-1})
* encoder          z_t ~ q(z | h_t, x_t)      (posterior; ``observe``)
* dynamics         z_t ~ p(z | h_t)           (prior; ``step``)
* predictors       x_t, r_t, c_t from features [h_t, z_t]

Every categorical mixes 1% uniform into its probabilities ("unimix"), so each class keeps
probability >= 0.01 / K and the KL stays bounded; samples pass straight-through gradients.
Vector inputs and reconstruction targets are symlog-transformed (eq. 1); the reward head is
a two-hot distribution over 255 symlog bins with a zero-initialised output layer (eq. 9, 10),
the continue head a Bernoulli. The loss (eq. 3-5) is
``pred + 1.0 * max(1, KL[sg(q) || p]) + 0.1 * max(1, KL[q || sg(p)])`` (free bits of 1 nat
on each KL term separately, per step, before averaging).

Functional API (``WorldModel``; the network is a Flax module, the scans are plain JAX over
its ``apply``, time is axis 1): the world-model protocol (``models.protocol``: ``initial``,
``observe`` one step of the posterior, ``step`` one step of the prior with the reward and
continue heads, ``features``, ``decode``), ``observe_sequence(params, carry, embed,
prev_action, is_first, key)`` (the posterior over a sequence), ``loss(params, batch, key)``
and ``report`` (open-loop predictions).

Deliberate differences from the official code: images use DreamerV2's VALID-padded 4x4
stride-2 encoder and 5-5-6-6 transposed-convolution decoder (64x64 only), not DreamerV3's
"same"-padded ones, so that the encoder's convolutions are ``nets.conv.Conv2D``; the model
state at a sequence's start is zeros (as the 2023 release), not one replayed from earlier.
Neither convolution stack runs inside a scan: frames are encoded and decoded all at once, so
XLA:CPU's slow convolution-in-loop path (docs/architecture.md, "CPU convolutions") does not arise.
The decoder's transposed convolutions are ``nets.conv.ConvTranspose2D`` with
``nn.ConvTranspose``'s parameter layout (``flax_kernel``): flax's own form convolves the
stride-dilated input, and XLA:CPU ran it and its gradients several times slower
(``benchmarks/README.md``, DreamerV3).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.media import Video
from jaxwm.nets.backbones.recurrent import BlockGRU
from jaxwm.nets.conv import Conv2D, ConvTranspose2D
from jaxwm.ops import twohot

# deter / hidden / classes / CNN depth / MLP units (paper, table of model sizes; official
# configs.yaml ``size*``).
SIZES = {
    "1m": dict(deter=512, hidden=64, classes=4, depth=4, units=64),
    "12m": dict(deter=2048, hidden=256, classes=16, depth=16, units=256),
    "25m": dict(deter=3072, hidden=384, classes=24, depth=24, units=384),
    "50m": dict(deter=4096, hidden=512, classes=32, depth=32, units=512),
    "100m": dict(deter=6144, hidden=768, classes=48, depth=48, units=768),
    "200m": dict(deter=8192, hidden=1024, classes=64, depth=64, units=1024),
    "400m": dict(deter=12288, hidden=1536, classes=96, depth=96, units=1536),
}
IMAGE_SIZE = 64  # the convolution stacks map 64x64 <-> 2x2 (encoder) / 1x1 (decoder)


def dense_block(x, units: int, layers: int, name: str, dtype=jnp.float32):
    """``layers`` x (Dense -> RMSNorm -> SiLU), DreamerV3's MLP layer, computed in ``dtype``."""
    for i in range(layers):
        x = nn.Dense(units, dtype=dtype, name=f"{name}_{i}")(x)
        x = nn.silu(nn.RMSNorm(dtype=dtype, name=f"{name}_norm_{i}")(x))
    return x


class MLP(nn.Module):
    """``dense_block`` then, when ``out`` > 0, a Dense output layer, returned in float32: every
    head of DreamerV3 (prior, posterior, reward, continue, critic, vector decoder) and, with
    ``out = 0``, the RSSM's input layers."""

    units: int
    layers: int
    out: int = 0
    out_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = dense_block(x, self.units, self.layers, "hidden", self.dtype)
        if self.out:
            x = nn.Dense(self.out, kernel_init=self.out_init, dtype=self.dtype, name="out")(x)
        return x.astype(jnp.float32)


def unimix_logits(logits, unimix: float):
    """log((1 - u) softmax(logits) + u / K): every class keeps probability >= u / K."""
    probs = jax.nn.softmax(logits, -1)
    probs = (1.0 - unimix) * probs + unimix / logits.shape[-1]
    return jnp.log(probs)


def sample_onehot(key, logits):
    """One-hot sample with straight-through gradients (Bengio et al. 2013)."""
    probs = jax.nn.softmax(logits, -1)
    sample = jax.nn.one_hot(jax.random.categorical(key, logits), logits.shape[-1])
    return sample + probs - jax.lax.stop_gradient(probs)


def categorical_kl(logits_p, logits_q):
    """KL[p || q] of S independent categoricals [..., S, K], summed over the latents."""
    log_p = jax.nn.log_softmax(logits_p, -1)
    log_q = jax.nn.log_softmax(logits_q, -1)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=(-2, -1))


class Encoder(nn.Module):
    """Vectors: symlog, then an MLP. Images [..., C, 64, 64] uint8: 4 stride-2 convolutions
    of depth x (1, 2, 4, 8) with RMSNorm + SiLU, flattened."""

    units: int
    depth: int
    layers: int = 3
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, obs):
        if obs.ndim >= 3 and obs.dtype == jnp.uint8:
            batch = obs.shape[:-3]
            x = jnp.moveaxis(obs.reshape((-1,) + obs.shape[-3:]), -3, -1)
            x = x.astype(jnp.float32) / 255.0 - 0.5
            for i, mult in enumerate((1, 2, 4, 8)):
                x = Conv2D(self.depth * mult, 4, 2, dtype=self.dtype, name=f"conv_{i}")(x)
                x = nn.silu(nn.RMSNorm(dtype=self.dtype, name=f"conv_norm_{i}")(x))
            return x.reshape(batch + (-1,))
        return dense_block(twohot.symlog(obs), self.units, self.layers, "mlp", self.dtype)


class Decoder(nn.Module):
    """Features -> the observation's reconstruction: symlog(x) for vectors, pixels in
    [-0.5, 0.5] for images (DreamerV2's transposed-convolution stack)."""

    obs_shape: tuple[int, ...]
    units: int
    depth: int
    layers: int = 3
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, feat):
        if len(self.obs_shape) == 3:
            channels = self.obs_shape[0]
            batch = feat.shape[:-1]
            x = nn.Dense(32 * self.depth, dtype=self.dtype, name="project")(feat)
            x = x.reshape((-1, 1, 1, 32 * self.depth))
            # Parameters as nn.ConvTranspose's (flax_kernel), computed by nets.conv.
            for i, (mult, kernel) in enumerate(((4, 5), (2, 5), (1, 6))):
                x = ConvTranspose2D(self.depth * mult, kernel, 2, dtype=self.dtype,
                                    flax_kernel=True, name=f"deconv_{i}")(x)
                x = nn.silu(nn.RMSNorm(dtype=self.dtype, name=f"deconv_norm_{i}")(x))
            x = ConvTranspose2D(channels, 6, 2, dtype=self.dtype, flax_kernel=True,
                                name="deconv_out")(x)
            x = jnp.moveaxis(x, -1, -3).reshape(batch + tuple(self.obs_shape))
            return x.astype(jnp.float32)
        return MLP(self.units, self.layers, self.obs_shape[0], dtype=self.dtype, name="mlp")(feat)


class WorldModelNet(nn.Module):
    """Every parameter of the world model; the methods are single steps and heads."""

    obs_shape: tuple[int, ...]
    action_dim: int
    discrete: bool
    deter: int
    hidden: int
    classes: int
    depth: int
    units: int
    stoch: int = 32
    blocks: int = 8
    unimix: float = 0.01
    num_bins: int = 255
    # Compute dtype (bfloat16 on accelerators); parameters, the recurrent state, logits and
    # losses stay float32.
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.encoder = Encoder(self.units, self.depth, dtype=self.dtype)
        self.decoder = Decoder(tuple(self.obs_shape), self.units, self.depth, dtype=self.dtype)
        self.core = BlockGRU(self.deter, self.blocks, dtype=self.dtype)
        mlp = lambda units, layers, out=0, **kw: MLP(units, layers, out, dtype=self.dtype, **kw)  # noqa: E731
        self.core_in = [mlp(self.hidden, 1) for _ in ("h", "z", "a")]  # inputs of the GRU
        latents = self.stoch * self.classes
        self.prior_net = mlp(self.hidden, 2, latents)
        self.post_net = mlp(self.hidden, 1, latents)
        # Zero-initialised: predicted rewards start at exactly 0 (paper, "Critic learning").
        self.reward_net = mlp(self.units, 1, self.num_bins, out_init=nn.initializers.zeros)
        self.cont_net = mlp(self.units, 1, 1)

    def __call__(self, obs, action):
        """Touches every parameter once (for ``init``)."""
        batch = action.shape[0]
        state = {"deter": jnp.zeros((batch, self.deter)),
                 "stoch": jnp.zeros((batch, self.stoch, self.classes))}
        deter = self.step(state, action)
        feat = jnp.concatenate([deter, self.posterior(deter, self.encode(obs)).reshape(
            (batch, -1))], -1)
        return self.prior(deter), self.decode(feat), self.reward(feat), self.cont(feat)

    def encode(self, obs):
        return self.encoder(obs).astype(jnp.float32)

    def decode(self, feat):
        return self.decoder(feat)

    def step(self, state, action):
        """h_t = f(h_{t-1}, z_{t-1}, a_{t-1}) (official ``_core``). Continuous actions are
        divided by max(1, |a|) (a stop-gradient scale), as there."""
        if not self.discrete:
            action = action / jax.lax.stop_gradient(jnp.maximum(1.0, jnp.abs(action)))
        inputs = (state["deter"], state["stoch"].reshape(state["stoch"].shape[:-2] + (-1,)),
                  action)
        x = jnp.concatenate([layer(v) for v, layer in zip(inputs, self.core_in, strict=True)],
                            -1)
        return self.core(state["deter"], x)

    def _logits(self, flat):
        return unimix_logits(flat.reshape(flat.shape[:-1] + (self.stoch, self.classes)),
                             self.unimix)

    def prior(self, deter):
        return self._logits(self.prior_net(deter))

    def posterior(self, deter, embed):
        return self._logits(self.post_net(jnp.concatenate([deter, embed], -1)))

    def reward(self, feat):
        return self.reward_net(feat)

    def cont(self, feat):
        return self.cont_net(feat)[..., 0]


def features(state) -> jax.Array:
    """[h, flatten(z)], what every head and the actor-critic read."""
    stoch = state["stoch"]
    return jnp.concatenate([state["deter"], stoch.reshape(stoch.shape[:-2] + (-1,))], -1)


@dataclasses.dataclass(frozen=True)
class LossScales:
    """Paper eq. 3-5: beta_pred 1, beta_dyn 1 (official configs.yaml; the paper's text says
    0.5), beta_rep 0.1, free bits of 1 nat on each KL term."""

    dyn: float = 1.0
    rep: float = 0.1
    pred: float = 1.0
    free_bits: float = 1.0


@dataclasses.dataclass(frozen=True)
class WorldModel:
    """DreamerV3's world model on the world-model protocol (``models.protocol``)."""

    net: WorldModelNet
    scales: LossScales = LossScales()
    # The reward head's two-hot space (``ops.twohot.Regression``): ``symexp`` as the official
    # code, ``symlog`` as the paper.
    twohot: str = "symexp"
    differentiable = True  # straight-through latents: gradients reach actions and states

    @property
    def reward_head(self) -> twohot.Regression:
        return twohot.Regression(self.twohot, self.net.num_bins)

    @property
    def discrete(self) -> bool:
        return self.net.discrete

    @property
    def action_dim(self) -> int:
        return self.net.action_dim

    @property
    def decodes(self) -> bool:
        return len(self.net.obs_shape) == 3

    def init(self, key, example_obs):
        """Parameters from an example observation batch [B, *obs_shape]."""
        action = jnp.zeros((example_obs.shape[0], self.net.action_dim))
        return self.net.init(key, example_obs, action)

    def initial(self, params, batch: int):
        del params
        return {"deter": jnp.zeros((batch, self.net.deter)),
                "stoch": jnp.zeros((batch, self.net.stoch, self.net.classes))}

    # ------------------------------------------------------------------ the protocol

    def observe(self, params, state, action, obs, is_first, key):
        """One posterior step on ``obs`` [B, ...] (``obs_step``)."""
        embed = self.net.apply(params, obs, method=WorldModelNet.encode)
        return self.obs_step(params, state, action, embed, is_first, key)[0]

    def step(self, params, state, action, key):
        """One prior step (``img_step``), with the reward and the continue probability the
        heads read from the state reached."""
        state = self.img_step(params, state, action, key)
        reward_logits, cont_logit = self.heads(params, features(state))
        return state, self.reward_head.predict(reward_logits), jax.nn.sigmoid(cont_logit)

    def features(self, params, state):
        del params
        return features(state)

    def report(self, params, batch, context: int, key) -> dict:
        return report(self, params, batch, context, key)

    def decode(self, params, state):
        """Frames [..., H, W, C] in [0, 1] (pixel models)."""
        recon = self.net.apply(params, features(state), method=WorldModelNet.decode)
        return jnp.clip(jnp.moveaxis(recon, -3, -1) + 0.5, 0.0, 1.0)

    def action_input(self, action):
        """Actions as the model reads them: one-hot for discrete action spaces."""
        if self.net.discrete:
            return jax.nn.one_hot(action, self.net.action_dim)
        return action.astype(jnp.float32)

    def obs_step(self, params, state, prev_action, embed, is_first, key):
        """One posterior step: resets state and previous action where ``is_first`` [B], then
        h_t = f(h, z, a), z_t ~ q(z | h_t, e_t). Returns (state, (post, prior) logits)."""
        keep = (~is_first).astype(jnp.float32)
        state = jax.tree.map(lambda x: x * keep.reshape((-1,) + (1,) * (x.ndim - 1)), state)
        prev_action = prev_action * keep[:, None]
        deter = self.net.apply(params, state, prev_action, method=WorldModelNet.step)
        prior = self.net.apply(params, deter, method=WorldModelNet.prior)
        post = self.net.apply(params, deter, embed, method=WorldModelNet.posterior)
        return {"deter": deter, "stoch": sample_onehot(key, post)}, (post, prior)

    def img_step(self, params, state, action, key):
        """One prior step: h_t = f(h, z, a), z_t ~ p(z | h_t)."""
        deter = self.net.apply(params, state, action, method=WorldModelNet.step)
        prior = self.net.apply(params, deter, method=WorldModelNet.prior)
        return {"deter": deter, "stoch": sample_onehot(key, prior)}

    def observe_sequence(self, params, state, embed, prev_action, is_first, key):
        """Posterior states over a sequence: embed [B, T, E], prev_action [B, T, A] (model
        input form), is_first [B, T]. Returns (last state, states [B, T, ...], post logits,
        prior logits [B, T, S, K])."""
        time_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731

        def step(state, inputs):
            action, e, first, k = inputs
            state, (post, prior) = self.obs_step(params, state, action, e, first, k)
            return state, (state, post, prior)

        keys = jax.random.split(key, embed.shape[1])
        last, outs = jax.lax.scan(step, state, (time_major(prev_action), time_major(embed),
                                                time_major(is_first), keys))
        return (last, *jax.tree.map(time_major, outs))

    def heads(self, params, feat):
        """(reward logits [..., bins], continue logit [...])."""
        return (self.net.apply(params, feat, method=WorldModelNet.reward),
                self.net.apply(params, feat, method=WorldModelNet.cont))

    def kl_terms(self, post, prior):
        """(dyn, rep) losses per step, each with free bits (paper eq. 5): the dynamics term
        trains the prior toward a fixed posterior, the representation term the posterior
        toward a fixed prior; below ``free_bits`` nats each is constant (zero gradient)."""
        sg = jax.lax.stop_gradient
        free = self.scales.free_bits
        dyn = jnp.maximum(free, categorical_kl(sg(post), prior))
        rep = jnp.maximum(free, categorical_kl(post, sg(prior)))
        return dyn, rep

    def loss(self, params, batch, key):
        """Paper eq. 3 on a replayed batch ``{obs, action, reward, is_first, is_terminal}``,
        each [B, T, ...] with ``action[t]`` the action taken at ``obs[t]``. Returns (loss,
        (metrics, posterior states [B, T, ...]))."""
        embed = self.net.apply(params, batch["obs"], method=WorldModelNet.encode)
        action = self.action_input(batch["action"])
        prev_action = jnp.concatenate([jnp.zeros_like(action[:, :1]), action[:, :-1]], 1)
        _, states, post, prior = self.observe_sequence(
            params, self.initial(params, embed.shape[0]), embed, prev_action,
            batch["is_first"], key)
        feat = features(states)
        recon = self.net.apply(params, feat, method=WorldModelNet.decode)
        if batch["obs"].dtype == jnp.uint8:
            target = batch["obs"].astype(jnp.float32) / 255.0 - 0.5
        else:
            target = twohot.symlog(batch["obs"])
        recon_axes = tuple(range(2, recon.ndim))
        decoder = jnp.sum((recon - target) ** 2, axis=recon_axes)
        reward_logits, cont_logit = self.heads(params, feat)
        reward = self.reward_head.loss(reward_logits, batch["reward"])
        cont_target = 1.0 - batch["is_terminal"].astype(jnp.float32)
        cont = -(cont_target * jax.nn.log_sigmoid(cont_logit)
                 + (1.0 - cont_target) * jax.nn.log_sigmoid(-cont_logit))
        dyn, rep = self.kl_terms(post, prior)
        s = self.scales
        total = s.pred * (decoder + reward + cont) + s.dyn * dyn + s.rep * rep
        metrics = {
            "model/loss": jnp.mean(total), "model/decoder": jnp.mean(decoder),
            "model/reward": jnp.mean(reward), "model/continue": jnp.mean(cont),
            "model/dyn": jnp.mean(dyn), "model/rep": jnp.mean(rep),
            "model/kl": jnp.mean(categorical_kl(post, prior)),
            "model/prior_entropy": jnp.mean(-jnp.sum(jnp.exp(prior) * prior, (-2, -1))),
            "model/post_entropy": jnp.mean(-jnp.sum(jnp.exp(post) * post, (-2, -1))),
        }
        return jnp.mean(total), (metrics, states)


def report(model: WorldModel, params, batch, context: int, key) -> dict:
    """Open-loop predictions on ``batch`` (``open_loop``): their MSEs in the decoder's space,
    over the observed and the imagined steps, and for pixels a side-by-side video."""
    target, recon = open_loop(model, params, batch, context, key)
    axes = tuple(range(2, target.ndim))
    error = jnp.mean(jnp.sum((recon - target) ** 2, axes), 0)  # [T]
    metrics = {"report/observed_mse": jnp.mean(error[:context]),
               "report/openloop_mse": jnp.mean(error[context:])}
    if model.decodes:
        metrics["report/openloop"] = Video(video_frames(target[0], recon[0]))
    return metrics


def open_loop(model: WorldModel, params, batch, context: int, key):
    """Open-loop predictions (the paper's video predictions): the posterior over the first
    ``context`` steps of ``batch`` [B, T, ...], then the prior under the replayed actions for
    the rest, every state decoded. Returns (target, reconstruction) [B, T, ...] in the
    decoder's space (symlog vectors; pixels in [-0.5, 0.5])."""
    k_obs, k_img = jax.random.split(key)
    embed = model.net.apply(params, batch["obs"][:, :context], method=WorldModelNet.encode)
    action = model.action_input(batch["action"])
    prev_action = jnp.concatenate([jnp.zeros_like(action[:, :1]), action[:, :-1]], 1)
    last, observed, _, _ = model.observe_sequence(
        params, model.initial(params, embed.shape[0]), embed, prev_action[:, :context],
        batch["is_first"][:, :context], k_obs)

    def step(state, inputs):
        state = model.img_step(params, state, *inputs)
        return state, state

    rest = jnp.swapaxes(prev_action[:, context:], 0, 1)
    _, imagined = jax.lax.scan(step, last, (rest, jax.random.split(k_img, rest.shape[0])))
    states = jax.tree.map(lambda a, b: jnp.concatenate([a, jnp.swapaxes(b, 0, 1)], 1),
                          observed, imagined)
    recon = model.net.apply(params, features(states), method=WorldModelNet.decode)
    obs = batch["obs"]
    target = obs.astype(jnp.float32) / 255.0 - 0.5 if obs.dtype == jnp.uint8 else \
        twohot.symlog(obs)
    return target, recon


def video_frames(target, recon) -> jax.Array:
    """[T, H, 3W, C] uint8 of one sequence ([T, C, H, W] each, in [-0.5, 0.5]): truth, model,
    and their absolute difference side by side."""
    to_image = lambda x: jnp.clip(jnp.moveaxis(x, -3, -1) + 0.5, 0.0, 1.0)  # noqa: E731
    truth, model = to_image(target), to_image(recon)
    frames = jnp.concatenate([truth, model, jnp.abs(truth - model)], axis=-2)
    return jnp.round(frames * 255).astype(jnp.uint8)


def make(obs_shape, action_dim: int, discrete: bool, size: str, twohot_space: str = "symexp",
         **overrides) -> WorldModel:
    """The world model of ``size`` (a key of ``SIZES``), sizes overridable by keyword."""
    return WorldModel(WorldModelNet(tuple(obs_shape), action_dim, discrete,
                                    **{**SIZES[size], **overrides}), twohot=twohot_space)


def for_spec(spec, d) -> WorldModel:
    """The world model for an ``EnvSpec`` from a ``config.dreamer`` block: its size, bins,
    latents' unimix, compute dtype, two-hot space and size overrides."""
    action_dim = spec.num_actions if spec.discrete else spec.action_shape[0]
    return make(spec.obs_shape, action_dim, spec.discrete, d.model_size, num_bins=d.num_bins,
                unimix=d.unimix, dtype=jnp.dtype(d.compute_dtype), twohot_space=d.twohot,
                **dict(d.size_overrides))
