"""World Models (Ha & Schmidhuber 2018, "Recurrent World Models Facilitate Policy Evolution",
NeurIPS; hardmaru/WorldModelsExperiments ``carracing/``), RL Lab's workflow: V learns to see,
M to remember and predict, C is evolved.

Phases (``configs/worldmodels.py``), each with its own counter:

1. ``collect`` (``env_steps``): random rollouts of the pixel env (uniform actions, the
   reference's, or ``brownian``, ctallec's reproduction's); every frame
   cropped and resized to 64x64 (``agents.worldmodels.preprocess``) and written as uint8 with
   its action, reward and flags to the phase artifact ``frames`` (``<workdir>/artifacts``;
   the paper's 10k rollouts are ~120 GB, beyond memory and checkpoints). Rows are written
   env by env, each env's steps of a call in order; ``reset`` marks where a row does not
   continue the one before it (an episode's first row, or the first of an env's stretch).
2. ``vae`` (``vae_updates``): the ConvVAE (``models.vae``) on batches of frames drawn from
   the artifact, Adam.
3. ``encode`` (``encoded_rows``): every frame, in order, to its posterior's mean and log
   variance, written to the artifact ``latents`` (``Artifact.after``: the pass resumes where
   its checkpoint left it).
4. ``rnn`` (``rnn_updates``): the MDN-RNN (``models.mdnrnn``) on windows of
   ``rnn_seq_len + 1`` latent rows, ``z`` sampled from each row's posterior as the
   reference's ``rnn_train.py`` does; the memory resets inside a window where a row starts
   anew, and a transition counts only if both rows belong to one episode. Adam, gradients
   clipped elementwise at ``rnn_grad_clip``.
5. ``evolve`` (``generations``): CMA-ES (``agents.cma_es``, evosax) over the controller's
   867 numbers. Each generation resets a pool of ``population x episodes`` envs split into
   one group per candidate (``acting.grouped``: V and M shared, a controller per group),
   steps it ``max_steps`` times and scores each candidate by the mean return of its envs'
   first episodes (``episode_returns``): ask -> that rollout (envpool's XLA step inside the
   acting layer's scan) -> tell, one jitted function; only the pool's reset is a host call
   before it. With ``controller.train_in=dream`` the population acts inside M instead
   (``dream_env``: M stepped as the env at ``dream.temperature``, from latents of real episode
   starts, its reward and done heads giving the reward and the end).

What the run shows besides the losses: every encode call, 8 frames above V's
reconstructions (``vae/reconstructions``, a PNG); every ``video_every`` generations, M's dream
of a real stretch beside the real frames, both decoded by V (``rnn/dream_vs_real``, a GIF), and
CMA-ES's best, mean and spread of returns and its step size (``cma/*``). The loop then
evaluates, in the real env, the controller at the mean of the search distribution, with V
and M (``Algorithm.policy``; ``eval.num_episodes``: 100 for ``carracing``, as the paper).
Exact resume holds across every phase: the learners and the evolution state are in the
checkpoint, the artifacts are cut back to it.

Not supported: several seeds in one process (the artifacts hold one run's data) and
asynchronous pools.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import cma_es
from jaxwm.agents.worldmodels import Agent, preprocess
from jaxwm.algos import NO_ASYNC_POOL, NO_PROCESSES, Capabilities
from jaxwm.config import ConfigError, require
from jaxwm.envs import acting, make_env
from jaxwm.envs.types import ActionBox, StepResult
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.artifacts import Artifact
from jaxwm.media import Image, Video
from jaxwm.models import mdnrnn, vae

TRAIN_IN = ("real", "dream")
COLLECT_POLICIES = ("random", "brownian")
RECONSTRUCTIONS = 8  # frames shown with their reconstructions
DREAM_FRAMES = 64  # steps of the dream-beside-real video
CAPABILITIES = Capabilities(
    actions=("continuous",), observations=("pixels",),
    device_batches=lambda c: {"worldmodels.vae_batch": c.worldmodels.vae_batch,
                              "worldmodels.rnn_batch": c.worldmodels.rnn_batch,
                              "worldmodels.encode_batch": c.worldmodels.encode_batch},
    cannot={"seeds": "its phase artifacts (frames, latents) hold one run's data; run one "
                     "seed per process (--config.seed=S)",
            "processes": NO_PROCESSES, "async_pool": NO_ASYNC_POOL})


@struct.dataclass
class Learner:
    params: Any
    opt_state: optax.OptState


@struct.dataclass
class WorldModelsState:
    vae: Learner
    rnn: Learner
    evolution: Any  # evosax's CMA-ES state
    actor: acting.ActorState  # the random-rollout pool


def validate(config) -> None:
    w, ctl = config.worldmodels, config.controller
    require([
        (ctl.train_in in TRAIN_IN, f"controller.train_in={ctl.train_in!r}; choose one of "
                                   f"{list(TRAIN_IN)}."),
        (ctl.population >= cma_es.MIN_POPULATION,
         f"controller.population={ctl.population}: CMA-ES needs at least "
         f"{cma_es.MIN_POPULATION} candidates to estimate its covariance."),
        (w.rollout_steps * w.rollouts >= w.rnn_seq_len + 1,
         f"worldmodels.rollouts x rollout_steps = {w.rollouts * w.rollout_steps} frames cannot "
         f"hold one MDN-RNN window of rnn_seq_len + 1 = {w.rnn_seq_len + 1} rows."),
        (w.kl_tolerance >= 0 and config.dream.temperature > 0,
         "worldmodels.kl_tolerance must be >= 0 and dream.temperature > 0."),
        (0 <= w.crop_rows, "worldmodels.crop_rows must be >= 0 (0: no crop)."),
        (w.collect_policy in COLLECT_POLICIES, f"worldmodels.collect_policy="
                                               f"{w.collect_policy!r}; choose one of "
                                               f"{list(COLLECT_POLICIES)}."),
    ])


def validate_env(config, spec) -> None:
    if len(spec.obs_shape) != 3 or 3 not in (spec.obs_shape[0], spec.obs_shape[-1]):
        raise ConfigError(f"{spec.env_id}: observations {spec.obs_shape}; World Models' VAE "
                          "reads RGB frames (a pixel env such as CarRacing-v3).")
    height = spec.obs_shape[1] if spec.obs_shape[0] == 3 else spec.obs_shape[0]
    if config.worldmodels.crop_rows > height:
        raise ConfigError(f"worldmodels.crop_rows={config.worldmodels.crop_rows} exceeds the "
                          f"frame's {height} rows.")


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    w = config.worldmodels
    return {"collect": {"env_steps": config.env.num_envs * w.rollout_steps},
            "update_vae": {"vae_updates": 1}, "encode": {"encoded_rows": w.encode_batch},
            "update_rnn": {"rnn_updates": 1}, "evolve": {"generations": 1}}


def episode_returns(steps: acting.Steps) -> jax.Array:
    """Each env's return [n] over its first episode in a rollout ``[T, n]`` that started
    from a reset: the reward arriving with row t counts while no earlier row ended the
    episode (a row that ends it brings its last reward; the next row starts another)."""
    ended_before = jnp.cumsum(steps.done, axis=0) - steps.done > 0
    counts = (jnp.arange(steps.reward.shape[0])[:, None] > 0) & ~ended_before
    return jnp.sum(jnp.where(counts, steps.reward, 0.0), axis=0)


def make_agent(config, spec) -> Agent:
    w = config.worldmodels
    memory = mdnrnn.MDNRNN(mdnrnn.MDNHyper(
        z_dim=w.z_dim, hidden=w.rnn_hidden, num_mixtures=w.num_mixtures,
        predict_reward=config.controller.train_in == "dream",
        predict_done=config.controller.train_in == "dream"))
    action_dim = int(spec.action_shape[0])
    if spec.env_id.startswith("CarRacing"):
        to_env = cma_es.carracing_action
    else:
        to_env = ActionBox.of(spec).to_env
    return Agent(vae.ConvVAE(w.z_dim), memory,
                 cma_es.Controller(w.z_dim + w.rnn_hidden, action_dim), to_env, w.crop_rows)


def build(config) -> Algorithm:
    w, ctl = config.worldmodels, config.controller
    mesh = parallel.data_mesh(config.num_devices or None)
    env = acting.make_pool(config)
    spec = env.spec
    agent = make_agent(config, spec)
    action_dim = agent.controller.action_dim
    evolution = cma_es.Evolution(agent.controller.num_params, ctl.population, ctl.sigma)
    vae_tx = optax.adam(w.vae_lr)
    rnn_tx = optax.chain(optax.clip(w.rnn_grad_clip), optax.adam(w.rnn_lr))
    vae_hyper = vae.VAEHyper(w.z_dim, w.kl_tolerance)

    # ---- collection: random rollouts written to the ``frames`` artifact, env by env

    def record(params, start, steps, final, completed):
        del params, start
        t, n = steps.is_first.shape
        frames = jax.vmap(lambda f: preprocess(f, w.crop_rows))(steps.obs)
        reset = steps.is_first.at[0].set(True)  # an env's stretch does not continue another's
        rows = {"frame": (frames * 255).round().astype(jnp.uint8),
                "action": steps.action.astype(jnp.float32),
                "reward": steps.reward.astype(jnp.float32), "reset": reset,
                "done": steps.done}
        env_major = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape((t * n,) + x.shape[2:]),
                                 rows)
        return final.carry, (env_major, acting.episode_metrics_by_group(completed, 1))

    explore = acting.uniform(spec) if w.collect_policy == "random" else brownian(spec)
    collector = acting.Actor(env, explore, w.rollout_steps, finish=record)

    def collect_hook(state, data, key):
        del data
        actor, (rows, metrics) = collector.collect((), state.actor, key)
        return state.replace(actor=actor), {"frames": rows}, metrics

    # ---- V

    def vae_update(learner, frames, key):
        frames = parallel.constrain_batch(frames.astype(jnp.float32) / 255.0, mesh)
        (_, metrics), grads = jax.value_and_grad(
            lambda p: vae.loss(agent.vision, p, frames, key, vae_hyper), has_aux=True)(
            learner.params)
        updates, opt_state = vae_tx.update(grads, learner.opt_state)
        return Learner(optax.apply_updates(learner.params, updates), opt_state), metrics

    vae_update = backend.jit(vae_update, donate_argnums=0)

    def update_vae_hook(state, data, key):
        learner, metrics = vae_update(state.vae, data["frames"]["frame"], key)
        return state.replace(vae=learner), {}, metrics

    def encode(params, read):
        rows = read["rows"]
        frames = parallel.constrain_batch(rows["frame"].astype(jnp.float32) / 255.0, mesh)
        mu, logvar = agent.vision.apply(params, frames, method=vae.ConvVAE.encode)
        latents = {"mu": mu, "logvar": logvar, "action": rows["action"],
                   "reward": rows["reward"], "reset": rows["reset"], "done": rows["done"]}
        # What V sees: 8 frames above their reconstructions from the posterior's mean.
        shown = agent.vision.apply(params, mu[:RECONSTRUCTIONS], method=vae.ConvVAE.decode)
        strip = lambda x: jnp.concatenate(list(x), axis=1)  # noqa: E731
        image = Image(jnp.concatenate([strip(frames[:RECONSTRUCTIONS]), strip(shown)], 0))
        return {"rows": latents, "mask": read["mask"]}, {"vae/reconstructions": image}

    encode = backend.jit(encode)

    def encode_hook(state, data, key):
        del key
        latents, metrics = encode(state.vae.params, data["frames_in_order"])
        return state, {"latents": latents}, metrics

    # ---- M

    def rnn_batch(window, key):
        """An MDN-RNN batch from latent windows [B, L + 1] (module docstring)."""
        z = vae.sample(window["mu"], window["logvar"], key)
        inside = ~window["done"][:, :-1] & ~window["reset"][:, 1:]
        return {"z": z, "action": window["action"][:, :-1], "reset": window["reset"][:, :-1],
                "mask": inside, "reward": window["reward"][:, 1:],
                "done": window["done"][:, 1:]}

    def rnn_update(learner, window, key):
        batch = parallel.constrain_batch(rnn_batch(window, key), mesh)
        (_, metrics), grads = jax.value_and_grad(
            lambda p: mdnrnn.loss(agent.memory, p, batch), has_aux=True)(learner.params)
        updates, opt_state = rnn_tx.update(grads, learner.opt_state)
        return Learner(optax.apply_updates(learner.params, updates), opt_state), metrics

    rnn_update = backend.jit(rnn_update, donate_argnums=0)

    def update_rnn_hook(state, data, key):
        learner, metrics = rnn_update(state.rnn, data["latents"], key)
        return state.replace(rnn=learner), {}, metrics

    # ---- C: CMA-ES in the real env or in the dream, with a video of M's dream each time

    video_of_dream = backend.jit(partial(dream_beside_real, agent,
                                         temperature=config.dream.temperature))

    def videos(state, data, key, due: bool):
        """The dream-beside-real video where ``due``, else nothing."""
        if not due:
            return {}
        return {"rnn/dream_vs_real": video_of_dream(state.vae.params, state.rnn.params,
                                                    data["latents"], key)}

    def video_due(es) -> bool:
        """Every ``video_every`` generations (read before a generation donates ``es``)."""
        return bool(w.video_every) and int(es.generation_counter) % w.video_every == 0

    pool_size = ctl.population * ctl.episodes

    if ctl.train_in == "real":
        pool = make_env(config.env, num_envs=pool_size, seed=config.seed + 100_000)
        real = acting.envpool(pool)
        population = agent.population_policy(ctl.population)

        def generation(es, vae_params, rnn_params, handle, first, key):
            """ask -> the population acts in the freshly reset pool -> tell, one program."""
            def evaluate(candidates, key):
                params = {"vae": vae_params, "rnn": rnn_params, "controller": candidates}
                actor = acting.ActorState.start(first, population.init_carry(params, pool_size),
                                                pool_size)
                _, _, steps, _ = acting.rollout(population, real, params, actor, handle,
                                                jax.random.split(key, ctl.population),
                                                ctl.max_steps + 1)
                returns = episode_returns(steps).reshape(ctl.population, -1).mean(-1)
                return returns, {}

            return evolution.generation(es, evaluate, key)

        generation = backend.jit(generation, donate_argnums=0)

        def evolve_hook(state, data, key):
            key, k_video = jax.random.split(key)
            handle, first = real.start()  # every env reset: whole episodes from the start
            due = video_due(state.evolution)
            es, metrics = generation(state.evolution, state.vae.params, state.rnn.params,
                                     handle, first, key)
            release(state.evolution)
            return state.replace(evolution=es), {}, {**metrics,
                                                     **videos(state, data, k_video, due)}

        close_pool = pool.close
    else:
        dream = dream_generation(agent, evolution, ctl, config.dream.temperature)
        dream = backend.jit(dream, donate_argnums=0)

        def evolve_hook(state, data, key):
            key, k_video = jax.random.split(key)
            due = video_due(state.evolution)
            es, metrics = dream(state.evolution, state.vae.params, state.rnn.params,
                                data["latents"], key)
            release(state.evolution)
            return state.replace(evolution=es), {}, {**metrics,
                                                     **videos(state, data, k_video, due)}

        close_pool = lambda: None  # noqa: E731

    # ---- the state

    def init(key):
        k_vae, k_rnn, k_es = jax.random.split(key, 3)
        vae_params = vae.init(agent.vision, k_vae)
        rnn_params = mdnrnn.init(agent.memory, k_rnn, action_dim)
        learners = parallel.replicate(
            (Learner(vae_params, vae_tx.init(vae_params)),
             Learner(rnn_params, rnn_tx.init(rnn_params))), mesh)
        return WorldModelsState(*learners, evolution.init(k_es), collector.init(()))

    frame_row = {"frame": np.zeros(vae.FRAME, np.uint8),
                 "action": np.zeros(action_dim, np.float32), "reward": np.zeros((), np.float32),
                 "reset": np.zeros((), bool), "done": np.zeros((), bool)}
    latent_row = {"mu": np.zeros(w.z_dim, np.float32), "logvar": np.zeros(w.z_dim, np.float32),
                  **{k: v for k, v in frame_row.items() if k != "frame"}}
    artifacts = {
        "frames": Artifact(frame_row, batch=w.vae_batch),  # random batches for V
        # the same file in order, after the rows already encoded
        "frames_in_order": Artifact(frame_row, batch=w.encode_batch, after="latents",
                                    view_of="frames"),
        "latents": Artifact(latent_row, batch=w.rnn_batch, length=w.rnn_seq_len + 1),
    }
    counts = hook_counts(config)

    def policy_params(state):
        return {"vae": state.vae.params, "rnn": state.rnn.params,
                "controller": evolution.mean(state.evolution)}

    def close():
        collector.close()
        close_pool()

    return Algorithm(
        name="World Models",
        init=init,
        hooks={
            "collect": Hook(collect_hook, counts=counts["collect"], writes=("frames",)),
            "update_vae": Hook(update_vae_hook, counts=counts["update_vae"], reads=("frames",)),
            "encode": Hook(encode_hook, counts=counts["encode"], reads=("frames_in_order",),
                           writes=("latents",)),
            "update_rnn": Hook(update_rnn_hook, counts=counts["update_rnn"],
                               reads=("latents",)),
            "evolve": Hook(evolve_hook, counts=counts["evolve"], reads=("latents",)),
        },
        policy=agent.policy(),
        policy_params=policy_params,
        artifacts=artifacts,
        close=close,
    )


def release(donated) -> None:
    """Frees what a donating call could not reuse. evosax's CMA-ES recomputes its eigenbasis
    ``B`` and scales ``D`` from ``C`` every generation; LAPACK's eigendecomposition writes
    buffers of its own, so XLA cannot put them in the donated ones, which would otherwise
    outlive the call beside the new."""
    for x in jax.tree.leaves(donated):
        if isinstance(x, jax.Array) and not x.is_deleted():
            x.delete()


def brownian(spec, dt: float = 1 / 50) -> acting.Policy:
    """ctallec/world-models' ``sample_continuous_policy``: each env's action a Brownian
    motion, ``a' = clip(a + sqrt(dt) N(0, I), low, high)``, from a uniform draw at each
    episode's start; smoother, longer-ranging drives than uniform noise per step (the car
    leaves its start more often). The carry is each env's last action."""
    low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)

    def init_carry(params, num_envs):
        del params
        return jnp.zeros((num_envs,) + tuple(spec.action_shape))

    def act(params, carry, obs, is_first, key, temperature=1.0):
        del params, obs, temperature
        k_start, k_step = jax.random.split(key)
        fresh = acting.uniform_action(spec, k_start, carry.shape[0])
        step = jnp.sqrt(dt) * jax.random.normal(k_step, carry.shape)
        action = jnp.clip(jnp.where(is_first[:, None], fresh, carry + step), low, high)
        return action, action, {}

    return acting.Policy(init_carry=init_carry, act=act)


def dream_beside_real(agent: Agent, vae_params, rnn_params, windows, key,
                      temperature: float) -> Video:
    """The first latent window's real frames (decoded from V's posterior means, left) beside
    M's dream of them (right): M started from the window's first latent, fed the real
    actions, its own samples as its next inputs, all decoded by V."""
    window = jax.tree.map(lambda x: x[0, :DREAM_FRAMES], windows)
    steps = window["mu"].shape[0]
    z0 = vae.sample(window["mu"][:1], window["logvar"][:1], key)

    def step(carry, inputs):
        memory, z, k = carry
        action, k_next = inputs
        memory, out = agent.memory.apply(rnn_params, memory, z[:, None], action[None, None],
                                         jnp.zeros((1, 1), bool))
        z = mdnrnn.sample(jax.tree.map(lambda x: x[:, 0], out), k, temperature)
        return (memory, z, k_next), z[0]

    keys = jax.random.split(key, steps)
    _, dreamed = jax.lax.scan(step, (agent.memory.initialize_carry(1), z0, keys[0]),
                              (window["action"][:-1], keys[1:]))
    dreamed = jnp.concatenate([z0, dreamed])
    decode = lambda z: agent.vision.apply(vae_params, z, method=vae.ConvVAE.decode)  # noqa
    return Video(jnp.concatenate([decode(window["mu"]), decode(dreamed)], axis=2), fps=15)


def dream_env(agent: Agent, rnn_params, temperature: float):
    """M as an env for ``acting.sync`` (the paper's sec. 4.4): the state is M's memory, the
    current latent and a key; a step reads ``[z, a]``, samples the next latent at
    ``temperature`` and takes the reward and the end from M's heads. Observations are
    ``[z, h]``, what the controller reads."""

    def step(env_state, action):
        carry, z, key = env_state
        key, k_z = jax.random.split(key)
        n = z.shape[0]
        carry, out = agent.memory.apply(rnn_params, carry, z[:, None], action[:, None],
                                        jnp.zeros((n, 1), bool))
        out = jax.tree.map(lambda x: x[:, 0], out)
        z = mdnrnn.sample(out, k_z, temperature)
        done = jax.nn.sigmoid(out["done_logit"]) > 0.5
        obs = jnp.concatenate([z, carry[1]], -1)
        return (carry, z, key), StepResult(obs, out["reward"], done, jnp.zeros(n, bool), done,
                                           out["reward"])

    return acting.sync(step)


def dream_generation(agent: Agent, evolution: cma_es.Evolution, ctl, temperature: float):
    """One generation inside the dream, as one function of ``(evolution state, vae params,
    rnn params, latent windows, key)``: the population's controllers act on ``[z, h]`` in
    ``population x episodes`` dreams started from real latents (the windows' first rows)."""
    n = ctl.population * ctl.episodes
    controller = agent.controller
    policy = acting.grouped(acting.stateless(
        lambda flat, obs, key, temperature: agent.to_env(controller.act(flat, obs))),
        ctl.population)

    def generation(es, vae_params, rnn_params, windows, key):
        del vae_params
        env = dream_env(agent, rnn_params, temperature)
        k_start, k_env, k_run = jax.random.split(key, 3)
        first = windows["mu"][:, 0]
        picks = jax.random.randint(k_start, (n,), 0, first.shape[0])
        z0 = vae.sample(first[picks], windows["logvar"][:, 0][picks], k_start)
        carry = agent.memory.initialize_carry(n)
        obs0 = jnp.concatenate([z0, carry[1]], -1)
        zeros = jnp.zeros(n, bool)
        start = StepResult(obs0, jnp.zeros(n), zeros, zeros, zeros, jnp.zeros(n))

        def evaluate(candidates, key):
            actor = acting.ActorState.start(start, (), n)
            _, _, steps, _ = acting.rollout(policy, env, candidates, actor,
                                            (carry, z0, k_env), jax.random.split(
                                                key, ctl.population), ctl.max_steps + 1)
            returns = episode_returns(steps).reshape(ctl.population, -1).mean(-1)
            return returns, {"dream/episode_return": jnp.mean(returns)}

        return evolution.generation(es, evaluate, k_run)

    return generation
