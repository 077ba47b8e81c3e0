"""Registry of algorithms and what each can run, checked against a config in one place.

``config.algo`` -> a module with ``CAPABILITIES`` (below), ``validate(config)`` (checks of its
own settings), optionally ``validate_env(config, spec)`` (of its settings against the env's
``EnvSpec``), ``hook_counts(config)`` (what one call of each hook adds to each counter: the
hooks ``build`` makes and ``--dry_run``'s phase table read it, so they cannot disagree), and
``build(config) -> Algorithm``. ``jaxwm.runner.validate`` runs them before
anything is built or compiled: the shared settings' checks (``jaxwm.config``), every size > 0
(``config.check_sizes``), the algorithm's ``validate``, then, with the env probed, the
capabilities and ``validate_env``. A new algorithm registers here with a small config its tests run
(``tiny``), and the contract suite (``tests/test_contract.py``) checks it from then on.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping

import jax

from jaxwm.config import ConfigError, pool_is_async


@dataclasses.dataclass(frozen=True)
class Entry:
    module: str
    tiny: str  # the config the contract suite runs, "configs/<file>.py:<variant>"


# Modules imported lazily so that one algorithm's imports never slow another.
REGISTRY = {
    "ppo": Entry("jaxwm.algos.ppo", "configs/ppo.py:tiny"),
    "mbrs": Entry("jaxwm.algos.mbrs", "configs/mbrs.py:tiny"),
    "sac": Entry("jaxwm.algos.sac", "configs/sac.py:tiny"),
    "mopo": Entry("jaxwm.algos.mopo", "configs/mopo.py:tiny"),
    "gormpo": Entry("jaxwm.algos.mopo", "configs/mopo.py:tiny_gormpo"),  # GORMPO's penalty
    "dreamer": Entry("jaxwm.algos.dreamer", "configs/dreamer.py:tiny"),
    "simple": Entry("jaxwm.algos.simple", "configs/simple.py:tiny"),
    "tdmpc2": Entry("jaxwm.algos.tdmpc2", "configs/tdmpc2.py:tiny"),
    "worldmodels": Entry("jaxwm.algos.worldmodels", "configs/worldmodels.py:tiny"),
    "diffusion": Entry("jaxwm.algos.diffusion", "configs/diffusion.py:tiny"),
}

NO_PROCESSES = ("it keeps its whole state on every device and steps its envs from one process; "
                "launch one run per process instead")
NO_ASYNC_POOL = ("it learns from synchronous steps of every env, and an asynchronous pool "
                 "returns whichever envs are ready")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an algorithm can run. ``cannot`` maps a capability it lacks to why: ``seeds``
    (``num_seeds`` > 1), ``processes`` (``jaxwm.launch``), ``async_pool`` (``env.batch_size``
    < ``env.num_envs``). ``actions`` and ``observations`` are the kinds of spaces it takes
    (``discrete``/``continuous``; ``vector``/``pixels``); ``device_batches(config)`` gives
    the batches split over the devices, ``{what: size}``, so each must divide by their
    count."""

    actions: tuple[str, ...] = ("discrete", "continuous")
    observations: tuple[str, ...] = ("vector", "pixels")
    device_batches: Callable[[object], Mapping[str, int]] = lambda config: {}
    cannot: Mapping[str, str] = dataclasses.field(default_factory=lambda: {
        "processes": NO_PROCESSES, "async_pool": NO_ASYNC_POOL})


def continuous_control(*batch_keys: str) -> Capabilities:
    """Continuous actions from vector observations (SAC, planners), with the batches of the
    dotted config keys ``batch_keys`` split over the devices."""
    def setting(config, dotted):
        for part in dotted.split("."):
            config = config[part]
        return config

    return Capabilities(actions=("continuous",), observations=("vector",),
                        device_batches=lambda c: {k: setting(c, k) for k in batch_keys})


def get(name: str):
    if name not in REGISTRY:
        raise ConfigError(f"Unknown algorithm {name!r}; known: {sorted(REGISTRY)}.")
    return importlib.import_module(REGISTRY[name].module)


def taking(action: str) -> list[str]:
    """The registered algorithms that take ``action`` ("discrete" or "continuous") actions."""
    return [name for name in REGISTRY if action in get(name).CAPABILITIES.actions]


def check_capabilities(config, capabilities: Capabilities, spec) -> None:
    """Refuses, in one line, a config or env the algorithm cannot run."""
    algo, cannot = config.algo, capabilities.cannot
    processes = jax.process_count()
    asked = {"seeds": (config.num_seeds > 1, f"num_seeds={config.num_seeds}", "num_seeds=1"),
             "processes": (processes > 1, f"{processes} processes", "one process"),
             "async_pool": (pool_is_async(config), f"env.batch_size={config.env.batch_size} < "
                            f"env.num_envs={config.env.num_envs}", "env.batch_size=0")}
    for capability, (wanted, what, instead) in asked.items():
        if wanted and capability in cannot:
            raise ConfigError(f"{algo} cannot run {what}: {cannot[capability]}. Use {instead}.")
    if pool_is_async(config) and (config.num_seeds > 1 or processes > 1):
        raise ConfigError("An asynchronous env pool (env.batch_size < env.num_envs) runs one "
                          "seed in one process; set env.batch_size=0 for num_seeds > 1 or "
                          "several processes.")
    if processes > 1:
        if config.num_seeds > 1:
            raise ConfigError("num_seeds > 1 runs in one process; with several processes use "
                              "num_seeds=1 (or launch one run per seed).")
        if config.env.num_envs % processes:
            raise ConfigError(f"env.num_envs={config.env.num_envs} does not split over "
                              f"{processes} processes (each steps its own share of the envs); "
                              "make it a multiple.")
        if config.num_devices not in (0, jax.device_count()):
            raise ConfigError(f"num_devices={config.num_devices}: a multi-process run uses "
                              f"every device of every process ({jax.device_count()}); leave "
                              "it at 0.")
    action = "discrete" if spec.discrete else "continuous"
    if action not in capabilities.actions:
        raise ConfigError(f"{algo} takes {' or '.join(capabilities.actions)} actions; "
                          f"{spec.env_id}'s are {action} (algorithms for {action} actions: "
                          f"{', '.join(taking(action))}).")
    observation = "pixels" if spec.is_pixels else "vector"
    if observation not in capabilities.observations:
        raise ConfigError(f"{algo} takes {' or '.join(capabilities.observations)} observations; "
                          f"{spec.env_id} has {observation} of shape {spec.obs_shape}.")
    num_devices = config.num_devices or jax.device_count()
    for what, size in capabilities.device_batches(config).items():
        if size % num_devices:
            raise ConfigError(f"{what}={size} must split over {num_devices} devices; make it a "
                              "multiple, or set --config.num_devices.")
