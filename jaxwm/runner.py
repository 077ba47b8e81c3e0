"""Validate, build and train from a config, in this process (no flags): what
``python -m jaxwm.train`` runs after parsing its command line, and what tests, benchmarks and
``jaxwm.data.make_dataset`` call directly."""

from __future__ import annotations

from jaxwm import algos
from jaxwm.config import ConfigError, pool_is_async, validate_common


def default_workdir(config) -> str:
    env = str(config.env.id).replace("/", "_")
    return f"runs/{config.algo}_{env}_s{config.seed}"


def validate(config) -> None:
    validate_common(config)
    module = algos.get(config.algo)
    if pool_is_async(config) and not getattr(module, "ASYNC_ENVS", False):
        raise ConfigError(f"env.batch_size={config.env.batch_size} < env.num_envs asks for "
                          f"envpool's asynchronous mode, which only PPO uses; {config.algo} "
                          "steps its envs synchronously: set env.batch_size=0.")
    module.validate(config)


def run(config, workdir: str):
    """Validates, builds and trains; returns the trainer's final metrics."""
    from jaxwm.loop.evaluate import Evaluator
    from jaxwm.loop.trainer import Trainer

    validate(config)
    module = algos.get(config.algo)
    algorithm = module.build(config)
    evaluator = None
    try:
        if algorithm.policy is not None:
            evaluator = Evaluator(config, algorithm.policy)
        return Trainer(config, algorithm, workdir, evaluator).run()
    finally:
        algorithm.close()
        if evaluator is not None:
            evaluator.close()
