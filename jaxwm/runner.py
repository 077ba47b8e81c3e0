"""Validate, build and train from a config, in this process (no flags): what
``python -m jaxwm.train`` runs after parsing its command line, and what tests, benchmarks and
``jaxwm.tools.make_dataset`` call directly."""

from __future__ import annotations

import os

from tqdm import tqdm

from jaxwm import algos
from jaxwm.config import validate_common


def default_workdir(config) -> str:
    env = str(config.env.id).replace("/", "_")
    return f"runs/{config.algo}_{env}_s{config.seed}"


def validate(config):
    """Every check of a config, in one place, before anything is built, written or compiled
    (each failure a one-line ``ConfigError``): the shared settings and every size
    (``config.validate_common``), the clocks' and phases' syntax, the algorithm's own
    settings, then the
    env (its id, and its spaces, probed with one env) against what the algorithm can run
    (``algos.check_capabilities``, and its ``validate_env`` where it has one). Returns the
    env's ``EnvSpec``."""
    from jaxwm.envs import probe_spec
    from jaxwm.loop.phases import Clock, phases_from_config

    validate_common(config)
    for name in ("log.every", "checkpoint.every", "eval.every"):  # units: when the loop starts
        section, field = name.split(".")
        Clock.parse(config[section][field], name)
    module = algos.get(config.algo)
    module.validate(config)
    derived = module.phase_hooks(config) if hasattr(module, "phase_hooks") else None
    phases_from_config(config, derived)  # their syntax; their hooks: when the loop starts
    spec = probe_spec(config.env)
    algos.check_capabilities(config, module.CAPABILITIES, spec)
    if hasattr(module, "validate_env"):
        module.validate_env(config, spec)
    return spec


def make_missing_inputs(config) -> None:
    """Makes the files a config says how to make when they are missing, before anything is
    built: a dataset (``config.dataset`` with ``config.dataset_make.level`` set) through
    ``jaxwm.tools.make_dataset``, which trains its behaviour agent in a run of its own."""
    make = config.get("dataset_make")
    path = os.path.expanduser(str(config.get("dataset", "") or ""))
    if make is None or not make.level or not path or os.path.exists(path):
        return
    from jaxwm.tools import make_dataset  # a tool above the algorithms

    tqdm.write(f"{path} does not exist: making it ({config.env.id}, {make.level}, "
               f"{make.size} transitions) with python -m jaxwm.tools.make_dataset.")
    make_dataset.make(config.env.id, make.level, path, size=make.size,
                      train_steps=make.train_steps, seed=config.seed)


def run(config, workdir: str):
    """Validates, makes missing inputs, builds and trains; returns the trainer's final
    metrics."""
    from jaxwm.loop.evaluate import Evaluator
    from jaxwm.loop.trainer import Trainer

    validate(config)
    make_missing_inputs(config)
    module = algos.get(config.algo)
    algorithm = module.build(config)
    evaluator = None
    try:
        if algorithm.policy is not None:
            evaluator = Evaluator.for_algorithm(config, algorithm)
        return Trainer(config, algorithm, workdir, evaluator).run()
    finally:
        algorithm.close()
        if evaluator is not None:
            evaluator.close()
