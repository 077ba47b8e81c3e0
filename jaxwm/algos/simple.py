"""SimPLe / MBARC on the phase loop (Kaiser et al. 2020, "Model-Based Reinforcement Learning
for Atari"; MBARC, thomas-schillaci/mbarc_atari): the wiring of the agent
(``jaxwm.agents.simple``: the next-frame world model, its reward head, PPO in the learned
simulator) to the real env (envpool's Atari, or gymnax's MinAtar: ``simple:minatar``), a replay
of every step and the loop.

Hooks (the learning each runs is described in ``agents.simple``): ``collect`` (PPO's policy
at temperature 1 in the real env, uniformly random until ``simple.random_steps`` transitions
are in, into the replay), ``report_model`` (open-loop predictions on the epoch's new steps,
before the model trains on them), ``update_model`` (one training rollout of the world model),
``update_reward`` (steps of the reward head alone), ``update_agent`` (one PPO iteration in
the simulator).

The schedule (``phase_hooks``): phase ``random`` collects ``random_steps`` random transitions;
each of ``epochs`` phases ``epoch_XX`` then runs ``collect:C, report_model, update_model:W,
update_reward:R, update_agent:P, evaluate`` once, with W larger in epoch 0 and P multiplied at
the epochs of ``agent_multipliers`` (SimPLe's x2 at epochs 7 and 11, x3 at 14), evaluating in
the real env at ``eval.temperature`` 0.5. Data parallel as Dreamer: parameters, optimisers and
the replay replicated over the mesh, every batch split over its ``data`` axis; envpool's envs
act on the process's first device.
"""

from __future__ import annotations

from functools import partial

from flax import struct

from jaxwm.agents import ppo, simple
from jaxwm.algos import Capabilities, Entry
from jaxwm.config import ConfigError, require
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting, native
from jaxwm.envs.stats import episode_metrics
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.compile import HookCompiler
from jaxwm.models import nextframe
from jaxwm.nets.actor_critic import validate as validate_network
from jaxwm.ops import reward_balance
from jaxwm.scores import ATARI_RANDOM_HUMAN, atari_game


def device_batches(config) -> dict[str, int]:
    s, p = config.simple, config.ppo
    return {"simple.batch_size": s.batch_size, "simple.reward_batch_size": s.reward_batch_size,
            "simple.sim.num_agents": s.sim.num_agents,
            "a PPO minibatch (simple.sim.num_agents * ppo.num_steps / ppo.num_minibatches)":
                s.sim.num_agents * p.num_steps // p.num_minibatches}


@struct.dataclass
class SimPLeState:
    model: simple.ModelLearner
    agent: ppo.Learner
    replay: SequenceReplay
    actor: acting.ActorState


def strategy_steps(config) -> int:
    """Reward-head steps per epoch of the configured strategy (0 for ``online``)."""
    s = config.simple
    return 0 if s.strategy == "online" else int(s.reward_steps[s.strategy])


def epoch_hooks(config, epoch: int) -> tuple[str, ...]:
    s = config.simple
    per_env = config.env.num_envs * s.collect_steps
    model_steps = s.model_steps_first if epoch == 0 else s.model_steps
    agent = s.agent_iterations * int(s.agent_multipliers.get(str(epoch), 1))
    hooks = [f"collect:{s.collect_per_epoch // per_env}", "report_model",
             f"update_model:{model_steps // s.rollout_length}"]
    if strategy_steps(config):
        hooks.append(f"update_reward:{strategy_steps(config) // s.reward_steps_per_call}")
    hooks.append(f"update_agent:{agent}")
    return tuple(hooks + (["evaluate"] if s.evaluate_each_epoch else []))


def phase_names(epochs: int) -> tuple[str, ...]:
    return ("random",) + tuple(f"epoch_{e:02d}" for e in range(epochs))


def phase_hooks(config) -> dict[str, tuple[str, ...]]:
    """The hooks of ``random`` and of every ``epoch_XX`` phase, from ``config.simple``."""
    hooks = {"random": ("collect",)}
    for epoch, name in enumerate(phase_names(config.simple.epochs)[1:]):
        hooks[name] = epoch_hooks(config, epoch)
    return hooks


def validate(config) -> None:
    s, env_id, minatar = config.simple, config.env.id, native.is_minatar(config.env.id)
    per_env = config.env.num_envs * s.collect_steps
    require([
        (atari_game(env_id) is not None or minatar,
         f"env.id={env_id!r} is neither one of the 26 Atari 100k games SimPLe is defined on "
         f"(choose one of {sorted(ATARI_RANDOM_HUMAN)} as '<Game>-v5') nor a MinAtar game "
         "('gymnax:Breakout-MinAtar', simple:minatar)."),
        (not minatar or (s.frames == 1 and not config.env.flatten_obs),
         f"{env_id}: MinAtar's frames are not stacked (their trail channels show motion) and "
         "not flattened: set simple.frames=1, env.frame_stack=1 and env.flatten_obs=False."),
        (s.strategy in reward_balance.STRATEGIES,
         f"simple.strategy={s.strategy!r} is unknown; choose one of "
         f"{list(reward_balance.STRATEGIES)}."),
        (s.model_size in nextframe.SIZES,
         f"simple.model_size={s.model_size!r} does not exist; choose one of "
         f"{list(nextframe.SIZES)}."),
        (s.reward_head in nextframe.REWARD_HEADS,
         f"simple.reward_head={s.reward_head!r}: choose one of {list(nextframe.REWARD_HEADS)}."),
        (s.frames == config.env.frame_stack,
         f"simple.frames={s.frames} must equal env.frame_stack={config.env.frame_stack}."),
        (minatar or not config.env.gray_scale,
         "SimPLe predicts RGB frames: set env.gray_scale=False."),
        (s.random_steps % per_env == 0 and s.collect_per_epoch % per_env == 0,
         f"simple.random_steps={s.random_steps} and collect_per_epoch={s.collect_per_epoch} "
         f"must be multiples of env.num_envs * simple.collect_steps = {per_env}."),
        (s.model_steps_first % s.rollout_length == 0 and s.model_steps % s.rollout_length == 0,
         f"simple.model_steps_first={s.model_steps_first} and model_steps={s.model_steps} must "
         f"be multiples of rollout_length={s.rollout_length} (one update per rollout step)."),
        (all(int(v) % s.reward_steps_per_call == 0 for v in s.reward_steps.values()),
         f"simple.reward_steps {dict(s.reward_steps)} must be multiples of "
         f"reward_steps_per_call={s.reward_steps_per_call}."),
        (set(s.reward_steps) == set(reward_balance.STRATEGIES[1:]),
         f"simple.reward_steps must name {list(reward_balance.STRATEGIES[1:])}."),
        (all(k.isdigit() and int(k) < s.epochs for k in s.agent_multipliers),
         f"simple.agent_multipliers keys {list(s.agent_multipliers)} must be epoch numbers "
         f"below simple.epochs={s.epochs}."),
        (s.frame_mode in ("argmax", "sample"),
         f"simple.frame_mode={s.frame_mode!r}: choose 'argmax' or 'sample'."),
        (len(s.mbarc_masses) == 3 and abs(sum(s.mbarc_masses) - 1.0) < 1e-6,
         f"simple.mbarc_masses={tuple(s.mbarc_masses)} must be three masses summing to 1."),
        ((s.sim.num_agents * config.ppo.num_steps) % config.ppo.num_minibatches == 0,
         f"ppo.num_minibatches={config.ppo.num_minibatches} must divide simple.sim.num_agents"
         f" * ppo.num_steps = {s.sim.num_agents * config.ppo.num_steps}."),
        (-(-s.report_batch // config.env.num_envs) * (s.report_length + s.frames)
         <= s.collect_per_epoch // config.env.num_envs,
         f"simple.report_batch={s.report_batch} windows of report_length={s.report_length} + "
         f"{s.frames} frames must fit in one epoch's new steps of the "
         f"{config.env.num_envs} env(s) ({s.collect_per_epoch // config.env.num_envs} each): "
         "the report is on data the model has not trained on."),
    ])
    expected = phase_names(s.epochs)
    if tuple(config.phase_order) != expected:
        raise ConfigError(f"phase_order {tuple(config.phase_order)} must be {expected} for "
                          f"simple.epochs={s.epochs} (jaxwm/configs/simple.py builds both).")


def validate_env(config, spec) -> None:
    validate_network(spec, config.network)
    frames, size = config.simple.frames, nextframe.SIZES[config.simple.model_size]
    if len(spec.obs_shape) != 3 or spec.obs_shape[0] % frames:
        raise ConfigError(f"{spec.env_id}: observations {spec.obs_shape}; SimPLe needs "
                          f"{frames} frames stacked channels first ([{frames} * C, H, W]).")
    height, width = spec.obs_shape[1:]
    if config.network.encoder in ("nature_cnn", "auto") and min(height, width) < 36:
        raise ConfigError(f"{height}x{width} frames are too small for the policy's Nature CNN "
                          "(8/4, 4/2, 3/1 convolutions need 36 pixels a side): set "
                          "env.img_height and env.img_width to 36 or more.")
    if min(height, width) >> size.compress_steps < 1:
        raise ConfigError(f"{height}x{width} frames are too small for {size.compress_steps} "
                          f"stride-2 steps of model_size={config.simple.model_size!r}.")


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    s, p = config.simple, config.ppo
    return {"collect": {"env_steps": config.env.num_envs * s.collect_steps},
            "report_model": {},
            "update_model": {"model_updates": s.rollout_length},
            "update_reward": {"reward_updates": s.reward_steps_per_call},
            "update_agent": {"agent_updates": p.update_epochs * p.num_minibatches,
                             "sim_steps": s.sim.num_agents * p.num_steps}}


def anneal_updates(config) -> int:
    """Agent updates over which PPO's learning rate anneals, if it does: the whole schedule's
    (SimPLe's learning rate counts agent updates, not env steps)."""
    s, p = config.simple, config.ppo
    iterations = sum(s.agent_iterations * int(s.agent_multipliers.get(str(e), 1))
                     for e in range(s.epochs))
    return max(1, iterations * p.update_epochs * p.num_minibatches)


def build(config) -> Algorithm:
    s = config.simple
    env = acting.make_pool(config)
    compiler = HookCompiler.for_config(config)
    agent = simple.make(env.spec, config, anneal_updates(config), compiler.mesh)

    def finish(params, start, steps, final, completed):
        del params, start
        return final.carry, ((simple.records(steps, agent.channels),),
                             episode_metrics(completed))

    actor = acting.Actor(env, acting.without_extras(agent.policy), s.collect_steps,
                         mesh=compiler.mesh, groups=config.num_seeds, finish=finish,
                         warmup_transitions=s.random_steps)
    capacity = s.random_steps + s.epochs * s.collect_per_epoch

    def init(key):
        model, learner, replay = compiler.init(
            lambda k: agent.init(k, env.spec, config.env.num_envs, capacity))(key)
        return SimPLeState(model, learner, replay, actor.init(learner))

    fill = compiler.function(partial(simple.fill_values, gamma=s.value_gamma),
                             donate_argnums=0)

    def collect_hook(state, data, key):
        del data
        actor_state, replay, metrics = actor.collect_into(state.replay, state.agent,
                                                          state.actor, key)
        return state.replace(actor=actor_state, replay=fill(replay)), {}, metrics

    def update_model(state, data, key):
        model, metrics = agent.train_model(state.model, state.replay, key)
        return state.replace(model=model), {}, metrics

    def update_reward(state, data, key):
        model, metrics = agent.train_reward(state.model, state.replay, key)
        return state.replace(model=model), {}, metrics

    def update_agent(state, data, key):
        learner, metrics = agent.train_agent(state.agent, state.model.params, state.replay, key)
        return state.replace(agent=learner), {}, metrics

    windows = max(1, -(-s.report_batch // config.env.num_envs))

    def report_model(state, data, key):
        return state, {}, agent.report(state.model.params, state.replay, key, windows)

    counts = hook_counts(config)
    return Algorithm(
        name="SimPLe", init=init,
        hooks={"collect": Hook(collect_hook, counts=counts["collect"]),
               **{name: compiler.hook(fn, counts=counts[name]) for name, fn in (
                   ("report_model", report_model), ("update_model", update_model),
                   ("update_reward", update_reward), ("update_agent", update_agent))}},
        policy=agent.policy, policy_params=lambda state: state.agent,
        world_model=agent.simulator, world_model_params=lambda state: state.model.params,
        phase_hooks=phase_hooks(config), close=actor.close)


ENTRY = Entry(
    name="simple", build=build, validate=validate, hook_counts=hook_counts,
    validate_env=validate_env, phase_hooks=phase_hooks, tiny="simple:tiny",
    tiny_more=("simple:minatar_tiny",),
    # num_seeds > 1: each seed keeps its replay of every frame (2.6 GB at Atari's full size).
    capabilities=Capabilities(actions=("discrete",), observations=("pixels",),
                              device_batches=device_batches),
    resumable=("ppo.learning_rate", "ppo.max_grad_norm"))
