"""Normalised scores: reference returns per task and the normalisation that uses them.

D4RL's normalised score (Fu et al. 2020, sec. 5): ``100 (R - min) / (max - min)`` with the
random and expert returns of each MuJoCo task as min and max (the D4RL repository's
``infos.py`` values for the v2 datasets). A base module with no dependencies inside jaxwm, so
that the loop's evaluator and the dataset tools share one table.
"""

from __future__ import annotations

import numpy as np

D4RL_REFERENCE = {"hopper": (-20.272305, 3234.3), "halfcheetah": (-280.178953, 12135.0),
                  "walker2d": (1.629008, 4592.3)}


def reference_returns(env_id: str) -> tuple[float, float] | None:
    """D4RL's (min, max) returns for an env id (``Hopper-v4``, ``hopper-medium-v2``), or
    None where none is known."""
    name = env_id.lower().replace("_", "").replace("-", "")
    for family, ref in D4RL_REFERENCE.items():
        if name.startswith(family):
            return ref
    return None


def normalized_score(returns, reference: tuple[float, float] | None):
    """D4RL's 100 (R - min) / (max - min); NaN where no reference is known."""
    returns = np.asarray(returns, np.float64)
    if reference is None:
        return np.full_like(returns, np.nan)
    low, high = reference
    return 100.0 * (returns - low) / (high - low)
