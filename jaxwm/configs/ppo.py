"""PPO with BenchNetRL's memory backbones (jaxwm/algos/ppo.py). Launch: jaxwm train --config=ppo:<variant>

Variants: cartpole (default; solves CartPole-v1 in ~200k steps), atari, mujoco, minigrid,
the partially observable cartpole_masked and lunarlander_masked (velocities zeroed;
BenchNetRL's settings), cartpole_masked_tuned (RL Zoo's tuned recurrent PPO, small memories:
solves masked CartPole within 200k steps), cartpole_masked_transformer (the CartPole settings
of MarcoMeter's episodic-transformer-memory-ppo: long rollouts and four small layers, with
which GTrXL solves masked CartPole within 500k steps), and
mujoco_memory (BenchNetRL's MuJoCo defaults, 8 envs: CleanRL's mujoco has one env, which a
memory backbone, shuffling whole envs, cannot split into minibatches).
Atari/MuJoCo defaults follow CleanRL (``ppo_atari_envpool``, ``ppo_continuous_action``),
whose settings are also BenchNetRL's
defaults; cartpole and minigrid are tuned for quick solves.

Every variant takes any memory backbone: ``--config.network.backbone=`` ff, lstm, gru, trxl,
gtrxl, mamba or mamba2, sized by its ``network.<block>`` (BenchNetRL's Atari sizes, or its
classic-control defaults in the masked variants). BenchNetRL's own Atari runs also use 16 envs,
8 minibatches and one frame for every agent but "PPO-4":
``--config.env.num_envs=16 --config.ppo.num_minibatches=8 --config.env.frame_stack=1``.

BenchNetRL's MiniGrid and MuJoCo run scripts are empty at its HEAD (SafeRL-Lab/BenchNetRL
55b36a1), so its scripts' argparse defaults are all there is: for both, 8 envs x 128 steps,
4 minibatches, 4 epochs, lr 2.5e-4, clip 0.1, ent 0.01 and the classic-control sizes above
(``CLASSIC_MEMORY``; use ``--config.network.rnn.hidden=512`` etc. to match on those envs).
Known differences kept here: its MiniGrid agents see 84x84 RGB renders of a 3x3 view through
the Nature CNN, while envpool's MiniGrid gives the symbolic grid (``grid_cnn``); its TrXL
script anneals the rate to 1e-5 with AdamW and the entropy coefficient from 1e-4 to 1e-6,
which jaxwm's one PPO does not.
"""

import ml_collections

from jaxwm.agents import ppo as ppo_agent
from jaxwm.agents.ppo import config_block as ppo_block
from jaxwm.config import base_config, prefixed
from jaxwm.nets import actor_critic
from jaxwm.nets.actor_critic import config_block as network_block

SUMMARIES = {
    "cartpole": "CartPole-v1 in ~200k steps: the quick default",
    "atari": "Atari (Breakout), CleanRL's ppo_atari_envpool settings",
    "mujoco": "MuJoCo (HalfCheetah), CleanRL's ppo_continuous_action settings",
    "minigrid": "MiniGrid DoorKey-5x5 on the symbolic grid, tuned for a quick solve",
    "cartpole_masked": "CartPole without velocities, BenchNetRL's settings",
    "cartpole_masked_tuned": "Masked CartPole, RL Zoo's tuned recurrent PPO: solves in 200k",
    "cartpole_masked_transformer": "Masked CartPole, MarcoMeter's TrXL settings: GTrXL solves in 500k",
    "lunarlander_masked": "LunarLander without velocities, BenchNetRL's settings",
    "mujoco_memory": "MuJoCo with a memory backbone: BenchNetRL's defaults, 8 envs",
    "gymnax_cartpole": "CartPole in JAX (gymnax), PureJaxRL's ppo.py settings, one program",
    "minatar": "MinAtar Breakout in JAX (gymnax), PureJaxRL's MinAtar settings, 10M steps",
    "craftax_classic": "Craftax-Classic symbolic (JAX), Craftax_Baselines' PPO-RNN settings, 1B steps",
    "tiny": "Every code path in seconds: the contract suite's",
}
VARIANTS = tuple(SUMMARIES)
FIELDS = {
    **prefixed("ppo", ppo_agent.FIELDS),
    "ppo.anneal_env_steps": (">= 0", "Env steps the rate anneals over (total_env_steps); 0: none."),
    **prefixed("network", actor_critic.FIELDS),
}


def memory_sizes(width: int, trxl: dict, state: int, headdim: int) -> dict:
    """A ``network_block`` override: a Linear(width) + ReLU encoder and every backbone at
    ``width`` (FF heads width x width, LSTM/GRU width, Mamba/Mamba-2 width with expand 2)."""
    block = ml_collections.ConfigDict
    return dict(
        encoder="mlp", hidden=(width,), activation="relu", separate_critic=False,
        ff=block(dict(head_hidden=(width, width))),
        rnn=block(dict(hidden=width, head_hidden=())),
        trxl=block(trxl),
        mamba=block(dict(dim=width, state=state, conv=4, expand=2, scan="auto",
                         learning_rate_scale=0.4)),
        mamba2=block(dict(dim=width, state=state, conv=4, expand=2, headdim=headdim,
                          chunk=64, learning_rate_scale=0.4)),
    )


# BenchNetRL's scripts' defaults for classic control (ppo.py, ppo_lstm.py, ppo_trxl.py,
# ppo_mamba.py; its run scripts for these envs set nothing): 8 envs x 128 steps, 4 minibatches,
# 4 epochs, lr 2.5e-4, clip 0.1, a Linear(512) + ReLU encoder, hidden sizes 512.
CLASSIC_MEMORY = dict(width=512, trxl=dict(dim=384, layers=3, heads=4, memory=119), state=64,
                      headdim=64)
# cartpole_masked_tuned: RL Zoo's tuned RecurrentPPO settings for CartPoleNoVel-v1 (8 envs x 32
# steps, one minibatch, lr 1e-3, gamma 0.98, lambda 0.8, no entropy bonus; it solves in 100k
# steps) with memories of 128 and 10 epochs, not Zoo's 20, which collapsed after peaking;
# BenchNetRL's settings learn this task slowly (benchmarks/results/learning_cpu.md).
TUNED_PPO = dict(num_steps=32, num_minibatches=1, update_epochs=10, learning_rate=1e-3,
                 gamma=0.98, gae_lambda=0.8, ent_coef=0.0, clip_coef=0.2)
SMALL_MEMORY = dict(width=128, trxl=dict(dim=128, layers=1, heads=2, memory=32), state=16,
                    headdim=32)
BENCHNETRL_PPO = dict(clip_coef=0.1)
# cartpole_masked_transformer: MarcoMeter/episodic-transformer-memory-ppo's cart.bat / yaml
# (16 envs x 256 steps, 4 minibatches x 4 epochs, gamma 0.99, lambda 0.95, entropy 1e-3,
# value coefficient 0.2, clip 0.2; TrXL with 4 blocks of dim 128, one head, memory 32) with
# two changes: lr 5e-4 annealed to 0 (theirs: 3e-4 to 3e-5) and the reward normalised by its
# return scale (theirs divides CartPole-v0's reward by 100). GTrXL solves it within 500k
# steps with these, not with cartpole_masked_tuned's short rollouts (the runs and the other
# settings tried: benchmarks/results/learning_cpu.md).
TRANSFORMER_PPO = dict(num_steps=256, num_minibatches=4, update_epochs=4, learning_rate=5e-4,
                       ent_coef=0.001, vf_coef=0.2, clip_coef=0.2, normalize_reward=True)
TRANSFORMER_MEMORY = dict(width=128, trxl=dict(dim=128, layers=4, heads=1, memory=32),
                          state=16, headdim=32)
# variant -> (env id, zeroed observation indices, envs, env steps, PPO overrides, memory
# sizes); the zeroed entries are CartPole's cart and pole velocities, LunarLander's linear and
# angular ones.
MASKED = {
    "cartpole_masked": ("CartPole-v1", (1, 3), 8, 500_000, BENCHNETRL_PPO, CLASSIC_MEMORY),
    "cartpole_masked_tuned": ("CartPole-v1", (1, 3), 8, 200_000, TUNED_PPO, SMALL_MEMORY),
    # 122 rollouts of 16 x 256 steps: the most that fit in 500k env steps.
    "cartpole_masked_transformer": ("CartPole-v1", (1, 3), 16, 122 * 16 * 256,
                                    TRANSFORMER_PPO, TRANSFORMER_MEMORY),
    "lunarlander_masked": ("LunarLander-v2", (2, 3, 5), 8, 5_000_000, BENCHNETRL_PPO,
                           CLASSIC_MEMORY),
}


def jax_env_variant(c, variant: str) -> None:
    """PureJaxRL's PPO settings on gymnax envs (Lu et al. 2022; ``purejaxrl/ppo.py`` for
    CartPole, its ``examples/brax_minatar.ipynb`` for MinAtar): rollouts of 128 steps, 4
    epochs, clip 0.2, entropy 0.01, separate 64 x 64 actor and critic MLPs, no observation
    or reward normalisation. Its budget is whole updates (``TOTAL_TIMESTEPS // (envs x
    128)``), run here as calls of ``iterations_per_call`` iterations (61 divides both)."""
    envs, updates = (4, 976) if variant == "gymnax_cartpole" else (64, 1220)
    c.env.num_envs = envs
    c.total_env_steps = updates * envs * 128
    c.iterations_per_call = 61
    c.log.every = f"{61 * envs * 128} env_steps"
    c.checkpoint.every = f"{4 * 61 * envs * 128} env_steps"
    if variant == "gymnax_cartpole":
        c.env.id = "gymnax:CartPole-v1"
        c.ppo = ppo_block()
        c.eval.every = "never"
    else:  # the flattened frames through an MLP, as PureJaxRL's FlattenObservationWrapper
        c.env.id = "gymnax:Breakout-MinAtar"
        c.env.flatten_obs = True
        c.ppo = ppo_block(learning_rate=5e-3, num_minibatches=8)
        c.network = network_block(activation="relu")
        c.eval.every = f"{10 * 61 * envs * 128} env_steps"


def craftax_variant(c) -> None:
    """Craftax_Baselines' PPO-RNN (Matthews et al. 2024; ``ppo_rnn.py``'s argparse defaults)
    on Craftax-Classic from symbols: 1024 envs x 64 steps, lr 2e-4 annealed, 4 epochs x 8
    minibatches, gamma 0.99, lambda 0.8, clip 0.2 (values too), entropy 0.01, grad norm 1.0; a
    512 ReLU embedding, a GRU of 512 and two 512 ReLU layers in each head. Its budget, 1e9
    steps, in whole updates of 65,536 (15,258 = 6 x 2,543 calls of 6 iterations). Known
    differences: its heads' hidden layers start from orthogonal(2) (jaxwm's MLPs: sqrt 2),
    and it treats Craftax's 10,000-step timeout as a termination (jaxwm bootstraps it)."""
    envs, steps, updates = 1024, 64, 15_258
    c.env.id = "craftax:Craftax-Classic-Symbolic-v1"
    c.env.num_envs = envs
    c.total_env_steps = updates * envs * steps
    c.iterations_per_call = 6
    c.ppo = ppo_block(num_steps=steps, learning_rate=2e-4, gae_lambda=0.8, num_minibatches=8,
                      max_grad_norm=1.0)
    c.network = network_block(encoder="mlp", hidden=(512,), activation="relu", backbone="gru",
                              separate_critic=False, rnn=ml_collections.ConfigDict(
                                  dict(hidden=512, head_hidden=(512, 512))))
    c.log.every = f"{6 * envs * steps} env_steps"
    c.checkpoint.every = f"{60 * envs * steps} env_steps"
    c.eval.every = f"{600 * envs * steps} env_steps"


def get_config(variant: str = "cartpole") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown ppo variant {variant!r}; choose one of {VARIANTS}.")
    c = base_config()
    c.algo = "ppo"
    c.network = network_block()
    if variant == "tiny":  # every code path in seconds: the contract suite's (tests/)
        c.env.id = "CartPole-v1"
        c.env.num_envs = 4
        c.total_env_steps = 4 * 16 * 4
        c.ppo = ppo_block(num_steps=16, learning_rate=1e-3)
        c.network = network_block(hidden=(16, 16))
        c.log.every = "64 env_steps"
        c.checkpoint.every = "128 env_steps"
        c.eval.every = "never"
        c.eval.num_envs = 2
        c.eval.num_episodes = 2
    elif variant == "cartpole":
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
    elif variant == "mujoco_memory":
        # BenchNetRL's scripts' defaults for MuJoCo with any backbone (8 envs, so memory
        # backbones can shuffle whole envs): its encoder Linear(64)+Tanh, Linear(512)+Tanh.
        c.env.id = "HalfCheetah-v4"
        c.env.num_envs = 8
        c.total_env_steps = 10_000_000
        c.ppo = ppo_block(clip_coef=0.1, normalize_obs=True, normalize_reward=True)
        c.network = network_block(**{**memory_sizes(**CLASSIC_MEMORY), "hidden": (64, 512),
                                     "activation": "tanh"})
        c.log.every = "20480 env_steps"
        c.eval.every = "100000 env_steps"
        c.eval.num_envs = 5
        c.eval.num_episodes = 5
        c.eval.temperature = 0.0
    elif variant in MASKED:
        (c.env.id, c.env.masked_indices, c.env.num_envs, c.total_env_steps, ppo,
         sizes) = MASKED[variant]
        c.ppo = ppo_block(**ppo)
        c.network = network_block(**memory_sizes(**sizes))
        c.log.every = "16384 env_steps"
        c.eval.every = "50000 env_steps"
    elif variant in ("gymnax_cartpole", "minatar"):  # PureJaxRL's ppo.py settings (jax envs)
        jax_env_variant(c, variant)
    elif variant == "craftax_classic":
        craftax_variant(c)
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
    # Hooks derived (algos.ppo.phase_hooks): collect, update_agent; with a JAX env, iterate.
    c.phases.train = dict(unit="env_steps", duration=c.get_ref("total_env_steps"), hooks=())
    c.lock()
    return c
