"""World models and agents as components a config names: ``config.components.world_model``
and ``config.components.agent``, so that pairing a world model with another system's agent is
a config (``jaxwm/configs/pairing.py``), not a new algorithm.

World models (each on the protocol of ``models.protocol``; the first two trainable by the
world-model-and-agent wiring, ``jaxwm.algos.dreamer``, the others by their own systems):

* ``rssm``: DreamerV3's RSSM (``models.rssm``), sized by ``config.dreamer``;
* ``tdmpc2``: TD-MPC2's latent model (``models.tdmpc2.LatentModel``), sized and weighted by
  ``config.tdmpc2`` (its value terms left to the agent);
* ``nextframe`` (SimPLe's, ``algo=simple``), ``vae_mdnrnn`` (World Models', ``algo=
  worldmodels``), ``ensemble`` (MOPO's, ``algo=mopo``): listed so that a config naming them
  here is refused in one line.

Agents (``jaxwm.agents.dreamer``'s learner for the first two):

* ``imagination``: DreamerV3's actor-critic, learned in the model's imagination;
* ``mppi``: the same actor-critic learned the same way, acting by MPPI planning in the model
  (``agents.mppi``; the critic's value as the terminal value, the actor's rollouts among the
  candidates, as TD-MPC2 plans with its Q and policy prior);
* ``cmaes``: a linear controller on the model's features evolved by CMA-ES inside the model
  (``agents.cma_es``, as World Models evolves in its dream), the model trained alone.

``make_agent`` builds the pair a config names: the learner, the policy acting in the real env
and its parameters, and CMA-ES's ``Search`` where the agent evolves.

``check`` refuses what cannot work, in one line: an agent that backpropagates through the
dynamics (the actor-critic with continuous actions) on a model whose steps have no gradient,
MPPI (which samples in a box) on discrete actions, a model this wiring does not train.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

from jaxwm.agents import cma_es, dreamer, mppi
from jaxwm.config import ConfigError
from jaxwm.models import protocol, rssm, tdmpc2


def rssm_model(config, spec) -> rssm.WorldModel:
    return rssm.for_spec(spec, config.dreamer)


def tdmpc2_model(config, spec) -> tdmpc2.LatentModel:
    t = config.tdmpc2
    net = tdmpc2.WorldModel(spec.action_shape[0], tdmpc2.SIZES[t.model_size], t.episodic)
    return tdmpc2.LatentModel(net, t.rho, t.consistency_coef, t.reward_coef,
                              t.termination_coef)


@dataclasses.dataclass(frozen=True)
class ModelComponent:
    differentiable: bool  # its imagined steps carry gradients to the actions
    build: Callable | None = None  # (config, spec) -> the model, where this wiring trains it
    block: str = "dreamer"  # the config block that sizes it
    vector_box_only: bool = False  # vector observations and a box of actions only
    trained_by: str = ""  # the algorithm that trains it, where this wiring does not


@dataclasses.dataclass(frozen=True)
class AgentComponent:
    block: str | None  # its own config block (beside ``config.dreamer``'s learner)
    learns_in_imagination: bool  # the actor-critic: backpropagates returns for a box
    samples_box: bool = False  # samples action sequences in a box (continuous actions)
    evolves: bool = False  # a controller evolved in the model (the ``evolve`` hook)


WORLD_MODELS = {
    "rssm": ModelComponent(differentiable=True, build=rssm_model),
    "tdmpc2": ModelComponent(differentiable=True, build=tdmpc2_model, block="tdmpc2",
                             vector_box_only=True),
    "nextframe": ModelComponent(differentiable=False, trained_by="simple"),
    "vae_mdnrnn": ModelComponent(differentiable=True, trained_by="worldmodels"),
    "ensemble": ModelComponent(differentiable=True, trained_by="mopo"),
}
AGENTS = {
    "imagination": AgentComponent(block=None, learns_in_imagination=True),
    "mppi": AgentComponent(block="mppi", learns_in_imagination=True, samples_box=True),
    "cmaes": AgentComponent(block="cmaes", learns_in_imagination=False, evolves=True),
}


def check(config, spec) -> None:
    """One-line refusals of a pairing that cannot work (module docstring)."""
    c = config.components
    if c.world_model not in WORLD_MODELS:
        raise ConfigError(f"components.world_model={c.world_model!r}; choose one of "
                          f"{sorted(WORLD_MODELS)}.")
    if c.agent not in AGENTS:
        raise ConfigError(f"components.agent={c.agent!r}; choose one of {list(AGENTS)}.")
    model, agent = WORLD_MODELS[c.world_model], AGENTS[c.agent]
    for name, block in (("world_model", model.block), ("agent", agent.block)):
        if block and block not in config:
            raise ConfigError(
                f"components.{name}={c[name]!r} takes its settings from config.{block}, which "
                "this config lacks; start from a jaxwm/configs/pairing.py variant (each has every "
                "component's block).")
    if spec is None:  # the rest: with the env's spaces (validate_env)
        return
    if agent.learns_in_imagination and not spec.discrete and not model.differentiable \
            and config.dreamer.actor_grad_cont == "backprop":
        raise ConfigError(f"{c.world_model} with the imagination actor-critic cannot work: "
                          "for continuous actions the actor learns by backpropagating returns "
                          f"through the dynamics, and {c.world_model}'s steps have no "
                          "gradient (dreamer.actor_grad_cont=reinforce needs none).")
    if model.trained_by:
        raise ConfigError(f"components.world_model={c.world_model!r} is trained by its own "
                          f"system's phases (algo={model.trained_by}); this wiring trains "
                          "rssm or tdmpc2.")
    if agent.samples_box and spec.discrete:
        raise ConfigError(f"components.agent={c.agent} samples action sequences in a box; "
                          f"{spec.env_id}'s actions are discrete (use imagination or cmaes).")
    if model.vector_box_only and (spec.discrete or spec.is_pixels):
        raise ConfigError(f"components.world_model={c.world_model} takes vector observations "
                          f"and a box of actions; {spec.env_id} has {spec.obs_shape} "
                          f"observations and {'discrete' if spec.discrete else 'box'} actions.")
    check_spaces(spec)


def check_spaces(spec) -> None:
    """The observation and action spaces the models here can take (the RSSM's image size)."""
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


def world_model(config, spec):
    """The configured world model for ``spec`` (a trainable one: ``check`` first)."""
    return WORLD_MODELS[config.components.world_model].build(config, spec)


class Search(NamedTuple):
    """CMA-ES's strategy and the controller it evolves (``components.agent=cmaes``)."""
    evolution: cma_es.Evolution
    controller: cma_es.Controller


def make_agent(config, spec):
    """The learner (world model and, unless CMA-ES, its actor-critic), the policy acting in
    the real env, its parameters in a state, and CMA-ES's ``Search`` (else ``None``)."""
    kind = config.components.agent
    agent = dreamer.make(spec, config.dreamer, world_model(config, spec),
                         learns_in_imagination=AGENTS[kind].learns_in_imagination)
    if kind == "imagination":
        return agent, agent.policy(), lambda state: state.learner, None
    if kind == "mppi":
        hyper = mppi.MPPIHyper(**dict(config.mppi))
        return agent, agent.planner(hyper), lambda state: state.learner, None
    c = config.cmaes
    controller = cma_es.Controller(agent.feat_dim, agent.action_dim)
    search = Search(cma_es.Evolution(controller.num_params, c.population, c.sigma), controller)
    policy = protocol.through_model(agent.world_model, lambda params: params["model"],
                                    cma_es.controller_on_model(controller, agent.world_model),
                                    agent.env_action)
    return agent, policy, lambda state: {
        "model": state.learner.params["model"],
        "controller": search.evolution.mean(state.evolution)}, search
