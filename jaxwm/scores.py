"""Normalised scores: reference returns per task and the normalisation that uses them.

Atari's human-normalised score (Mnih et al. 2015; the Atari 100k convention of Kaiser et al.
2020): ``(R - random) / (human - random)``, a fraction (1.0: human level), with the random and
human returns of DQN-zoo's table (google-deepmind/dqn_zoo, ``dqn_zoo/atari_data.py``;
mila-iqia/spr's ``rlpyt_utils.py`` agrees on all 26 games) for the 26 Atari 100k games.

D4RL's normalised score (Fu et al. 2020, sec. 5): ``100 (R - min) / (max - min)`` with the
random and expert returns of each MuJoCo task as min and max (the D4RL repository's
``infos.py`` values for the v2 datasets).

Craftax and Crafter (Matthews et al. 2024; Hafner 2022): the return as a percentage of the
most an episode can earn (``100 R / max``, "% of max" in Craftax's papers: each achievement's
reward once), and Crafter's score over achievement success rates ``s_i`` in percent,
``exp(mean_i ln(1 + s_i)) - 1`` (Hafner 2022, "Benchmarking the Spectrum of Agent
Capabilities", sec. 3.3; a geometric mean that credits rare achievements).

A base module with no dependencies inside jaxwm, so that the loop's evaluator, the dataset
tools and the report share one table.
"""

from __future__ import annotations

import numpy as np

D4RL_REFERENCE = {"hopper": (-20.272305, 3234.3), "halfcheetah": (-280.178953, 12135.0),
                  "walker2d": (1.629008, 4592.3)}


# (random, human) returns of the 26 Atari 100k games, DQN-zoo's ``_ATARI_DATA``.
ATARI_RANDOM_HUMAN = {
    "Alien": (227.8, 7127.7), "Amidar": (5.8, 1719.5), "Assault": (222.4, 742.0),
    "Asterix": (210.0, 8503.3), "BankHeist": (14.2, 753.1), "BattleZone": (2360.0, 37187.5),
    "Boxing": (0.1, 12.1), "Breakout": (1.7, 30.5), "ChopperCommand": (811.0, 7387.8),
    "CrazyClimber": (10780.5, 35829.4), "DemonAttack": (152.1, 1971.0),
    "Freeway": (0.0, 29.6), "Frostbite": (65.2, 4334.7), "Gopher": (257.6, 2412.5),
    "Hero": (1027.0, 30826.4), "Jamesbond": (29.0, 302.8), "Kangaroo": (52.0, 3035.0),
    "Krull": (1598.0, 2665.5), "KungFuMaster": (258.5, 22736.3), "MsPacman": (307.3, 6951.6),
    "Pong": (-20.7, 14.6), "PrivateEye": (24.9, 69571.3), "Qbert": (163.9, 13455.0),
    "RoadRunner": (11.5, 7845.0), "Seaquest": (68.4, 42054.7), "UpNDown": (533.4, 11693.2),
}


def atari_game(env_id: str) -> str | None:
    """The Atari 100k game of an envpool id (``MsPacman-v5`` -> ``MsPacman``), or None."""
    game = env_id.split("-")[0]
    return game if game in ATARI_RANDOM_HUMAN else None


def human_normalized_score(returns, env_id: str):
    """``(R - random) / (human - random)`` for an Atari 100k game; NaN for any other env."""
    returns = np.asarray(returns, np.float64)
    game = atari_game(env_id)
    if game is None:
        return np.full_like(returns, np.nan)
    random, human = ATARI_RANDOM_HUMAN[game]
    return (returns - random) / (human - random)


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


# The most an episode can earn: Crafter's and Craftax-Classic's 22 achievements at +1 each;
# Craftax's 67 at 1, 3, 5 or 8 (craftax's ACHIEVEMENT_REWARD_MAP sums to 226). Health's +-0.1
# per unit is left out, as Craftax's papers leave it.
CRAFTAX_MAX_RETURN = {"crafter": 22.0, "craftax-classic": 22.0, "craftax": 226.0}


def craftax_max_return(env_id: str) -> float | None:
    """The most an episode of ``crafter`` or a ``craftax:`` env can earn, or None."""
    name = env_id.lower()
    if name == "crafter":
        return CRAFTAX_MAX_RETURN["crafter"]
    if not name.startswith("craftax:"):
        return None
    classic = name.startswith("craftax:craftax-classic")
    return CRAFTAX_MAX_RETURN["craftax-classic" if classic else "craftax"]


def percent_of_max(returns, env_id: str):
    """Craftax's ``100 R / max`` (``craftax_max_return``); NaN for any other env."""
    returns = np.asarray(returns, np.float64)
    most = craftax_max_return(env_id)
    return np.full_like(returns, np.nan) if most is None else 100.0 * returns / most


def crafter_score(success_rates):
    """Crafter's score of success rates in percent, ``[..., achievements]`` -> ``[...]``:
    ``exp(mean ln(1 + s)) - 1`` (module docstring)."""
    rates = np.asarray(success_rates, np.float64)
    return np.exp(np.mean(np.log1p(rates), axis=-1)) - 1.0


def dmc_score(returns):
    """DMC's returns as a fraction of the most a 1000-step episode can earn (every step's
    reward is in [0, 1]): ``R / 1000``."""
    return np.asarray(returns, np.float64) / 1000.0


class UnknownNormalization(ValueError):
    """A normalisation that does not exist, or has no reference for an env."""


# name -> (what it means, returns x env id -> normalised scores)
NORMALIZATIONS = {
    "raw": ("raw returns", lambda r, env_id: np.asarray(r, np.float64)),
    "atari_hns": ("Atari human-normalised score (1 = human)", human_normalized_score),
    "d4rl": ("D4RL normalised score (100 = expert)",
             lambda r, env_id: normalized_score(r, reference_returns(env_id))),
    "dmc": ("DMC return / 1000", lambda r, env_id: dmc_score(r)),
    "craftax": ("% of the most an episode earns (Craftax, Crafter)", percent_of_max),
}


def normalize(returns, env_id: str, kind: str):
    """``returns`` of ``env_id`` under the normalisation ``kind`` (``NORMALIZATIONS``);
    ``UnknownNormalization`` for an unknown kind or an env it has no reference for."""
    if kind not in NORMALIZATIONS:
        raise UnknownNormalization(f"unknown normalisation {kind!r}; choose one of "
                                   f"{', '.join(NORMALIZATIONS)}.")
    scores = NORMALIZATIONS[kind][1](returns, env_id)
    if np.size(scores) and np.isnan(scores).all() and not np.isnan(returns).all():
        raise UnknownNormalization(
            f"{kind} has no reference returns for {env_id}: use --normalize raw (or dmc for "
            "DMC tasks, craftax for Craftax and Crafter), or group this env apart.")
    return scores
