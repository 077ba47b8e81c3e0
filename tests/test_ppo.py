"""PPO end to end: learning on CartPole, asynchronous collection, every env family, the CLI
(resume, donation, devices and seeds: tests/test_contract.py)."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import jaxwm.config
from jaxwm import train
from jaxwm.algos import ppo as ppo_algo
from jaxwm.loop.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ppo_config(variant="cartpole", **overrides):
    return jaxwm.config.load(f"ppo:{variant}",
                             {"log.progress": False, **overrides})


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "jaxwm.train", *args], cwd=ROOT, timeout=timeout,
                          capture_output=True, text=True)


def test_default_cartpole_solves_within_200k_steps(tmp_path):
    """The README's default job: mean eval return >= 475 (10 episodes) within 200k env steps."""
    config = ppo_config(total_env_steps=199_680)  # 390 iterations of 8 envs x 64 steps
    summary = train.run(config, str(tmp_path))
    assert summary["env_steps"] <= 200_000
    assert summary["eval/episodic_return"] >= 475, summary
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    for name in ("charts/episodic_return", "charts/episodic_length", "charts/SPS",
                 "losses/policy_loss", "losses/value_loss", "eval/episodic_return"):
        assert any(name in r for r in rows), name
    assert os.path.exists(tmp_path / "learning_curve.png")


def test_async_collection_acts_with_the_parameters_from_before_the_last_update():
    """ppo.async_collect: the rollout the second collect returns was collected during the first
    update, by the initial parameters (a one-update lag), from where the first rollout ended:
    exactly what a synchronous collect with those parameters gives."""
    key1, key2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    rollouts = {}
    for mode in (True, False):
        algo = ppo_algo.build(ppo_config(**{"ppo.async_collect": mode}))
        try:
            state = algo.init(jax.random.PRNGKey(0))
            state, first, _ = algo.hooks["collect"].fn(state, {}, key1)
            if mode:  # rollout 2 is collected while this update runs
                state, _, _ = algo.hooks["update_agent"].fn(state, first, jax.random.PRNGKey(3))
                state, second, _ = algo.hooks["collect"].fn(state, {}, key2)
                assert not any(x.is_deleted() for x in jax.tree.leaves(state))
            else:  # no update: the parameters rollout 2 was started with
                state, second, _ = algo.hooks["collect"].fn(state, {}, jax.random.fold_in(key1, 1))
            rollouts[mode] = jax.device_get(second["rollout"])
        finally:
            algo.close()
    for name in ("obs", "action", "log_prob", "value", "reward"):
        np.testing.assert_array_equal(getattr(rollouts[True], name), getattr(rollouts[False], name))


@pytest.mark.slow  # a learning test (~20 s)
def test_async_collection_solves_cartpole(tmp_path):
    summary = train.run(ppo_config(**{"ppo.async_collect": True}), str(tmp_path / "run"))
    assert summary["eval/episodic_return"] >= 475.0


def test_extending_a_run_keeps_the_learning_rate_schedule(tmp_path):
    """A run planned for 2048 steps and one stopped at 1024 then extended to 2048 anneal the
    learning rate identically: the schedule follows ppo.anneal_env_steps, not the budget."""
    common = {"eval.every": "never", "eval.at_end": False, "log.every": "512 env_steps"}
    straight = ppo_config(total_env_steps=2048, **common)
    train.run(straight, str(tmp_path / "a"))
    extended = ppo_config(total_env_steps=1024, **{"ppo.anneal_env_steps": 2048, **common})
    train.run(extended, str(tmp_path / "b"))
    extended.total_env_steps = 2048
    extended.resume = True
    train.run(extended, str(tmp_path / "b"))
    rates = [[r["charts/learning_rate"] for r in read_jsonl(tmp_path / run / "metrics.jsonl")]
             for run in ("a", "b")]
    assert len(rates[0]) == 4 and bool(np.all(np.diff(rates[0]) < 0))
    np.testing.assert_allclose(rates[1], rates[0], rtol=1e-6)


@pytest.mark.parametrize("variant, overrides", [
    ("atari", {"env.num_envs": 2, "ppo.num_steps": 16, "ppo.num_minibatches": 2,
               "ppo.update_epochs": 1, "env.max_episode_steps": 200}),
    ("mujoco", {"env.num_envs": 2, "ppo.num_steps": 32, "ppo.num_minibatches": 2,
                "ppo.update_epochs": 1, "env.max_episode_steps": 40}),
    ("minigrid", {"env.num_envs": 2, "ppo.num_steps": 16, "ppo.num_minibatches": 2,
                  "ppo.update_epochs": 1}),
    # Memory backbones end to end, on the envs the BenchNetRL issue names.
    ("minigrid", {"env.num_envs": 2, "ppo.num_steps": 16, "ppo.num_minibatches": 2,
                  "ppo.update_epochs": 1, "env.id": "MiniGrid-MemoryS11-v0",
                  "network.backbone": "gtrxl", "network.trxl.dim": 32,
                  "network.trxl.memory": 8}),
    ("mujoco_memory", {"env.num_envs": 2, "ppo.num_steps": 16, "ppo.num_minibatches": 2,
                       "ppo.update_epochs": 1, "env.max_episode_steps": 40,
                       "network.backbone": "mamba", "network.mamba.dim": 32,
                       "network.hidden": (16, 32)}),
    ("cartpole_masked_tuned", {"network.backbone": "lstm", "ppo.update_epochs": 2}),
    ("cartpole_masked_transformer", {"env.num_envs": 4, "ppo.num_steps": 16,
                                     "ppo.num_minibatches": 2, "ppo.update_epochs": 1,
                                     "network.backbone": "gtrxl", "network.trxl.layers": 2}),
    ("lunarlander_masked", {"env.num_envs": 2, "ppo.num_steps": 16, "ppo.num_minibatches": 2,
                            "ppo.update_epochs": 1, "env.max_episode_steps": 50,
                            "network.backbone": "mamba2", "network.mamba2.dim": 64,
                            "network.hidden": (32,)}),
])
def test_every_variant_runs_a_few_iterations(tmp_path, variant, overrides):
    config = ppo_config(variant, **overrides)
    per_iteration = config.env.num_envs * config.ppo.num_steps
    config.total_env_steps = 3 * per_iteration
    config.log.every = f"{per_iteration} env_steps"
    config.eval.every = "never"
    config.eval.num_envs = 1
    config.eval.num_episodes = 1
    if variant == "atari":
        config.eval.at_end = False  # a full Breakout game under a random policy is slow
    summary = train.run(config, str(tmp_path))
    assert summary["env_steps"] == 3 * per_iteration
    assert np.isfinite(summary["losses/policy_loss"]) and np.isfinite(summary["losses/value_loss"])
    if variant != "atari":
        assert np.isfinite(summary["eval/episodic_return"])


@pytest.mark.parametrize("args, returncode, message", [
    (["--config.ppo.lerning_rate=1e-3"], 2, 'Did you mean "learning_rate"'),
    (["--config.env.id=CartPol-v1"], 1, "CartPole-v1"),
    (["--config.ppo.num_minibatches=7"], 1, "must divide"),
    (["--config.phases.train.unit=steps"], 1, "no hook of PPO counts 'steps'"),
    (["--config.phases.train.hooks=('colect',)"], 1, "Did you mean 'collect'?"),
    (["--config.eval.temperature=-1"], 1, "eval.temperature must be >= 0"),
    (["--config.log.every=5000"], 1, "write 'N unit'"),
    (["--config.env.batch_size=16"], 1, "must be in [0, env.num_envs=8]"),
    (["--config.ppo.num_steps=0"], 1, "ppo.num_steps=0 is a size and must be > 0"),
])
def test_cli_rejects_bad_settings_in_one_line(tmp_path, args, returncode, message):
    workdir = str(tmp_path / "run")
    result = cli("--config=ppo:cartpole", *args, f"--workdir={workdir}")
    assert result.returncode == returncode and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not os.path.exists(workdir)


@pytest.mark.parametrize("spec, env, message", [
    ("ppo:atari", "HalfCheetah-v4", "network.encoder='nature_cnn' takes images; "
     "HalfCheetah-v4 observes vectors"),
    ("ppo:minigrid", "CartPole-v1", "network.encoder='grid_cnn' takes images"),
    ("ppo:mujoco_memory", "Breakout-v5", "network.encoder='mlp' takes vectors"),
])
def test_a_network_for_other_observations_is_refused_in_one_line(tmp_path, spec, env, message):
    config = jaxwm.config.load(spec, {"env.id": env})
    with pytest.raises(jaxwm.config.ConfigError, match=message):
        train.run(config, str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("spec, message", [("ppo:cartpol", "cartpole"),
                                           ("configs/nope.py", "No config file")])
def test_cli_rejects_a_bad_config_file_or_variant(tmp_path, spec, message):
    result = cli(f"--config={spec}", f"--workdir={tmp_path / 'run'}")
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_trains_then_resumes_from_the_saved_step(tmp_path):
    workdir = str(tmp_path / "run")
    common = ["--config=ppo:cartpole", f"--workdir={workdir}",
              "--config.log.progress=False", "--config.eval.num_episodes=2",
              "--config.log.every=512 env_steps"]
    first = cli(*common, "--config.total_env_steps=1024")
    assert first.returncode == 0, first.stderr[-2000:]
    again = cli(*common, "--config.total_env_steps=1024")
    assert again.returncode == 1 and "resume=True" in again.stderr
    # A bigger budget would stretch the annealed learning rate (it would jump back up), and
    # keeping the schedule would leave the rate at 0 for the added steps: both refused.
    longer = cli(*common, "--config.total_env_steps=2048", "--config.resume=True")
    assert longer.returncode == 1 and "ppo.anneal_env_steps: saved 1024, now 2048" in longer.stderr
    pinned = cli(*common, "--config.total_env_steps=2048", "--config.resume=True",
                 "--config.ppo.anneal_env_steps=1024")
    assert pinned.returncode == 1 and "would be 0 for the last 1024 steps" in pinned.stderr
    # Without annealing a finished run extends.
    workdir = str(tmp_path / "constant")
    common = [*common[:1], f"--workdir={workdir}", *common[2:], "--config.ppo.anneal_lr=False"]
    first = cli(*common, "--config.total_env_steps=1024")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = cli(*common, "--config.total_env_steps=2048", "--config.resume=True")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Resumed" in resumed.stderr + resumed.stdout
    rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    assert [r["step"] for r in rows] == [512, 1024, 1536, 2048]
    assert all(r["charts/learning_rate"] == pytest.approx(1e-3) for r in rows)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")), key=int)[-1] == "8"
    for result in (again, longer, pinned):
        assert "Traceback" not in result.stderr


def test_how_often_evaluation_runs_leaves_training_unchanged(tmp_path):
    losses = {}
    for every in ("never", "512 env_steps"):
        config = ppo_config(total_env_steps=1536, **{"log.every": "512 env_steps",
                                                     "eval.every": every, "eval.at_end": False,
                                                     "eval.num_episodes": 1})
        workdir = str(tmp_path / every.split()[0])
        train.run(config, workdir)
        rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
        losses[every] = [(r["losses/policy_loss"], r["losses/value_loss"]) for r in rows]
        assert ("eval/episodic_return" in rows[0]) == (every != "never")
    assert losses["never"] == losses["512 env_steps"]


def test_eval_video_is_written(tmp_path):
    """A GIF of the evaluation (and an MP4 beside it where an encoder is installed); MuJoCo
    and DMC videos: tests/test_videos.py."""
    from jaxwm.loop.metrics import mp4_encoder

    config = ppo_config(total_env_steps=512, **{"eval.video": True, "eval.num_episodes": 1})
    train.run(config, str(tmp_path / "cp"))
    videos = sorted(os.listdir(tmp_path / "cp" / "videos"))
    assert [os.path.splitext(v)[1] for v in videos] == ([".gif", ".mp4"] if mp4_encoder()
                                                        else [".gif"])
    assert os.path.getsize(tmp_path / "cp" / "videos" / videos[0]) > 1000


@pytest.mark.slow
def test_mujoco_halfcheetah_passes_1000_within_1m_steps(tmp_path):
    """CleanRL's MuJoCo settings; mean greedy eval return over 5 episodes > 1000 at 1M steps.

    Takes roughly an hour on 2 CPU cores (run with ``pytest -m slow``).
    """
    config = ppo_config("mujoco", **{"eval.every": "never"})
    summary = train.run(config, str(tmp_path))
    assert summary["env_steps"] <= 1_001_472
    assert summary["eval/episodic_return"] > 1000, summary


def test_sigterm_saves_a_checkpoint_and_the_run_resumes(tmp_path):
    import signal
    import time

    workdir = tmp_path / "run"
    args = [sys.executable, "-m", "jaxwm.train", "--config=ppo:cartpole",
            f"--workdir={workdir}", "--config.total_env_steps=50000000",
            "--config.log.every=2048 env_steps", "--config.log.progress=False"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 120
    metrics = workdir / "metrics.jsonl"
    while not (metrics.exists() and metrics.stat().st_size) and time.time() < deadline:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, output[-2000:]  # train.EXIT_INTERRUPTED: requeue me
    assert "SIGTERM received" in output and "interrupted" in output
    saved = int(sorted(os.listdir(workdir / "checkpoints"), key=int)[-1])
    env_steps = saved // 2 * 512  # a checkpoint waits for the update that reads the rollout
    assert 2048 <= env_steps < 50_000_000

    # A shorter budget, keeping the 50M-step learning-rate schedule.
    resumed = cli(f"--workdir={workdir}", "--config=ppo:cartpole",
                  f"--config.total_env_steps={env_steps + 1024}", "--config.resume=True",
                  "--config.ppo.anneal_env_steps=50000000",
                  "--config.log.progress=False", "--config.eval.num_episodes=1")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"Resumed from {workdir / 'checkpoints'} at step {saved} (" in resumed.stdout
    assert f"env_steps {env_steps:,}" in resumed.stdout
    assert f"Finished {env_steps + 1024:,} env steps" in resumed.stdout
