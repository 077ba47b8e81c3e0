"""SimPLe / MBARC (jaxwm/algos/simple.py). Launch:

jaxwm train --config=simple:tiny           # every hook and phase in ~1 min on a CPU
jaxwm train --config=simple:atari100k --config.env.id=Freeway-v5 --config.strategy=mbarc
jaxwm train --config=simple:atari100k --config.env.id=Pong-v5 \
    --config.strategy=online --config.stochastic=False
jaxwm train --config=simple:minatar --config.env.id=gymnax:SpaceInvaders-MinAtar

``atari100k`` follows MBARC's defaults (thomas-schillaci/mbarc_atari, ``mbarc/__main__.py``),
which are SimPLe's (Kaiser et al. 2020) with MBARC's 5 compress steps and short schedule: the
real env without sticky actions, up to 8 no-ops, frame skip 4, 105x80 RGB, 4 frames, rewards
clipped to their sign; 6400 random steps, then 15 epochs of 6400 policy steps (temperature 1)
-> world model (45k optimiser steps in epoch 0, then 15k; batch 4, rollouts of 50, scheduled
sampling over 22,250 steps) -> reward head (the strategy's steps, batch 32) -> PPO inside the
model (1000 iterations of 16 agents x 50 steps, x2 at epochs 7 and 11, x3 at 14; lr 1e-4,
clip 0.1, 5 minibatches x 4 epochs, entropy 0.01, value 0.5, no annealing) -> evaluation in the
real env at temperature 0.5. 102,400 real steps in all.

``--config.strategy`` (or ``simple.strategy``, one setting): online | class_balanced |
square_root | progressively_balanced | mbarc (MBARC's default). ``--config.stochastic``
(or ``simple.stochastic``): the discrete latent on (default) or off. ``simple.model_size``:
full (~69M parameters, MBARC's), small, tiny, minatar. ``minatar``: SimPLe on MinAtar in
gymnax (``minatar()`` below; docs/simple.md).

Departures: envpool max-pools the last two raw frames of each skip and resizes with area
interpolation; MBARC's wrapper keeps the last frame and takes every other pixel. The policy
network is jaxwm's Nature CNN (MBARC's third convolution has 32 filters, not 64).
"""

import ml_collections

from jaxwm.agents import ppo as ppo_agent
from jaxwm.agents.ppo import config_block as ppo_block
from jaxwm.config import base_config, prefixed
from jaxwm.models import nextframe
from jaxwm.nets import actor_critic
from jaxwm.nets.actor_critic import config_block as network_block
from jaxwm.ops import reward_balance

SUMMARIES = {
    "atari100k": "Atari 100k as MBARC's defaults (SimPLe, Kaiser et al. 2020)",
    "tiny": "Every hook and phase in a minute on a CPU; deterministic model",
    "minatar": "MinAtar Breakout in JAX (gymnax): 10x10 object channels, 40k real steps",
    "minatar_tiny": "simple:minatar's every hook and phase in a minute on a CPU",
}
VARIANTS = tuple(SUMMARIES)
# Reward-head steps per epoch of each strategy (MBARC's).
REWARD_STEPS = {"class_balanced": 450, "square_root": 475, "progressively_balanced": 1000,
                "mbarc": 1500}
STRATEGIES = "{" + ", ".join(reward_balance.STRATEGIES) + "}"
SIMPLE_FIELDS = {  # simple_block's
    "model_size": ("{" + ", ".join(nextframe.SIZES) + "}",
                   "Next-frame model size: full (~69M parameters, MBARC's), small, tiny, "
                   "minatar (MinAtar's 10x10 frames)."),
    "pixel_classes": ("[2, 256]", "Classes of each pixel value, evenly spaced over 0..255: 256 "
                      "(every uint8 value), 2 (MinAtar's cells, 0 or 255)."),
    "reward_head": ("{" + ", ".join(nextframe.REWARD_HEADS) + "}",
                    "Reward head: mbarc (MBARC's conv head) or simple (SimPLe's pooled MLP)."),
    "strategy": (STRATEGIES, "How the reward head's samples are drawn (MBARC's strategies)."),
    "stochastic": (None, "The world model's discrete latent on (SimPLe's) or off."),
    "focal_loss": (None, "online only: class-balanced focal loss instead of cross-entropy."),
    "frames": ("> 0", "Frames stacked as the model's input (= env.frame_stack)."),
    "random_steps": ("> 0", "Random-action env steps before the first epoch."),
    "collect_per_epoch": ("> 0", "Env steps of the policy collected per epoch."),
    "collect_steps": ("> 0", "Env steps of each env per collect call."),
    "epochs": ("> 0", "Epochs of collect, model, reward head, agent."),
    "batch_size": ("> 0", "Replayed windows per world-model update."),
    "rollout_length": ("> 0", "Steps per world-model training rollout (one optimiser step each)."),
    "model_steps_first": ("> 0", "World-model optimiser steps in epoch 0."),
    "model_steps": ("> 0", "World-model optimiser steps in each later epoch."),
    "scheduled_sampling_steps": ("> 0", "Model steps over which feeding it real frames decays to 0."),
    "input_noise": ("[0, 1]", "Probability of each input value being replaced by the median."),
    "value_gamma": ("[0, 1]", "Discount of the replay's returns the value head learns."),
    "reward_steps.*": ("> 0", "Reward-head steps per epoch of this strategy."),
    "reward_steps_per_call": ("> 0", "Reward-head steps per update_reward call."),
    "reward_batch_size": ("> 0", "Transitions per reward-head step."),
    "balance_stages": ("> 0", "progressively_balanced: stages from uniform to balanced."),
    "mbarc_masses": ("[0, 1]", "mbarc: sampling masses of its three groups (sum 1)."),
    "agent_iterations": ("> 0", "PPO iterations in the simulator per epoch."),
    "agent_multipliers.*": ("> 0", "Multiplier of agent_iterations at this epoch."),
    "frame_mode": ("{argmax, sample}", "How the simulator picks its next frame."),
    "sim.num_agents": ("> 0", "Agents acting in the simulator per PPO iteration."),
    "report_length": ("> 0", "Steps of each open-loop prediction report."),
    "report_batch": ("> 0", "Windows per open-loop prediction report."),
    "evaluate_each_epoch": (None, "Evaluate in the real env at the end of each epoch."),
}
FIELDS = {
    **prefixed("simple", SIMPLE_FIELDS),
    **prefixed("ppo", ppo_agent.FIELDS),
    **prefixed("network", actor_critic.FIELDS),
    "strategy": (STRATEGIES, "simple.strategy: one setting, either sets both."),
    "stochastic": (None, "simple.stochastic: one setting, either sets both."),
}


def simple_block(**overrides) -> ml_collections.ConfigDict:
    s = ml_collections.ConfigDict()
    s.model_size = "full"
    s.pixel_classes = nextframe.PIXEL_CLASSES
    s.reward_head = "mbarc"  # mbarc (MBARC's conv head) | simple (SimPLe's pooled MLP)
    s.strategy = "mbarc"
    s.stochastic = True
    s.focal_loss = False  # online only: class-balanced focal loss instead of cross-entropy
    s.frames = 4
    s.random_steps = 6400
    s.collect_per_epoch = 6400
    s.collect_steps = 100  # per env per collect call
    s.epochs = 15
    s.batch_size = 4
    s.rollout_length = 50
    s.model_steps_first = 45_000
    s.model_steps = 15_000
    s.scheduled_sampling_steps = 22_250
    s.input_noise = 0.05
    s.value_gamma = 0.99
    s.reward_steps = ml_collections.ConfigDict(REWARD_STEPS)
    s.reward_steps_per_call = 25
    s.reward_batch_size = 32
    s.balance_stages = 50
    s.mbarc_masses = (0.35, 0.05, 0.6)
    s.agent_iterations = 1000
    s.agent_multipliers = ml_collections.ConfigDict({"7": 2, "11": 2, "14": 3})
    s.frame_mode = "argmax"  # argmax | sample: how the simulator picks its next frame
    s.sim = ml_collections.ConfigDict({"num_agents": 16})
    s.report_length = 50
    s.report_batch = 4
    s.evaluate_each_epoch = True
    s.update(overrides)
    return s


def shrink(c: ml_collections.ConfigDict) -> None:
    """Every hook and phase of ``c`` in a minute on a CPU: 2 envs, 32 random and 32 policy
    steps, one epoch of a few updates of each kind (the tiny configs)."""
    c.env.num_envs = 2
    c.simple.update(random_steps=32, collect_per_epoch=32, collect_steps=8, epochs=1,
                    batch_size=4, rollout_length=4, model_steps_first=8, model_steps=4,
                    scheduled_sampling_steps=8, reward_steps_per_call=2, reward_batch_size=4,
                    balance_stages=4, agent_iterations=2, report_length=4, report_batch=2,
                    evaluate_each_epoch=False)
    c.simple.reward_steps = ml_collections.ConfigDict({name: 4 for name in REWARD_STEPS})
    c.simple.sim.num_agents = 4
    c.ppo.update(num_steps=4, num_minibatches=2, update_epochs=1)
    c.eval.num_envs = c.eval.num_episodes = 1
    c.log.every = "16 env_steps, 4 model_updates, 2 agent_updates"
    c.checkpoint.every = "8 model_updates, 4 agent_updates"


def minatar(c: ml_collections.ConfigDict) -> None:
    """SimPLe on MinAtar (Young & Tian 2019) in gymnax, a world-model check that fits a CPU:
    one 10x10 frame of the game's object channels (not stacked: its trail channels show
    motion; gymnax's sticky actions, 0.1, on), the ``minatar`` model (two compress steps),
    16 real envs, 8000 random steps then 4 epochs of 8000 (40k real steps), PPO in the model
    with MinAtar's CNN and an entropy coefficient of 0.05. Any MinAtar game:
    ``--config.env.id=gymnax:SpaceInvaders-MinAtar``."""
    c.env.id = "gymnax:Breakout-MinAtar"
    c.env.update(num_envs=16, frame_stack=1)
    c.network = network_block(encoder="minatar_cnn", separate_critic=False)
    c.ppo = ppo_block(num_steps=50, learning_rate=1e-4, anneal_lr=False, clip_coef=0.1,
                      num_minibatches=5, update_epochs=4, vf_coef=0.5, ent_coef=0.05)
    c.simple = simple_block(
        model_size="minatar", pixel_classes=2, frames=1, random_steps=8000, collect_per_epoch=8000,
        collect_steps=50, epochs=4, batch_size=16, rollout_length=10, model_steps_first=8000,
        model_steps=2000, scheduled_sampling_steps=4000, agent_iterations=300)
    c.simple.agent_multipliers = ml_collections.ConfigDict({})
    c.eval.num_envs = c.eval.num_episodes = 32
    c.log.every = "8000 env_steps, 1000 model_updates, 1000 agent_updates"
    c.checkpoint.every = "4000 model_updates, 4000 agent_updates"


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown simple variant {variant!r}; choose one of {VARIANTS}.")
    c = base_config()
    c.algo = "simple"
    c.env.id = "Freeway-v5"
    c.env.update(img_height=105, img_width=80, gray_scale=False, frame_stack=4, frame_skip=4,
                 noop_max=8, repeat_action_probability=0.0, episodic_life=False,
                 use_fire_reset=True, reward_clip=True, full_action_space=False)
    c.env.num_envs = 1  # MBARC's one real env: 6400 steps are a few whole episodes
    c.ppo = ppo_block(num_steps=50, learning_rate=1e-4, anneal_lr=False, clip_coef=0.1,
                      num_minibatches=5, update_epochs=4, vf_coef=0.5)
    c.network = network_block(encoder="nature_cnn", separate_critic=False)
    c.eval.temperature = 0.5
    c.eval.num_envs = 15
    c.eval.num_episodes = 30
    c.eval.every = "never"  # each epoch ends with an evaluation (its hooks), and the run
    c.log.every = "6400 env_steps, 1500 model_updates, 2000 agent_updates"
    c.log.x_axis = "env_steps"
    c.checkpoint.every = "15000 model_updates, 20000 agent_updates"

    if variant == "tiny":  # every hook and phase in a minute on a CPU; the deterministic model
        # (--config.stochastic=True adds the latent; tests/test_simple.py covers it)
        c.env.id = "Pong-v5"
        c.env.update(img_height=44, img_width=36)
        c.simple = simple_block(model_size="tiny", stochastic=False)
        shrink(c)
        c.simple.agent_multipliers = ml_collections.ConfigDict({"0": 2})
    elif variant == "minatar":
        minatar(c)
    elif variant == "minatar_tiny":  # the contract suite's SimPLe on a JAX env
        minatar(c)
        shrink(c)
    else:
        c.simple = simple_block()

    s = c.simple
    # --config.strategy / --config.stochastic (the and MBARC's CLI) and
    # --config.simple.strategy / .stochastic are one setting each: either sets both.
    c.strategy, c.stochastic = s.strategy, s.stochastic
    s.strategy, s.stochastic = c.get_ref("strategy"), c.get_ref("stochastic")
    c.total_env_steps = s.random_steps + s.epochs * s.collect_per_epoch
    c.phase_order = ("random",) + tuple(f"epoch_{e:02d}" for e in range(s.epochs))
    # The hooks of every phase come from config.simple (jaxwm/algos/simple.py, phase_hooks).
    c.phases.random = dict(unit="env_steps", duration=s.random_steps, hooks=())
    for name in c.phase_order[1:]:
        c.phases[name] = dict(unit="iterations", duration=1, hooks=())
    c.lock()
    return c
