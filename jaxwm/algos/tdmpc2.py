"""TD-MPC2 on the phase loop (Hansen, Su and Wang 2024; RL Lab's TD-MPC workflow at its
current state of the art): hooks ``collect`` and ``update_model``, wiring the agent
(``jaxwm.agents.tdmpc2``: world model, policy prior, Q ensemble, MPPI planner) to envs, a
sequence replay and the loop.

* ``collect``: the acting layer's jitted rollout (``acting.Actor``) of
  ``tdmpc2.steps_per_collect`` steps with MPPI planning inside it (the planner is the policy;
  its warm-start mean is the carry, kept per env), uniformly random until the replay has been
  given ``tdmpc2.seed_steps`` transitions (``acting.warmup``). Every step goes into a
  ``SequenceReplay`` as ``{obs, action, reward, terminated, is_first}``, DreamerV3's
  convention (``reward`` and ``terminated`` arrived with ``obs``; ``action``, in [-1, 1], was
  taken at it; the reset row after an episode's last observation is ``is_first``).
* ``update_model``: ``updates_per_step`` x the env steps of a collect TD-MPC2 updates, one
  jitted scan, each on ``batch_size`` windows of ``horizon + 1`` steps (losses past an
  episode's end masked, ``agents.tdmpc2``).

* ``iterate`` (a JAX env, ``envs.native``): ``iterations_per_call`` rounds of collect and
  update_model as one compiled program (``HookCompiler.replay_iterations_hook``): planning, env
  steps and updates stay on the device, the host visited once a call.

Phases (``jaxwm/configs/tdmpc2.py``): ``seed`` collects ``seed_steps`` random env steps
(max(1000, 5 x episode length)), ``pretrain`` runs as many updates, ``train`` alternates
collect and update_model (one update per env step by default), or calls ``iterate`` on a JAX
env (``phase_hooks``). DMC runs with action repeat 2
(``env.frame_skip``; episodes of 500 agent steps, returns up to 1000).

Seeds (``num_seeds`` N): learner and replay get a leading seed axis and every jitted function
is vmapped over it; one pool of N x ``env.num_envs`` envs acts in groups. Devices: the pool
acts on the process's first device; the learner and replay are replicated over the mesh and
each update's batch is split over its ``data`` axis.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from jaxwm.agents import tdmpc2
from jaxwm.algos import NO_ASYNC_POOL, Entry, continuous_control, whole_calls
from jaxwm.config import ConfigError, require
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting
from jaxwm.envs.native import is_native
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.compile import HookCompiler
from jaxwm.models import tdmpc2 as world_model


@struct.dataclass
class TDMPC2State:
    learner: tdmpc2.Learner
    replay: SequenceReplay
    actor: acting.ActorState


def updates_per_collect(config) -> int:
    t = config.tdmpc2
    return max(1, round(t.updates_per_step * t.steps_per_collect * config.env.num_envs))


def validate(config) -> None:
    t = config.tdmpc2
    steps_per_env = t.seed_steps // config.env.num_envs
    require([
        (t.model_size in world_model.SIZES,
         f"tdmpc2.model_size={t.model_size!r} does not exist; choose one of "
         f"{list(world_model.SIZES)} (millions of parameters)."),
        (t.num_pi_trajs < t.num_samples and t.num_elites <= t.num_samples,
         f"tdmpc2.num_samples={t.num_samples} must exceed num_pi_trajs={t.num_pi_trajs} "
         f"and be at least num_elites={t.num_elites}."),
        (0.0 < t.rho <= 1.0 and 0.0 < t.tau <= 1.0, "tdmpc2.rho and tdmpc2.tau must be in "
                                                    "(0, 1]."),
        (0.0 <= t.discount < 1.0, f"tdmpc2.discount={t.discount} must be in [0, 1) (0: from "
                                  "the episode length)."),
        (t.min_std <= t.max_std, "tdmpc2.min_std must be at most max_std."),
        (steps_per_env > t.horizon,
         f"tdmpc2.seed_steps={t.seed_steps} gives each of the {config.env.num_envs} env(s) "
         f"{steps_per_env} steps; the first update samples windows of horizon + 1 = "
         f"{t.horizon + 1}. Raise seed_steps."),
        (t.capacity >= t.seed_steps, "tdmpc2.capacity must hold the seed_steps."),
    ])
    require([whole_calls(config, config.total_env_steps - t.seed_steps, hook_counts(config),
                         "total_env_steps - tdmpc2.seed_steps")])


def validate_env(config, spec) -> None:
    if len(spec.action_shape) != 1:
        raise ConfigError(f"{spec.env_id}: tdmpc2 takes a flat box of actions, not shape "
                          f"{spec.action_shape}.")


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    t, k = config.tdmpc2, config.iterations_per_call
    counts = {"collect": {"env_steps": config.env.num_envs * t.steps_per_collect},
              "update_model": {"model_updates": updates_per_collect(config)}}
    if is_native(config.env.id):  # both in one program, k rounds a call
        counts["iterate"] = {c: n * k for hook in counts.values() for c, n in hook.items()}
    return counts


def phase_hooks(config) -> dict[str, tuple[str, ...]]:
    """The train phase's hooks: ``collect, update_model``, or with a JAX env ``iterate``
    (plan, step and update in one program)."""
    return {"train": ("iterate",) if is_native(config.env.id) else ("collect", "update_model")}


def build(config) -> Algorithm:
    t, num_envs = config.tdmpc2, config.env.num_envs  # envs per seed
    env = acting.make_pool(config)
    spec = env.spec
    agent = tdmpc2.make(spec, t)
    compiler = HookCompiler.for_config(config)
    policy = agent.planner()

    def finish(params, start, steps, final, completed):
        """One group's steps as replay records (the module docstring's convention)."""
        del params, start
        records = {"obs": steps.obs.astype(jnp.float32),
                   "action": agent.box.from_env(steps.action),
                   "reward": steps.reward, "terminated": steps.terminated,
                   "is_first": steps.is_first}
        return final.carry, ((records,), episode_metrics(completed))

    actor = acting.Actor(env, policy, t.steps_per_collect, mesh=compiler.mesh,
                         groups=config.num_seeds, finish=finish,
                         warmup_transitions=t.seed_steps)
    counts = hook_counts(config)
    update = agent.make_update(lambda replay, key: replay.sample(key, t.batch_size, t.horizon + 1),
                               counts["update_model"]["model_updates"], compiler.mesh)

    def init_one(key):
        example = {"obs": jnp.zeros(spec.obs_shape, jnp.float32),
                   "action": jnp.zeros(agent.action_dim), "reward": jnp.zeros(()),
                   "terminated": jnp.zeros((), bool), "is_first": jnp.zeros((), bool)}
        return TDMPC2State(agent.init_learner(key),
                           SequenceReplay.create(t.capacity, example, num_envs), None)

    def init(key):
        state = compiler.init(init_one, jit=True)(key)
        return state.replace(actor=actor.init(state.learner))

    def update_model(state, data, key):
        learner, metrics = update(state.learner, state.replay, key)
        return state.replace(learner=learner), {}, metrics

    hooks = {"collect": Hook(actor.replay_hook(), counts=counts["collect"]),
             "update_model": compiler.hook(update_model, counts=counts["update_model"])}
    if actor.env_step.in_state:  # collect and update_model as one program, k rounds a call
        hooks["iterate"] = compiler.replay_iterations_hook(
            actor, update_model, config.iterations_per_call, counts["iterate"])
    return Algorithm(
        name="TD-MPC2", init=init, hooks=hooks, phase_hooks=phase_hooks(config),
        policy=policy, world_model=agent.latent,
        world_model_params=lambda state: state.learner.params, close=actor.close)


ENTRY = Entry(name="tdmpc2", build=build, validate=validate, hook_counts=hook_counts,
              validate_env=validate_env, phase_hooks=phase_hooks, tiny="tdmpc2:tiny",
              tiny_more=("tdmpc2:playground_tiny",),
              # several rounds in one program (iterations_per_call) need a JAX env
              capabilities=continuous_control("tdmpc2.batch_size", cannot={
                  "async_pool": NO_ASYNC_POOL}),
              resumable=("tdmpc2.lr", "tdmpc2.grad_clip_norm"),
              zero_means={"tdmpc2.envs_per_batch": "1 on a CPU, every env on a GPU"})
