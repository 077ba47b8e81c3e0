"""TD-MPC2 (jaxwm/algos/tdmpc2.py). Launch:

jaxwm train --config=tdmpc2:dmc --config.env.id=CheetahRun-v1
jaxwm train --config=tdmpc2:dmc --config.model_size=1 --config.env.id=CartpoleSwingup-v1
jaxwm train --config=tdmpc2:mujoco --config.env.id=Hopper-v4
jaxwm train --config=tdmpc2:pendulum  # the 1M model learns Pendulum on a CPU
jaxwm train --config=tdmpc2:cartpole --config.num_seeds=3  # CartpoleBalance, MJX, ~1 h on a CPU
jaxwm train --config=tdmpc2:tiny      # every hook and phase (minutes)
jaxwm train --config=tdmpc2:tiny \
    --config.env.id=CartpoleBalance-v1 --config.tdmpc2.horizon=5

The algorithm's settings live under ``config.tdmpc2`` (the reference's ``config.yaml``:
batch 256, horizon 3, Adam 3e-4 with the encoder at 0.3x, grad clip 20, tau 0.01, rho 0.5,
coefficients 20 / 0.1 / 0.1 / 1, MPPI 6 iterations of 512 samples, 64 elites, 24 policy
trajectories, temperature 0.5). ``--config.model_size`` (or ``tdmpc2.model_size``, one setting):
1, 5 (default), 19, 48 or 317 million parameters.

Phases: ``seed`` (``tdmpc2.seed_steps`` random env steps: max(1000, 5 x episode length)),
``pretrain`` (as many updates), ``train`` (one update per env step). Env steps count agent
steps, as the reference's step counter does: DMC runs with action repeat 2 (``env.frame_skip``)
and 500-step episodes, so ``dmc``'s 1M steps are 2M simulator steps, and returns stay on DMC's
0-1000 scale. ``mujoco`` is episodic (Hopper and Walker fall): a termination head, and TD
targets cut at each transition's own termination.
"""

import ml_collections

from jaxwm.agents import tdmpc2 as tdmpc2_agent
from jaxwm.agents.tdmpc2 import config_block
from jaxwm.config import base_config, prefixed

SUMMARIES = {
    "dmc": "DMC with the reference's settings: 5M model, action repeat 2",
    "mujoco": "MuJoCo tasks that end (Hopper, Walker): a termination head",
    "pendulum": "The 1M model learns Pendulum in minutes on a CPU",
    "cartpole": "The 1M model balances Playground's CartpoleBalance in 10k steps on a CPU",
    "tiny": "The contract suite's: every hook and phase in a minute",
    "playground_tiny": "The tiny config on MuJoCo Playground's CartpoleBalance (MJX, in JAX)",
}
VARIANTS = tuple(SUMMARIES)
FIELDS = {
    **prefixed("tdmpc2", tdmpc2_agent.FIELDS),
    "model_size": (tdmpc2_agent.FIELDS["model_size"][0],
                   "Model size, millions of parameters: one setting with tdmpc2.model_size."),
}


def get_config(variant: str = "dmc") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown tdmpc2 variant {variant!r}; choose one of {VARIANTS}.")
    c = base_config()
    c.algo = "tdmpc2"
    c.env.num_envs = 1
    c.env.frame_skip = 2  # DMC's action repeat (other families ignore it)
    c.eval.temperature = 0.0  # the planner without exploration noise
    c.eval.num_envs = c.eval.num_episodes = 10
    if variant == "dmc":
        c.env.id = "CheetahRun-v1"
        c.total_env_steps = 1_000_000
        c.tdmpc2 = config_block(seed_steps=2500)  # 5 episodes of 500 steps
        c.log.every = "5000 env_steps"
        c.eval.every = "50000 env_steps"
        c.checkpoint.every = "50000 env_steps"
    elif variant == "mujoco":
        c.env.id = "Hopper-v4"
        c.total_env_steps = 1_000_000
        c.tdmpc2 = config_block(seed_steps=5000, episodic=True)  # 5 episodes of 1000 steps
        c.log.every = "5000 env_steps"
        c.eval.every = "50000 env_steps"
        c.checkpoint.every = "50000 env_steps"
    elif variant == "pendulum":  # the 1M model, minutes on a CPU
        c.env.id = "Pendulum-v1"
        c.total_env_steps = 5_000
        # max(1000, 5 x 200) seed steps; a lighter planner and batch than the reference's
        # (4 x 256 samples, batch 128): a third of the time per step, and Pendulum needs no more
        c.tdmpc2 = config_block(model_size=1, seed_steps=1000, batch_size=128, num_samples=256,
                                iterations=4)
        c.log.every = "500 env_steps"
        c.eval.every = "1000 env_steps"
        c.eval.num_envs = c.eval.num_episodes = 5
        c.checkpoint.every = "5000 env_steps"
    elif variant == "cartpole":  # the 1M model on Playground's cartpole-balance, in JAX
        c.env.id = "playground:CartpoleBalance"
        c.total_env_steps = 10_000
        # max(1000, 2 x 500) seed steps; a lighter planner (2 x 128 samples, 32 elites, 12
        # policy trajectories: a 1-D action needs no more) and batch than the reference's
        c.tdmpc2 = config_block(model_size=1, seed_steps=1000, batch_size=128, num_samples=128,
                                iterations=2, num_elites=32, num_pi_trajs=12,
                                capacity=10_000)  # the whole run
        c.log.every = "1000 env_steps"
        c.eval.every = "5000 env_steps"
        c.eval.num_envs = c.eval.num_episodes = 5
        c.checkpoint.every = "5000 env_steps"
    else:  # every code path in a minute: the contract suite's (on Pendulum or Playground)
        c.env.id = "Pendulum-v1" if variant == "tiny" else "playground:CartpoleBalance"
        c.env.num_envs = 2
        c.total_env_steps = 96
        c.tdmpc2 = config_block(model_size=1, batch_size=16, seed_steps=64, capacity=1000,
                                iterations=2, num_samples=32, num_elites=8, num_pi_trajs=4,
                                steps_per_collect=4, updates_per_step=0.25)
        c.log.every = "16 env_steps"
        c.eval.every = "never"
        c.eval.num_envs = c.eval.num_episodes = 2
        c.checkpoint.every = "32 env_steps, 16 model_updates"
    t = c.tdmpc2
    # --config.model_size (the and the reference's CLI) and --config.tdmpc2.model_size
    # are one setting: either sets both.
    c.model_size = t.model_size
    t.model_size = c.get_ref("model_size")
    c.phase_order = ("seed", "pretrain", "train")
    c.phases.seed = dict(unit="env_steps", duration=t.get_ref("seed_steps"), hooks=("collect",))
    c.phases.pretrain = dict(unit="model_updates", duration=t.get_ref("seed_steps"),
                             hooks=("update_model",))
    # train's hooks: collect and update_model, or iterate on a JAX env (algos.tdmpc2.phase_hooks)
    c.phases.train = dict(unit="env_steps",
                          duration=c.get_ref("total_env_steps") - t.get_ref("seed_steps"),
                          hooks=())
    c.lock()
    return c
