"""World Models learning check (``slow``): ``worldmodels:carracing_cpu`` on
CarRacing-v3 runs every phase, the CMA-ES population's mean return rises over the
generations, and the evolved controller (the search distribution's mean, with V and M) ends
at least 100 above a uniformly random policy on full episodes.

Budget: the config as it ships: 32 random rollouts of 1000 steps, 1000 VAE updates at batch
32, 500 MDN-RNN updates on windows of 200, 20 generations of 16 candidates x 2 episodes of
500 steps, then 10 full evaluation episodes: 23 min 20 s on 2 CPU cores (2026-11-26, other
work beside it for part of the time). That run: population mean return per generation -3.0,
-24.5, -18.0 (first three) to 74.2, 112.2, 89.7 (last three); the mean controller scored 99.0
(std 90.1 over 10 episodes of 1000 steps); uniform random actions scored -30.2 on the same
evaluation, so the controller ended 129 above random (docs/figures/
worldmodels_carracing_cpu_curve.png). One run: the evaluation's standard error is about 28.
An earlier run, before the acting policy read envpool's channels-first frames right, ended
110 above random on scrambled features."""

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
    config = load("worldmodels:carracing_cpu", {"log.progress": False,
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
