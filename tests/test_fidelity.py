"""benchmarks/fidelity/dreamer.py: both sides' command lines from one table of settings, and
the table and figure from both sides' logs (synthetic logs in each side's format)."""

import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "fidelity"))
import dreamer as fidelity  # noqa: E402


def _flags(command, prefix):
    """{key: value} of ``--config.key=value`` (jaxwm) or ``--key value`` (official) flags."""
    if prefix == "--config.":
        return dict(a[len(prefix):].split("=", 1) for a in command if a.startswith(prefix))
    pairs = command[command.index("--src") + 2:]
    return {k[2:]: v for k, v in zip(pairs[::2], pairs[1::2], strict=True)}


def test_both_sides_get_the_same_settings():
    s = fidelity.with_overrides(fidelity.PRESETS["cpu"], ["lr=1e-4", "steps=1000"])
    ours = _flags(fidelity.jaxwm_command(s, 2, "runs/x"), "--config.")
    theirs = _flags(fidelity.official_command(s, 2, "runs/y", "python", "src"), "--")
    assert float(ours["dreamer.learning_rate"]) == float(theirs["agent.opt.lr"]) == 1e-4
    assert int(ours["total_env_steps"]) == int(theirs["run.steps"]) == 1000
    assert ours["seed"] == theirs["seed"] == "2"
    for a, b in (("env.num_envs", "run.envs"), ("dreamer.batch_size", "batch_size"),
                 ("dreamer.batch_length", "batch_length"), ("dreamer.warmup", "agent.opt.warmup"),
                 ("dreamer.train_ratio", "run.train_ratio")):
        assert float(ours[a]) == float(theirs[b]), (a, b)
    assert float(ours["dreamer.gamma"]) == pytest.approx(1 - 1 / float(theirs["agent.horizon"]))
    assert theirs["task"] == "gym_" + ours["env.id"] and theirs["configs"] == "size1m"


def test_unknown_setting_is_refused():
    with pytest.raises(SystemExit, match="lr"):
        fidelity.with_overrides(fidelity.PRESETS["cpu"], ["learning_rate=1e-4"])


def test_windows_and_the_dip_after_solving():
    steps = np.array([100, 900, 1500, 2600, 3100, 3900])
    values = np.array([10.0, 30.0, 500.0, 100.0, 480.0, 490.0])
    curve = fidelity.windowed(steps, values, 1000, 5000)
    np.testing.assert_allclose(curve[:4], [20.0, 500.0, 100.0, 485.0])
    assert np.isnan(curve[4])  # not reached
    assert fidelity.dip_after_solving(curve, 475.0) == 100.0
    assert np.isnan(fidelity.dip_after_solving(np.array([1.0, 2.0]), 475.0))
    assert fidelity.largest_fall(np.array([10.0, 300.0, 120.0, 500.0, 260.0, np.nan])) == 240.0


def test_plot_reads_both_sides_logs(tmp_path):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        ours = runs / "jaxwm" / f"seed{seed}"
        ours.mkdir(parents=True)
        with open(ours / "metrics.jsonl", "w") as f:
            for step in range(1000, 5001, 1000):
                f.write(json.dumps({"counters/env_steps": step,
                                    "charts/episodic_return": step / 10 + seed}) + "\n")
            f.write('{"counters/env_steps": 60')  # a line still being written
        theirs = runs / "official" / f"seed{seed}"
        theirs.mkdir(parents=True)
        with open(theirs / "scores.jsonl", "w") as f:
            for step in range(250, 5001, 250):
                f.write(json.dumps({"step": step, "episode/score": 500.0}) + "\n")
    fidelity.main(["plot", "--seeds", "1", "2", "--runs", str(runs), "--set", "steps=5000",
                   "--window", "1000", "--results", str(tmp_path), "--figures",
                   str(tmp_path)])
    out = json.loads((tmp_path / "dreamer_cartpole_cpu.json").read_text())
    assert out["table"]["jaxwm"]["1"]["final"] == pytest.approx((401 + 501) / 2)
    assert out["table"]["official"]["2"]["first_solved"] == 1000
    assert out["table"]["official"]["2"]["dip_after_solving"] == 500.0
    assert (tmp_path / "fidelity_dreamer_cartpole_cpu.png").stat().st_size > 0
    assert "| official | mean | 500 | 500 |" in (tmp_path / "dreamer_cartpole_cpu.md").read_text()
