"""Learning with memory (slow): velocity-masked CartPole needs memory to solve.

BenchNetRL's observation: with cart and pole velocities zeroed, a memoryless agent cannot
balance the pole for long, while recurrent, attention and state-space agents can. Thresholds:
each memory backbone reaches a mean evaluation return >= 400 within 500k env steps
(configs/ppo.py:cartpole_masked, BenchNetRL's classic-control settings); the feed-forward
agent (one frame) stays below 200 under the same budget. These take 10-40 minutes each on 2 CPU
cores; run them with ``python -m pytest -m slow tests/test_learning_memory.py``.
"""

import os

import pytest

import jaxwm.config
from jaxwm import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def masked_cartpole(backbone):
    return jaxwm.config.load(os.path.join(ROOT, "configs/ppo.py:cartpole_masked"),
                             {"network.backbone": backbone, "log.progress": False,
                              "checkpoint.every": "never"})


@pytest.mark.slow
@pytest.mark.parametrize("backbone", ["lstm", "gru", "gtrxl", "mamba"])
def test_memory_backbones_solve_masked_cartpole(backbone, tmp_path):
    summary = train.run(masked_cartpole(backbone), str(tmp_path))
    assert summary["env_steps"] <= 500_000
    assert summary["eval/episodic_return"] >= 400, summary


@pytest.mark.slow
def test_feed_forward_cannot_solve_masked_cartpole(tmp_path):
    summary = train.run(masked_cartpole("ff"), str(tmp_path))
    assert summary["eval/episodic_return"] < 200, summary
