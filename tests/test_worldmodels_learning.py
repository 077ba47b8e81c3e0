"""World Models learning check (``slow``): ``configs/worldmodels.py:carracing_cpu`` on
CarRacing-v3 runs every phase, the CMA-ES population's mean return rises over the
generations, and the evolved controller (the search distribution's mean, with V and M) ends
at least 100 above a uniformly random policy on full episodes.

Budget: the config as it ships: 32 random rollouts of 1000 steps, 1000 VAE updates at batch
32, 500 MDN-RNN updates on windows of 200, 20 generations of 16 candidates x 2 episodes of
500 steps, then 10 full evaluation episodes. Measured (2026-11-26, 46 min on 2 CPU cores
shared with three other runs): population mean return per generation -19.9, -19.4, -15.6
(first three) to 0.8, 13.4, -2.2 (last three); the mean controller scored 79.7 (std 108 over
10 episodes, mean length 874); uniform random actions scored -30.2 (std 4.4) on the same
10-episode evaluation, so the controller ended 110 above random. One run: the evaluation's
standard error is about 34. That run predates a fix: while acting, V read envpool's
channels-first frames resized as if channels-last (training V and M read them right), so
the controller evolved on scrambled features; not yet run again since."""

import json
import os

import jax
import numpy as np
import pytest

from jaxwm import runner
from jaxwm.config import load
from jaxwm.envs import acting, probe_spec
from jaxwm.loop.evaluate import Evaluator

pytestmark = pytest.mark.slow


def test_carracing_controller_rises_over_generations_and_beats_random_by_100(tmp_path):
    config = load("configs/worldmodels.py:carracing_cpu", {"log.progress": False,
                                                           "checkpoint.every": "never"})
    summary = runner.run(config, str(tmp_path))
    rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
    means = [r["cma/return_mean"] for r in rows if "cma/return_mean" in r]
    assert len(means) == config.controller.generations
    random = Evaluator(config, acting.uniform(probe_spec(config.env)),
                       params_of=lambda state: ()).run((), jax.random.PRNGKey(0))
    evolved = summary["eval/episodic_return"]
    print("population means:", np.round(means, 1), "evolved:", evolved,
          "random:", random["eval/episodic_return"])
    assert np.mean(means[-3:]) > np.mean(means[:3]) + 10, means
    assert evolved >= random["eval/episodic_return"] + 100, (evolved, random)
