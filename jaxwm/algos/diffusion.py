"""Diffusion Policy (or MLP behaviour cloning, ``diffusion.model=mlp``) trained on
demonstrations and evaluated in the env: one hook, ``update_agent``.

The demonstrations are a D4RL-format file (``config.dataset``, read by
``jaxwm.data.datasets``; ``python -m jaxwm.tools.make_dataset --level=expert`` makes them with
jaxwm's own SAC, and the runner does so first where the config says how: ``dataset_make``).
They are read-only data of the algorithm (on the device, never checkpointed): the steps'
observations and actions, and every window of ``horizon`` steps inside one episode, padded
at both ends by repeating the first or last step (``datasets.sequence_windows``: the
reference's ``SequenceSampler`` with ``pad_before = n_obs_steps - 1``, ``pad_after =
action_steps - 1``). ``update_agent`` samples ``batch_size`` windows uniformly and takes
``diffusion.updates_per_call`` steps in one jitted scan (``agents.diffusion_policy``).
The loop's evaluator acts with the EMA weights through the acting layer (the action-queue
policy), and reports the D4RL-normalised score where the dataset records reference returns.

Seeds: the learner gets a leading seed axis (``loop.seeds``), the data is shared. Devices:
the learner is replicated over the mesh and each batch split over the ``data`` axis.
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from flax import struct

from jaxwm import backend, parallel
from jaxwm.agents import diffusion_policy as dp
from jaxwm.algos import continuous_control
from jaxwm.config import require
from jaxwm.data.datasets import load_configured, sequence_windows, window_rows
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Algorithm, Hook, learner_update

CAPABILITIES = continuous_control("diffusion.batch_size")


@struct.dataclass
class DiffusionState:
    learner: dp.Learner


def validate(config) -> None:
    require(dp.check(config.diffusion) + [
        (bool(config.dataset), "Set --config.dataset to a D4RL-format HDF5 file of "
                               "demonstrations (python -m jaxwm.tools.make_dataset "
                               "--level=expert makes one)."),
        (config.diffusion.updates_per_call >= 1, "diffusion.updates_per_call must be >= 1."),
    ])


def hook_counts(config) -> dict[str, dict[str, int]]:
    """What one call of each hook adds to each counter (``build``'s hooks and
    ``python -m jaxwm.train --dry_run``'s phase table: one source)."""
    return {"update_agent": {"agent_updates": config.diffusion.updates_per_call}}


def schedule_steps(config) -> int:
    """The learning-rate schedule's length: the updates of the phases that train."""
    return sum(int(config.phases[name].duration) for name in config.phase_order
               if "update_agent" in config.phases[name].get("hooks", ()))


def build(config) -> Algorithm:
    c = config.diffusion
    dataset, spec = load_configured(config)
    hyper = dp.Hyper.from_config(c, dataset.obs_dim, dataset.action_dim, schedule_steps(config))
    obs, action = (np.asarray(dataset.transitions[k], np.float32) for k in ("obs", "action"))
    windows = sequence_windows(dataset.episode_starts(), len(dataset), c.horizon,
                               pad_before=c.n_obs_steps - 1, pad_after=c.action_steps - 1)
    mesh = parallel.data_mesh(config.num_devices or None)
    data = parallel.put_readonly({"demos": {"obs": obs, "action": action},
                                  "windows": windows}, mesh)

    def sample_batch(demos, windows, key):
        rows = window_rows(windows[jax.random.randint(key, (c.batch_size,), 0,
                                                      windows.shape[0])], c.horizon)
        return {"obs": demos["obs"][rows[:, :c.n_obs_steps]], "action": demos["action"][rows]}

    step = dp.make_update(hyper, sample_batch, partial(parallel.constrain_batch, mesh=mesh))

    def updates(learner, demos, windows, key):
        def body(learner, k):
            return step(learner, demos, windows, k)

        learner, metrics = jax.lax.scan(body, learner, jax.random.split(key, c.updates_per_call))
        return learner, jax.tree.map(lambda m: m[-1], metrics)

    over_seeds = partial(seeds.vmap, num_seeds=config.num_seeds)
    _update = backend.jit(over_seeds(updates, in_axes=(0, None, None, 0)), donate_argnums=0)

    def init(key):
        learner = over_seeds(lambda k: dp.init_learner(hyper, k, obs, action))(key)
        return DiffusionState(parallel.replicate(learner, mesh))

    return Algorithm(
        name="Diffusion Policy" if c.model == "unet" else "MLP behaviour cloning",
        init=init,
        hooks={"update_agent": Hook(
            learner_update(_update, lambda state, data: (data["demos"], data["windows"])),
            counts=hook_counts(config)["update_agent"], reads=("demos", "windows"))},
        data=data,
        policy=dp.policy(hyper, spec.action_low, spec.action_high),
        policy_params=lambda state: dp.acting_params(state.learner),
        score_reference=dataset.reference_returns,
    )
