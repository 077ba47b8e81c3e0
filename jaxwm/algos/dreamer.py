"""DreamerV3 on the phase loop (Hafner et al. 2023, arXiv 2301.04104): hooks ``collect`` and
``update_model``.

* ``collect`` steps the envs ``dreamer.steps_per_collect`` times in one jitted ``lax.scan``
  through envpool's XLA handle. Each step filters the observation into the RSSM's posterior
  (the carry lives in the state) and acts with the actor, or uniformly at random while the
  replay holds fewer than ``dreamer.prefill`` steps. Every step goes into the sequence replay
  as ``{obs, action, reward, is_first, is_terminal}`` in DreamerV3's convention: ``reward``
  and ``is_terminal`` arrived with ``obs``, ``action`` was taken at it, and envpool's reset
  observation after an episode's final one is ``is_first`` (its ignored action and zero
  reward are what the reset convention of ``envs.types`` gives).
* ``update_model`` is one jitted training step, as the official agent's ``train``: a
  [batch, length] sequence batch, the world model's loss (``models.rssm``), imagination from
  every posterior state and the actor-critic's losses (``agents.imagination``), one
  optimiser over all of it (``agents.optim.dreamer_optimizer``: AGC -> RMS -> momentum), and
  the slow critic's EMA. The state is donated, so the replay is updated in place.

``train_ratio`` (replayed steps per env step, as in the paper) is met by the train phase's
``collect:M, update_model:K``: K / M updates per collect = train_ratio x env steps per collect
/ (batch x length). ``resolve_phases`` derives M and K when the config leaves the hooks out,
and ``validate`` refuses a ratio those hooks cannot reach within 1%. The achieved ratio is
logged as ``replay/train_ratio``.

Action spaces: discrete (one-hot into the model) and continuous boxes, which the actor
produces in [-1, 1] and ``collect`` maps to the env's bounds.
"""

from __future__ import annotations

import fractions
from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import imagination, optim
from jaxwm.config import ConfigError
from jaxwm.data import replay
from jaxwm.envs import EpisodeStats, check_available, episode_metrics, make_env
from jaxwm.loop import phases
from jaxwm.loop.algorithm import Algorithm, Hook, Policy
from jaxwm.loop.metrics import Video
from jaxwm.models import rssm
from jaxwm.nets.distributions import sample_at_temperature
from jaxwm.ops.normalize import PercentileScale

MAX_HOOK_REPEATS = 64  # M of collect:M, update_model:K (collects per cycle)


@struct.dataclass
class Cursor:
    """The live envs between collects: the current observation and what came with it, the
    RSSM's posterior state and the last action (model-input form), episode statistics."""

    obs: jax.Array
    reward: jax.Array
    is_first: jax.Array
    is_terminal: jax.Array
    done: jax.Array  # obs is an episode's final observation: the next one is a reset
    model_state: dict
    prev_action: jax.Array
    stats: EpisodeStats


@struct.dataclass
class DreamerState:
    params: dict  # {model, actor, critic}: what the optimiser trains
    slow_critic: dict
    opt_state: object
    retnorm: PercentileScale
    replay: replay.ReplayState
    env_steps: jax.Array  # collected, for the achieved train ratio
    updates: jax.Array
    actor: Cursor


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


def resolve_phases(config) -> None:
    """Fills an empty ``phases.train.hooks`` with ``collect:M, update_model:K`` from
    ``dreamer.train_ratio`` (a derived value, computed once, before anything compiles)."""
    train = config.phases.get("train")
    if train is not None and not tuple(train.hooks):
        m, k = ratio_hooks(config)
        if k == 0:
            raise ConfigError(
                f"dreamer.train_ratio={config.dreamer.train_ratio} is below one update per "
                f"{MAX_HOOK_REPEATS} collects; raise it, or set phases.train.hooks yourself.")
        train.hooks = (f"collect:{m}", f"update_model:{k}")


def _hook_repeats(hooks) -> dict:
    """{hook name: calls per cycle} of a phase's hook list (``loop.phases`` syntax)."""
    out = {}
    for name, repeats in map(phases.parse_hook, hooks):
        out[name] = out.get(name, 0) + repeats
    return out


def validate(config) -> None:
    d = config.dreamer
    check_available(config.env)
    num_devices = config.num_devices or jax.device_count()
    checks = [
        (config.num_seeds == 1, "num_seeds > 1 is not supported by dreamer yet (PPO has it): "
                                "run one process per seed."),
        (d.model_size in rssm.SIZES, f"dreamer.model_size={d.model_size!r} does not exist; "
                                     f"choose one of {list(rssm.SIZES)}."),
        (d.batch_size > 0 and d.batch_length > 1, "dreamer.batch_size must be > 0 and "
                                                  "dreamer.batch_length > 1."),
        (d.batch_size % num_devices == 0, f"dreamer.batch_size={d.batch_size} must split over "
                                          f"{num_devices} devices."),
        (d.train_ratio > 0, f"dreamer.train_ratio must be > 0, got {d.train_ratio}."),
        (d.steps_per_collect > 0, "dreamer.steps_per_collect must be > 0."),
        (d.capacity >= max(d.prefill, d.batch_length),
         "dreamer.capacity (steps per env) must be >= dreamer.prefill and batch_length."),
        (d.prefill >= d.batch_length, f"dreamer.prefill={d.prefill} must be >= batch_length "
                                      f"{d.batch_length}: the first update samples sequences."),
        (d.horizon > 0, "dreamer.horizon must be > 0."),
        (d.compute_dtype in ("float32", "bfloat16"),
         f"dreamer.compute_dtype={d.compute_dtype!r}: choose 'float32' or 'bfloat16' "
         "(bfloat16 pays off on accelerators; on a CPU it is slower)."),
        (0 < d.report_context < d.report_length <= d.prefill,
         "dreamer.report_context must be in (0, report_length) and report_length <= prefill."),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    resolve_phases(config)
    train = config.phases.get("train")
    if train is not None:
        repeats = _hook_repeats(train.hooks)
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


def _check_spaces(spec) -> None:
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
    d = config.dreamer
    env = make_env(config.env, num_envs=config.env.num_envs, seed=config.seed)
    spec = env.spec
    _check_spaces(spec)
    num_envs = spec.num_envs
    action_dim = spec.num_actions if spec.discrete else spec.action_shape[0]
    dtype = jnp.dtype(d.compute_dtype)
    world_model = rssm.make(spec.obs_shape, action_dim, spec.discrete, d.model_size,
                            num_bins=d.num_bins, unimix=d.unimix, dtype=dtype,
                            **dict(d.size_overrides))
    sizes = {**rssm.SIZES[d.model_size], **dict(d.size_overrides)}
    hyper = imagination.ActorCriticHyper.from_config(d)
    actor_critic = imagination.ActorCritic(
        imagination.Actor(action_dim, spec.discrete, sizes["units"], unimix=hyper.unimix,
                          min_std=hyper.min_std, max_std=hyper.max_std, dtype=dtype),
        imagination.critic(sizes["units"], num_bins=hyper.num_bins, dtype=dtype), hyper)
    feat_dim = sizes["deter"] + world_model.net.stoch * sizes["classes"]
    optimizer = optim.dreamer_optimizer(d.learning_rate, agc=d.agc, warmup=d.warmup)
    if spec.discrete:
        low = high = None
    else:
        low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
    env_handle = {"handle": None}
    # Data parallel as online SAC: envpool's custom call runs on the mesh's first device, so
    # acting runs there; parameters, optimiser and replay are replicated over the mesh, and
    # each update's sequences are split over its ``data`` axis.
    mesh = parallel.data_mesh(config.num_devices or None)
    multi_device = mesh.size > 1
    env_device = mesh.devices.flat[0]
    replicate = (lambda tree: jax.device_put(tree, parallel.replicated(mesh))) if multi_device \
        else (lambda tree: tree)

    def env_action(action):
        if spec.discrete:
            return action
        return low + (jnp.clip(action, -1.0, 1.0) + 1.0) * 0.5 * (high - low)

    def fresh_actor():
        env_handle["handle"], first = env.xla_reset()
        n = first.obs.shape[0]
        cursor = Cursor(first.obs, jnp.zeros(n), jnp.ones(n, bool), jnp.zeros(n, bool),
                        jnp.zeros(n, bool), world_model.initial(n), jnp.zeros((n, action_dim)),
                        EpisodeStats.create(n))
        return jax.device_put(cursor, env_device) if multi_device else cursor

    def init(key):
        k_model, k_ac = jax.random.split(key)
        example_obs = jnp.zeros((1,) + tuple(spec.obs_shape), spec.obs_dtype)
        params = {"model": world_model.init(k_model, example_obs),
                  **actor_critic.init(k_ac, feat_dim)}
        action_example = jnp.zeros((num_envs,), jnp.int32) if spec.discrete else \
            jnp.zeros((num_envs, action_dim))
        example = {"obs": jnp.zeros((num_envs,) + tuple(spec.obs_shape), spec.obs_dtype),
                   "action": action_example, "reward": jnp.zeros(num_envs),
                   "is_first": jnp.zeros(num_envs, bool),
                   "is_terminal": jnp.zeros(num_envs, bool)}
        slow_critic = jax.tree.map(jnp.copy, params["critic"])  # own buffers: donated apart
        learner = (params, slow_critic, optimizer.init(params), PercentileScale.create(),
                   replay.init(d.capacity, example), jnp.zeros((), jnp.int32),
                   jnp.zeros((), jnp.int32))
        return DreamerState(*replicate(learner), fresh_actor())

    def filter_and_act(params, model_state, prev_action, obs, is_first, key, temperature):
        """The posterior step on a new observation, then an action from the actor."""
        k_obs, k_act = jax.random.split(key)
        embed = world_model.net.apply(params["model"], obs, method=rssm.WorldModelNet.encode)
        model_state, _ = world_model.obs_step(params["model"], model_state, prev_action,
                                              embed, is_first, k_obs)
        dist = actor_critic.policy(params["actor"], rssm.features(model_state))
        return model_state, sample_at_temperature(dist, k_act, temperature)

    def random_action(key):
        if spec.discrete:
            return jax.random.randint(key, (num_envs,), 0, action_dim)
        return jax.random.uniform(key, (num_envs, action_dim), minval=-1.0, maxval=1.0)

    @partial(backend.jit, donate_argnums=1)
    def _rollout(params, cursor: Cursor, handle, random, key):
        """``steps_per_collect`` env steps on the env's device; the records to replay."""

        def step(carry, k):
            cursor, handle = carry
            k_act, k_random = jax.random.split(k)
            model_state, action = filter_and_act(params, cursor.model_state, cursor.prev_action,
                                                 cursor.obs, cursor.is_first, k_act, 1.0)
            action = jnp.where(random, random_action(k_random), action)
            record = {"obs": cursor.obs, "action": action, "reward": cursor.reward,
                      "is_first": cursor.is_first, "is_terminal": cursor.is_terminal}
            handle, res = env.xla_step(handle, env_action(action))
            stats, completed = cursor.stats.update(res)
            cursor = Cursor(res.obs, res.reward, cursor.done, res.terminated, res.done,
                            model_state, world_model.action_input(action), stats)
            return (cursor, handle), (record, completed)

        (cursor, handle), (records, completed) = jax.lax.scan(
            step, (cursor, handle), jax.random.split(key, d.steps_per_collect))
        return cursor, handle, records, {**episode_metrics(completed),
                                         "charts/random_actions": random.astype(jnp.float32)}

    @partial(backend.jit, donate_argnums=(0, 1))
    def _add(buffer, env_steps, records):
        buffer = replay.add(buffer, records)
        # A buffer of its own (float) for the metric, not the replay's size, which is donated.
        return buffer, env_steps + num_envs * d.steps_per_collect, \
            (buffer.size * num_envs).astype(jnp.float32)

    def collect_hook(state: DreamerState, data, key):
        del data
        random = state.replay.size < d.prefill  # a device scalar: no host sync
        cursor, env_handle["handle"], records, metrics = _rollout(
            parallel.local_replica(state.params, env_device), state.actor,
            env_handle["handle"], parallel.local_replica(random, env_device), key)
        buffer, env_steps, size = _add(state.replay, state.env_steps, replicate(records))
        state = state.replace(actor=cursor, replay=buffer, env_steps=env_steps)
        return state, {}, {**metrics, "replay/size": size}

    def losses(params, slow_critic, retnorm, batch, key):
        k_model, k_ac = jax.random.split(key)
        model_loss, (metrics, post) = world_model.loss(params["model"], batch, k_model)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        start_cont = 1.0 - flat(batch["is_terminal"]).astype(jnp.float32)
        ac_loss, (ac_metrics, retnorm) = actor_critic.loss(
            {"actor": params["actor"], "critic": params["critic"]}, slow_critic, world_model,
            params["model"], jax.tree.map(flat, post), start_cont, retnorm, k_ac)
        return model_loss + ac_loss, ({**metrics, **ac_metrics}, retnorm)

    @partial(backend.jit, donate_argnums=0)
    def _train(state: DreamerState, key):
        k_batch, k_loss = jax.random.split(key)
        batch = replay.sample_sequences(state.replay, k_batch, d.batch_size, d.batch_length)
        if multi_device:  # each device takes its share of the sequences; XLA all-reduces
            batch = jax.lax.with_sharding_constraint(batch, parallel.batch_sharding(mesh))
        grads, (metrics, retnorm) = jax.grad(losses, has_aux=True)(
            state.params, state.slow_critic, state.retnorm, batch, k_loss)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = jax.tree.map(lambda p, u: p + u, state.params, updates)
        slow = actor_critic.slow_update(state.slow_critic, params["critic"])
        replayed = (state.updates + 1) * d.batch_size * d.batch_length
        trained_steps = jnp.maximum(state.env_steps - d.prefill * num_envs, 1)
        metrics = {**metrics, "replay/train_ratio": replayed / trained_steps,
                   "optim/grad_norm": optax.global_norm(grads),
                   "optim/update_norm": optax.global_norm(updates)}
        return state.replace(params=params, slow_critic=slow, opt_state=opt_state,
                             retnorm=retnorm, updates=state.updates + 1), metrics

    @backend.jit
    def _report(state: DreamerState, key):
        """Open-loop predictions on replayed sequences: ``report_context`` observed steps,
        then the model alone under the replayed actions."""
        k_batch, k_model = jax.random.split(key)
        batch = replay.sample_sequences(state.replay, k_batch, d.report_batch,
                                        d.report_length)
        target, recon = rssm.open_loop(world_model, state.params["model"], batch,
                                       d.report_context, k_model)
        axes = tuple(range(2, target.ndim))
        error = jnp.mean(jnp.sum((recon - target) ** 2, axes), 0)  # [T]
        metrics = {"report/observed_mse": jnp.mean(error[:d.report_context]),
                   "report/openloop_mse": jnp.mean(error[d.report_context:])}
        if spec.is_pixels:
            metrics["report/openloop"] = Video(rssm.video_frames(target[0], recon[0]))
        return metrics

    updates_seen = {"count": None}  # host copy of state.updates: read once, then counted

    def train_hook(state, data, key):
        del data
        actor = state.actor  # on the env's device; the learner is on the whole mesh
        state, metrics = _train(state.replace(actor=None), key)
        if d.report_every > 0:
            if updates_seen["count"] is None:  # first call (or first after a resume)
                updates_seen["count"] = int(state.updates)
            else:
                updates_seen["count"] += 1
            if updates_seen["count"] % d.report_every == 0:
                metrics = {**metrics, **_report(state, jax.random.fold_in(key, 1))}
        return state.replace(actor=actor), {}, metrics

    @backend.jit
    def act(state, carry, obs, is_first, key, temperature):
        model_state, prev_action = carry
        model_state, action = filter_and_act(state.params, model_state, prev_action,
                                             jnp.asarray(obs), jnp.asarray(is_first), key,
                                             temperature)
        return (model_state, world_model.action_input(action)), env_action(action)

    def init_carry(state, n):
        del state
        return world_model.initial(n), jnp.zeros((n, action_dim))

    return Algorithm(
        name="DreamerV3",
        init=init,
        hooks={
            "collect": Hook(collect_hook, counts={"env_steps": num_envs * d.steps_per_collect}),
            "update_model": Hook(train_hook, counts={"model_updates": 1}),
        },
        policy=Policy(init_carry=init_carry, act=act),
        # Parameters, optimiser, replay and counters continue exactly on resume; the live
        # envs (and so the RSSM's filtering state) restart their episodes.
        persistent=lambda state: state.replace(actor=None),
        on_restore=lambda fresh, saved: saved.replace(actor=fresh.actor),
        close=env.close,
    )
