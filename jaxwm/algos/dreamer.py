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
from jaxwm.config import ConfigError
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting, make_env
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop import phases, seeds
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.media import Video
from jaxwm.models import rssm

MAX_HOOK_REPEATS = 64  # M of collect:M, update_model:K (collects per cycle)


@struct.dataclass
class DreamerState:
    learner: dreamer.Learner
    replay: SequenceReplay
    env_steps: jax.Array  # collected, for the achieved train ratio
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


CAPABILITIES = Capabilities(device_batches=("dreamer.batch_size",))


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
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
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


def build(config) -> Algorithm:
    d, num_seeds = config.dreamer, config.num_seeds
    env = make_env(config.env, num_envs=num_seeds * config.env.num_envs, seed=config.seed)
    spec = env.spec
    num_envs = config.env.num_envs  # per seed
    agent = dreamer.make(spec, d)
    # Data parallel as online SAC: acting runs on the process's first device; parameters,
    # optimiser and replay are replicated over the mesh, and each update's sequences are
    # split over its ``data`` axis.
    mesh = parallel.data_mesh(config.num_devices or None)
    over_seeds = partial(seeds.vmap, num_seeds=num_seeds)
    policy = agent.policy()

    def finish(params, start, steps, final, completed):
        """One group's steps as replay records, in DreamerV3's convention: ``reward`` and
        ``is_terminal`` arrived with ``obs``, ``action`` (the model's units) was taken at
        it; the reset observation after an episode's last one is ``is_first``."""
        del params, start
        records = {"obs": steps.obs, "action": agent.model_action(steps.action),
                   "reward": steps.reward, "is_first": steps.is_first,
                   "is_terminal": steps.terminated}
        return final.carry, (records, episode_metrics(completed))

    actor = acting.Actor(env, acting.warmup(policy, partial(acting.uniform_action, spec)),
                         d.steps_per_collect, mesh=mesh, groups=num_seeds, finish=finish)

    def acting_params(learner, replay):  # random actions until the replay holds the prefill
        return replay.size < d.prefill, learner.params

    def init(key):
        example_obs = jnp.zeros((1,) + tuple(spec.obs_shape), spec.obs_dtype)
        action = jnp.zeros((), jnp.int32) if spec.discrete else \
            jnp.zeros(agent.action_dim)
        example = {"obs": example_obs[0], "action": action, "reward": jnp.zeros(()),
                   "is_first": jnp.zeros((), bool), "is_terminal": jnp.zeros((), bool)}
        learner, replay = over_seeds(lambda k: (
            agent.init(k, example_obs), SequenceReplay.create(d.capacity, example, num_envs)))(
            key)
        counters = over_seeds(lambda k: (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)))(
            key)  # two buffers: each is donated on its own
        learner, replay, counters = parallel.replicate((learner, replay, counters), mesh)
        return DreamerState(learner, replay, *counters,
                            actor.init(acting_params(learner, replay)))

    @partial(backend.jit, donate_argnums=(0, 1))
    def _add(replay, env_steps, records):
        replay = over_seeds(lambda r, x: r.add(x))(replay, records)
        # A buffer of its own (float) for the metric, not the replay's size, which is donated.
        return replay, env_steps + num_envs * d.steps_per_collect, \
            replay.transitions.astype(jnp.float32)

    def collect_hook(state: DreamerState, data, key):
        del data
        random = acting_params(state.learner, state.replay)[0]
        actor_state, (records, metrics) = actor.collect(
            acting_params(state.learner, state.replay), state.actor, key)
        replay, env_steps, size = _add(state.replay, state.env_steps,
                                       parallel.replicate(records, mesh))
        state = state.replace(actor=actor_state, replay=replay, env_steps=env_steps)
        return state, {}, {**metrics, "replay/size": size,
                           "charts/random_actions": random.astype(jnp.float32)}

    update = agent.make_update(mesh)

    def train(learner, replay, env_steps, updates, key):
        k_batch, k_loss = jax.random.split(key)
        batch = replay.sample(k_batch, d.batch_size, d.batch_length)
        learner, metrics = update(learner, batch, k_loss)
        replayed = (updates + 1) * d.batch_size * d.batch_length
        trained_steps = jnp.maximum(env_steps - d.prefill * num_envs, 1)
        return learner, updates + 1, {**metrics, "replay/train_ratio": replayed / trained_steps}

    _train = backend.jit(over_seeds(train), donate_argnums=(0, 3))

    def report(learner, replay, key):
        k_batch, k_model = jax.random.split(key)
        batch = replay.sample(k_batch, d.report_batch, d.report_length)
        return agent.report(learner.params, batch, d.report_context, k_model, spec.is_pixels)

    @backend.jit
    def _report(learner, replay, key):
        metrics = over_seeds(report)(learner, replay, key)
        if num_seeds > 1:  # one video (seed 0's); the MSEs per seed
            metrics = {k: jax.tree.map(lambda x: x[0], v) if isinstance(v, Video) else v
                       for k, v in metrics.items()}
        return metrics

    updates_seen = {"count": None}  # host copy of state.updates: read once, then counted

    def train_hook(state, data, key):
        del data
        learner, updates, metrics = _train(state.learner, state.replay, state.env_steps,
                                           state.updates, key)
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
            "collect": Hook(collect_hook, counts={"env_steps": num_envs * d.steps_per_collect}),
            "update_model": Hook(train_hook, counts={"model_updates": 1}),
        },
        policy=acting.grouped(policy, num_seeds),
        policy_params=lambda state: state.learner.params,
        num_seeds=num_seeds,
        phase_hooks=phase_hooks(config),
        close=actor.close,
    )
