"""Diffusion Policy on demonstrations (jaxwm/algos/diffusion.py). Launch:
jaxwm train --config=diffusion:pendulum  # makes its demonstrations if missing
jaxwm train --config=diffusion:pendulum --config.diffusion.horizon=16 \
    --config.diffusion.action_steps=8 --config.diffusion.sampler=ddim \
    --config.diffusion.inference_steps=10
jaxwm train --config=diffusion:pendulum --config.diffusion.model=mlp  # MLP-BC
jaxwm train --config=diffusion:reacher   # MuJoCo in minutes on a CPU
jaxwm train --config=diffusion:mujoco --config.env.id=Hopper-v4 \
    --config.dataset=data/hopper-expert.hdf5

Settings follow the reference's state-input U-Net (real-stanford/diffusion_policy,
``diffusion_policy/config/train_diffusion_unet_lowdim_workspace.yaml``; Chi et al. 2023): horizon 16,
2 observation steps, 8 executed actions, down dims [256, 512, 1024], step embedding 256,
kernel 5, 8 groups, DDPM with 100 steps (squaredcos_cap_v2, epsilon prediction, clipped
samples), AdamW 1e-4 (0.95, 0.999), weight decay 1e-6, cosine with 500 warm-up steps, EMA
power 0.75 up to 0.9999, batch 256. ``mujoco`` uses them as they are. ``pendulum`` is the
same code at CPU sizes (down dims [32, 64, 128], step embedding 32, batch 128, lr 1e-3,
5000 updates, DDIM 10, one executed action per plan) on 20k expert steps that jaxwm's SAC
makes when the file is missing (``jaxwm.tools.make_dataset``, about 5 minutes). ``reacher``
is MuJoCo's Reacher-v4 at the same CPU sizes with the reference's 8 executed actions per plan
(reaching tolerates open-loop chunks), on 100k expert steps from a 30k-step SAC that the run
makes when missing (about 5 minutes).
``tiny`` runs every code path in seconds (the contract suite's).
"""

import ml_collections

from jaxwm.agents import diffusion_policy
from jaxwm.agents.diffusion_policy import config_block
from jaxwm.config import base_config, prefixed
from jaxwm.configs.mopo import DATA_FIELDS

SUMMARIES = {
    "pendulum": "Pendulum-v1 at CPU sizes on 20k SAC-expert steps it makes",
    "reacher": "Reacher-v4 at CPU sizes, 8 actions per plan, 100k expert steps",
    "mujoco": "Hopper-v4 with Chi et al. 2023's state U-Net settings as they are",
    "tiny": "Every code path in seconds: the contract suite's",
}
VARIANTS = tuple(SUMMARIES)
FIELDS = {**DATA_FIELDS, **prefixed("diffusion", diffusion_policy.FIELDS)}


def get_config(variant: str = "pendulum") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown diffusion variant {variant!r}; choose one of {VARIANTS}.")
    c = base_config()
    c.algo = "diffusion"
    c.env.num_envs = 1  # offline: the env is only evaluated (eval.num_envs)
    c.diffusion = config_block()
    # Make the demonstrations when the file is missing (level "": never; the user points
    # --config.dataset at a file, or makes one with jaxwm.tools.make_dataset).
    c.dataset_make = ml_collections.ConfigDict({"level": "", "size": 20_000,
                                                "train_steps": 20_000})
    c.phase_order = ("train",)
    c.log.x_axis = "agent_updates"
    c.eval.num_envs = 10
    c.eval.num_episodes = 10
    c.eval.temperature = 1.0  # the sampler's own noise (agents/diffusion_policy.py)
    if variant == "mujoco":
        c.env.id = "Hopper-v4"
        c.dataset = "data/hopper-expert.hdf5"
        c.diffusion.updates_per_call = 10
        c.phases.train = dict(unit="agent_updates", duration=200_000, hooks=("update_agent",))
        c.log.every = "1000 agent_updates"
        c.checkpoint.every = "10000 agent_updates"
        c.eval.every = "20000 agent_updates"
    elif variant in ("pendulum", "reacher"):
        # CPU sizes, and what a CPU budget needs (measured, docs/diffusion.md): lr 1e-3
        # (at 1e-4, 3000 updates ended near random).
        c.diffusion.update(down_dims=(32, 64, 128), step_embed_dim=32, mlp_hidden=(256, 256),
                           batch_size=128, learning_rate=1e-3, sampler="ddim",
                           inference_steps=10, updates_per_call=50)
        c.dataset_make.level = "expert"
        if variant == "pendulum":
            c.env.id = "Pendulum-v1"
            c.dataset = "data/pendulum-expert.hdf5"
            # One executed action per plan: Pendulum balances an unstable point, and 8
            # open-loop actions (0.4 s) lose it.
            c.diffusion.action_steps = 1
        else:
            c.env.id = "Reacher-v4"
            c.dataset = "data/reacher-expert.hdf5"
            c.dataset_make.update(size=100_000, train_steps=30_000)
        c.phases.train = dict(unit="agent_updates", duration=5_000, hooks=("update_agent",))
        c.log.every = "500 agent_updates"
        c.checkpoint.every = "2500 agent_updates"
        c.eval.every = "2500 agent_updates"
    else:  # tiny
        c.env.id = "Pendulum-v1"
        c.dataset = "data/pendulum-random-tiny.hdf5"  # the MOPO tiny config's file
        c.dataset_make.update(level="random", size=2_000)
        c.diffusion.update(horizon=4, n_obs_steps=2, action_steps=2, down_dims=(16,),
                           step_embed_dim=8, groups=4, mlp_hidden=(16,), train_steps=10,
                           inference_steps=10, warmup_steps=2, batch_size=16,
                           updates_per_call=2)
        c.phases.train = dict(unit="agent_updates", duration=8, hooks=("update_agent",))
        c.log.every = "2 agent_updates"
        c.checkpoint.every = "4 agent_updates"
        c.eval.every = "never"
        c.eval.num_envs = c.eval.num_episodes = 2
        c.env.max_episode_steps = 20
    c.lock()
    return c
