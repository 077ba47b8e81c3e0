"""TD-MPC2's implicit world model (Hansen, Su and Wang 2024, "TD-MPC2: Scalable, Robust World
Models for Continuous Control", ICLR; nicklashansen/tdmpc2 ``common/world_model.py``,
``common/layers.py``, ``common/math.py``).

Five MLPs over a latent state ``z`` that never decodes back to observations:

* encoder      z = h(s)                  (``encode``; the last layer is SimNorm)
* dynamics     z' = d(z, a)              (``next``; SimNorm)
* reward       r-hat = R(z, a)           (``reward``: logits of a two-hot over 101 bins)
* termination  P(terminal | z')          (``termination``; only for episodic tasks)
* policy prior a ~ pi(z)                 (``pi``: a tanh-squashed Gaussian)
* Q ensemble   Q_i(z, a), i < num_q      (``q``: logits of two-hot over 101 bins each)

Every hidden layer is Linear -> LayerNorm -> Mish (``NormedLinear``; LayerNorm and Mish are one
op with a hand-written backward, ``ops.layer_norm``; for planning, ``centre_weights`` and
``centred`` compute the same layers with fewer passes; the Q heads run the same layers as one
function of their stacked parameters, ``q_logits``); the first hidden layer of
each Q network has dropout 0.01 (``ops.dropout``, which makes it 655/65536). SimNorm (sec.
3.2) splits the latent into groups of 8 and takes a softmax over each, so every group is a
point on a simplex: the latent stays bounded and sparse whatever the task's scale. Rewards
and Q-values are regressed as two-hot distributions over 101 bins evenly spaced in symlog
space on [-10, 10] (``ops.twohot``), as DreamerV3 does with 255 bins on [-20, 20].

Initialisation as the reference: every Linear's weights truncated-normal with std 0.02 and
zero biases, and the last layers of the reward head and every Q head all zeros (so both start
by predicting 0). Since the reference's commit e9f5932 the Q heads' hidden layers are
initialised the same way; before it they kept PyTorch's default (the published results).

Model sizes (``SIZES``, the paper's table 8 as ``common/__init__.py``'s presets): 1M, 5M
(default), 19M, 48M and 317M parameters for a single task; parameter counts depend on the
observation and action sizes (``tests/test_tdmpc2.py`` checks the 5M count on a DMC task).

Actions are in [-1, 1] everywhere here (the agent maps them to the env's box).

Functional API: ``WorldModel`` is a Flax module whose methods are applied with
``model.apply(params, ..., method=...)``; the Q heads' parameters (``q_params``) are stacked on
a leading axis so that ``q_heads`` evaluates any subset of them, online, frozen or target.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax.losses

from jaxwm.models import protocol
from jaxwm.ops import twohot
from jaxwm.ops.dropout import dropout
from jaxwm.ops.layer_norm import layer_norm, layer_norm_mish

LOG_STD_MIN, LOG_STD_MAX = -10.0, 2.0
NUM_BINS, V_MIN, V_MAX = 101, -10.0, 10.0
SIMNORM_DIM = 8
Q_DROPOUT = 0.01


@dataclasses.dataclass(frozen=True)
class Sizes:
    enc_dim: int = 256
    mlp_dim: int = 512
    latent_dim: int = 512
    num_enc_layers: int = 2
    num_q: int = 5


# Millions of parameters -> sizes (the reference's MODEL_SIZE presets).
SIZES = {
    1: Sizes(enc_dim=256, mlp_dim=384, latent_dim=128, num_enc_layers=2, num_q=2),
    5: Sizes(),
    19: Sizes(enc_dim=1024, mlp_dim=1024, latent_dim=768, num_enc_layers=3),
    48: Sizes(enc_dim=1792, mlp_dim=1792, latent_dim=768, num_enc_layers=4),
    317: Sizes(enc_dim=4096, mlp_dim=4096, latent_dim=1376, num_enc_layers=5, num_q=8),
}


def bins() -> jax.Array:
    return twohot.bins(NUM_BINS, V_MIN, V_MAX)


def decode(logits: jax.Array) -> jax.Array:
    """Two-hot logits [..., 101] -> the scalar they predict (symexp of the expected bin)."""
    return twohot.symexp(twohot.decode(logits, bins()))


def soft_cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    """Cross-entropy of logits [..., 101] to the two-hot encoding of the scalar ``target``
    [...] (the reference's ``math.soft_ce``)."""
    return twohot.loss(logits, twohot.symlog(target), bins())


def simnorm(x: jax.Array, dim: int = SIMNORM_DIM) -> jax.Array:
    """Simplicial normalisation (sec. 3.2): a softmax over each group of ``dim`` features."""
    groups = x.reshape(x.shape[:-1] + (-1, dim))
    return jax.nn.softmax(groups, axis=-1).reshape(x.shape)


def _dense(features: int, zero: bool = False) -> nn.Dense:
    init = nn.initializers.zeros if zero else nn.initializers.truncated_normal(0.02)
    return nn.Dense(features, kernel_init=init, bias_init=nn.initializers.zeros)


class NormedLinear(nn.Module):
    """Linear -> LayerNorm -> activation (``layers.NormedLinear``).

    ``centred``: the Linear's weights come centred by ``centre_weights``, so its outputs have
    zero mean per row and LayerNorm takes only E[x^2] (``ops.layer_norm``'s ``centred``). For
    programs that apply each weight matrix to many more rows than it has (MPPI: 512 samples x
    3 steps x 6 iterations per env step)."""

    features: int
    act: str = "mish"  # mish | simnorm
    centred: bool = False

    @nn.compact
    def __call__(self, x):
        x = _dense(self.features)(x)
        return LayerNormAct(self.act, self.centred, name="LayerNorm_0")(x)


class LayerNormAct(nn.Module):
    """flax's ``LayerNorm`` (the same parameters, so checkpoints and parameter counts are
    unchanged) then Mish, as one op with a hand-written backward (``ops.layer_norm``: the
    update's elementwise work over the Q ensemble is mostly this), or then SimNorm."""

    act: str = "mish"  # mish | simnorm
    centred: bool = False  # the input's rows have zero mean (NormedLinear)

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],))
        if self.act == "simnorm":
            return simnorm(layer_norm(x, scale, bias, self.centred))
        return layer_norm_mish(x, scale, bias, self.centred)


class MLP(nn.Module):
    """``layers.mlp``: hidden NormedLinears, then a NormedLinear with SimNorm
    (``out_act="simnorm"``) or a plain Linear (``zero_out``: zero-initialised)."""

    hidden: tuple[int, ...]
    out: int
    out_act: str | None = None
    zero_out: bool = False
    centred: bool = False  # NormedLinear's

    @nn.compact
    def __call__(self, x):
        # One axis of rows, whatever x's batch shape: the backward then sums each layer's
        # parameter gradients over one contiguous axis. Over [steps, rows, width] XLA:CPU
        # sums with a reduce-window spanning both leading axes, half as fast
        # (benchmarks/README.md, TD-MPC2).
        batch = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])
        for width in self.hidden:
            x = NormedLinear(width, centred=self.centred)(x)
        if self.out_act is not None:
            x = NormedLinear(self.out, act=self.out_act, centred=self.centred)(x)
        else:
            x = _dense(self.out, zero=self.zero_out)(x)
        return x.reshape(batch + x.shape[-1:])


def init_q_heads(key, num_heads: int, in_dim: int, width: int) -> dict:
    """Parameters of ``num_heads`` Q networks stacked on a leading axis, each two hidden
    NormedLinears of ``width`` (the first with dropout) and 101 zero-initialised logits:
    ``NormedLinear_0``, ``NormedLinear_1`` (``Dense_0``: kernel, bias; ``LayerNorm_0``: scale,
    bias) and ``Dense_0``, the tree a ``vmap`` of ``MLP`` would make. Every leaf is an array
    of its own: updates donate the parameters, and XLA refuses one buffer donated twice."""
    normal = nn.initializers.truncated_normal(0.02)

    def normed_linear(k, fan_in):
        return {"Dense_0": {"kernel": normal(k, (num_heads, fan_in, width)),
                            "bias": jnp.zeros((num_heads, width))},
                "LayerNorm_0": {"scale": jnp.ones((num_heads, width)),
                                "bias": jnp.zeros((num_heads, width))}}

    k_first, k_second = jax.random.split(key)
    return {"NormedLinear_0": normed_linear(k_first, in_dim),
            "NormedLinear_1": normed_linear(k_second, width),
            "Dense_0": {"kernel": jnp.zeros((num_heads, width, NUM_BINS)),
                        "bias": jnp.zeros((num_heads, NUM_BINS))}}


def q_logits(heads: dict, x: jax.Array, dropout_key=None, centred: bool = False) -> jax.Array:
    """Logits ``[num_heads, ..., 101]`` of the stacked Q networks ``heads`` (``init_q_heads``'
    tree, all of the ensemble or some of its heads) at ``x`` ``[..., in]``, which every head
    reads; dropout on the first hidden layer with ``dropout_key``; ``centred`` as
    ``NormedLinear``'s (not with dropout, which breaks the rows' zero mean).

    Written over the stacked parameters rather than as a ``vmap`` of one head, for the layout:
    the first layer is one matmul for every head, ``x @ [in, heads * width]``, and its
    activations stay rows-major, ``[rows, heads, width]``, through dropout, LayerNorm and
    Mish, so that its weight, scale and bias gradients contract the rows of arrays laid out
    as they are; only then do the heads move to the leading axis, for the second layer's
    batched matmul. A ``vmap`` puts the heads first from the start, and XLA:CPU then
    transposes the first layer's gradient before its weight gradient and sums the scale and
    bias gradients with strided reduce-windows (what the layout saves: benchmarks/README.md,
    TD-MPC2)."""
    first, second, out = heads["NormedLinear_0"], heads["NormedLinear_1"], heads["Dense_0"]
    num_heads, width = first["Dense_0"]["bias"].shape
    batch, in_dim = x.shape[:-1], x.shape[-1]
    kernel = jnp.swapaxes(first["Dense_0"]["kernel"], 0, 1).reshape(in_dim, num_heads * width)
    h = (x.reshape(-1, in_dim) @ kernel).reshape(-1, num_heads, width) + first["Dense_0"]["bias"]
    if dropout_key is not None:  # ops.dropout: half the random bits of nn.Dropout
        h = dropout(dropout_key, h, Q_DROPOUT)
    norm = first["LayerNorm_0"]
    h = layer_norm_mish(h, norm["scale"], norm["bias"], centred and dropout_key is None)
    h = jnp.swapaxes(h, 0, 1)  # [heads, rows, width]
    h = jnp.einsum("hrc,hcd->hrd", h, second["Dense_0"]["kernel"]) \
        + second["Dense_0"]["bias"][:, None]
    norm = second["LayerNorm_0"]
    h = layer_norm_mish(h, norm["scale"][:, None], norm["bias"][:, None], centred)
    logits = jnp.einsum("hrc,hcd->hrd", h, out["kernel"]) + out["bias"][:, None]
    return logits.reshape((num_heads,) + batch + (NUM_BINS,))


class QEnsemble(nn.Module):
    """``num_q`` Q networks with independent parameters and dropout masks: logits
    ``[num_q, ..., 101]``. Their parameters are stacked on a leading axis (``init_q_heads``;
    ``q_heads`` evaluates a subset)."""

    sizes: Sizes
    centred: bool = False  # NormedLinear's

    @nn.compact
    def __call__(self, z, a, train: bool = False):
        x = jnp.concatenate([z, a], -1)
        heads = self.param("heads", init_q_heads, self.sizes.num_q, x.shape[-1],
                           self.sizes.mlp_dim)
        return q_logits(heads, x, self.make_rng("dropout") if train else None, self.centred)


def q_heads(qs, z, a, heads: jax.Array, key, train: bool = False, centred: bool = False):
    """Logits ``[len(heads), ..., 101]`` of the Q heads ``heads`` only (indices into the
    ensemble whose parameters are ``qs``, ``q_params(params)`` or a target copy): the
    planner, the TD target and the policy loss use two heads of five, so the other three
    are never computed (the reference evaluates all five and keeps two)."""
    chosen = jax.tree.map(lambda x: x[heads], qs["heads"])
    return q_logits(chosen, jnp.concatenate([z, a], -1), key if train else None, centred)


class WorldModel(nn.Module):
    """TD-MPC2's model for one task with vector observations (module docstring)."""

    action_dim: int
    sizes: Sizes = Sizes()
    episodic: bool = False  # a termination head (tasks whose episodes can end early)
    centred: bool = False  # NormedLinear's: weights from centre_weights (for planning)

    def setup(self):
        s, c = self.sizes, self.centred
        mlp2 = (s.mlp_dim, s.mlp_dim)
        self.encoder = MLP((s.enc_dim,) * max(s.num_enc_layers - 1, 1), s.latent_dim,
                           out_act="simnorm", centred=c)
        self.dynamics = MLP(mlp2, s.latent_dim, out_act="simnorm", centred=c)
        self.reward_head = MLP(mlp2, NUM_BINS, zero_out=True, centred=c)
        if self.episodic:
            self.termination_head = MLP(mlp2, 1, centred=c)
        self.policy = MLP(mlp2, 2 * self.action_dim, centred=c)
        self.qs = QEnsemble(s, c)

    def __call__(self, obs, action, key):
        """Touches every head (for ``init``): (z, z', reward logits, pi action, Q logits)."""
        z = self.encode(obs)
        nxt = self.next(z, action)
        if self.episodic:
            self.termination(nxt)
        return z, nxt, self.reward(z, action), self.pi(z, key)[0], self.q(z, action)

    def encode(self, obs):
        return self.encoder(obs)

    def next(self, z, a):
        return self.dynamics(jnp.concatenate([z, a], -1))

    def reward(self, z, a):
        return self.reward_head(jnp.concatenate([z, a], -1))

    def termination(self, z):
        """Logit of "this latent is an episode's terminal state"."""
        return self.termination_head(z)[..., 0]

    def q(self, z, a, train: bool = False):
        return self.qs(z, a, train)

    def pi(self, z, key):
        """A sample of the tanh-squashed Gaussian policy prior at ``z`` and its ``info``
        (``squashed_gaussian``)."""
        return squashed_gaussian(self.policy(z), key)


def squashed_gaussian(out: jax.Array, key) -> tuple[jax.Array, dict]:
    """The policy prior's head (``world_model.pi``): ``out`` [..., 2 |A|] is the Gaussian's mean
    and unsquashed log-std; returns a tanh-squashed sample and ``info``: ``mean`` (squashed),
    ``log_std``, ``entropy`` (of the squashed sample) and ``scaled_entropy``, the reference's
    entropy for the policy loss: ``-|A| * log N(eps; 0, std)`` before the squash (its tanh
    correction cancels out in ``world_model.pi``)."""
    mean, log_std = jnp.split(out, 2, axis=-1)
    action_dim = mean.shape[-1]
    log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(log_std) + 1)
    eps = jax.random.normal(key, mean.shape)
    gaussian = jnp.sum(-0.5 * eps ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1)
    action = jnp.tanh(mean + eps * jnp.exp(log_std))
    correction = jnp.sum(jnp.log(jax.nn.relu(1 - action ** 2) + 1e-6), -1)
    return action, {"mean": jnp.tanh(mean), "log_std": log_std,
                    "entropy": -(gaussian - correction),
                    "scaled_entropy": -gaussian * action_dim}


def centre_weights(params):
    """``params`` with every NormedLinear's Linear centred over its output features:
    ``W - mean_j W`` and ``b - mean b``. Then ``x @ W + b`` comes out minus its row's mean,
    which the LayerNorm after it subtracts anyway: a model with ``centred=True`` computes with
    these weights what the model computes with ``params``, with no pass to add the bias before
    LayerNorm's statistics and one row reduction of two. The planner centres once per call,
    outside its loops. In an update, with 256 rows per weight and the centring differentiated,
    it cost more than it saved (benchmarks/README.md, TD-MPC2)."""
    def centre(path, x):
        keys = [getattr(k, "key", "") for k in path]
        in_normed_linear = any(a.startswith("NormedLinear") and b == "Dense_0"
                               for a, b in zip(keys, keys[1:], strict=False))
        return x - jnp.mean(x, -1, keepdims=True) if in_normed_linear else x

    return jax.tree_util.tree_map_with_path(centre, params)


def q_params(params):
    return params["params"]["qs"]


def policy_params(params):
    return params["params"]["policy"]


def with_policy(params, policy):
    """``params`` with the policy prior's parameters replaced by ``policy``."""
    return {**params, "params": {**params["params"], "policy": policy}}


def is_encoder(path) -> bool:
    return any(getattr(k, "key", None) == "encoder" for k in path)


def is_policy(path) -> bool:
    return any(getattr(k, "key", None) == "policy" for k in path)


def param_groups(params):
    """``"encoder"``, ``"policy"`` or ``"model"`` per leaf (optimiser partitions: the encoder
    learns at 0.3x the rate, the policy prior has an optimiser of its own)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "encoder" if is_encoder(path) else "policy" if is_policy(path)
        else "model", params)


def init(model: WorldModel, key, obs_dim: int):
    k_params, k_pi, k_drop = jax.random.split(key, 3)
    obs = jnp.zeros((1, obs_dim))
    action = jnp.zeros((1, model.action_dim))
    return model.init({"params": k_params, "dropout": k_drop}, obs, action, k_pi)


def count_params(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))


def masked_mean(x, mask):
    """[H, B] -> [H]: each step's mean over its valid rows."""
    return jnp.sum(x * mask, 1) / jnp.maximum(jnp.sum(mask, 1), 1.0)


def rollout_terms(net: WorldModel, params, obs, action, reward, terminated, inside, next_z,
                  rho):
    """The latent rollout of TD-MPC2's model loss (sec. 3.2) and its terms, time-major:
    ``z_0 = h(s_0)``, ``z_{t+1} = d(z_t, a_t)`` over ``action`` [H, B, A]; the consistency
    ``||z_{t+1} - next_z_t||^2`` to the (stopped) encodings ``next_z`` [H, B, L], the reward's
    two-hot cross-entropy against ``reward`` [H, B] and, for episodic tasks, the termination
    BCE against ``terminated``, each step weighted ``rho^t`` and masked by ``inside`` [H, B]
    (the transition stays in the episode of s_0). Returns ``(zs [H + 1, B, L], terms)``."""
    horizon = action.shape[0]
    z0 = net.apply(params, obs[0], method=WorldModel.encode)

    def step(z, a):
        z = net.apply(params, z, a, method=WorldModel.next)
        return z, z

    _, rolled = jax.lax.scan(step, z0, action)  # z_1..z_H
    zs = jnp.concatenate([z0[None], rolled])
    consistency = jnp.mean((rolled - next_z) ** 2, -1)
    reward_ce = soft_cross_entropy(net.apply(params, zs[:-1], action, method=WorldModel.reward),
                                   reward)
    terms = {"consistency": jnp.sum(rho * masked_mean(consistency, inside)) / horizon,
             "reward": jnp.sum(rho * masked_mean(reward_ce, inside)) / horizon}
    if net.episodic:
        logits = net.apply(params, rolled, method=WorldModel.termination)
        bce = optax.losses.sigmoid_binary_cross_entropy(logits, terminated)
        terms["termination"] = jnp.sum(bce * inside) / jnp.maximum(jnp.sum(inside), 1.0)
    return zs, terms


@dataclasses.dataclass(frozen=True)
class LatentModel:
    """TD-MPC2's latent model on the world-model protocol (``models.protocol``): the state is
    the latent ``z`` (SimNorm'd), ``observe`` encodes an observation, ``step`` is the
    dynamics with the reward head's two-hot prediction of the transition's reward, and the
    termination head's continuation for episodic tasks (1 otherwise); ``features`` are the
    latent itself. The model decodes no observations. Actions in [-1, 1]."""

    net: WorldModel
    rho: float = 0.5
    consistency_coef: float = 20.0
    reward_coef: float = 0.1
    termination_coef: float = 1.0
    discrete = False
    decodes = False
    differentiable = True

    @property
    def action_dim(self) -> int:
        return self.net.action_dim

    def init(self, key, example_obs):
        """Parameters (every head's, the Q ensemble and policy prior included) from an
        example observation batch."""
        return init(self.net, key, example_obs.shape[-1])

    def loss(self, params, batch, key):
        """TD-MPC2's model loss without its value terms (the agent learning in the model
        brings its own): consistency, reward and termination over the ``[B, T]`` sequences
        of ``batch`` in the replay's convention (``obs``, ``action`` taken at it, ``reward``,
        ``is_terminal``, ``is_first`` arriving with it), from each sequence's first
        observation (``rollout_terms``). Returns ``(loss, (metrics, encodings [B, T, L]))``:
        every observation's latent, where imagination starts."""
        del key
        tm = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
        obs, action = tm(batch["obs"]).astype(jnp.float32), tm(batch["action"])[:-1]
        horizon = action.shape[0]
        inside = jnp.cumprod(1.0 - tm(batch["is_first"])[1:].astype(jnp.float32), axis=0)
        encoded = self.net.apply(params, obs, method=WorldModel.encode)  # [T, B, L]
        _, terms = rollout_terms(
            self.net, params, obs, action, tm(batch["reward"])[1:].astype(jnp.float32),
            tm(batch["is_terminal"])[1:].astype(jnp.float32), inside,
            jax.lax.stop_gradient(encoded[1:]),
            self.rho ** jnp.arange(horizon, dtype=jnp.float32))
        total = self.consistency_coef * terms["consistency"] + self.reward_coef * terms[
            "reward"] + self.termination_coef * terms.get("termination", 0.0)
        return total, ({f"model/{k}": v for k, v in {**terms, "loss": total}.items()},
                       tm(encoded))

    def report(self, params, batch, context: int, key) -> dict:
        """The reward predicted open loop (``protocol.open_loop``) against the replay's."""
        rewards, _ = protocol.open_loop(self, params, batch, context, key)
        return {"report/openloop_reward_mse": jnp.mean(
            (rewards - batch["reward"][:, context:]) ** 2)}

    def initial(self, params, batch: int):
        del params
        return jnp.zeros((batch, self.net.sizes.latent_dim))

    def observe(self, params, state, action, obs, is_first, key):
        del state, action, is_first, key
        return self.net.apply(params, jnp.asarray(obs, jnp.float32), method=WorldModel.encode)

    def step(self, params, state, action, key):
        del key
        reward = decode(self.net.apply(params, state, action, method=WorldModel.reward))
        state = self.net.apply(params, state, action, method=WorldModel.next)
        if self.net.episodic:
            cont = 1.0 - jax.nn.sigmoid(self.net.apply(params, state,
                                                       method=WorldModel.termination))
        else:
            cont = jnp.ones(state.shape[:-1])
        return state, reward, cont

    def features(self, params, state):
        del params
        return state

    def decode(self, params, state):
        raise NotImplementedError("TD-MPC2's latent model decodes no observations.")
