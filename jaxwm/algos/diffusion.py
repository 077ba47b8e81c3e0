"""Diffusion Policy (or MLP behaviour cloning, ``diffusion.model=mlp``) trained on
demonstrations and evaluated in the env: one hook, ``update_agent``.

The demonstrations are a D4RL-format file (``config.dataset``, read by
``jaxwm.data.datasets``; ``python -m jaxwm.tools.make_dataset --level=expert`` makes them with
jaxwm's own SAC, and ``jaxwm.train`` does so first where the config says how:
``dataset_make``). The steps' observations and actions are a phase artifact the run imports
when it starts (a resume refuses a file that changed since, as MOPO's dataset), read whole on
the device; every window of ``horizon`` steps inside one episode is read-only data, padded
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

from jaxwm import parallel
from jaxwm.agents import diffusion_policy as dp
from jaxwm.algos import DEFAULT_CANNOT, NO_JAX_ENVS_OFFLINE, Entry, continuous_control
from jaxwm.config import require
from jaxwm.data.datasets import load_configured, sequence_windows, window_rows
from jaxwm.loop.algorithm import Algorithm
from jaxwm.loop.artifacts import Artifact
from jaxwm.loop.compile import HookCompiler


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
    dataset, spec = load_configured(config, batches=("diffusion.batch_size",))
    hyper = dp.Hyper.from_config(c, dataset.obs_dim, dataset.action_dim, schedule_steps(config))
    obs, action = (np.asarray(dataset.transitions[k], np.float32) for k in ("obs", "action"))
    windows = sequence_windows(dataset.episode_starts(), len(dataset), c.horizon,
                               pad_before=c.n_obs_steps - 1, pad_after=c.action_steps - 1)
    compiler = HookCompiler.for_config(config)
    # The demonstrations: a phase artifact the run imports when it starts and keeps (a resume
    # refuses a dataset file that changed since), read whole on the device; their windows,
    # derived from the same file, read-only data.
    demos = {"obs": obs, "action": action}
    artifacts = {"demos": Artifact(example={k: v[0] for k, v in demos.items()},
                                   source=lambda: demos,
                                   place=partial(parallel.put_readonly, mesh=compiler.mesh))}
    data = parallel.put_readonly({"windows": windows}, compiler.mesh)

    def sample_batch(demos, windows, key):
        rows = window_rows(windows[jax.random.randint(key, (c.batch_size,), 0,
                                                      windows.shape[0])], c.horizon)
        return {"obs": demos["obs"][rows[:, :c.n_obs_steps]], "action": demos["action"][rows]}

    step = dp.make_update(hyper, sample_batch,
                          partial(parallel.constrain_batch, mesh=compiler.mesh))

    def update_agent(state, data, key):
        def body(learner, k):
            return step(learner, data["demos"], data["windows"], k)

        learner, metrics = jax.lax.scan(body, state.learner,
                                        jax.random.split(key, c.updates_per_call))
        return state.replace(learner=learner), {}, jax.tree.map(lambda m: m[-1], metrics)

    return Algorithm(
        name="Diffusion Policy" if c.model == "unet" else "MLP behaviour cloning",
        init=compiler.init(lambda k: DiffusionState(dp.init_learner(hyper, k, obs, action))),
        hooks={"update_agent": compiler.hook(
            update_agent, counts=hook_counts(config)["update_agent"], reads=("demos", "windows"),
            shared=("demos", "windows"))},
        data=data, artifacts=artifacts,
        policy=dp.policy(hyper, spec.action_low, spec.action_high),
        policy_params=lambda state: dp.acting_params(state.learner),
        score_reference=dataset.reference_returns,
    )


ENTRY = Entry(name="diffusion", build=build, validate=validate, hook_counts=hook_counts,
              tiny="diffusion:tiny",
              capabilities=continuous_control(
                  "diffusion.batch_size",
                  cannot={**DEFAULT_CANNOT, "jax_envs": NO_JAX_ENVS_OFFLINE}),
              resumable=("diffusion.learning_rate",), offline=True)
