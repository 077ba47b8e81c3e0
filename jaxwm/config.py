"""Config pieces every algorithm shares, and the host-side validation run before compiling.

Algorithm config files (``configs/<algo>.py``) start from ``base_config()`` and add their
own block (e.g. ``config.ppo``). ``total_env_steps`` is a FieldReference, so phases whose
duration refers to it follow a ``--config.total_env_steps=...`` override.

Clocks (``log.every``, ``checkpoint.every``, ``eval.every``) are strings ``"N unit"`` in any
counter the algorithm's hooks declare, several separated by commas, or ``"never"``
(``jaxwm.loop.phases.Clock``); they are checked against the algorithm when the loop is built.
"""

from __future__ import annotations

import ml_collections


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.algo = ""
    c.seed = 1
    c.resume = False
    c.total_env_steps = ml_collections.FieldReference(100_000)
    c.num_devices = 0  # 0: every device JAX sees
    c.num_seeds = 1  # > 1: that many independent agents in one process (jaxwm/loop/seeds.py)

    c.env = ml_collections.ConfigDict()
    c.env.id = "CartPole-v1"
    c.env.num_envs = 8
    c.env.max_episode_steps = 0  # 0: the env's registered limit
    c.env.masked_indices = ()  # vector observations: dims set to 0 (velocity masking)
    # envpool's asynchronous mode (PPO): each step returns the batch_size envs ready first,
    # out of num_envs. 0: all envs, synchronously (jaxwm/envs/factory.py).
    c.env.batch_size = 0
    c.env.num_threads = 0  # envpool's worker threads; 0: its default (async: min(batch, cores))

    c.phase_order = ("train",)
    c.phases = ml_collections.ConfigDict()

    c.log = ml_collections.ConfigDict()
    c.log.every = "10000 env_steps"
    c.log.x_axis = "env_steps"  # the counter TensorBoard and metrics.jsonl plot against
    c.log.progress = True
    # Weights & Biases (jaxwm.loop.wandb_sink; pip install 'jaxwm[wandb]'): on when project is
    # set; group defaults to the algorithm, name to the run directory's.
    c.log.wandb = ml_collections.ConfigDict(
        {"project": "", "entity": "", "group": "", "name": "", "mode": "offline"})

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = "100000 env_steps"
    c.checkpoint.keep = 3

    c.eval = ml_collections.ConfigDict()
    c.eval.every = "50000 env_steps"  # "never": only at the end (eval.at_end)
    c.eval.at_end = True
    c.eval.num_envs = 8  # at most num_episodes are used: each env owes a fixed quota
    c.eval.num_episodes = 10
    c.eval.temperature = 1.0  # 0: the policy's mode (greedy); 1: as trained
    c.eval.video = False
    c.eval.action_noise = 0.0  # std of Gaussian noise added to actions (robustness tests)
    c.eval.obs_noise = 0.0  # std of Gaussian noise added to the observations the policy sees
    return c


def pool_is_async(c: ml_collections.ConfigDict) -> bool:
    """Whether ``c.env`` asks for envpool's asynchronous mode: ``env.batch_size`` of the
    ``env.num_envs`` envs per step (0 or ``num_envs``: all, synchronously)."""
    return 0 < c.env.batch_size < c.env.num_envs


def is_learning_rate(dotted: str) -> bool:
    """Whether a dotted setting names a learning rate (``sac.actor_lr``, ``ppo.learning_rate``)."""
    leaf = dotted.rsplit(".", 1)[-1]
    return leaf in ("lr", "learning_rate") or leaf.endswith("_lr")


class ConfigError(ValueError):
    """A config value the user set is invalid; the message says which and what to do."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def require(checks) -> None:
    """Raises the ``ConfigError`` of the first ``(ok, message)`` whose ``ok`` is false."""
    for ok, message in checks:
        _require(ok, message)


# The shared settings (``base_config``) where 0 means something other than a size; an
# algorithm's own are on its registry entry (``algos.Entry.zero_means``). Every other integer
# a config holds, alone or in a tuple, is a size and must be > 0 (``check_sizes``).
ZERO_MEANS = {
    "seed": "a seed", "num_devices": "every device", "env.batch_size": "every env, synchronously",
    "env.num_threads": "envpool's default", "env.max_episode_steps": "the registered limit",
    "env.noop_max": "no no-op starts", "env.masked_indices": "an index",
}
NOT_SIZES = ("env.camera",)  # indices that may be negative
# Phases are checked by the loop's parser (loop.phases.phases_from_config): only those in
# phase_order, whose durations must be > 0; a phase left out may have any.
CHECKED_ELSEWHERE = ("phases.",)


def _leaves(node, prefix=""):
    for name, value in node.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def check_sizes(c: ml_collections.ConfigDict, zero_means: dict | None = None) -> None:
    """Every integer setting (alone or in a tuple) is > 0, except those of ``ZERO_MEANS`` and
    the algorithm's ``zero_means`` (>= 0) and ``NOT_SIZES``: one place, so no algorithm meets
    a batch of 0 at run time."""
    zero_means = {**ZERO_MEANS, **(zero_means or {})}
    for name, value in _leaves(c):
        values = value if isinstance(value, (tuple, list)) else (value,)
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if name in NOT_SIZES or name.startswith(CHECKED_ELSEWHERE) or not ints:
            continue
        if name in zero_means:
            _require(min(ints) >= 0, f"{name}={value!r} must be >= 0 (0: "
                     f"{zero_means[name]}).")
        else:
            _require(min(ints) > 0, f"{name}={value!r} is a size and must be > 0.")


def validate_common(c: ml_collections.ConfigDict, zero_means: dict | None = None) -> None:
    """Checks of the settings every config shares (``base_config``), and of every size (those
    of ``zero_means`` may be 0 too)."""
    check_sizes(c, zero_means)
    _require(c.env.batch_size <= c.env.num_envs,
             f"env.batch_size={c.env.batch_size} must be in [0, env.num_envs={c.env.num_envs}]:"
             " an asynchronous pool returns batch_size of its num_envs envs per step (0: all "
             "of them, synchronously).")
    _require(c.eval.temperature >= 0, f"eval.temperature must be >= 0 (0: greedy), got "
             f"{c.eval.temperature}.")
    _require(c.eval.action_noise >= 0 and c.eval.obs_noise >= 0,
             "eval.action_noise and eval.obs_noise are standard deviations: >= 0.")


def load(spec: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """``"configs/ppo.py:cartpole"`` -> that file's ``get_config("cartpole")``, unlocked, with
    ``overrides`` applied by dotted path (``{"ppo.num_steps": 16}``), like ``--config.*``.

    For scripts and tests; the command line goes through ``ml_collections.config_flags``.
    """
    import importlib.util
    import os

    path, _, variant = spec.partition(":")
    name = "jaxwm_config_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or not os.path.exists(path):
        raise ConfigError(f"No config file at {path!r}.")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(variant) if variant else module.get_config()
    config.unlock()
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        node = config
        for name in parents:
            node = node[name]
        if leaf not in node:
            raise ConfigError(f"Unknown config key {dotted!r}.")
        node[leaf] = value
    return config
