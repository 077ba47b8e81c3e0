"""Model-based random shooting on Pendulum. Launch:
jaxwm train --config=mbrs:pendulum

Phases: ``warmup`` collects random transitions; ``train`` cycles collect -> update_model ->
imagine -> update_agent (see jaxwm/algos/mbrs.py). Sizes are chosen for a 2-core CPU.
"""

import ml_collections

from jaxwm.config import base_config

SUMMARIES = {
    "pendulum": "Random-shooting MPC (Nagabandi et al. 2018) on Pendulum, CPU sizes",
    "tiny": "Every code path in seconds: the contract suite's",
}
VARIANTS = tuple(SUMMARIES)
# The ``mbrs`` block (below, in get_config): the planner (jaxwm/agents/shooting.py) and its
# dynamics model (jaxwm/models/dynamics.py).
FIELDS = {
    "mbrs.warmup_steps": ("> 0", "Env steps of uniformly random actions before planning."),
    "mbrs.steps_per_collect": ("> 0", "Steps each env takes per collect."),
    "mbrs.capacity": ("> 0", "Transitions the replay holds (at least warmup_steps)."),
    "mbrs.hidden": ("> 0", "Widths of the dynamics MLP's layers (Nagabandi et al. 2018)."),
    "mbrs.learning_rate": ("> 0", "Adam's learning rate of the dynamics model."),
    "mbrs.batch_size": ("> 0", "Transitions per model update."),
    "mbrs.model_updates_per_call": ("> 0", "Model updates per update_model call."),
    "mbrs.normalizer_samples": ("> 0", "Replay samples the model's normalisers are refit on."),
    "mbrs.horizon": ("> 0", "Steps each candidate action sequence is imagined for."),
    "mbrs.num_candidates": (">= 2", "Action sequences per plan: half uniform, half the prior's."),
    "mbrs.num_elites": ("> 0", "Best imagined sequences per state the prior moves toward (CEM)."),
    "mbrs.imagine_batch": ("> 0", "Replay states planned from per imagine call."),
    "mbrs.prior_momentum": ("[0, 1)", "Share of the old prior kept at each CEM step."),
    "mbrs.prior_min_std": (">= 0", "Floor on the prior's std, in action units."),
}


def get_config(variant: str = "pendulum") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"Unknown mbrs variant {variant!r}; choose one of {VARIANTS}.")
    c = base_config()
    c.algo = "mbrs"
    c.env.id = "Pendulum-v1"
    c.env.num_envs = 8
    c.total_env_steps = 10_000

    m = ml_collections.ConfigDict()
    m.warmup_steps = 2_000
    m.steps_per_collect = 25  # per env; x num_envs env steps per collect
    m.capacity = 100_000
    m.hidden = (200, 200)
    m.learning_rate = 1e-3
    m.batch_size = 256
    m.model_updates_per_call = 100
    m.normalizer_samples = 4096
    m.horizon = 15
    m.num_candidates = 256
    m.num_elites = 8
    m.imagine_batch = 16
    m.prior_momentum = 0.5
    m.prior_min_std = 0.1
    c.mbrs = m

    c.phase_order = ("warmup", "train")
    # FieldReferences, so --config.total_env_steps / --config.mbrs.warmup_steps reach the phases.
    c.phases.warmup = dict(unit="env_steps", duration=m.get_ref("warmup_steps"),
                           hooks=("collect",))
    c.phases.train = dict(unit="env_steps",
                          duration=c.get_ref("total_env_steps") - m.get_ref("warmup_steps"),
                          hooks=("collect", "update_model", "imagine", "update_agent"))
    c.log.every = "1000 env_steps"
    c.checkpoint.every = "5000 env_steps"
    c.eval.every = "never"
    c.eval.num_envs = 4
    c.eval.num_episodes = 4
    if variant == "tiny":  # every code path in seconds: the contract suite's (tests/)
        c.env.num_envs = 2
        c.total_env_steps = 64
        m.update(warmup_steps=16, steps_per_collect=4, capacity=1_000, hidden=(16, 16),
                 batch_size=16, model_updates_per_call=4, normalizer_samples=64, horizon=4,
                 num_candidates=16, num_elites=4, imagine_batch=4)
        c.log.every = "16 env_steps"
        c.checkpoint.every = "32 env_steps"
        c.eval.num_envs = c.eval.num_episodes = 2
    c.lock()
    return c
