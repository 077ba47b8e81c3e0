"""Several seeds in one process (jaxwm/loop/seeds.py): N vmapped agents are logged per seed
with mean and spread, and shard over devices with a memory backbone (that they train exactly
as N separate runs, for every algorithm: tests/test_contract.py)."""

import os
import textwrap

import numpy as np
import pytest

import jaxwm.config
from jaxwm import train
from jaxwm.loop.metrics import MetricWindow, PerSeed, plot_learning_curve, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"log.progress": False, "total_env_steps": 4 * 8 * 64, "log.every": "1 iterations",
         "eval.every": "never", "eval.num_episodes": 4, "eval.num_envs": 2,
         "checkpoint.every": "never"}


def test_per_seed_window_means_each_seed_then_summarises():
    window = MetricWindow()
    window.add({"r": PerSeed(np.array([1.0, np.nan, np.nan]))})
    window.add({"r": PerSeed(np.array([3.0, 4.0, np.nan]))})
    row = window.flush()
    # Seed 0: mean(1, 3) = 2; seed 1: 4; seed 2 finished no episode and is left out.
    assert row == {"r": 3.0, "r/seed_std": 1.0, "r/seed_0": 2.0, "r/seed_1": 4.0}


def test_seeds_are_logged_each_and_summarised(tmp_path):
    """A 2-seed run's rows hold every metric per seed, their mean and spread; counters count
    per seed; the evaluation is per seed too and the curve shows the band. (That each seed
    trains exactly as its own run: the contract suite, tests/test_contract.py.)"""
    both = jaxwm.config.load("ppo:cartpole",
                             {**SMALL, "num_seeds": 2})
    summary = train.run(both, str(tmp_path / "both"))
    rows = read_jsonl(tmp_path / "both" / "metrics.jsonl")
    assert len(rows) == 4 and rows[-1]["counters/env_steps"] == 4 * 8 * 64  # counted per seed
    for name in ("losses/value_loss", "losses/policy_loss", "charts/episodes"):
        for row in rows:
            per_seed = [row[f"{name}/seed_{k}"] for k in range(2)]
            assert row[name] == pytest.approx(np.mean(per_seed))
            assert row[f"{name}/seed_std"] == pytest.approx(np.std(per_seed))
        assert any(r[f"{name}/seed_0"] != r[f"{name}/seed_1"] for r in rows)  # two agents
    assert {"eval/episodic_return/seed_0", "eval/episodic_return/seed_1",
            "eval/episodic_return/seed_std"} <= set(summary)
    assert summary["eval/episodic_return"] == np.mean(
        [summary["eval/episodic_return/seed_0"], summary["eval/episodic_return/seed_1"]])
    assert (tmp_path / "both" / "learning_curve.png").exists()


def test_learning_curve_band(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(
        f'{{"step": {s}, "charts/episodic_return": {s}, "charts/episodic_return/seed_std": 1,'
        f' "charts/episodic_return/seed_0": {s - 1}, "charts/episodic_return/seed_1": {s + 1}}}\n'
        for s in (1, 2, 3)))
    assert plot_learning_curve(str(path), str(tmp_path / "c.png"), "t", "env_steps")
    assert (tmp_path / "c.png").stat().st_size > 1000


SEEDS_ON_DEVICES = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    import jax, numpy as np
    import jaxwm.config
    from jaxwm.algos import ppo as ppo_algo
    from jaxwm.loop import seeds
    out = {{}}
    for n in (1, 2):
        c = jaxwm.config.load("ppo:cartpole_masked", {{
            "num_devices": n, "num_seeds": 2, "network.backbone": "gru", "network.rnn.hidden": 16,
            "network.hidden": (16,), "ppo.num_steps": 16}})
        algo = ppo_algo.build(c)
        key = seeds.loop_key(0, 2, 8)
        state = algo.init(key)
        for i in range(2):
            key, k1 = seeds.split(key)
            key, k2 = seeds.split(key)
            state, passed, metrics = algo.hooks["collect"].fn(state, {{}}, k1)
            state, _, losses = algo.hooks["update_agent"].fn(state, passed, k2)
        out[n] = dict(params=[np.asarray(x).ravel().tolist()
                              for x in jax.tree.leaves(state.learner.params)],
                      shape=list(jax.tree.leaves(state.learner.params)[0].shape),
                      loss=np.asarray(losses["losses/value_loss"]).tolist())
        algo.close()
    print(json.dumps(out))
""")


def test_seeds_with_a_memory_backbone_over_two_devices(run_script):
    out = run_script(SEEDS_ON_DEVICES, devices=2)
    assert out["2"]["shape"][0] == 2 and len(out["2"]["loss"]) == 2
    np.testing.assert_allclose(out["1"]["loss"], out["2"]["loss"], rtol=1e-4)
    for a, b in zip(out["1"]["params"], out["2"]["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
