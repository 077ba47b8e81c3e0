"""Diffusion Policy (Chi et al. 2023, RSS; real-stanford/diffusion_policy): behaviour cloning
of action chunks by denoising diffusion, and the plain MLP behaviour cloning beside it.

The learner (``init_learner`` / ``make_update``, the convention of ``agents/sac.py``):

* inputs and targets normalised to [-1, 1] per dimension from the data's limits
  (``Normalizer``: the reference's ``LinearNormalizer`` in ``limits`` mode, dims whose range is
  below 1e-4 mapped to 0);
* ``model="unet"``: epsilon prediction, ``|| eps - eps_theta(x_t, t, obs) ||^2`` over the
  whole chunk with t uniform over the training steps (``models.diffusion``), conditioned on
  the flattened history of ``n_obs_steps`` observations (``obs_as_global_cond``);
  ``model="mlp"``: the chunk regressed directly, mean squared error (the baseline);
* AdamW (lr 1e-4, betas (0.95, 0.999), weight decay 1e-6) with diffusers' cosine schedule
  after a linear warm-up of 500 steps (``optax.warmup_cosine_decay_schedule``), as the
  reference's ``get_scheduler("cosine")``;
* an EMA of the weights, used for acting (the reference's ``EMAModel``: decay
  ``1 - (1 + k)^-0.75`` capped at 0.9999, 0 for the first two updates: ``ema_decay``).

The policy (``policy``), shared by evaluation and any collection through the acting layer:
its carry holds each env's last ``n_obs_steps`` observations (repeated at an episode's start,
as the reference pads) and a queue of actions. When an env's queue is empty it plans a chunk
of ``horizon`` actions and queues the ``action_steps`` from ``n_obs_steps - 1`` on (the
reference's ``action_pred[:, To - 1 : To - 1 + Ta]``); the queue empties at episode starts.
Planning runs only on steps where some env needs it (``lax.cond``; with several seeds the
grouped policy is vmapped and the cond becomes a select, so every step plans), for all envs
at once, and keeps the new plan where a queue was empty. Actions are clipped to the env's
bounds. The acting layer's temperature is not used: the sampler starts from Gaussian noise,
and ``sampler="ddim"`` with ``eta=0`` adds none after that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import struct

from jaxwm.envs.acting import Policy
from jaxwm.models import diffusion

MODELS = ("unet", "mlp")
SAMPLERS = ("ddpm", "ddim")


def config_block(**overrides) -> ml_collections.ConfigDict:
    """``config.diffusion``: the reference's state-input defaults (real-stanford/diffusion_policy,
    ``diffusion_policy/config/train_diffusion_unet_lowdim_workspace.yaml``)."""
    c = ml_collections.ConfigDict()
    c.model = "unet"  # or "mlp": behaviour cloning's baseline
    c.horizon = 16
    c.n_obs_steps = 2
    c.action_steps = 8
    c.down_dims = (256, 512, 1024)
    c.step_embed_dim = 256
    c.kernel_size = 5
    c.groups = 8
    c.mlp_hidden = (256, 256, 256)
    c.train_steps = 100  # diffusion steps
    c.sampler = "ddpm"
    c.inference_steps = 100  # DDIM: e.g. 10
    c.eta = 0.0
    c.clip_sample = True
    c.learning_rate = 1e-4
    c.betas = (0.95, 0.999)
    c.weight_decay = 1e-6
    c.warmup_steps = 500
    c.ema_power = 0.75
    c.ema_max = 0.9999
    c.batch_size = 256
    c.updates_per_call = 1  # updates per update_agent call, one jitted scan
    c.update(overrides)
    return c


# ``config_block``'s settings: ``{key: (valid range, description)}`` (``jaxwm.config``).
FIELDS = {
    "model": ("{unet, mlp}", "unet: Diffusion Policy (Chi et al. 2023); mlp: plain BC baseline."),
    "horizon": ("> 0", "Actions per planned chunk (the reference's horizon)."),
    "n_obs_steps": ("> 0", "Past observations each plan is conditioned on."),
    "action_steps": ("> 0", "Actions of each plan executed before the next plan."),
    "down_dims": ("> 0", "U-Net channels per level (multiples of groups)."),
    "step_embed_dim": (">= 4", "Width of the diffusion-step embedding (even)."),
    "kernel_size": ("> 0", "Kernel width of the U-Net's 1-D convolutions."),
    "groups": ("> 0", "GroupNorm groups in the U-Net's blocks."),
    "mlp_hidden": ("> 0", "model=mlp: widths of the MLP's hidden layers."),
    "train_steps": ("> 0", "Diffusion steps of the noise schedule (squaredcos_cap_v2)."),
    "sampler": ("{ddpm, ddim}", "Reverse process: DDPM (every step) or DDIM (fewer steps)."),
    "inference_steps": ("> 0", "Denoising steps per plan (divides train_steps; DDPM: equal)."),
    "eta": (">= 0", "DDIM's noise: 0 deterministic (the reference's), 1 as DDPM."),
    "clip_sample": (None, "Clip the predicted clean chunk to the normalised [-1, 1]."),
    "learning_rate": ("> 0", "AdamW's peak learning rate (warm-up, then cosine decay)."),
    "betas": ("[0, 1)", "AdamW's (b1, b2)."),
    "weight_decay": (">= 0", "AdamW's decoupled weight decay."),
    "warmup_steps": ("> 0", "Updates of linear learning-rate warm-up."),
    "ema_power": (">= 0", "EMA of the weights: decay 1 - (1 + k)^-power after k updates."),
    "ema_max": ("[0, 1]", "Cap on the EMA's decay."),
    "batch_size": ("> 0", "Windows of demonstrations per update."),
    "updates_per_call": ("> 0", "Updates per update_agent call, in one jitted scan."),
}


@dataclasses.dataclass(frozen=True)
class Hyper:
    model: str
    horizon: int
    n_obs_steps: int
    action_steps: int
    obs_dim: int
    action_dim: int
    down_dims: tuple[int, ...]
    step_embed_dim: int
    kernel_size: int
    groups: int
    mlp_hidden: tuple[int, ...]
    train_steps: int
    sampler: str
    inference_steps: int
    eta: float
    clip_sample: bool
    learning_rate: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    schedule_steps: int  # the cosine schedule's length: the run's updates
    ema_power: float
    ema_max: float
    batch_size: int

    @classmethod
    def from_config(cls, c, obs_dim: int, action_dim: int, schedule_steps: int) -> Hyper:
        names = {f.name for f in dataclasses.fields(cls)} - {"obs_dim", "action_dim",
                                                              "schedule_steps"}
        values = {k: (tuple(c[k]) if isinstance(c[k], (list, tuple)) else c[k]) for k in names}
        return cls(obs_dim=obs_dim, action_dim=action_dim, schedule_steps=schedule_steps,
                   **values)

    @property
    def first_action(self) -> int:
        return self.n_obs_steps - 1


def check(c) -> list[tuple[bool, str]]:
    """The settings' own consistency, as ``jaxwm.config.require`` checks."""
    levels = 2 ** (len(c.down_dims) - 1)
    return [
        (c.model in MODELS, f"diffusion.model must be one of {MODELS}, got {c.model!r}."),
        (c.sampler in SAMPLERS, f"diffusion.sampler must be one of {SAMPLERS}, got "
                                f"{c.sampler!r}."),
        (c.n_obs_steps - 1 + c.action_steps <= c.horizon,
         f"diffusion.horizon={c.horizon} is too short for diffusion.action_steps="
         f"{c.action_steps} executed from step n_obs_steps - 1 = {c.n_obs_steps - 1}: make "
         f"horizon >= {c.n_obs_steps - 1 + c.action_steps} or execute fewer actions."),
        (c.model != "unet" or c.horizon % levels == 0,
         f"diffusion.horizon={c.horizon} must be a multiple of {levels}: the U-Net halves it "
         f"{len(c.down_dims) - 1} times (down_dims={tuple(c.down_dims)})."),
        (all(d % c.groups == 0 for d in c.down_dims) and c.down_dims[0] % 8 == 0,
         f"diffusion.down_dims={tuple(c.down_dims)} must be multiples of diffusion.groups="
         f"{c.groups} (GroupNorm), and the first of 8 (the last block's 8 groups)."),
        (1 <= c.inference_steps <= c.train_steps and c.train_steps % c.inference_steps == 0,
         f"diffusion.inference_steps={c.inference_steps} must divide diffusion.train_steps="
         f"{c.train_steps} (DDPM uses every step: set them equal)."),
        (c.sampler == "ddim" or c.inference_steps == c.train_steps,
         "DDPM samples with every training step: set diffusion.inference_steps="
         f"{c.train_steps}, or diffusion.sampler=ddim for fewer."),
        (c.step_embed_dim % 2 == 0 and c.step_embed_dim >= 4,
         "diffusion.step_embed_dim must be even and >= 4."),
    ]


# ----------------------------------------------------------------------------- normalizer


@struct.dataclass
class Normalizer:
    """``x -> scale * x + offset`` per dimension, mapping the data's limits to [-1, 1]."""

    scale: jax.Array
    offset: jax.Array

    @classmethod
    def fit(cls, x: np.ndarray, range_eps: float = 1e-4) -> Normalizer:
        low, high = x.min(0), x.max(0)
        span = high - low
        flat = span < range_eps
        span = np.where(flat, 2.0, span)
        scale = 2.0 / span
        offset = np.where(flat, -low, -1.0 - scale * low)
        return cls(jnp.asarray(scale, jnp.float32), jnp.asarray(offset, jnp.float32))

    def __call__(self, x):
        return x * self.scale + self.offset

    def inverse(self, y):
        return (y - self.offset) / self.scale


@struct.dataclass
class Learner:
    params: dict
    ema_params: dict
    opt_state: optax.OptState
    step: jax.Array
    obs_norm: Normalizer
    action_norm: Normalizer


# ----------------------------------------------------------------------------- networks


def network(h: Hyper):
    if h.model == "unet":
        return diffusion.ConditionalUnet1D(h.action_dim, tuple(h.down_dims), h.step_embed_dim,
                                           h.kernel_size, h.groups)
    return diffusion.MLPChunk(h.horizon, h.action_dim, tuple(h.mlp_hidden))


def optimizer(h: Hyper) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, h.learning_rate, h.warmup_steps, max(h.schedule_steps, h.warmup_steps + 1))
    return optax.adamw(schedule, b1=h.betas[0], b2=h.betas[1], weight_decay=h.weight_decay)


def ema_decay(h: Hyper, step):
    """The reference's ``EMAModel.get_decay`` (inv_gamma 1, update_after_step 0) after update
    number ``step`` (1, 2, ...): the reference passes the 0-based optimisation step and takes
    ``k = step - 1`` of it, so the first two updates copy the weights (decay 0) and update
    ``step`` then uses ``1 - (1 + k)^-power`` with ``k = step - 2``, at most ``ema_max``."""
    k = jnp.maximum(step - 2, 0).astype(jnp.float32)
    decay = 1.0 - (1.0 + k) ** -h.ema_power
    return jnp.where(k <= 0, 0.0, jnp.clip(decay, 0.0, h.ema_max))


def condition(h: Hyper, learner_or_norm, obs_history):
    """``[B, n_obs_steps, obs_dim]`` raw observations -> the flattened normalised condition."""
    norm = learner_or_norm.obs_norm if isinstance(learner_or_norm, Learner) else learner_or_norm
    return norm(obs_history).reshape(obs_history.shape[0], -1)


def init_learner(h: Hyper, key, obs: np.ndarray, action: np.ndarray) -> Learner:
    """Parameters, optimiser and normalisers fitted to the data's observations and actions."""
    net = network(h)
    cond = jnp.zeros((1, h.n_obs_steps * h.obs_dim))
    init = jax.jit(net.init)  # one program: flax's eager init dispatches op by op
    if h.model == "unet":
        params = init(key, jnp.zeros((1, h.horizon, h.action_dim)), jnp.zeros((1,), jnp.int32),
                      cond)
    else:
        params = init(key, cond)
    ema = jax.tree.map(jnp.copy, params)  # its own buffers: the update donates both
    return Learner(params, ema, optimizer(h).init(params), jnp.zeros((), jnp.int32),
                   Normalizer.fit(obs), Normalizer.fit(action))


def loss_fn(h: Hyper, schedule: diffusion.Schedule, params, learner: Learner, batch, key):
    """Mean squared error of the predicted noise (U-Net) or chunk (MLP), normalised units."""
    net = network(h)
    cond = condition(h, learner, batch["obs"][:, :h.n_obs_steps])
    target = learner.action_norm(batch["action"])
    if h.model == "mlp":
        return jnp.mean((net.apply(params, cond) - target) ** 2)
    k_noise, k_t = jax.random.split(key)
    noise = jax.random.normal(k_noise, target.shape)
    t = jax.random.randint(k_t, (target.shape[0],), 0, h.train_steps)
    noisy = diffusion.add_noise(schedule, target, noise, t)
    return jnp.mean((net.apply(params, noisy, t, cond) - noise) ** 2)


def make_update(h: Hyper, sample_batch, constrain=lambda batch: batch):
    """``update(learner, *sources, key) -> (learner, metrics)``: one step on
    ``sample_batch(*sources, key)`` (``{"obs": [B, To+, O], "action": [B, H, A]}``, raw)."""
    schedule = diffusion.squaredcos_cap_v2(h.train_steps)
    opt = optimizer(h)

    def update(learner: Learner, *sources_and_key):
        *sources, key = sources_and_key
        k_batch, k_loss = jax.random.split(key)
        batch = constrain(sample_batch(*sources, k_batch))
        loss, grads = jax.value_and_grad(loss_fn, argnums=2)(h, schedule, learner.params,
                                                             learner, batch, k_loss)
        updates, opt_state = opt.update(grads, learner.opt_state, learner.params)
        params = optax.apply_updates(learner.params, updates)
        step = learner.step + 1
        decay = ema_decay(h, step)
        ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, learner.ema_params, params)
        metrics = {"loss/bc": loss, "optim/grad_norm": optax.tree.norm(grads),
                   "optim/ema_decay": decay}
        return learner.replace(params=params, ema_params=ema, opt_state=opt_state,
                               step=step), metrics

    return update


# ----------------------------------------------------------------------------- acting


def plan(h: Hyper, params, obs_norm: Normalizer, action_norm: Normalizer, obs_history, key):
    """``[n, horizon, action_dim]`` raw actions for ``[n, n_obs_steps, obs_dim]`` histories:
    the reverse process from noise (U-Net) or the regression (MLP)."""
    chex.assert_rank(obs_history, 3)
    net = network(h)
    cond = condition(h, obs_norm, obs_history)
    n = obs_history.shape[0]
    if h.model == "mlp":
        chunk = net.apply(params, cond)
    else:
        schedule = diffusion.squaredcos_cap_v2(h.train_steps)
        steps = diffusion.timesteps(h.train_steps, h.inference_steps, h.sampler)
        # Every step's FiLM at once ([steps, n, 2 * width] per block): one batched product.
        films = net.apply(params, jnp.broadcast_to(steps[:, None], (steps.shape[0], n)), cond,
                          method=net.conditions)
        chunk = diffusion.sample(
            lambda x, t, film: net.apply(params, x, film, method=net.trunk), schedule,
            (n, h.horizon, h.action_dim), key, sampler=h.sampler,
            num_inference=h.inference_steps, eta=h.eta, clip=h.clip_sample, per_step=films)
    return action_norm.inverse(chunk)


def acting_params(learner: Learner):
    """What the policy acts with: the EMA weights and the normalisers."""
    return (learner.ema_params, learner.obs_norm, learner.action_norm)


def policy(h: Hyper, action_low: Sequence[float], action_high: Sequence[float]) -> Policy:
    """The action-queue policy (module docstring); params are ``acting_params(learner)``."""
    low, high = jnp.asarray(action_low), jnp.asarray(action_high)

    def init_carry(params, num_envs):
        del params
        return {"history": jnp.zeros((num_envs, h.n_obs_steps, h.obs_dim)),
                "queue": jnp.zeros((num_envs, h.action_steps, h.action_dim)),
                "index": jnp.full((num_envs,), h.action_steps, jnp.int32)}

    def act(params, carry, obs, is_first, key, temperature=1.0):
        del temperature
        weights, obs_norm, action_norm = params
        obs = obs.astype(jnp.float32)
        fresh = jnp.repeat(obs[:, None], h.n_obs_steps, axis=1)
        shifted = jnp.concatenate([carry["history"][:, 1:], obs[:, None]], axis=1)
        history = jnp.where(is_first[:, None, None], fresh, shifted)
        index = jnp.where(is_first, h.action_steps, carry["index"])
        empty = index >= h.action_steps

        def replan(queue):
            chunk = plan(h, weights, obs_norm, action_norm, history, key)
            new = chunk[:, h.first_action:h.first_action + h.action_steps]
            return jnp.where(empty[:, None, None], new, queue)

        queue = jax.lax.cond(jnp.any(empty), replan, lambda q: q, carry["queue"])
        index = jnp.where(empty, 0, index)
        action = jnp.clip(jnp.take_along_axis(queue, index[:, None, None], axis=1)[:, 0],
                          low, high)
        return {"history": history, "queue": queue, "index": index + 1}, action, {}

    return Policy(init_carry=init_carry, act=act)
