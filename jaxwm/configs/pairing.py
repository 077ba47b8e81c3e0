"""Pairings of world models and agents that none of the five original systems has
(jaxwm/agents/components.py; wired by jaxwm/algos/dreamer.py). Launch:

jaxwm train --config=pairing:rssm_mppi            # Pendulum, minutes
jaxwm train --config=pairing:tdmpc2_imagination   # Pendulum, minutes
jaxwm train --config=pairing:rssm_cmaes           # CartPole, minutes

* ``rssm_mppi``: MPPI planning in DreamerV3's RSSM, as TD-MPC2 plans in its latent model:
  candidates scored by their imagined rewards plus the critic's value at their last state,
  the actor's rollouts among them; the RSSM and the actor-critic learn as DreamerV3's.
* ``tdmpc2_imagination``: DreamerV3's imagination actor-critic in TD-MPC2's latent model
  (its consistency, reward and termination losses, sequences of its horizon + 1), one
  optimiser over both; the actor learns by REINFORCE (``dreamer.actor_grad_cont``).
* ``rssm_cmaes``: a linear controller on the RSSM's features evolved by CMA-ES inside the
  RSSM, as World Models evolves in its MDN-RNN's dream; the RSSM trains alone.

Any other pairing of ``components.world_model`` (rssm, tdmpc2) and ``components.agent``
(imagination, mppi, cmaes) is a command line away from any variant here (each defines every
component's block); pairings that cannot work are refused in one line. ``tiny_<pairing>``:
the contract suite's forms (tests/test_contract.py).
"""

import ml_collections

from jaxwm.agents import dreamer as dreamer_agent
from jaxwm.agents import tdmpc2 as tdmpc2_agent
from jaxwm.agents.dreamer import config_block as dreamer_block
from jaxwm.agents.tdmpc2 import config_block as tdmpc2_block
from jaxwm.config import base_config, prefixed
from jaxwm.configs.dreamer import COMPONENTS_FIELDS
from jaxwm.configs.worldmodels import CMAES_FIELDS

PAIRINGS = {"rssm_mppi": ("rssm", "mppi", "Pendulum-v1"),
            "tdmpc2_imagination": ("tdmpc2", "imagination", "Pendulum-v1"),
            "rssm_cmaes": ("rssm", "cmaes", "CartPole-v1")}
ABOUT = {"rssm_mppi": "MPPI planning in DreamerV3's RSSM, the actor-critic as DreamerV3's",
         "tdmpc2_imagination": "DreamerV3's actor-critic in TD-MPC2's latent model (REINFORCE)",
         "rssm_cmaes": "A linear controller evolved by CMA-ES inside the RSSM"}
SUMMARIES = {**{name: ABOUT[name] for name in PAIRINGS},
             **{f"tiny_{name}": f"The contract suite's form of {name}" for name in PAIRINGS}}
VARIANTS = tuple(SUMMARIES)
# The tdmpc2 block's settings that its latent model reads (components.tdmpc2_model).
TDMPC2_KEYS = ("model_size", "episodic", "rho", "consistency_coef", "reward_coef",
               "termination_coef")
# Each block is described where its defaults are: dreamer's and tdmpc2's in their agents,
# components' in jaxwm/configs/dreamer.py, cmaes's in jaxwm/configs/worldmodels.py; mppi's
# (agents.mppi.MPPIHyper, sized here) shares TD-MPC2's planner's descriptions.
FIELDS = {
    **prefixed("dreamer", dreamer_agent.FIELDS),
    **prefixed("tdmpc2", {key: tdmpc2_agent.FIELDS[key] for key in TDMPC2_KEYS}),
    **COMPONENTS_FIELDS,
    **prefixed("mppi", {
        "horizon": ("> 0", "Steps of MPPI's plans in the world model."),
        "iterations": ("> 0", "MPPI rounds per step."),
        **{key: tdmpc2_agent.FIELDS[key] for key in (
            "num_samples", "num_elites", "num_pi_trajs", "temperature", "min_std", "max_std")},
        "envs_per_batch": (">= 0", "Envs planned at once, the rest in turn; 0: all at once."),
    }),
    **prefixed("cmaes", {
        **CMAES_FIELDS,
        "start_batch": ("> 0", "Replayed sequences whose model states start the dreams."),
    }),
}
# DreamerV3's size1m with narrower layers, small enough for CPU learning checks.
SMALL = dict(deter=128, hidden=64, classes=8, units=64, depth=4)
TINY = dict(deter=8, hidden=8, classes=4, units=8, depth=2)


def get_config(variant: str = "rssm_mppi") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown pairing {variant!r}; choose one of {VARIANTS}.")
    tiny = variant.startswith("tiny_")
    world_model, agent, env_id = PAIRINGS[variant.removeprefix("tiny_")]
    c = base_config()
    c.algo = "pairing"
    c.components = ml_collections.ConfigDict({"world_model": world_model, "agent": agent})
    c.env.id = env_id
    c.env.num_envs = 2 if tiny else 4
    c.total_env_steps = 40 if tiny else (20_000 if agent != "cmaes" else 30_000)
    # Sequences of TD-MPC2's horizon + 1 for its latent model's consistency loss.
    length = 4 if world_model == "tdmpc2" else (4 if tiny else 32)
    c.dreamer = dreamer_block(
        model_size="1m", size_overrides=TINY if tiny else SMALL, batch_size=4 if tiny else 16,
        batch_length=length, train_ratio=8.0 if tiny else 32.0, prefill=8 if tiny else 250,
        capacity=400 if tiny else 40_000, steps_per_collect=1 if tiny else 4,
        learning_rate=3e-4, warmup=10 if tiny else 100, gamma=0.99, num_bins=5 if tiny else 255,
        report_every=2 if tiny else 200, report_batch=2, report_length=4 if tiny else 16,
        report_context=2 if tiny else 5)
    # Every component's block, so that any other pairing is a command line away
    # (--config.components.agent=...); each is read only by the components it names.
    block = tdmpc2_block(model_size=1, episodic=False)  # the latent model's settings
    c.tdmpc2 = ml_collections.ConfigDict({k: block[k] for k in TDMPC2_KEYS})
    if world_model == "tdmpc2":
        c.dreamer.batch_size = 8 if tiny else 64
        # On Pendulum (benchmarks/results/learning_cpu.md, "Pairings"): at train ratio 32
        # (about 2.5k updates in 20k steps) neither gradient learned, the actor
        # backpropagating through TD-MPC2's latent dynamics settling on one saturated action;
        # at 128 REINFORCE learned on two seeds, backpropagation more slowly on one.
        c.dreamer.actor_grad_cont = "reinforce"
        c.dreamer.train_ratio = 8.0 if tiny else 128.0
    # agents.mppi.MPPIHyper, smaller than TD-MPC2's 512 x 6 for a CPU.
    c.mppi = ml_collections.ConfigDict(dict(
        horizon=3 if tiny else 8, iterations=2 if tiny else 4, num_samples=16 if tiny else 128,
        num_elites=4 if tiny else 16, num_pi_trajs=2 if tiny else 8, temperature=0.5,
        min_std=0.05, max_std=2.0, envs_per_batch=0))
    # Dreams of 300 steps: at 100 every candidate soon reached the cap, CMA-ES had nothing to
    # select by and its mean wandered (real returns rose to 100-160, then fell to 14).
    c.cmaes = ml_collections.ConfigDict(dict(
        population=4 if tiny else 16, episodes=1 if tiny else 4, sigma=0.5,
        max_steps=4 if tiny else 300, start_batch=2 if tiny else 16))
    c.phase_order = ("prefill", "train")
    d = c.dreamer
    c.phases.prefill = dict(unit="env_steps", duration=d.get_ref("prefill") * c.env.get_ref(
        "num_envs"), hooks=("collect",))
    c.phases.train = dict(unit="env_steps", duration=c.get_ref("total_env_steps")
                          - d.get_ref("prefill") * c.env.get_ref("num_envs"), hooks=())
    c.log.every = "8 env_steps" if tiny else "1000 env_steps"
    c.checkpoint.every = "16 env_steps" if tiny else "10000 env_steps"
    c.eval.every = "never" if tiny else "5000 env_steps"
    c.eval.num_envs = c.eval.num_episodes = 2 if tiny else 8
    c.lock()
    return c
