"""benchmarks/fidelity/ (dreamer.py, mopo.py): both sides' command lines from one table of
settings, and the table and figure from both sides' logs (synthetic logs in each side's
format); the stand-in env that OfflineRL-Kit is given."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "fidelity"))
import dreamer as fidelity  # noqa: E402
import eval_starts  # noqa: E402
import gormpo_density_probe  # noqa: E402
import mopo as mopo_fidelity  # noqa: E402
import mopo_offlinerlkit  # noqa: E402

from jaxwm.loop.metrics import read_jsonl  # noqa: E402


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
    assert theirs["seed"] == "2"
    assert ours["seed"] == "2000"  # jaxwm_seed: neighbouring seeds' env pools share no env
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
    # The official side's curves again from that JSON (its logs gone), beside new jaxwm runs
    shutil.rmtree(runs / "official")
    fidelity.main(["plot", "--seeds", "1", "2", "--runs", str(runs), "--set", "steps=5000",
                   "--window", "1000", "--results", str(tmp_path), "--figures", str(tmp_path),
                   "--reuse", "official", "--reuse", "jaxwm=jaxwm, earlier"])
    again = json.loads((tmp_path / "dreamer_cartpole_cpu.json").read_text())
    assert list(again["curves"]) == ["jaxwm", "official", "jaxwm, earlier"]
    assert again["curves"]["official"] == out["curves"]["official"]
    assert "| jaxwm, earlier | mean |" in (tmp_path / "dreamer_cartpole_cpu.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dreamer_cartpole_learns_and_never_falls_back(tmp_path, seed):
    """Issue 32's bar at the level the measurements support (24-55 min per seed on one core):
    dreamer:cartpole at the fidelity tool's CPU preset, run by the same command as
    the comparison's jaxwm side (seed s at ``--config.seed`` 1000 x s). Once a 2,500-step
    window of training episodes reaches 300 (learned: a random policy scores ~22), no later
    window falls below 100; the last two windows average >= 300. Measured on every jaxwm
    run (benchmarks/fidelity/README.md, "Independent seeds", and this test's own run):
    lowest window after learning 102-367, finals 347-500; the official code's finals
    421-480. CartPole's own 475 is not the bar: with sampled actions most independent seeds,
    of either code, first reach a 475 window late in the 40k budget or not at all. The
    deterministic evaluation is printed, not asserted: one run of seed 2 ended at 234 while
    its last two training windows averaged 415 (the greedy policy can be the weaker one)."""
    settings = fidelity.PRESETS["cpu"]
    logdir = str(tmp_path / "run")
    subprocess.run(fidelity.jaxwm_command(settings, seed, logdir), check=True, cwd=ROOT)
    curve = fidelity.windowed(*fidelity.episode_returns("jaxwm", logdir), 2500, settings.steps)
    row = fidelity.summarise({"jaxwm": {seed: curve}}, 2500, 300.0, 2)["jaxwm"][seed]
    evaluations = [r["eval/episodic_return"] for r in
                   read_jsonl(os.path.join(logdir, "metrics.jsonl")) if "eval/episodic_return" in r]
    print(f"seed {seed}: {row}, evaluations {evaluations}")
    assert row["first_solved"] is not None, row  # reached 300
    assert np.isnan(row["dip_after_solving"]) or row["dip_after_solving"] >= 100, row
    assert row["final"] >= 300, row


# ----------------------------------------------------------------------------- MOPO


def test_mopo_both_sides_get_the_same_settings():
    s = mopo_fidelity.with_overrides(mopo_fidelity.PRESETS["pendulum"],
                                     ["epochs=7", "penalty_coef=2.5"])
    ours = _flags(mopo_fidelity.jaxwm_command(s, 3, "runs/x"), "--config.")
    command = mopo_fidelity.kit_command(s, 3, "runs/y", "python", "src")
    launcher = command[command.index("--src"):command.index("--")]
    pairs = command[command.index("--") + 1:]
    theirs = {k[2:]: v for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
    assert theirs["seed"] == "3"
    assert ours["seed"] == "3000"  # jaxwm_seed: runs 1, 2, 3 share no env streams
    assert int(ours["phases.policy.duration"]) == 7 * int(theirs["step-per-epoch"]) == 7000
    assert int(ours["mopo.updates_per_epoch"]) == int(theirs["step-per-epoch"])
    assert float(ours["penalty_coef"]) == float(theirs["penalty-coef"]) == 2.5
    assert int(ours["mopo.horizon"]) == int(theirs["rollout-length"])
    assert int(ours["mopo.rollout_batch"]) == int(theirs["rollout-batch-size"])
    assert int(ours["eval.num_episodes"]) == int(theirs["eval_episodes"])
    assert ours["eval.every"] == f"{theirs['step-per-epoch']} agent_updates"
    assert int(ours["phases.model.duration"]) == int(
        launcher[launcher.index("--model-max-epochs") + 1])
    assert ours["dataset"] == launcher[launcher.index("--dataset") + 1]
    assert "--gormpo-src" not in launcher and "algo" not in ours
    g = mopo_fidelity.with_overrides(s, ["algo=gormpo"])
    ours = _flags(mopo_fidelity.jaxwm_command(g, 3, "runs/x"), "--config.")
    command = mopo_fidelity.kit_command(g, 3, "runs/y", "python", "src", "gormpo")
    assert (ours["algo"], ours["penalty"], ours["gormpo.score_next_state"]) == (
        "gormpo", "linear", "True")  # GORMPO scores the predicted next state, as its code
    assert command[command.index("--gormpo-src") + 1] == "gormpo"
    # jaxwm-only settings (GORMPO's code's density) reach jaxwm's command, after the shared ones
    extra = mopo_fidelity.jaxwm_command(g, 3, "runs/x", ["gormpo.threshold_quantile=0.01"])
    assert extra[-1] == "--config.gormpo.threshold_quantile=0.01"
    assert _flags(extra, "--config.")["gormpo.threshold_quantile"] == "0.01"


def test_mopo_plot_reads_both_sides_logs(tmp_path):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        ours = runs / "mopo" / "jaxwm" / f"seed{seed}"
        ours.mkdir(parents=True)
        with open(ours / "metrics.jsonl", "w") as f:
            f.write(json.dumps({"counters/agent_updates": 0, "losses/model_nll": 1.0}) + "\n")
            for epoch in range(1, 4):
                f.write(json.dumps({"counters/agent_updates": epoch * 1000,
                                    "eval/episodic_return": -1000.0 + 100 * epoch + seed}) + "\n")
        record = (runs / "mopo" / "offlinerlkit" / f"seed{seed}" / "log" / "pendulum-medium"
                  / "mopo&penalty_coef=1.0" / f"seed_{seed}&timestamp_x" / "record")
        record.mkdir(parents=True)
        (record / "policy_training_progress.csv").write_text(
            "alpha,eval/normalized_episode_reward,timestep\n"
            "0.9,-800.0,1000\n0.8,-300.0,2000\n0.7,-500.0,3000\n")
    plot = ["plot", "--seeds", "1", "2", "--runs", str(runs), "--set", "epochs=3",
            "--set", f"dataset={tmp_path / 'absent.hdf5'}", "--final-epochs", "2",
            "--results", str(tmp_path), "--figures", str(tmp_path)]
    mopo_fidelity.main(plot)
    out = json.loads((tmp_path / "mopo_pendulum_medium.json").read_text())
    assert out["unit"] == "return"  # no dataset to say, and Pendulum has no D4RL reference
    assert out["table"]["jaxwm"]["2"]["final"] == pytest.approx((-798 + -698) / 2)
    assert out["table"]["offlinerlkit"]["1"]["best"] == -300.0
    assert out["table"]["offlinerlkit"]["1"]["largest_fall"] == 200.0
    assert out["curves"]["jaxwm"]["1"] == [-899.0, -799.0, -699.0]
    assert (tmp_path / "fidelity_mopo_pendulum_medium.png").stat().st_size > 0
    mopo_fidelity.main(plot + ["--set", "env=Hopper-v4", "--suffix", "_hopper",
                               "--also-jaxwm", "before=" + str(runs / "mopo" / "jaxwm")])
    out = json.loads((tmp_path / "mopo_pendulum_medium_hopper.json").read_text())
    low, high = out["reference"]  # D4RL's hopper returns, both sides normalised alike
    assert out["curves"]["offlinerlkit"]["1"][1] == pytest.approx(100 * (-300 - low) / (high - low))
    assert out["curves"]["before"] == out["curves"]["jaxwm"]  # a third side, read as jaxwm's
    assert "| before | mean |" in (tmp_path / "mopo_pendulum_medium_hopper.md").read_text()
    # An earlier plot's sides come back from its JSON (their logs gone), under a new label
    again = tmp_path / "again"
    shutil.copytree(runs / "mopo" / "jaxwm", again / "runs" / "mopo" / "jaxwm")
    shutil.copy(tmp_path / "mopo_pendulum_medium.json", again)
    replot = ["plot", "--seeds", "1", "2", "--runs", str(again / "runs"), "--set", "epochs=3",
              "--set", f"dataset={tmp_path / 'absent.hdf5'}", "--results", str(again),
              "--figures", str(again)]
    mopo_fidelity.main(replot + ["--reuse", "offlinerlkit", "--reuse", "jaxwm=jaxwm, earlier"])
    out = json.loads((again / "mopo_pendulum_medium.json").read_text())
    assert list(out["curves"]) == ["jaxwm", "offlinerlkit", "jaxwm, earlier"]
    assert out["curves"]["jaxwm, earlier"] == out["curves"]["jaxwm"]
    assert out["table"]["offlinerlkit"]["1"]["best"] == -300.0
    assert "| OfflineRL-Kit | mean |" in (again / "mopo_pendulum_medium.md").read_text()
    with pytest.raises(SystemExit, match="has the sides"):
        mopo_fidelity.main(replot + ["--reuse", "nobody"])
    with pytest.raises(SystemExit, match=r"seeds \[1, 2\] of 'jaxwm' have runs here too"):
        mopo_fidelity.main(replot + ["--reuse", "jaxwm"])
    # More seeds for a side whose first runs' logs are gone: stored seed 1 joins new seed 2
    more = tmp_path / "more"
    shutil.copytree(runs / "mopo" / "jaxwm" / "seed2", more / "runs" / "mopo" / "jaxwm" / "seed2")
    stored = json.loads((tmp_path / "mopo_pendulum_medium.json").read_text())
    stored["curves"]["jaxwm"] = {"1": stored["curves"]["jaxwm"]["1"]}
    (more / "mopo_pendulum_medium.json").write_text(json.dumps(stored))
    mopo_fidelity.main(["plot", "--seeds", "1", "2", "--runs", str(more / "runs"), "--set",
                        "epochs=3", "--set", f"dataset={tmp_path / 'absent.hdf5'}", "--results",
                        str(more), "--figures", str(more), "--reuse", "jaxwm"])
    merged = json.loads((more / "mopo_pendulum_medium.json").read_text())["curves"]["jaxwm"]
    assert merged == json.loads((tmp_path / "mopo_pendulum_medium.json").read_text())[
        "curves"]["jaxwm"]


def test_eval_starts_needs_the_behaviour_sac_and_says_so(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        eval_starts.main(["--dataset", str(tmp_path / "absent.hdf5")])
    (tmp_path / "d.hdf5").write_bytes(b"")
    with pytest.raises(SystemExit, match="holds no SAC snapshots"):
        eval_starts.main(["--dataset", str(tmp_path / "d.hdf5")])


def test_the_kits_env_stand_in_speaks_the_old_gym_api_and_d4rl(tmp_path):
    import gymnasium
    import h5py

    path = str(tmp_path / "d.hdf5")
    with h5py.File(path, "w") as f:
        for key, shape in (("observations", (5, 3)), ("actions", (5, 1)), ("rewards", (5,)),
                           ("terminals", (5,)), ("timeouts", (5,)),
                           ("next_observations", (5, 3))):
            f[key] = np.zeros(shape)
    env = mopo_offlinerlkit.OfflineEnv(gymnasium.make("Pendulum-v1"), path)
    env.seed(3)
    first = env.reset()
    env.seed(3)
    np.testing.assert_array_equal(env.reset(), first)  # seeded as Gym's env.seed did
    steps = 0
    while True:
        obs, reward, done, info = env.step(np.zeros(1, np.float32))
        steps += 1
        if done:
            break
    assert steps == env._max_episode_steps == 200  # the time limit ends it (old-API done)
    assert set(env.get_dataset()) >= {"observations", "timeouts", "next_observations"}
    # The kit logs 100 x this as its "normalized" column: the raw return, normalised later.
    assert env.get_normalized_score(-250.0) * 100 == pytest.approx(-250.0)


def test_the_density_probes_are_the_runs_rows_with_noise(tmp_path):
    """Both sides of gormpo_density_probe.py score the same rows: the (s', a) rows the runs
    fit on (timeout-final steps dropped), drawn with a fixed seed; action noise stays in the
    dataset's action range, state noise leaves the actions alone."""
    import h5py

    n = 6000
    rng = np.random.default_rng(1)
    path = str(tmp_path / "d.hdf5")
    with h5py.File(path, "w") as f:
        f["next_observations"] = rng.normal(size=(n, 3)).astype(np.float32)
        f["actions"] = rng.uniform(-2, 2, size=(n, 1)).astype(np.float32)
        f["timeouts"] = np.arange(n) % 200 == 199
    rows, obs_dim = gormpo_density_probe.dataset_rows(path)
    assert (rows.shape, obs_dim) == ((n - 30, 4), 3)
    probes = gormpo_density_probe.probes(rows, obs_dim)
    again = gormpo_density_probe.probes(rows, obs_dim)
    assert all(np.array_equal(probes[k], again[k]) for k in probes)
    base = probes["dataset rows"]
    assert base.shape == (5000, 4) and len(np.unique(base, axis=0)) == 5000
    for std in gormpo_density_probe.ACTION_NOISE:
        noisy = probes[f"action noise {std}"]
        np.testing.assert_array_equal(noisy[:, :3], base[:, :3])
        assert noisy[:, 3].min() >= rows[:, 3].min() and noisy[:, 3].max() <= rows[:, 3].max()
        assert 0.5 * std < np.std(noisy[:, 3] - base[:, 3]) < std
    state = probes["next-state noise 0.1"]
    np.testing.assert_array_equal(state[:, 3:], base[:, 3:])
    assert 0.09 < np.std(state[:, :3] - base[:, :3]) < 0.11
