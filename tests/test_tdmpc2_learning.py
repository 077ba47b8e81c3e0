"""TD-MPC2 learning checks (``slow``): the 1M model with a lighter planner learns Pendulum-v1
and DMC's cartpole-balance (in MuJoCo Playground, three seeds) on a CPU. Budgets, thresholds
and what the runs measured are in each test and in README.md ("Tests"); both run the whole
schedule (seed -> pretrain -> train) through ``jaxwm.runner`` and read the run's
``metrics.jsonl``."""

import json
import os

import pytest

from jaxwm import runner
from jaxwm.config import load

pytestmark = pytest.mark.slow


def evaluations(spec: str, workdir: str, **overrides) -> list[tuple[int, float]]:
    """(env step, mean evaluation return) for every evaluation of the run."""
    config = load(spec, {"log.progress": False, "checkpoint.every": "never", **overrides})
    runner.run(config, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return [(r["counters/env_steps"], r["eval/episodic_return"]) for r in rows
            if "eval/episodic_return" in r]


def test_pendulum_reaches_minus_250(tmp_path):
    """``tdmpc2:pendulum`` as it ships: 1000 random steps, 1000 pretraining updates,
    then 4000 steps with one update each (batch 128; MPPI 4 iterations of 256 samples),
    evaluated on 5 episodes every 1000 steps and after the last update. Budget: 5000 env
    steps. Measured (2026-11-25, 35 min on 2 cores with other runs beside it): -1517.0 (random,
    1000), -243.2, -398.7, -144.6, -213.6 (5000) and -122.4 after the last update. Again
    (2026-11-27, 12 min alone, Q-head dropout from ``ops.dropout``): -239.5, -397.3, -118.6,
    -211.8 and -123.6. Again (2026-11-27, later, the Q heads as one function of their stacked
    parameters, 11 min alone): -196.7, -172.3, -117.8, -207.4 and -122.0."""
    evals = evaluations("tdmpc2:pendulum", str(tmp_path))
    print("Pendulum evaluations:", evals)
    assert evals[-1][0] == 5000
    assert evals[-1][1] >= -250, evals


def test_playground_cartpole_balance_reaches_750_on_three_seeds(tmp_path):
    """``tdmpc2:cartpole`` as it ships (DMC cartpole-balance in MuJoCo Playground, stepped in
    MJX: action repeat 2, 500-step episodes, returns on DMC's 0-1000 scale; the 1M model, MPPI
    2 x 128 samples, batch 128), three seeds in one process (``num_seeds=3``). Budget: 10,000
    env steps each, the first 1000 random, evaluated greedily on 5 episodes at 5000 and 10,000
    steps and after the last update. Every seed's best evaluation must reach 750. Measured
    (2026-12-02, 2 cores shared, ~2 h): 729.5 / 668.5 / 741.5 at 5000 and 826.7 / 917.2 /
    781.4 at 10,000 steps; issue 63's 900 on every seed needs a larger budget. A one-seed
    check on envpool's task (``CartpoleBalance-v1``, until 2026-12-02) passed three times
    (best 860.0, 962.2, 938.9) and then failed at 728.5 once a refactor changed its rounding
    (benchmarks/results/learning_cpu.md): one seed is a draw, three are a check. Measured
    figures are in benchmarks/results/learning_cpu.md ("TD-MPC2 on Playground")."""
    config = load("tdmpc2:cartpole", {"num_seeds": 3, "log.progress": False,
                                      "checkpoint.every": "never"})
    runner.run(config, str(tmp_path))
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
    evals = [[r[f"eval/episodic_return/seed_{k}"] for k in range(3)] for r in rows
             if "eval/episodic_return/seed_0" in r]
    print("CartpoleBalance evaluations per seed:", evals)
    assert len(evals) >= 2 and rows[-1]["counters/env_steps"] == 10_000
    assert min(max(e[k] for e in evals) for k in range(3)) >= 750, evals
