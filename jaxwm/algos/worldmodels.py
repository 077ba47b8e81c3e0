"""World Models (Ha & Schmidhuber 2018, "Recurrent World Models Facilitate Policy Evolution",
NeurIPS; hardmaru/WorldModelsExperiments ``carracing/``), RL Lab's workflow: V learns to see,
M to remember and predict, C is evolved. Phases (``jaxwm/configs/worldmodels.py``), each with
its own counter, and their hooks (the learning is described in ``agents.worldmodels``):

1. ``collect`` (``env_steps``): random rollouts (uniform actions, the reference's, or
   ``brownian``, ctallec's reproduction's), their 64x64 frames written to the phase artifact
   ``frames`` (``<workdir>/artifacts``; the paper's 10k rollouts are ~120 GB).
2. ``vae`` (``vae_updates``, ``update_vae``): V on batches of frames drawn from the artifact.
3. ``encode`` (``encoded_rows``): every frame, in order, to its posterior, written to the
   artifact ``latents`` (``Artifact.after``: the pass resumes where its checkpoint left it).
4. ``rnn`` (``rnn_updates``, ``update_rnn``): M on windows of ``rnn_seq_len + 1`` latents.
5. ``evolve`` (``generations``): one CMA-ES generation per call over the controller's 867
   numbers, in a pool of ``population x episodes`` envs reset for the generation or, with
   ``controller.train_in=dream``, inside M at ``dream.temperature``.

Shown besides the losses: ``vae/reconstructions``, ``rnn/dream_vs_real`` (M's dream beside
the real frames, every ``video_every`` generations), ``cma/*``. The loop evaluates the mean
controller in the real env. Exact resume in every phase: learners and evolution state are
checkpointed, artifacts cut back to it, a resumed generation sees the uninterrupted run's
episodes (``acting.NumberedResets``). Several processes: each collects its share of the envs,
writes every process's rows (``acting.gather_processes``) to its own copy of the artifacts
(so all read the same batches) and runs real-env generations whole, in its own pool.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import optax
from flax import struct

from jaxwm import parallel
from jaxwm.agents import cma_es
from jaxwm.agents.worldmodels import Agent, Learner, brownian
from jaxwm.algos import NO_ASYNC_POOL, NO_ITERATIONS, Capabilities, Entry
from jaxwm.config import ConfigError, require
from jaxwm.envs import acting, make_env
from jaxwm.envs.types import ActionBox
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.artifacts import Artifact
from jaxwm.loop.compile import HookCompiler, free_donated
from jaxwm.models import mdnrnn, vae

TRAIN_IN = ("real", "dream")
COLLECT_POLICIES = ("random", "brownian")


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


def make_agent(config, spec, mesh) -> Agent:
    """V, M and C for the env ``spec``, batches split over ``mesh``."""
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
                 cma_es.Controller(w.z_dim + w.rnn_hidden, action_dim), to_env, w.crop_rows,
                 vae_tx=optax.adam(w.vae_lr),
                 rnn_tx=optax.chain(optax.clip(w.rnn_grad_clip), optax.adam(w.rnn_lr)),
                 vae_hyper=vae.VAEHyper(w.z_dim, w.kl_tolerance),
                 constrain=partial(parallel.constrain_batch, mesh=mesh))


def build(config) -> Algorithm:
    w, ctl = config.worldmodels, config.controller
    compiler = HookCompiler.for_config(config)
    env = acting.make_pool(config)
    agent = make_agent(config, env.spec, compiler.mesh)
    evolution = cma_es.Evolution(agent.controller.num_params, ctl.population, ctl.sigma)

    # ---- collection: random rollouts written to the ``frames`` artifact, env by env

    def record(params, start, steps, final, completed):
        del params, start
        return final.carry, (agent.frame_rows(steps), acting.episode_metrics(completed))

    explore = acting.uniform(env.spec) if w.collect_policy == "random" else brownian(env.spec)
    collector = acting.Actor(env, explore, w.rollout_steps, finish=record)

    def collect_hook(state, data, key):
        del data
        actor, (rows, metrics) = collector.collect((), state.actor, key)
        rows, metrics = acting.gather_processes(rows, metrics, agent.join_processes)
        return state.replace(actor=actor), {"frames": rows}, metrics

    # ---- V and M

    def update_vae(state, data, key):
        learner, metrics = agent.vae_update(state.vae, data["frames"]["frame"], key)
        return state.replace(vae=learner), {}, metrics

    def encode(state, data, key):
        read = data["frames_in_order"]
        latents, metrics = agent.encode(state.vae.params, read["rows"])
        return state, {"latents": {"rows": latents, "mask": read["mask"]}}, metrics

    def update_rnn(state, data, key):
        learner, metrics = agent.rnn_update(state.rnn, data["latents"], key)
        return state.replace(rnn=learner), {}, metrics

    evolve_hook, pool = evolution_hook(config, agent, evolution, compiler)

    def init(key):
        k_vae, k_rnn, k_es = jax.random.split(key, 3)
        learners, es = parallel.replicate((agent.init(k_vae, k_rnn), evolution.init(k_es)),
                                          compiler.mesh)
        return WorldModelsState(*learners, es, collector.init(()))

    frame_row, latent_row = agent.row_examples()
    # Every read is the same rows on every process (artifacts.py), so one value for the mesh.
    place = partial(parallel.replicate, mesh=compiler.mesh)
    artifacts = {
        "frames": Artifact(frame_row, batch=w.vae_batch, place=place),  # random batches for V
        # the same file in order, after the rows already encoded
        "frames_in_order": Artifact(frame_row, batch=w.encode_batch, after="latents",
                                    view_of="frames", place=place),
        "latents": Artifact(latent_row, batch=w.rnn_batch, length=w.rnn_seq_len + 1,
                            place=place),
    }
    counts = hook_counts(config)

    def close():
        collector.close()
        if pool is not None:
            pool.close()

    return Algorithm(
        name="World Models", init=init,
        hooks={
            "collect": Hook(collect_hook, counts=counts["collect"], writes=("frames",)),
            "update_vae": compiler.hook(update_vae, counts=counts["update_vae"],
                                        reads=("frames",)),
            "encode": compiler.hook(encode, counts=counts["encode"],
                                    reads=("frames_in_order",), writes=("latents",)),
            "update_rnn": compiler.hook(update_rnn, counts=counts["update_rnn"],
                                        reads=("latents",)),
            "evolve": Hook(evolve_hook, counts=counts["evolve"], reads=("latents",)),
        },
        policy=agent.policy(), world_model=agent.model(), world_model_params=lambda state: {
            "vae": state.vae.params, "rnn": state.rnn.params},
        policy_params=lambda state: {"vae": state.vae.params, "rnn": state.rnn.params,
                                     "controller": evolution.mean(state.evolution)},
        artifacts=artifacts, close=close)


def evolution_hook(config, agent: Agent, evolution: cma_es.Evolution, compiler):
    """C's hook, one CMA-ES generation per call, in the real env or in the dream, with a video
    of M's dream every ``video_every`` generations; and the pool it evaluates in, if any."""
    w, ctl = config.worldmodels, config.controller
    dream_video = compiler.function(partial(agent.dream_beside_real,
                                            temperature=config.dream.temperature))
    if ctl.train_in == "real":
        # Reset once per generation; generation g always sees the pool's start g, resumed or not.
        pool = acting.NumberedResets(make_env(config.env, num_envs=ctl.population * ctl.episodes,
                                              seed=config.seed + 100_000))
        one_device = compiler.mesh.size == 1
        generation = compiler.function(agent.real_generation(
            evolution, pool.env, ctl.episodes, ctl.max_steps), donate_argnums=0 if one_device else ())
        if not one_device:  # envpool's steps are host calls of one device: this process's
            generation = parallel.on_local_device(generation, compiler.mesh)
    else:
        pool = None
        generation = compiler.function(agent.dream_generation(
            evolution, ctl.episodes, ctl.max_steps, config.dream.temperature), donate_argnums=0)

    def evolve_hook(state, data, key):
        key, k_video = jax.random.split(key)
        done = int(state.evolution.generation_counter)  # read before the call donates it
        video = {} if not (w.video_every and done % w.video_every == 0) else {
            "rnn/dream_vs_real": dream_video(state.vae.params, state.rnn.params,
                                             data["latents"], k_video)}
        # Where the population acts: the pool's start for this generation (the episodes an
        # uninterrupted run's generation sees), or the latent windows M dreams from.
        where = pool.start(done) if pool is not None else (data["latents"],)
        es, metrics = generation(state.evolution, state.vae.params, state.rnn.params, *where,
                                 key)
        free_donated(state.evolution, es)  # what the eigendecomposition left
        return state.replace(evolution=es), {}, {**metrics, **video}

    return evolve_hook, pool


ENTRY = Entry(
    name="worldmodels", build=build, validate=validate, hook_counts=hook_counts,
    validate_env=validate_env, tiny="worldmodels:tiny",
    zero_means={"worldmodels.crop_rows": "every row", "worldmodels.video_every": "no videos"},
    capabilities=Capabilities(
        actions=("continuous",), observations=("pixels",),
        device_batches=lambda c: {"worldmodels.vae_batch": c.worldmodels.vae_batch,
                                  "worldmodels.rnn_batch": c.worldmodels.rnn_batch,
                                  "worldmodels.encode_batch": c.worldmodels.encode_batch},
        cannot={"seeds": "its phase artifacts (frames, latents) hold one run's data; run one "
                         "seed per process (--config.seed=S)",
                "async_pool": NO_ASYNC_POOL, "iterations": NO_ITERATIONS,
                "jax_envs": "its VAE takes CarRacing's 64x64 frames"}),
    resumable=("worldmodels.vae_lr", "worldmodels.rnn_lr", "worldmodels.rnn_grad_clip"))
