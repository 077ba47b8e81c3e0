"""Offline model-based RL: MOPO and GORMPO (jaxwm/algos/mopo.py). Launch:
jaxwm train --config=mopo:pendulum_tiny        # minutes on a CPU
jaxwm train --config=mopo:hopper_medium --config.dataset=data/hopper-medium.hdf5
jaxwm train --config=mopo:hopper_medium --config.algo=gormpo \
    --config.penalty=tanh --config.penalty_coef=0.5
jaxwm train --config=mopo:halfcheetah_medium \
    --config.dataset=~/.d4rl/datasets/halfcheetah_medium-v2.hdf5

Phases: (GORMPO only) ``density`` fits the RealNVP density on the dataset's rows epoch by
epoch until its validation NLL stops improving (``until=density_converged``); ``model`` trains
the dynamics ensemble epoch by epoch until no member has improved
its held-out MSE for ``mopo.model_patience`` epochs (``until=model_converged``; the duration
is a cap); ``policy`` cycles imagine (one batch of model rollouts) -> update_agent
(``mopo.updates_per_epoch`` SAC updates), OfflineRL-Kit's rollout every 1000 updates, for
``phases.policy.duration`` updates (3M: OfflineRL-Kit's 3000 epochs).
GORMPO's density is part of the run's state (checkpointed, fit again by a new run). Its inverse
shape, e^(tau - logp), is unbounded: give it a small coefficient (--config.penalty_coef=0.001
learned on pendulum_tiny where 1.0 diverged and 0.01 learned on one dataset only); softplus,
softplus(-logp), grows with -logp too (there 1.0 learned on one dataset only, 0.1 in 2 of 3
runs on the other).

Settings follow OfflineRL-Kit's MOPO (yihaosun1124/OfflineRL-Kit): ensemble 7 / elites 5, 4x200 Swish,
lr 1e-3, batch 256; rollouts from 50k dataset states, model buffer of 5 rollout batches,
5% real data; SAC 256x256 with actor 1e-4, critic 3e-4, alpha 1e-4, the kit's initial
weights (torch.nn.Linear's for SAC, ``sac.weight_init=torch``; its EnsembleLinear's for the
dynamics, ``mopo.model_init=kit``), the kit's actor (log-std clamped to [-5, 2],
``sac.log_std=clip``), alpha capped at 1 (``sac.max_alpha``) and the actor's lr
cosine-annealed to 0 over the policy phase, one step per epoch (``mopo.actor_lr_cosine``);
3000 epochs of 1000 updates; per-dataset horizon / lambda for
the nine D4RL MuJoCo datasets (variants ``<env>_medium``, ``<env>_medium_replay``,
``<env>_medium_expert``; e.g. hopper-medium 5 / 5, halfcheetah-medium 5 / 0.5,
walker2d-medium-replay 1 / 2.5).
``pendulum_tiny`` is the same code path at CPU sizes, on a Pendulum medium dataset that it
makes (``jaxwm.tools.make_dataset``, about two minutes) when the file is missing.
"""

import ml_collections

from jaxwm.agents import sac
from jaxwm.agents.sac import config_block as sac_block
from jaxwm.config import base_config, prefixed

ENV_IDS = {"hopper": "Hopper-v4", "halfcheetah": "HalfCheetah-v4", "walker2d": "Walker2d-v4"}
# MOPO's rollout horizon h and penalty lambda per D4RL dataset (Yu et al. 2020,
# appendix G): (h, lambda).
HORIZON_LAMBDA = {
    "halfcheetah_medium": (5, 0.5), "hopper_medium": (5, 5.0), "walker2d_medium": (5, 0.5),
    "halfcheetah_medium_replay": (5, 0.5), "hopper_medium_replay": (5, 2.5),
    "walker2d_medium_replay": (1, 2.5), "halfcheetah_medium_expert": (5, 2.5),
    "hopper_medium_expert": (5, 5.0), "walker2d_medium_expert": (1, 2.5),
}
# variant -> (env id, default dataset path, horizon, lambda)
DATASETS = {
    name: (ENV_IDS[name.split("_")[0]],
           "data/" + name.replace("_", "-") + ".hdf5", h, lam)
    for name, (h, lam) in HORIZON_LAMBDA.items()}
DATASETS["pendulum_tiny"] = ("Pendulum-v1", "data/pendulum-medium.hdf5", 5, 1.0)
# Every code path in seconds (the contract suite's, tests/): a small random dataset it makes.
SMOKE = {"tiny": "mopo", "tiny_gormpo": "gormpo"}
DATASETS.update({name: ("Pendulum-v1", "data/pendulum-random-tiny.hdf5", 2, 1.0)
                 for name in SMOKE})
SUMMARIES = {
    **{name: f"D4RL {name.replace('_', '-')}, Yu et al. 2020's h {h}, lambda {lam}"
       for name, (h, lam) in HORIZON_LAMBDA.items()},
    "pendulum_tiny": "MOPO at CPU sizes on a Pendulum medium dataset it makes (minutes)",
    "tiny": "Every MOPO code path in seconds: the contract suite's",
    "tiny_gormpo": "Every GORMPO code path in seconds: the contract suite's",
}
VARIANTS = tuple(SUMMARIES)
# The offline data's settings, which jaxwm/configs/diffusion.py shares.
DATA_FIELDS = {
    "dataset": (None, "The offline data: a D4RL-format HDF5 file or a Minari dataset."),
    "dataset_make.level": ("{, random, medium, medium-replay, expert, medium-expert}",
                           "D4RL level jaxwm's SAC makes a missing dataset at; '': never."),
    "dataset_make.size": ("> 0", "Transitions of a made dataset."),
    "dataset_make.train_steps": ("> 0", "Env steps the SAC behind a made dataset trains for."),
}
FIELDS = {
    **DATA_FIELDS,
    "penalty": ("{, uncertainty, linear, inverse, tanh, softplus}",
                "Reward penalty: mopo's uncertainty or gormpo's density shapes; '': the algo's."),
    "penalty_coef": (">= 0", "lambda, the penalty's weight: r - lambda * u (Yu et al. 2020)."),
    "mopo.num_members": ("> 0", "Members of the dynamics ensemble (OfflineRL-Kit's 7)."),
    "mopo.num_elites": ("> 0", "Members with the best held-out MSE that rollouts sample."),
    "mopo.model_hidden": ("> 0", "Widths of each member's Swish layers."),
    "mopo.weight_decay": (">= 0", "L2 weight decay of each layer, the output's last."),
    "mopo.model_lr": ("> 0", "Adam's learning rate of the ensemble."),
    "mopo.model_init": ("{flax, kit}", "Initial weights: nn.Dense's or OfflineRL-Kit's."),
    "mopo.model_batch": ("> 0", "Transitions per ensemble update."),
    "mopo.model_patience": ("> 0", "Epochs without any member improving that end the model phase."),
    "mopo.horizon": ("> 0", "Steps of each model rollout, h (Yu et al. 2020)."),
    "mopo.rollout_batch": ("> 0", "Dataset states each imagine call rolls out from."),
    "mopo.retain_epochs": ("> 0", "Rollout batches the model buffer keeps."),
    "mopo.real_ratio": ("[0, 1]", "Share of dataset transitions in each SAC batch."),
    "mopo.updates_per_epoch": ("> 0", "SAC updates per update_agent call (one epoch)."),
    "mopo.actor_lr_cosine": (None, "Cosine-anneal the actor's lr to 0 over the policy phase."),
    **prefixed("sac", sac.FIELDS),
    "gormpo.num_couplings": ("> 0", "Affine coupling layers of the RealNVP (Dinh et al. 2017)."),
    "gormpo.hidden": ("> 0", "Widths of each coupling's scale and shift MLPs."),
    "gormpo.learning_rate": ("> 0", "Adam's learning rate of the density."),
    "gormpo.batch_size": ("> 0", "Rows per density update."),
    "gormpo.max_epochs": ("> 0", "Cap on the density's epochs (the density phase)."),
    "gormpo.patience": ("> 0", "Epochs without a better validation NLL that end the fit."),
    "gormpo.threshold_quantile": ("[0, 1]", "Quantile of validation log-probs taken as tau."),
    "gormpo.score_next_state": (None, "Score and fit on (s', a), as the reference, not (s, a)."),
    "gormpo.density_seed": (">= 0", "Seed of the density's split and init: one per dataset."),
}


def get_config(variant: str = "pendulum_tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown mopo variant {variant!r}; choose one of {VARIANTS}.")
    env_id, dataset, horizon, coef = DATASETS[variant]
    tiny = variant == "pendulum_tiny"
    c = base_config()
    c.algo = SMOKE.get(variant, "mopo")  # or "gormpo"
    c.env.id = env_id
    c.env.num_envs = 1  # offline: the env is only evaluated (eval.num_envs)
    c.dataset = dataset
    c.penalty = ""  # "": the algorithm's own (mopo: uncertainty; gormpo: linear)
    c.penalty_coef = coef
    # Make the dataset when the file is missing (pendulum_tiny only; level "" never makes).
    c.dataset_make = ml_collections.ConfigDict(
        {"level": "medium" if tiny else "", "size": 20_000, "train_steps": 20_000})

    m = ml_collections.ConfigDict()
    m.num_members = 7
    m.num_elites = 5
    m.model_hidden = (200, 200, 200, 200)
    m.weight_decay = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)
    m.model_lr = 1e-3
    m.model_init = "kit"  # OfflineRL-Kit's EnsembleLinear init; "flax": nn.Dense's
    m.model_batch = 256
    m.model_patience = 5
    m.horizon = horizon
    m.rollout_batch = 5_000 if tiny else 50_000
    m.retain_epochs = 5
    m.real_ratio = 0.05
    m.updates_per_epoch = 1_000
    # The actor's lr cosine-annealed to 0 over phases.policy.duration, one step per epoch
    # (OfflineRL-Kit's CosineAnnealingLR); a resume that lengthens the phase stretches it.
    m.actor_lr_cosine = True
    c.mopo = m
    kit_sac = dict(actor_lr=1e-4, critic_lr=3e-4, alpha_lr=1e-4, log_std="clip", max_alpha=1.0,
                   weight_init="torch")
    c.sac = sac_block(**kit_sac)

    g = ml_collections.ConfigDict()
    g.num_couplings = 6
    g.hidden = (256, 256)
    g.learning_rate = 1e-3
    g.batch_size = 128
    g.max_epochs = 60
    g.patience = 15
    g.threshold_quantile = 0.05
    # True: the reference's (predicted s', a) instead of (s, a), the density then fit on the
    # dataset's (s', a) rows as the reference's is.
    g.score_next_state = False
    g.density_seed = 0  # one density per dataset: the same for every seed and run
    c.gormpo = g

    # GORMPO fits its density first; MOPO, which has none, leaves the phase out
    # (algos/mopo.py, phase_hooks).
    c.phase_order = ("density", "model", "policy")
    c.phases.density = dict(unit="density_epochs", duration=g.get_ref("max_epochs"), hooks=(),
                            until="density_converged")
    # Budgets live in the phases, which a resume may change (train longer: raise
    # --config.phases.policy.duration and pass --config.resume=True).
    c.phases.model = dict(unit="model_epochs", duration=100 if tiny else 2_000,
                          hooks=("update_model",), until="model_converged")
    c.phases.policy = dict(unit="agent_updates", duration=20_000 if tiny else 3_000_000,
                           hooks=("imagine", "update_agent"))
    c.log.x_axis = "agent_updates"
    c.log.every = "5 model_epochs, 1000 agent_updates" if tiny else \
        "10 model_epochs, 10000 agent_updates"
    c.checkpoint.every = "50 model_epochs, 5000 agent_updates" if tiny else \
        "50 model_epochs, 100000 agent_updates"
    c.eval.every = "5000 agent_updates" if tiny else "50000 agent_updates"
    c.eval.num_envs = 5
    c.eval.num_episodes = 10
    c.eval.temperature = 0.0  # SAC's deterministic policy, tanh(mean)
    if variant in SMOKE:
        c.dataset_make.update(level="random", size=2_000)
        m.update(num_members=3, num_elites=2, model_hidden=(16, 16),
                 weight_decay=(2.5e-5, 5e-5, 1e-4), model_batch=32, rollout_batch=64,
                 retain_epochs=2, updates_per_epoch=8)
        c.sac = sac_block(**kit_sac, batch_size=32, actor_hidden=(16, 16),
                          critic_hidden=(16, 16))
        g.update(num_couplings=2, hidden=(16, 16), batch_size=256, max_epochs=3)
        c.phases.model.duration = 3
        c.phases.policy.duration = 32
        c.log.every = "1 model_epochs, 8 agent_updates"
        c.checkpoint.every = "2 model_epochs, 16 agent_updates"
        c.eval.every = "never"
        c.eval.num_envs = c.eval.num_episodes = 2
    c.lock()
    return c
