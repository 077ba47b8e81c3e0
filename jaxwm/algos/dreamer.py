"""DreamerV3 on the phase loop (Hafner et al. 2023, arXiv 2301.04104): hooks ``collect`` and
``update_model``, wiring the agent (``jaxwm.agents.dreamer``) to envs, a sequence replay and
the loop.

* ``collect`` is the acting layer's jitted rollout (``jaxwm.envs.acting.Actor``) of
  ``dreamer.steps_per_collect`` steps under the agent's policy (the RSSM posterior filters
  each observation; the carry lives in the actor state), or uniformly random actions while
  the replay holds fewer than ``dreamer.prefill`` steps per env (``acting.warmup``). Every
  step goes into the sequence replay (``data.replay.SequenceReplay``) as ``{obs, action,
  reward, is_first, is_terminal}`` in DreamerV3's convention: ``reward`` and ``is_terminal``
  arrived with ``obs``, ``action`` was taken at it, and envpool's reset observation after an
  episode's final one is ``is_first`` (its ignored action and zero reward are what the reset
  convention of ``envs.types`` gives).
* ``update_model`` is one jitted training step (``DreamerAgent.make_update``) on a sequence
  batch from the replay; every ``report_every`` updates also open-loop predictions.

``train_ratio`` (replayed steps per env step, as in the paper) is met by the train phase's
``collect:M, update_model:K``: K / M updates per collect = train_ratio x env steps per collect
/ (batch x length). ``phase_hooks`` derives M and K when the config leaves the hooks out
(the loop fills them in; the config is not rewritten), and ``validate`` refuses a ratio those
hooks cannot reach within 1%. The achieved ratio is logged as ``replay/train_ratio``.

Seeds (``num_seeds`` N): learner, replay and counters get a leading seed axis, every jitted
function is vmapped over it, and one pool of N x ``env.num_envs`` envs acts in groups.

Action spaces: discrete (one-hot into the model) and continuous boxes, which the actor
produces in [-1, 1] and the policy maps to the env's bounds.
"""

from __future__ import annotations

import fractions
from functools import partial

import jax
import jax.numpy as jnp
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import dreamer
from jaxwm.algos import Capabilities
from jaxwm.config import ConfigError, require
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop import phases, seeds
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.media import Video
from jaxwm.models import rssm
from jaxwm.ops import twohot

MAX_HOOK_REPEATS = 64  # M of collect:M, update_model:K (collects per cycle)


CAPABILITIES = Capabilities(
    device_batches=lambda c: {"dreamer.batch_size": c.dreamer.batch_size})


@struct.dataclass
class DreamerState:
    learner: dreamer.Learner
    replay: SequenceReplay
    updates: jax.Array
    actor: acting.ActorState


def ratio_hooks(config) -> tuple[int, int]:
    """(M, K) with K / M = updates per collect closest to ``train_ratio``, M <= 64 collects
    per cycle (K is whatever the ratio needs: dmc_proprio's 1024 with 16 envs gives K = 16)."""
    d = config.dreamer
    per_collect = (d.train_ratio * config.env.num_envs * d.steps_per_collect
                   / (d.batch_size * d.batch_length))
    best = fractions.Fraction(per_collect).limit_denominator(MAX_HOOK_REPEATS)
    return best.denominator, best.numerator


def achieved_ratio(config, collects: int, updates: int) -> float:
    d = config.dreamer
    return updates * d.batch_size * d.batch_length / (collects * config.env.num_envs
                                                       * d.steps_per_collect)


def phase_hooks(config) -> dict[str, tuple[str, ...]]:
    """The train phase's ``collect:M, update_model:K`` derived from ``dreamer.train_ratio``,
    for a config that leaves ``phases.train.hooks`` empty (``Algorithm.phase_hooks``)."""
    m, k = ratio_hooks(config)
    if k == 0:
        raise ConfigError(
            f"dreamer.train_ratio={config.dreamer.train_ratio} is below one update per "
            f"{MAX_HOOK_REPEATS} collects; raise it, or set phases.train.hooks yourself.")
    return {"train": (f"collect:{m}", f"update_model:{k}")}


def _hook_repeats(hooks) -> dict:
    """{hook name: calls per cycle} of a phase's hook list (``loop.phases`` syntax)."""
    out = {}
    for name, repeats in map(phases.parse_hook, hooks):
        out[name] = out.get(name, 0) + repeats
    return out


def validate(config) -> None:
    d = config.dreamer
    checks = [
        (d.model_size in rssm.SIZES, f"dreamer.model_size={d.model_size!r} does not exist; "
                                     f"choose one of {list(rssm.SIZES)}."),
        (d.batch_length > 1, "dreamer.batch_length must be > 1."),
        (d.train_ratio > 0, f"dreamer.train_ratio must be > 0, got {d.train_ratio}."),
        (d.capacity // config.env.num_envs >= max(d.prefill, d.batch_length),
         f"dreamer.capacity={d.capacity} transitions hold {d.capacity // config.env.num_envs} "
         f"steps of each of the {config.env.num_envs} envs; they must hold dreamer.prefill "
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
    ]
    require(checks)
    derived = phase_hooks(config)["train"]  # refuses a ratio no hooks can meet
    train = config.phases.get("train")
    if train is not None:
        repeats = _hook_repeats(tuple(train.hooks) or derived)
        m, k = repeats.get("collect", 0), repeats.get("update_model", 0)
        if m and k:
            got = achieved_ratio(config, m, k)
            if abs(got - d.train_ratio) > 0.01 * d.train_ratio:
                best_m, best_k = ratio_hooks(config)
                raise ConfigError(
                    f"phases.train.hooks {tuple(train.hooks)} give a train ratio of {got:g}, "
                    f"not dreamer.train_ratio={d.train_ratio}; leave the hooks empty to derive "
                    f"them (nearest: collect:{best_m}, update_model:{best_k} gives "
                    f"{achieved_ratio(config, best_m, best_k):g}), or change the ratio.")


def validate_env(config, spec) -> None:
    """The observation and action spaces DreamerV3 can model."""
    if spec.is_pixels and spec.obs_shape[1:] != (rssm.IMAGE_SIZE, rssm.IMAGE_SIZE):
        raise ConfigError(
            f"{spec.env_id}: images of {spec.obs_shape[1:]} pixels; the DreamerV3 encoder takes "
            f"{rssm.IMAGE_SIZE}x{rssm.IMAGE_SIZE} (set env.img_height and env.img_width to "
            f"{rssm.IMAGE_SIZE}).")
    if (not spec.discrete and len(spec.action_shape) != 1) or \
            (spec.discrete and spec.action_shape != ()):
        kind = "discrete" if spec.discrete else "box"
        raise ConfigError(f"{spec.env_id}: dreamer supports one discrete action or a flat box, "
                          f"not a {kind} action of shape {spec.action_shape}.")
    if len(spec.obs_shape) not in (1, 3):
        raise ConfigError(f"{spec.env_id}: dreamer takes vector or image observations, not "
                          f"shape {spec.obs_shape}.")


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    return {"collect": {"env_steps": config.env.num_envs * config.dreamer.steps_per_collect},
            "update_model": {"model_updates": 1}}


def build(config) -> Algorithm:
    d, num_envs = config.dreamer, config.env.num_envs  # envs per seed
    env = acting.make_pool(config)
    spec = env.spec
    agent = dreamer.make(spec, d)
    # Data parallel as online SAC: acting runs on the process's first device; parameters,
    # optimiser and replay are replicated over the mesh, and each update's sequences are
    # split over its ``data`` axis.
    mesh = parallel.data_mesh(config.num_devices or None)
    over_seeds = partial(seeds.vmap, num_seeds=config.num_seeds)
    policy = agent.policy()

    def finish(params, start, steps, final, completed):
        """One group's steps as replay records, in DreamerV3's convention: ``reward`` and
        ``is_terminal`` arrived with ``obs``, ``action`` (the model's units) was taken at
        it; the reset observation after an episode's last one is ``is_first``."""
        del params, start
        records = {"obs": steps.obs, "action": agent.model_action(steps.action),
                   "reward": steps.reward, "is_first": steps.is_first,
                   "is_terminal": steps.terminated}
        return final.carry, ((records,), episode_metrics(completed))

    # Random actions until the replay holds the prefill.
    actor = acting.Actor(env, policy, d.steps_per_collect, mesh=mesh, groups=config.num_seeds,
                         finish=finish, warmup_transitions=d.prefill * num_envs)

    def init(key):
        example_obs = jnp.zeros((1,) + tuple(spec.obs_shape), spec.obs_dtype)
        action = jnp.zeros((), jnp.int32) if spec.discrete else \
            jnp.zeros(agent.action_dim)
        example = {"obs": example_obs[0], "action": action, "reward": jnp.zeros(()),
                   "is_first": jnp.zeros((), bool), "is_terminal": jnp.zeros((), bool)}
        learner, replay, updates = over_seeds(lambda k: (
            agent.init(k, example_obs), SequenceReplay.create(d.capacity, example, num_envs),
            jnp.zeros((), jnp.int32)))(key)
        learner, replay, updates = parallel.replicate((learner, replay, updates), mesh)
        return DreamerState(learner, replay, updates, actor.init(learner))

    update = agent.make_update(mesh)

    def train(learner, replay, updates, key):
        k_batch, k_loss = jax.random.split(key)
        batch = replay.sample(k_batch, d.batch_size, d.batch_length)
        learner, metrics = update(learner, batch, k_loss)
        replayed = (updates + 1) * d.batch_size * d.batch_length
        trained_steps = jnp.maximum(replay.added - d.prefill * num_envs, 1)
        return learner, updates + 1, {**metrics, "replay/train_ratio": replayed / trained_steps}

    _train = backend.jit(over_seeds(train), donate_argnums=(0, 2))

    def report(learner, replay, key):
        k_batch, k_model = jax.random.split(key)
        batch = replay.sample(k_batch, d.report_batch, d.report_length)
        return agent.report(learner.params, batch, d.report_context, k_model, spec.is_pixels)

    @backend.jit
    def _report(learner, replay, key):
        metrics = over_seeds(report)(learner, replay, key)
        if config.num_seeds > 1:  # one video (seed 0's); the MSEs per seed
            metrics = {k: jax.tree.map(lambda x: x[0], v) if isinstance(v, Video) else v
                       for k, v in metrics.items()}
        return metrics

    updates_seen = {"count": None}  # host copy of state.updates: read once, then counted

    def train_hook(state, data, key):
        del data
        learner, updates, metrics = _train(state.learner, state.replay, state.updates, key)
        state = state.replace(learner=learner, updates=updates)
        if d.report_every > 0:
            if updates_seen["count"] is None:  # first call (or first after a resume)
                updates_seen["count"] = int(jnp.ravel(updates)[0])
            else:
                updates_seen["count"] += 1
            if updates_seen["count"] % d.report_every == 0:
                metrics = {**metrics, **_report(state.learner, state.replay,
                                                seeds.fold_in(key, 1))}
        return state, {}, metrics

    return Algorithm(
        name="DreamerV3",
        init=init,
        hooks={
            "collect": Hook(actor.replay_hook(), counts=hook_counts(config)["collect"]),
            "update_model": Hook(train_hook, counts=hook_counts(config)["update_model"]),
        },
        policy=policy,
        phase_hooks=phase_hooks(config),
        close=actor.close,
    )
