"""Online SAC (jaxwm/algos/sac.py). Launch:
jaxwm train --config=sac:pendulum
jaxwm train --config=sac:mujoco --config.env.id=HalfCheetah-v4

Phases: ``warmup`` collects ``sac.learning_starts`` uniformly random steps; ``train`` cycles
collect -> update_agent with ``sac.updates_per_step`` updates per env step. Sizes follow
Haarnoja et al. 2018 (256x256, Adam 3e-4, batch 256, tau 0.005, gamma 0.99, target entropy
-|A|, 1M replay); the learning start (5000 MuJoCo steps, 1000 on Pendulum) follows CleanRL /
Stable-Baselines3. ``steps_per_collect`` env steps between updates (the same number of
updates then follow) keeps the host loop out of the way; SAC's usual is one.
"""

import ml_collections

from jaxwm.agents import sac
from jaxwm.agents.sac import config_block as sac_block
from jaxwm.config import base_config, prefixed

SUMMARIES = {
    "pendulum": "Pendulum-v1 in 20k steps, Haarnoja et al. 2018's sizes",
    "mujoco": "MuJoCo (HalfCheetah), 1M steps: Haarnoja et al. 2018's SAC",
    "tiny": "Every code path in seconds: the contract suite's",
    "playground_tiny": "The tiny config on MuJoCo Playground's CartpoleBalance (MJX, in JAX)",
}
VARIANTS = tuple(SUMMARIES)
FIELDS = prefixed("sac", sac.FIELDS)


def get_config(variant: str = "pendulum") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown sac variant {variant!r}; choose one of {VARIANTS}.")
    c = base_config()
    c.algo = "sac"
    c.env.num_envs = 1
    if variant in ("tiny", "playground_tiny"):  # every code path in seconds: the contract's
        c.env.id = "Pendulum-v1" if variant == "tiny" else "playground:CartpoleBalance"
        c.env.num_envs = 2
        c.total_env_steps = 64
        c.sac = sac_block(learning_starts=16, capacity=1_000, batch_size=16,
                          actor_hidden=(16, 16), critic_hidden=(16, 16), steps_per_collect=4,
                          updates_per_step=0.5)
        c.log.every = "16 env_steps"
        c.eval.every = "never"
        c.checkpoint.every = "32 env_steps"
    elif variant == "pendulum":
        c.env.id = "Pendulum-v1"
        c.total_env_steps = 20_000
        c.sac = sac_block(learning_starts=1_000, capacity=100_000)
        c.log.every = "2000 env_steps"
        c.eval.every = "5000 env_steps"
        c.checkpoint.every = "10000 env_steps"
    else:
        c.env.id = "HalfCheetah-v4"
        c.total_env_steps = 1_000_000
        c.sac = sac_block()
        c.log.every = "10000 env_steps"
        c.eval.every = "50000 env_steps"
    c.eval.num_envs = 2 if variant.endswith("tiny") else 5
    c.eval.num_episodes = 2 if variant.endswith("tiny") else 10
    c.eval.temperature = 0.0  # SAC evaluates its deterministic policy, tanh(mean)
    c.phase_order = ("warmup", "train")
    s = c.sac
    c.phases.warmup = dict(unit="env_steps", duration=s.get_ref("learning_starts"),
                           hooks=("collect",))
    c.phases.train = dict(unit="env_steps",
                          duration=c.get_ref("total_env_steps") - s.get_ref("learning_starts"),
                          hooks=("collect", "update_agent"))
    c.lock()
    return c
