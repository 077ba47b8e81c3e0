"""Learning on envs written in JAX (slow): PPO solves gymnax's CartPole at PureJaxRL's
settings, and on two MinAtar games stays within reach of PureJaxRL's ``ppo.py`` with the same
settings and budget.

PureJaxRL's figures are measured beside jaxwm on this machine class by ``python
benchmarks/jax_envs.py --learning --games Breakout-MinAtar,SpaceInvaders-MinAtar
--peer-seeds-apart`` (``benchmarks/results/jax_envs_learning_cpu.md``: 3 seeds a side, 2M env
steps a seed; the figure ``docs/figures/jax_envs_minatar.png``). There, on SpaceInvaders,
jaxwm's mean final return was 132.2 (seeds 132.3, 138.6, 125.6) against PureJaxRL's 127.4
(118.4, 137.1, 126.7): the issue's goal (at least PureJaxRL's) met; on Breakout 35.5 (62.1,
17.2, 27.4) against 43.2 (53.5, 48.8, 27.3): below, by 0.5 standard errors of the difference,
so not shown there. This test trains jaxwm's three seeds again and fails where their mean
falls more than two standard errors of the difference below PureJaxRL's.
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("gymnax", reason="the gymnax extra (pip install -e '.[dev]')")

import jaxwm.config  # noqa: E402
from jaxwm import train  # noqa: E402

pytestmark = pytest.mark.slow

# PureJaxRL's mean final training return (last 10% of each run) and its standard error over
# 3 seeds, 2M steps a seed (benchmarks/results/jax_envs_learning_cpu.md).
PUREJAXRL_FINAL = {"Breakout-MinAtar": (43.2, 8.06), "SpaceInvaders-MinAtar": (127.4, 5.41)}


def test_gymnax_cartpole_is_solved_at_purejaxrls_settings(tmp_path):
    """ppo:gymnax_cartpole (4 envs x 128 steps, 499,712 steps in 16 calls of 61 iterations):
    the last calls' training return >= 475 and the final evaluation >= 475."""
    config = jaxwm.config.load("ppo:gymnax_cartpole", {"log.progress": False})
    summary = train.run(config, str(tmp_path))
    rows = [r for r in _metrics(tmp_path) if "charts/episodic_return" in r]
    assert np.mean([r["charts/episodic_return"] for r in rows[-3:]]) >= 475
    assert summary["eval/episodic_return"] >= 475


@pytest.mark.parametrize("game", sorted(PUREJAXRL_FINAL))
def test_minatar_stays_within_two_standard_errors_of_purejaxrl(game):
    """jaxwm's three seeds (vmapped), 2M env steps each: their mean final return no more than
    two standard errors of the difference below PureJaxRL's mean on this machine class."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import jax_envs

    out = jax_envs.jaxwm_learning(game, 2_000_000, 3, quick=False)
    finals = [jax_envs.final_return(curve) for curve in out["returns"]]
    theirs, their_sem = PUREJAXRL_FINAL[game]
    ours_sem = np.std(finals, ddof=1) / np.sqrt(len(finals))
    assert np.mean(finals) >= theirs - 2 * np.hypot(ours_sem, their_sem), finals


def _metrics(workdir):
    with open(workdir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]
