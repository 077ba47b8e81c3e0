"""World Models' memory model M: an LSTM with a mixture-density head over the next latent
(Ha & Schmidhuber 2018, sec. 2.2 and appendix A.2, after Graves 2013 and Ha & Eck 2017;
hardmaru/WorldModelsExperiments ``carracing/rnn/rnn.py``).

Input ``[z_t, a_t]``, an LSTM of 256 units (``nets.backbones`` RNN without its output
LayerNorm: the reference's cell has ``use_layer_norm=0``), and a dense head that gives, for
every one of the ``z_dim`` latent dimensions independently, a mixture of ``num_mixtures`` (5)
Gaussians over ``z_{t+1}``: ``log pi`` (log-softmax over the mixture), ``mu``, ``log sigma``.
The loss is the negative log-likelihood of the next latent, averaged over batch, time and
dimensions (the reference's ``get_lossfunc``):

    -log p(y) = -logsumexp_k [log pi_k + log N(y; mu_k, exp(log sigma_k))].

Optional heads for dreaming (``predict_reward``, ``predict_done``: the paper's Doom model
predicts ``done``): the next reward by squared error and the episode's end by binary
cross-entropy, from the same LSTM output.

Sampling with a temperature tau (the paper's sec. 4.4, the reference's ``sample_sequence``):
``log pi / tau`` renormalised, then ``z = mu_k + sigma_k sqrt(tau) eps`` for the chosen k,
per dimension.

One difference from the reference: Flax's LSTM adds no +1 to the forget gate's bias (the
reference's TF cell does, ``forget_bias=1.0``); an LSTM learns its bias either way.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxwm.nets.backbones.recurrent import RNN

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclasses.dataclass(frozen=True)
class MDNHyper:
    z_dim: int = 32
    hidden: int = 256
    num_mixtures: int = 5
    predict_reward: bool = False
    predict_done: bool = False


class MDNRNN(nn.Module):
    hyper: MDNHyper = MDNHyper()

    def setup(self):
        h = self.hyper
        self.rnn = RNN("lstm", h.hidden, norm=False, name="lstm")
        self.mdn = nn.Dense(h.z_dim * h.num_mixtures * 3, name="mdn")
        if h.predict_reward:
            self.reward_head = nn.Dense(1, name="reward")
        if h.predict_done:
            self.done_head = nn.Dense(1, name="done")

    def initialize_carry(self, batch_size: int):
        """A zero memory (c, h) for ``batch_size`` sequences, the LSTM backbone's layout
        (callable on an unbound module)."""
        zeros = lambda: jnp.zeros((batch_size, self.hyper.hidden))  # noqa: E731
        return zeros(), zeros()

    def __call__(self, carry, z, action, reset):
        """``z`` [B, T, z_dim], ``action`` [B, T, A], ``reset`` [B, T] (zero the memory
        first) -> (carry, outputs): ``log_pi``, ``mu``, ``log_sigma`` [B, T, z_dim, K], the
        LSTM output ``h`` [B, T, hidden], and ``reward`` / ``done_logit`` [B, T] if
        predicted."""
        h = self.hyper
        carry, out = self.rnn(carry, jnp.concatenate([z, action], -1), reset)
        params = self.mdn(out).reshape(out.shape[:-1] + (h.z_dim, h.num_mixtures, 3))
        log_pi = jax.nn.log_softmax(params[..., 0], axis=-1)
        outputs = {"log_pi": log_pi, "mu": params[..., 1], "log_sigma": params[..., 2],
                   "h": out}
        if h.predict_reward:
            outputs["reward"] = self.reward_head(out)[..., 0]
        if h.predict_done:
            outputs["done_logit"] = self.done_head(out)[..., 0]
        return carry, outputs


def log_normal(y, mu, log_sigma):
    return -0.5 * ((y - mu) / jnp.exp(log_sigma)) ** 2 - log_sigma - LOG_SQRT_2PI


def mixture_log_prob(log_pi, mu, log_sigma, y):
    """log p(y) [...] of ``y`` [...] under per-dimension mixtures [..., K]."""
    return jax.scipy.special.logsumexp(log_pi + log_normal(y[..., None], mu, log_sigma), -1)


def sample(outputs, key, temperature: float = 1.0):
    """A next latent [..., z_dim] from the mixtures at ``temperature`` (module docstring)."""
    k_pick, k_noise = jax.random.split(key)
    logits = outputs["log_pi"] / temperature
    pick = jax.random.categorical(k_pick, logits, axis=-1)[..., None]
    mu = jnp.take_along_axis(outputs["mu"], pick, -1)[..., 0]
    sigma = jnp.exp(jnp.take_along_axis(outputs["log_sigma"], pick, -1)[..., 0])
    return mu + sigma * jnp.sqrt(temperature) * jax.random.normal(k_noise, mu.shape)


def loss(model: MDNRNN, params, batch):
    """``(loss, metrics)`` on sequences: ``z`` [B, T + 1, z_dim] (latents sampled from the
    VAE's posterior), ``action`` [B, T, A] and, if predicted, ``reward`` and ``done`` [B, T]
    (what followed each action). Every sequence starts with a fresh memory; optional
    ``reset`` [B, T] zeroes it again before a step (a new episode inside a window) and
    ``mask`` [B, T] leaves out transitions that are not one (across an episode's end)."""
    h = model.hyper
    z, action = batch["z"], batch["action"]
    carry = model.initialize_carry(z.shape[0])
    reset = batch.get("reset", jnp.zeros(action.shape[:2], bool))
    mask = batch.get("mask", jnp.ones(action.shape[:2], bool)).astype(jnp.float32)
    count = jnp.maximum(jnp.sum(mask), 1.0)

    def mean(x):  # over the valid transitions
        return jnp.sum(x * mask) / count

    _, out = model.apply(params, carry, z[:, :-1], action, reset)
    log_p = mixture_log_prob(out["log_pi"], out["mu"], out["log_sigma"], z[:, 1:])
    nll = -mean(jnp.mean(log_p, -1))
    metrics = {"rnn/z_nll": nll}
    total = nll
    if h.predict_reward:
        metrics["rnn/reward_mse"] = mean((out["reward"] - batch["reward"]) ** 2)
        total = total + metrics["rnn/reward_mse"]
    if h.predict_done:
        metrics["rnn/done_bce"] = mean(optax.sigmoid_binary_cross_entropy(
            out["done_logit"], batch["done"].astype(jnp.float32)))
        total = total + metrics["rnn/done_bce"]
    metrics["rnn/loss"] = total
    return total, metrics


def init(model: MDNRNN, key, action_dim: int):
    h = model.hyper
    return model.init(key, model.initialize_carry(1), jnp.zeros((1, 1, h.z_dim)),
                      jnp.zeros((1, 1, action_dim)), jnp.zeros((1, 1), bool))
