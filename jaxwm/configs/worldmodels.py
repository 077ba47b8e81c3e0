"""World Models (jaxwm/algos/worldmodels.py; Ha & Schmidhuber 2018). Launch:

jaxwm train --config=worldmodels:carracing
jaxwm train --config=worldmodels:carracing \\
    --config.controller.train_in=dream --config.dream.temperature=1.15
jaxwm train --config=worldmodels:carracing_cpu  # under an hour on 2 CPU cores
jaxwm train --config=worldmodels:tiny      # minutes on a CPU
jaxwm train --config=worldmodels:tiny --config.controller.population=16

Phases, each with its own counter: ``collect`` (random rollouts, ``env_steps``) -> ``vae``
(``vae_updates``) -> ``encode`` (every frame to its posterior, ``encoded_rows``) -> ``rnn``
(``rnn_updates``) -> ``evolve`` (CMA-ES ``generations``, in the real env or in the dream),
then the loop's evaluation of the distribution's mean controller.

``carracing`` is the paper's recipe (Ha & Schmidhuber 2018, appendix A; the settings of
hardmaru/WorldModelsExperiments ``carracing/``): 10k random rollouts of
1000 steps, VAE batch 100 at lr 1e-4 for 10 epochs, MDN-RNN of 256 units and 5 Gaussians at
lr 1e-3, batch 100, sequences of 1000 steps, 4000 updates, clipped at 1; CMA-ES population
64, 16 episodes each, sigma 0.1. At that size it is days of compute (the paper's CMA-ES ran on
64 CPU cores); the frames stream from ``<workdir>/artifacts/frames.h5`` (about 120 GB).
CarRacing-v3 (gymnasium, through envpool) is not the paper's v0: scores differ.
``carracing_cpu`` is the same recipe cut to a CPU budget (the slow learning test's): 32
rollouts, one VAE epoch at batch 32, 500 MDN-RNN updates on windows of 200, CMA-ES 16 x 2
episodes of 500 steps for 20 generations, evaluated on 10 full episodes.
"""

import ml_collections

from jaxwm.agents.cma_es import MIN_POPULATION
from jaxwm.config import base_config, prefixed

SUMMARIES = {
    "carracing": "The paper's CarRacing recipe (Ha & Schmidhuber 2018): days of compute",
    "carracing_cpu": "The recipe cut to a CPU budget: under an hour on 2 cores",
    "tiny": "Every phase in minutes on a CPU",
}
VARIANTS = tuple(SUMMARIES)
# A linear controller evolved by CMA-ES (jaxwm/agents/cma_es.py): World Models' controller
# block and jaxwm/configs/pairing.py's cmaes block.
CMAES_FIELDS = {
    "population": (f">= {MIN_POPULATION}", "CMA-ES candidates per generation."),
    "episodes": ("> 0", "Episodes each candidate is scored on (mean return)."),
    "sigma": ("> 0", "CMA-ES's initial step size."),
    "max_steps": ("> 0", "Steps per scoring episode."),
}
FIELDS = {
    **prefixed("worldmodels", {
        "rollouts": ("> 0", "Random rollouts collected."),
        "rollout_steps": ("> 0", "Env steps per random rollout."),
        "collect_policy": ("{random, brownian}",
                           "Rollout actions: uniform (the paper's) or brownian (ctallec's)."),
        "crop_rows": (">= 0", "Frame rows kept from the top (CarRacing: the dashboard cut); 0: all."),
        "z_dim": ("> 0", "The VAE's latent size."),
        "kl_tolerance": (">= 0", "The VAE's free bits per latent dimension, nats."),
        "vae_lr": ("> 0", "The VAE's Adam learning rate."),
        "vae_batch": ("> 0", "Frames per VAE update."),
        "vae_epochs": ("> 0", "Passes of the VAE over the collected frames."),
        "encode_batch": ("> 0", "Frames encoded per call of the encode phase."),
        "rnn_hidden": ("> 0", "The MDN-RNN's LSTM units."),
        "num_mixtures": ("> 0", "Gaussians of the MDN-RNN's mixture."),
        "rnn_lr": ("> 0", "The MDN-RNN's Adam learning rate."),
        "rnn_batch": ("> 0", "Sequences per MDN-RNN update."),
        "rnn_seq_len": ("> 0", "Steps per MDN-RNN training sequence."),
        "rnn_grad_clip": ("> 0", "Clip of each MDN-RNN gradient element (by value)."),
        "rnn_updates": ("> 0", "MDN-RNN updates."),
        "video_every": (">= 0", "Generations between dream-beside-real videos; 0: never."),
    }),
    **prefixed("controller", {
        **CMAES_FIELDS,
        "generations": ("> 0", "CMA-ES generations."),
        "train_in": ("{real, dream}", "Where candidates are scored: the real env or M's dream."),
    }),
    "dream.temperature": ("> 0", "Temperature of M's samples in the dream."),
}


def get_config(variant: str = "carracing") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown worldmodels variant {variant!r}; choose one of {VARIANTS}.")
    tiny = variant == "tiny"
    c = base_config()
    c.algo = "worldmodels"
    c.env.id = "CarRacing-v3"
    c.env.num_envs = 2 if tiny else 16  # the random-rollout pool
    w = c.worldmodels = ml_collections.ConfigDict()
    w.rollouts = 2 if tiny else 10_000  # random rollouts of rollout_steps steps
    w.rollout_steps = 24 if tiny else 1000
    w.collect_policy = "random"  # random (uniform, the paper's) | brownian (ctallec's)
    w.crop_rows = 84  # CarRacing's frame above its dashboard (the reference's crop)
    w.z_dim = 32
    w.kl_tolerance = 0.5
    w.vae_lr = 1e-4
    w.vae_batch = 8 if tiny else 100
    w.vae_epochs = 10  # passes over the frames (vae_updates = epochs x frames / batch)
    w.encode_batch = 16 if tiny else 1000
    w.rnn_hidden = 32 if tiny else 256
    w.num_mixtures = 5
    w.rnn_lr = 1e-3
    w.rnn_batch = 4 if tiny else 100
    w.rnn_seq_len = 8 if tiny else 1000
    w.rnn_grad_clip = 1.0  # per gradient element, as the reference's clip_by_value
    w.rnn_updates = 6 if tiny else 4000
    w.video_every = 1 if tiny else 10  # generations between dream-beside-real videos (0: never)
    if tiny:
        w.vae_epochs = 1
    cpu = variant == "carracing_cpu"
    if cpu:  # the slow learning test's budget (tests/test_worldmodels_learning.py)
        c.env.num_envs = 8
        w.rollouts, w.vae_batch, w.vae_epochs = 32, 32, 1
        w.rnn_batch, w.rnn_seq_len, w.rnn_updates = 16, 200, 500
    ctl = c.controller = ml_collections.ConfigDict()
    ctl.population = 4 if tiny else 64
    ctl.episodes = 2 if tiny else 16  # per candidate, averaged
    ctl.sigma = 0.1
    ctl.generations = 2 if tiny else 300
    ctl.max_steps = 20 if tiny else 1000  # steps per evaluation episode
    ctl.train_in = "real"  # real | dream
    if cpu:
        ctl.population, ctl.episodes, ctl.max_steps, ctl.generations = 16, 2, 500, 20
    c.dream = ml_collections.ConfigDict({"temperature": 1.0})

    c.eval.every = "never"  # the loop evaluates the mean controller at the end
    c.eval.num_envs = 2 if tiny else 10
    c.eval.num_episodes = 2 if tiny else 10 if cpu else 100
    c.eval.temperature = 0.0
    c.log.every = "2 vae_updates, 2 rnn_updates, 1 generations" if tiny else \
        "200 vae_updates, 100 rnn_updates, 1 generations" if cpu else \
        "1000 vae_updates, 100 rnn_updates, 1 generations"
    c.log.x_axis = "iterations"  # the one counter that moves in every phase
    c.checkpoint.every = "3 vae_updates, 1 generations" if tiny else \
        "20000 vae_updates, 500 rnn_updates, 10 generations"
    c.phase_order = ("collect", "vae", "encode", "rnn", "evolve")
    frames = w.get_ref("rollouts") * w.get_ref("rollout_steps")
    c.total_env_steps = frames
    c.phases.collect = dict(unit="env_steps", duration=frames, hooks=("collect",))
    c.phases.vae = dict(unit="vae_updates",
                        duration=w.get_ref("vae_epochs") * frames // w.get_ref("vae_batch"),
                        hooks=("update_vae",))
    c.phases.encode = dict(unit="encoded_rows", duration=frames, hooks=("encode",))
    c.phases.rnn = dict(unit="rnn_updates", duration=w.get_ref("rnn_updates"),
                        hooks=("update_rnn",))
    c.phases.evolve = dict(unit="generations", duration=ctl.get_ref("generations"),
                           hooks=("evolve",))
    c.lock()
    return c
