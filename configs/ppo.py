"""PPO configs. Launch: python -m jaxwm.train --config=configs/ppo.py:<variant>

Variants: cartpole (default; solves CartPole-v1 in ~200k steps), atari, mujoco, minigrid.
Atari/MuJoCo defaults follow CleanRL (REFERENCE.md); the others are tuned for quick solves.
"""

import ml_collections

from jaxwm.config import base_config

VARIANTS = ("cartpole", "atari", "mujoco", "minigrid")


def ppo_block(**overrides) -> ml_collections.ConfigDict:
    p = ml_collections.ConfigDict()
    p.num_steps = 128
    p.learning_rate = 2.5e-4
    p.anneal_lr = True  # linearly to 0 over anneal_env_steps (set in get_config)
    p.gamma = 0.99
    p.gae_lambda = 0.95
    p.num_minibatches = 4
    p.update_epochs = 4
    p.clip_coef = 0.2
    p.clip_vloss = True
    p.ent_coef = 0.01
    p.vf_coef = 0.5
    p.max_grad_norm = 0.5
    p.norm_adv = True
    p.normalize_obs = False
    p.normalize_reward = False
    p.loop_form = "auto"  # auto | scan | unroll | host (see jaxwm/agents/ppo.py)
    p.update(overrides)
    return p


def network_block(**overrides) -> ml_collections.ConfigDict:
    n = ml_collections.ConfigDict()
    n.encoder = "auto"  # auto | mlp | nature_cnn | grid_cnn
    n.hidden = (64, 64)
    n.activation = "tanh"
    n.backbone = "ff"
    n.separate_critic = True
    n.update(overrides)
    return n


def get_config(variant: str = "cartpole") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown ppo variant {variant!r}; choose one of {VARIANTS}.")
    c = base_config()
    c.algo = "ppo"
    c.network = network_block()
    if variant == "cartpole":
        c.env.id = "CartPole-v1"
        c.env.num_envs = 8
        c.total_env_steps = 200_000
        c.ppo = ppo_block(num_steps=64, learning_rate=1e-3)
        c.log.every = "8192 env_steps"
        c.eval.every = "50000 env_steps"
    elif variant == "atari":
        c.env.id = "Breakout-v5"
        c.env.num_envs = 8
        c.env.episodic_life = True
        c.env.reward_clip = True
        c.env.frame_stack = 4
        c.env.img_height = 84
        c.env.img_width = 84
        c.env.gray_scale = True
        c.env.noop_max = 30
        c.env.use_fire_reset = True
        c.env.repeat_action_probability = 0.0
        c.env.full_action_space = False
        c.total_env_steps = 10_000_000
        c.ppo = ppo_block(clip_coef=0.1)
        c.network = network_block(encoder="nature_cnn", separate_critic=False)
        c.log.every = "20480 env_steps"
        c.eval.every = "500000 env_steps"
        c.eval.num_episodes = 8
    elif variant == "mujoco":
        c.env.id = "HalfCheetah-v4"
        c.env.num_envs = 1
        c.total_env_steps = 1_000_000
        c.ppo = ppo_block(num_steps=2048, learning_rate=3e-4, num_minibatches=32,
                          update_epochs=10, ent_coef=0.0, normalize_obs=True,
                          normalize_reward=True)
        c.log.every = "20480 env_steps"
        c.eval.every = "100000 env_steps"
        c.eval.num_envs = 5
        c.eval.num_episodes = 5
        c.eval.temperature = 0.0
    elif variant == "minigrid":
        c.env.id = "MiniGrid-DoorKey-5x5-v0"
        c.env.num_envs = 16
        c.total_env_steps = 1_000_000
        c.ppo = ppo_block(learning_rate=2.5e-4)
        c.network = network_block(encoder="grid_cnn", separate_critic=False)
        c.log.every = "20480 env_steps"
    # The annealing horizon: total_env_steps when anneal_lr is set (0 otherwise), fixed when
    # the run starts. A derived reference: it follows both until set, and setting it leaves
    # them alone; a resume refuses a change (the rate would jump), see jaxwm/algos/ppo.py.
    c.ppo.anneal_env_steps = c.get_ref("total_env_steps") * c.ppo.get_ref("anneal_lr")
    c.phases.train = dict(unit="env_steps", duration=c.get_ref("total_env_steps"),
                          hooks=("collect", "update_agent"))
    c.lock()
    return c
