"""Learning with memory (slow): velocity-masked CartPole needs memory to solve.

BenchNetRL's observation: with cart and pole velocities zeroed, a memoryless agent cannot
balance the pole for long, while recurrent, attention and state-space agents can. Thresholds:
each memory backbone reaches a mean evaluation return >= 400 (10 episodes; evaluated every 25k
steps and at the end) within 200k env steps, the issue's bound being 500k; no evaluation of the
feed-forward agent (one frame) reaches 200 under the same budget. Settings:
configs/ppo.py:cartpole_masked_tuned (RL Zoo's tuned RecurrentPPO settings for CartPoleNoVel
with 10 epochs, memories of 128). Under BenchNetRL's own settings
(cartpole_masked: clip 0.1, lr 2.5e-4, 4 epochs, memories of 512) the GRU reached only 157 at
500k steps. Run them with ``python -m pytest -m slow tests/test_learning_memory.py``; the
README lists the measured returns and times.
"""

import os

import pytest

import jaxwm.config
from jaxwm import train
from jaxwm.loop.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def masked_cartpole(backbone):
    return jaxwm.config.load(os.path.join(ROOT, "configs/ppo.py:cartpole_masked_tuned"),
                             {"network.backbone": backbone, "log.progress": False,
                              "checkpoint.every": "never", "eval.every": "25000 env_steps"})


def evaluations(backbone, workdir) -> dict[int, float]:
    """Trains ``backbone``; returns {env steps: mean eval return (10 episodes)}."""
    summary = train.run(masked_cartpole(backbone), workdir)
    assert summary["env_steps"] <= 500_000
    curve = {r["step"]: r["eval/episodic_return"]
             for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
             if "eval/episodic_return" in r}
    print(f"{backbone}: eval returns {[(s, round(v, 1)) for s, v in curve.items()]}")
    return curve


@pytest.mark.slow
@pytest.mark.parametrize("backbone", [
    "lstm", "gru", "mamba",
    # GTrXL runs (a failure is reported as xfail, a pass as xpass) but is not yet expected to
    # pass: measured 2026-11-23 it learns this task far more slowly than the other cores here
    # (best evaluation 89 within 200k steps at 20 epochs; 318 at 500k with memory 4, still
    # rising; below 400 in the test's own run). The README's Tests section tracks it.
    pytest.param("gtrxl", marks=pytest.mark.xfail(
        strict=False, reason="known gap, measured 2026-11-23: GTrXL's best evaluation on "
        "masked CartPole stays below 400 within 200k steps (89 at 20 epochs); cause not yet "
        "found")),
])
def test_memory_backbones_solve_masked_cartpole(backbone, tmp_path):
    """Some evaluation within the budget (every 25k steps and at the end) averages >= 400."""
    curve = evaluations(backbone, str(tmp_path))
    assert max(curve.values()) >= 400, curve


@pytest.mark.slow
def test_feed_forward_cannot_solve_masked_cartpole(tmp_path):
    """No evaluation within the same budget averages 200 or more."""
    curve = evaluations("ff", str(tmp_path))
    assert max(curve.values()) < 200, curve
