"""Registry of algorithms: ``config.algo`` -> (validate(config), build(config) -> Algorithm)."""

from __future__ import annotations

import importlib

from jaxwm.config import ConfigError

# Module per algorithm, imported lazily so that one algorithm's imports never slow another.
REGISTRY = {
    "ppo": "jaxwm.algos.ppo",
    "mbrs": "jaxwm.algos.mbrs",
    "sac": "jaxwm.algos.sac",
    "mopo": "jaxwm.algos.mopo",
    "gormpo": "jaxwm.algos.mopo",  # MOPO with GORMPO's density penalty
    "dreamer": "jaxwm.algos.dreamer",
}


def get(name: str):
    if name not in REGISTRY:
        raise ConfigError(f"Unknown algorithm {name!r}; known: {sorted(REGISTRY)}.")
    return importlib.import_module(REGISTRY[name])
