"""The registry of algorithms: one typed ``Entry`` per algorithm carries everything the rest
of jaxwm asks of it, checked against a config in one place.

``config.algo`` -> ``get(name)``, an ``Entry``: how to ``build`` it (``config ->
loop.algorithm.Algorithm``), what it can run (``capabilities``), its checks (``validate``, of
its own settings, and ``validate_env``, of them against the env's ``EnvSpec``), what one call
of each hook adds to each counter (``hook_counts``: the hooks ``build`` makes and
``--dry_run``'s phase table read it, so they cannot disagree), the hooks it derives for
phases a config leaves empty (``phase_hooks``), which of its settings may change on resume
(``resumable``; its learning rates that may not say why in ``fixed``), which of its integer
settings may be 0 (``zero_means``), whether it learns from a dataset alone (``offline``), and
the small config its tests run (``tiny``). ``jaxwm.runner.validate`` runs the checks before
anything is built or compiled: the shared settings' (``jaxwm.config``), every size > 0
(``config.check_sizes``, with the entry's ``zero_means``), ``validate``, then, with the env
probed, the capabilities and ``validate_env``. Nothing elsewhere keeps a table keyed by an
algorithm's name: a new algorithm defines its ``ENTRY`` and registers its module here, and the
contract suite (``tests/test_contract.py``) checks it from then on.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping

import jax

from jaxwm.config import ConfigError, pool_is_async
from jaxwm.envs.native import is_native

# Modules imported lazily so that one algorithm's imports never slow another:
# ``"module"`` (its ``ENTRY``) or ``"module:NAME"``.
REGISTRY = {
    "ppo": "jaxwm.algos.ppo",
    "mbrs": "jaxwm.algos.mbrs",
    "sac": "jaxwm.algos.sac",
    "mopo": "jaxwm.algos.mopo:MOPO",
    "gormpo": "jaxwm.algos.mopo:GORMPO",  # MOPO with GORMPO's density penalty
    "dreamer": "jaxwm.algos.dreamer",
    "pairing": "jaxwm.algos.dreamer:PAIRING",  # a world model and an agent as components
    "simple": "jaxwm.algos.simple",
    "tdmpc2": "jaxwm.algos.tdmpc2",
    "worldmodels": "jaxwm.algos.worldmodels",
    "diffusion": "jaxwm.algos.diffusion",
}

NO_ASYNC_POOL = ("it learns from synchronous steps of every env, and an asynchronous pool "
                 "returns whichever envs are ready")
NO_ITERATIONS = "its hooks visit the host every iteration"
NO_JAX_ENVS_OFFLINE = ("it learns from a D4RL-style dataset made and evaluated in envpool's "
                       "envs")
DEFAULT_CANNOT = {"async_pool": NO_ASYNC_POOL, "iterations": NO_ITERATIONS}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an algorithm can run. ``cannot`` maps a capability it lacks to why: ``seeds``
    (``num_seeds`` > 1), ``processes`` (``jaxwm.launch``), ``async_pool`` (``env.batch_size``
    < ``env.num_envs``), ``jax_envs`` (an env written in JAX, ``envs.native``), ``iterations``
    (``iterations_per_call`` > 1: several iterations in one compiled call). ``actions`` and
    ``observations`` are the kinds of spaces it takes (``discrete``/``continuous``;
    ``vector``/``pixels``); ``device_batches(config)`` gives the batches split over the
    devices, ``{what: size}``, so each must divide by their count."""

    actions: tuple[str, ...] = ("discrete", "continuous")
    observations: tuple[str, ...] = ("vector", "pixels")
    device_batches: Callable[[object], Mapping[str, int]] = lambda config: {}
    cannot: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_CANNOT))


def setting(config, dotted: str):
    """``config``'s value at a dotted key (``"sac.batch_size"``)."""
    for part in dotted.split("."):
        config = config[part]
    return config


def continuous_control(*batch_keys: str, **kwargs) -> Capabilities:
    """Continuous actions from vector observations (SAC, planners), with the batches of the
    dotted config keys ``batch_keys`` split over the devices."""
    return Capabilities(actions=("continuous",), observations=("vector",),
                        device_batches=lambda c: {k: setting(c, k) for k in batch_keys},
                        **kwargs)


def whole_calls(config, train_steps: int, counts: dict, train_steps_are: str):
    """``require``'s check that a train phase of ``train_steps`` env steps (what
    ``train_steps_are``, in words) is a whole number of ``iterate`` calls, when the entry's
    ``hook_counts`` (``counts``) have one: otherwise the last call would run past
    ``total_env_steps``."""
    per_call = counts.get("iterate", {}).get("env_steps", 1)
    return (train_steps % per_call == 0,
            f"The train phase's {train_steps:,} env steps ({train_steps_are}) are not a "
            f"multiple of the {per_call:,} of one call (iterations_per_call="
            f"{config.iterations_per_call}); the last call would run past total_env_steps. "
            "Use another iterations_per_call or total_env_steps.")


def _no_env_checks(config, spec) -> None:
    del config, spec


def _no_derived_hooks(config) -> dict:
    del config
    return {}


@dataclasses.dataclass(frozen=True)
class Entry:
    """Everything jaxwm asks of one algorithm (module docstring).

    ``resumable``: dotted settings that may change between a run and its resume, each a
    constant of a jitted update or a schedule of an optimiser's step count, never a number
    kept in the state (learning rates, clip norms); the NaN stop advises lowering the learning
    rates among them. ``fixed``: its learning-rate settings that may not change on resume,
    each with why. ``zero_means``: its integer settings that may be 0, with what 0 means (every
    other integer is a size, > 0). ``offline``: it learns from ``config.dataset`` and steps no
    env while training (the contract suite hands it a small dataset)."""

    name: str
    build: Callable
    validate: Callable
    hook_counts: Callable[[object], Mapping[str, Mapping[str, int]]]
    tiny: str  # the config the contract suite runs, "<config>:<variant>" (jaxwm/configs/)
    tiny_more: tuple[str, ...] = ()  # more it runs (each pairing of pairing:*)
    capabilities: Capabilities = Capabilities()
    validate_env: Callable = _no_env_checks
    phase_hooks: Callable[[object], Mapping[str, tuple[str, ...]]] = _no_derived_hooks
    resumable: tuple[str, ...] = ()
    fixed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    zero_means: Mapping[str, str] = dataclasses.field(default_factory=dict)
    offline: bool = False

    @property
    def tiny_configs(self) -> tuple[str, ...]:
        return (self.tiny, *self.tiny_more)


def names() -> tuple[str, ...]:
    return tuple(sorted(REGISTRY))


def get(name: str) -> Entry:
    if name not in REGISTRY:
        raise ConfigError(f"Unknown algorithm {name!r}; known: {sorted(REGISTRY)}.")
    module, _, attribute = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), attribute or "ENTRY")


def taking(action: str) -> list[str]:
    """The registered algorithms that take ``action`` ("discrete" or "continuous") actions."""
    return [name for name in sorted(REGISTRY) if action in get(name).capabilities.actions]


def check_capabilities(config, capabilities: Capabilities, spec, offline: bool = False) -> None:
    """Refuses, in one line, a config or env the algorithm cannot run (``offline``: it steps
    no env while it trains, so its envs need not split over processes)."""
    algo, cannot = config.algo, capabilities.cannot
    processes, iterations = jax.process_count(), config.iterations_per_call
    jax_env = is_native(config.env.id)
    asked = {"seeds": (config.num_seeds > 1, f"num_seeds={config.num_seeds}", "num_seeds=1"),
             "processes": (processes > 1, f"{processes} processes", "one process"),
             "async_pool": (pool_is_async(config), f"env.batch_size={config.env.batch_size} < "
                            f"env.num_envs={config.env.num_envs}", "env.batch_size=0"),
             "jax_envs": (jax_env, f"the JAX env {config.env.id}", "an envpool env"),
             "iterations": (iterations > 1, f"iterations_per_call={iterations}",
                            "iterations_per_call=1")}
    for capability, (wanted, what, instead) in asked.items():
        if wanted and capability in cannot:
            raise ConfigError(f"{algo} cannot run {what}: {cannot[capability]}. Use {instead}.")
    if iterations > 1 and not jax_env:
        raise ConfigError(f"iterations_per_call={iterations} runs several iterations in one "
                          f"compiled program, which needs an env written in JAX ({config.env.id}"
                          " is stepped on the host): use a gymnax:/craftax: env id, or "
                          "iterations_per_call=1.")
    if pool_is_async(config) and (config.num_seeds > 1 or processes > 1):
        raise ConfigError("An asynchronous env pool (env.batch_size < env.num_envs) runs one "
                          "seed in one process; set env.batch_size=0 for num_seeds > 1 or "
                          "several processes.")
    if processes > 1:
        if config.num_seeds > 1:
            raise ConfigError("num_seeds > 1 runs in one process (the seeds are vmapped "
                              "inside each device's program; only the data axis of the mesh "
                              "spans processes): with several processes use num_seeds=1, or "
                              "launch one run per seed.")
        if jax_env:
            raise ConfigError(f"A JAX env ({config.env.id}) runs in one process for now: its "
                              "state lives on the devices, not split over processes. Launch one "
                              "process (or use the envpool version of the env).")
        if config.env.num_envs % processes and not offline:
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
