"""SimPLe's next-frame predictor (Kaiser et al. 2020, "Model-Based Reinforcement Learning for
Atari", sec. 4 and fig. 2) as MBARC builds it (thomas-schillaci/mbarc_atari,
``mbarc/next_frame_predictor.py``): a pixel world model that maps a stack of frames and an
action to the next frame, the reward class and the value of the stack.

Architecture (sizes in ``SIZES``; ``full`` is the reference's, ~68M parameters + the reward
head):

* frames standardised per channel, ``(x - mean) / max(std, 1/sqrt(HW))``; a 1x1 embedding to
  ``hidden`` channels plus a timing signal (Vaswani et al. 2017's sinusoids over height and
  width, ``timing_signal``);
* encoder: ``compress_steps`` 4x4 stride-2 convolutions (PyTorch padding 1), the filters
  doubling for the first ``filter_double_steps``, each after dropout and a timing signal, each
  followed by ReLU and instance norm; the value head reads the bottleneck;
* the action is injected as ``x * sigmoid(W1 a) + W2 a`` (``ActionInjector``) at the bottleneck
  and before every decoder step;
* stochastic latent (SimPLe sec. 4, "discrete latent"): an inference net sees the stack and
  the target frame and emits 128 bits (tanh + N(0, 0.2) noise, straight-through sign, 10% bit
  flips); an LSTM predicts the bits 8 at a time from the bottleneck (teacher-forced
  cross-entropy in training; sampled at test time). The bits modulate the bottleneck like an
  action. The latent is phased in with the scheduled-sampling ``epsilon``: with probability
  ``(1 - eps) * 0.5`` an element takes the LSTM's sampled bits instead of the posterior's,
  and ``1 - (1 - eps) * 0.8`` of the bottleneck's elements bypass the latent;
* middle: ``hidden_layers`` 3x3 convolutions with dropout 0.5, the last residual + norm;
* decoder: transposed 4x4 stride-2 convolutions (``nets.conv.ConvTranspose2D``), ReLU, the
  encoder's skip connection added, instance norm, timing signal; logits of 256 classes per
  pixel and channel;
* reward head: MBARC's (``mbarc``: a conv stack over the decoder's last features next to the
  bottleneck) or SimPLe's (``simple``: means of both through an MLP), three classes for the
  clipped rewards -1, 0, +1.

Losses (``losses``): pixels ``mean(max(CE, 0.03)) - 0.03`` (SimPLe's clipped loss: pixels the
model already predicts well stop pulling), value MSE, the bits' cross-entropy / 50 (as the
reference), and the reward's cross-entropy or class-balanced focal loss (Cui et al. 2019, beta
0.9999, gamma 2) when the reward head trains jointly (``online``).

Deliberate differences from the reference, each a bug there:
* dropout runs only in training (``train=True``); the reference calls ``F.dropout`` without
  ``training=`` so it stays on in its simulator and when it trains the reward head;
* the posterior bits are discrete (straight-through): the reference mixes ``(bits, tanh,
  1 - eps)`` the wrong way round, so from epoch 1 on its latent is the continuous tanh and its
  bit flips vanish;
* the attention pooling of the inference net takes a softmax over positions per head; the
  reference reshapes NCHW to ``(HW, 4)`` without a transpose, mixing heads and positions;
* the first timing signal is added once (the reference adds it twice).

Convolutions go through ``nets.conv`` so that their gradients stay on XLA:CPU's fast path inside
the training rollout's ``lax.scan`` (docs/architecture.md, "CPU convolutions"). Tensors are
NHWC here; envpool's stacks are ``[4 * 3, H, W]`` uint8, oldest frame first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwm.data.frames import CHANNELS, as_rgb, to_hwc
from jaxwm.nets.conv import Conv2D, ConvTranspose2D

REWARD_CLASSES = 3  # clipped rewards -1, 0, +1 as classes 0, 1, 2
PIXEL_CLASSES = 256


@dataclasses.dataclass(frozen=True)
class Sizes:
    hidden: int = 96
    compress_steps: int = 5
    filter_double_steps: int = 3
    hidden_layers: int = 2
    bits: int = 128
    bits_per_step: int = 8  # the LSTM predicts this many bits at a time (one byte)
    lstm: int = 128
    inference_filters: tuple[int, int] = (128, 512)
    inference_kernel: tuple[int, int] = (8, 4)  # the inference net's convolutions: size, stride
    attention_out: int = 30
    reward_hidden: int = 128


SIZES = {
    "full": Sizes(),  # MBARC's defaults (SimPLe's original has 6 compress steps)
    "small": Sizes(hidden=32, compress_steps=4, filter_double_steps=3, bits=64, lstm=64,
                   inference_filters=(32, 64), attention_out=16, reward_hidden=64),
    "tiny": Sizes(hidden=8, compress_steps=3, filter_double_steps=2, bits=16, lstm=16,
                  inference_filters=(8, 16), attention_out=4, reward_hidden=16),
    # MinAtar's 10 x 10 frames: two compress steps (10 -> 5 -> 2) and an inference net of
    # 4 / 2 convolutions, whose 8 / 4 ones would leave no pixel after the second.
    "minatar": Sizes(hidden=32, compress_steps=2, filter_double_steps=2, bits=32, lstm=64,
                     inference_filters=(32, 64), inference_kernel=(4, 2), attention_out=16,
                     reward_hidden=64),
}
REWARD_HEADS = ("mbarc", "simple")


def timing_signal(height: int, width: int, channels: int) -> jax.Array:
    """``[H, W, C]`` sinusoids (tensor2tensor's ``get_timing_signal_nd``): a quarter of the
    channels ``sin`` and a quarter ``cos`` of the row index over timescales 1 .. 1e4, the other
    half the same of the column index."""
    n = channels // 4
    inc = math.log(1e4) / max(n - 1, 1)
    inv = jnp.exp(-jnp.arange(n) * inc)
    rows = jnp.arange(height)[:, None] * inv
    cols = jnp.arange(width)[:, None] * inv
    row = jnp.concatenate([jnp.sin(rows), jnp.cos(rows)], -1)[:, None, :]
    col = jnp.concatenate([jnp.sin(cols), jnp.cos(cols)], -1)[None, :, :]
    signal = jnp.concatenate([jnp.broadcast_to(row, (height, width, 2 * n)),
                              jnp.broadcast_to(col, (height, width, 2 * n))], -1)
    return jnp.pad(signal, ((0, 0), (0, 0), (0, channels - 4 * n)))


def add_timing(x: jax.Array) -> jax.Array:
    return x + timing_signal(*x.shape[1:])


def standardize(x: jax.Array) -> jax.Array:
    """Per sample and channel over H, W: ``(x - mean) / max(std, 1/sqrt(HW))`` (unbiased
    variance, as ``torch.var``)."""
    hw = x.shape[1] * x.shape[2]
    mean = x.mean(axis=(1, 2), keepdims=True)
    var = jnp.sum((x - mean) ** 2, axis=(1, 2), keepdims=True) / (hw - 1)
    return (x - mean) / jnp.maximum(jnp.sqrt(var), 1.0 / math.sqrt(hw))


def instance_norm(affine: bool = True, epsilon: float = 1e-6) -> nn.Module:
    return nn.GroupNorm(num_groups=None, group_size=1, epsilon=epsilon, use_bias=affine,
                        use_scale=affine)


class ActionInjector(nn.Module):
    """``x * sigmoid(W1 a) + W2 a``, broadcast over the image."""

    @nn.compact
    def __call__(self, x, a):
        c = x.shape[-1]
        gate = nn.Dense(c, name="gate")(a)[:, None, None, :]
        shift = nn.Dense(c, name="shift")(a)[:, None, None, :]
        return x * nn.sigmoid(gate) + shift


class MeanAttention(nn.Module):
    """Attention pooling: per channel, the mean and 4 softmax-over-positions weighted means,
    then a linear map to ``features``."""

    features: int

    @nn.compact
    def __call__(self, x):
        b, h, w, c = x.shape
        # No bias: a softmax over positions ignores a per-head constant, so a bias would get
        # only rounding noise as its gradient, which Adafactor's normalisation amplifies.
        weights = jax.nn.softmax(nn.Dense(4, use_bias=False)(x).reshape(b, h * w, 4), axis=1)
        pooled = jnp.einsum("bpc,bpk->bck", x.reshape(b, h * w, c), weights) / (h * w)
        pooled = jnp.concatenate([pooled, x.mean(axis=(1, 2))[..., None]], -1)
        return nn.Dense(self.features)(pooled.reshape(b, -1))


def to_bytes(bits: jax.Array, per_step: int) -> jax.Array:
    """``[B, n]`` bits in {-1, 1} -> ``[B, n / per_step]`` ints, little-endian per group."""
    groups = (bits > 0).reshape(bits.shape[0], -1, per_step).astype(jnp.int32)
    return jnp.sum(groups << jnp.arange(per_step), axis=-1)


def from_bytes(values: jax.Array, per_step: int) -> jax.Array:
    """The inverse of ``to_bytes``: ``[B, steps]`` -> ``[B, steps * per_step]`` in {-1, 1}."""
    bits = (values[..., None] >> jnp.arange(per_step)) & 1
    return (2 * bits - 1).reshape(values.shape[0], -1).astype(jnp.float32)


class BitsPredictor(nn.Module):
    """An LSTM that predicts the latent bits from the bottleneck, ``bits_per_step`` at a time
    (one 256-way choice per step for 8 bits). ``teacher`` returns the mean cross-entropy of the
    given bits; ``sample`` draws bits at ``temperature``."""

    sizes: Sizes

    def setup(self):
        s = self.sizes
        self.first_input, self.first_h, self.first_c = (nn.Dense(s.lstm) for _ in range(3))
        self.embed = nn.Dense(s.lstm)
        self.logits = nn.Dense(2 ** s.bits_per_step)
        self.cell = nn.LSTMCell(s.lstm)
        self.dropout = nn.Dropout(0.1)

    def _start(self, layer):
        flat = layer.reshape(layer.shape[0], -1)
        return (self.first_c(flat), self.first_h(flat)), self.first_input(flat)

    def teacher(self, layer, bits, train: bool):
        s = self.sizes
        targets = to_bytes(bits, s.bits_per_step)  # [B, steps]
        carry, first = self._start(layer)
        embedded = self.dropout(self.embed(jax.nn.one_hot(targets, 2 ** s.bits_per_step)),
                                deterministic=not train)
        inputs = jnp.concatenate([first[:, None], embedded[:, :-1]], 1)
        outputs = []
        for t in range(inputs.shape[1]):
            carry, h = self.cell(carry, inputs[:, t])
            outputs.append(h)
        logits = self.logits(self.dropout(jnp.stack(outputs, 1), deterministic=not train))
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None],
                                             -1))

    def sample(self, layer, key, temperature: float = 1.0):
        s = self.sizes
        carry, x = self._start(layer)
        values = []
        for key_t in jax.random.split(key, s.bits // s.bits_per_step):
            carry, h = self.cell(carry, x)
            value = jax.random.categorical(key_t, self.logits(h) / temperature)
            values.append(value)
            x = self.embed(jax.nn.one_hot(value, 2 ** s.bits_per_step))
        return from_bytes(jnp.stack(values, 1), s.bits_per_step)


def _mix(key, a, b, p_b):
    """Per element: ``b`` with probability ``p_b``, else ``a``."""
    return jnp.where(jax.random.uniform(key, a.shape) < p_b, b, a)


class StochasticLatent(nn.Module):
    """SimPLe's discrete latent over the bottleneck ``layer`` (module docstring)."""

    sizes: Sizes
    bit_noise: float = 0.2
    bit_flip: float = 0.1

    @nn.compact
    def __call__(self, layer, stack, action, target, epsilon, train: bool):
        s = self.sizes
        predictor = BitsPredictor(s, name="bits_predictor")
        gate, shift = nn.Dense(layer.shape[-1], name="bits_gate"), \
            nn.Dense(layer.shape[-1], name="bits_shift")
        add_bits = lambda bits: layer * nn.sigmoid(gate(bits))[:, None, None] + \
            shift(bits)[:, None, None]  # noqa: E731
        if target is None:  # simulation and evaluation: bits from the LSTM
            bits = predictor.sample(layer, self.make_rng("latent"))
            return add_bits(bits), jnp.zeros(())
        keys = jax.random.split(self.make_rng("latent"), 6)
        x = Conv2D(s.hidden, 1)(jnp.concatenate([stack, target], -1))
        x = ActionInjector()(add_timing(x), action)
        size, stride = s.inference_kernel
        conv = lambda filters: Conv2D(filters, size, stride, padding=(size - stride) // 2)  # noqa: E731
        x1 = conv(s.inference_filters[0])(x)
        x2 = conv(s.inference_filters[1])(nn.relu(x1))
        h = nn.Dense(s.bits)(jnp.concatenate([MeanAttention(s.attention_out)(x1),
                                              MeanAttention(s.attention_out)(x2)], -1))
        noise = jax.random.truncated_normal(keys[0], -2.0, 2.0, h.shape) * self.bit_noise
        soft = jnp.tanh(h + noise) if train else jnp.tanh(h)
        bits = soft + jax.lax.stop_gradient(jnp.where(soft > 0, 1.0, -1.0) - soft)
        if train:
            bits = bits * jnp.where(jax.random.uniform(keys[1], bits.shape) < self.bit_flip,
                                    -1.0, 1.0)
        clean = jax.lax.stop_gradient(jnp.where(h > 0, 1.0, -1.0))
        lstm_loss = predictor.teacher(layer, clean, train)
        sampled = predictor.sample(layer, keys[2])
        # Phase the latent in as teacher forcing fades (epsilon: 1 -> 0).
        bits = _mix(keys[3], bits, clean + jax.lax.stop_gradient(sampled - clean),
                    (1.0 - epsilon) * 0.5)
        out = _mix(keys[4], add_bits(bits), layer, 1.0 - (1.0 - epsilon) * 0.8)
        return out, lstm_loss


class RewardHead(nn.Module):
    """Reward-class logits from the bottleneck ``mid`` and the decoder's last features
    ``fin``: MBARC's conv stack (``mbarc``) or SimPLe's pooled MLP (``simple``)."""

    kind: str
    sizes: Sizes

    @nn.compact
    def __call__(self, mid, fin, train: bool):
        s = self.sizes
        if self.kind == "simple":
            x = jnp.concatenate([mid.mean(axis=(1, 2)), fin.mean(axis=(1, 2))], -1)
        else:
            mid = Conv2D(s.hidden, 1)(mid)
            fin = Conv2D(s.hidden, 1)(fin)
            for _ in range(s.compress_steps):
                fin = nn.Dropout(0.3, broadcast_dims=(1, 2))(fin, deterministic=not train)
                fin = nn.relu(Conv2D(s.hidden, 4, 2, padding=1)(fin))
                fin = instance_norm(affine=False, epsilon=1e-5)(fin)
            x = jnp.concatenate([mid, fin], -1).reshape(mid.shape[0], -1)
        return nn.Dense(REWARD_CLASSES)(nn.relu(nn.Dense(s.reward_hidden)(x)))


class NextFramePredictor(nn.Module):
    """``(stack [B, H, W, C * frames] in [0, 1], action one-hot [B, A], target [B, H, W, C]
    in [0, 1] or None, epsilon, train) -> (frame logits [B, H, W, C, 256], reward logits
    [B, 3], value [B], lstm loss)``, ``C`` = ``channels`` per frame (3: Atari's RGB; MinAtar's
    object channels, each cell 0 or 255). Randomness: rngs ``dropout`` (training) and
    ``latent``.

    ``reward_features_only``: skip the pixel logits (the reward head's own training);
    ``reward_train``: the reward head's dropout on while the rest runs as at test time."""

    sizes: Sizes
    reward_head: str = "mbarc"
    stochastic: bool = True
    channels: int = CHANNELS
    pixel_classes: int = PIXEL_CLASSES  # 2 for MinAtar's cells (``pixel_values``)
    detach_reward: bool = True  # False: the reward loss trains the trunk too (``online``)

    @nn.compact
    def __call__(self, stack, action, target=None, epsilon=0.0, train: bool = False,
                 reward_features_only: bool = False, reward_train: bool = False):
        s = self.sizes
        drop = lambda rate, x: nn.Dropout(rate)(x, deterministic=not train)  # noqa: E731
        x_std = standardize(stack)
        x = add_timing(Conv2D(s.hidden, 1, name="embed")(x_std))
        skips, channels = [], s.hidden
        for i in range(s.compress_steps):
            skips.append(x)
            x = drop(0.15, x)
            if i > 0:  # the embedding's timing signal is already in
                x = add_timing(x)
            channels = channels * 2 if i < s.filter_double_steps else channels
            x = instance_norm()(nn.relu(Conv2D(channels, 4, 2, padding=1)(x)))
        value = nn.Dense(1, name="value")(x.reshape(x.shape[0], -1))[:, 0]
        x = ActionInjector()(x, action)
        lstm_loss = jnp.zeros(())
        if self.stochastic:
            x, lstm_loss = StochasticLatent(s, name="latent")(
                x, x_std, action, None if target is None else standardize(target), epsilon,
                train)
        mid = x
        for i in range(s.hidden_layers):
            y = nn.relu(Conv2D(x.shape[-1], 3, padding=1)(drop(0.5, x)))
            x = instance_norm()(x + y) if i == s.hidden_layers - 1 else y
        for skip in reversed(skips):
            x = ActionInjector()(drop(0.15, x), action)
            pad = (skip.shape[1] - 2 * x.shape[1], skip.shape[2] - 2 * x.shape[2])
            if pad[0] != pad[1]:  # one output_padding per layer: grow to the larger, crop
                up = ConvTranspose2D(skip.shape[-1], 4, 2, padding=1, output_padding=max(pad))
                x = up(x)[:, :skip.shape[1], :skip.shape[2]]
            else:
                x = ConvTranspose2D(skip.shape[-1], 4, 2, padding=1, output_padding=pad[0])(x)
            x = add_timing(instance_norm()(nn.relu(x) + skip))
        fin = x
        reward_in = (mid, fin)
        if self.detach_reward:
            reward_in = jax.tree.map(jax.lax.stop_gradient, reward_in)
        reward = RewardHead(self.reward_head, s, name="reward_head")(*reward_in,
                                                                    train or reward_train)
        if reward_features_only:
            return None, reward, value, lstm_loss
        logits = Conv2D(self.channels * self.pixel_classes, 1, name="logits")(fin)
        logits = logits.reshape(logits.shape[:3] + (self.channels, self.pixel_classes))
        return logits, reward, value, lstm_loss


def is_reward_head(path) -> bool:
    return any(getattr(k, "key", None) == "reward_head" for k in path)


def reward_head_labels(params):
    """``"reward"`` for the reward head's leaves, ``"model"`` for the rest (optimiser
    partitions)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "reward" if is_reward_head(path) else "model", params)


def pixel_classes_of(frame_u8, classes: int):
    """Each uint8 value's class among ``classes`` levels evenly spaced over 0 .. 255 (the
    nearest): the value itself for 256, 0 / 1 for MinAtar's cells (0 or 255) with 2."""
    return (frame_u8.astype(jnp.int32) * (classes - 1) + 127) // 255


def pixel_values(logits, key=None):
    """The uint8 frame of pixel logits ``[..., classes]``: each pixel's most likely class
    (or one drawn from ``key``), as its level's value (``pixel_classes_of``'s inverse)."""
    classes = logits.shape[-1]
    chosen = jnp.argmax(logits, -1) if key is None else jax.random.categorical(key, logits)
    return (chosen * 255 // (classes - 1)).astype(jnp.uint8)


def pixel_loss(logits, target_u8, clip: float = 0.03):
    """SimPLe's clipped pixel loss, ``mean(max(CE, clip)) - clip`` over every pixel and
    channel (per sample: ``[B]``)."""
    target = pixel_classes_of(target_u8, logits.shape[-1])
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), target[..., None], -1)[..., 0]
    return jnp.mean(jnp.maximum(ce, clip), axis=(1, 2, 3)) - clip


def class_balanced_focal(logits, labels, counts, beta: float = 0.9999, gamma: float = 2.0):
    """Cui et al. 2019 (class-balanced loss, eq. 2 with the focal loss of Lin et al. 2017):
    per sample ``w_y (1 - p_y)^gamma (-log p_y)`` with ``w_c`` proportional to ``(1 - beta) /
    (1 - beta^n_c)``, normalised to sum to the number of classes seen (``n_c > 0``). Returns
    ``[B]``.

    Classes a game cannot produce (Freeway never gives a negative reward) have ``n_c = 0``:
    the formula gives them an infinite weight (the usual implementations, which normalise over
    every class, then turn the loss into NaN), or, floored at one sample, nearly all of the
    normalised mass, which would shrink the weights of the classes that occur ~100x. They get
    weight 0 and take no part in the normalisation."""
    seen = counts > 0
    effective = jnp.where(seen, (1.0 - beta) / (1.0 - beta ** jnp.maximum(counts, 1.0)), 0.0)
    weights = effective * jnp.sum(seen) / jnp.maximum(jnp.sum(effective), 1e-30)
    log_p = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1)[:, 0]
    return weights[labels] * (1.0 - jnp.exp(log_p)) ** gamma * -log_p


def reward_cross_entropy(logits, labels):
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1)[:, 0]


def make_apply(net: NextFramePredictor, num_actions: int):
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


@dataclasses.dataclass(frozen=True)
class FrameModel:
    """The next-frame predictor on the world-model protocol (``models.protocol``): SimPLe's
    learned simulator. Its state is the frame stack ``[n, F * C, H, W]`` uint8 in envpool's
    layout (``C`` = ``channels`` per frame), which is also what a policy reads (``features``),
    as in the real env. A step appends the most likely of each pixel's classes (or a sample,
    ``frame_mode="sample"``) as its value (``pixel_values``); the reward is the reward head's
    class minus 1; episodes never end (``cont`` 1: the policy bootstraps at the rollout's
    end). Actions arrive one-hot."""

    apply: Callable
    action_dim: int
    obs_shape: tuple[int, int, int]  # the stack's [F * C, H, W]
    frame_mode: str = "argmax"
    channels: int = CHANNELS
    discrete = True
    decodes = True
    differentiable = False  # argmax frames and classes: no gradient through a step

    def initial(self, params, batch: int):
        del params
        return jnp.zeros((batch,) + tuple(self.obs_shape), jnp.uint8)

    def observe(self, params, state, action, obs, is_first, key):
        del params, state, action, is_first, key
        return obs  # the env's own stack

    def step(self, params, state, action, key):
        k_model, k_frame = jax.random.split(key)
        logits, reward_logits, _, _ = self.apply(params, to_hwc(state), jnp.argmax(action, -1),
                                                 k_model)
        frame = pixel_values(logits, k_frame if self.frame_mode == "sample" else None)
        state = jnp.concatenate([state[:, self.channels:], jnp.moveaxis(frame, -1, 1)], 1)
        reward = (jnp.argmax(reward_logits, -1) - 1).astype(jnp.float32)
        return state, reward, jnp.ones(state.shape[0])

    def features(self, params, state):
        del params
        return state

    def decode(self, params, state):
        del params
        return as_rgb(jnp.moveaxis(state[..., -self.channels:, :, :], -3, -1)).astype(
            jnp.float32) / 255.0
