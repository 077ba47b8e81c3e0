"""DreamerV3 on the loop (dreamer:debug, vector CartPole): train_ratio through the
phases, the same seed giving the same run, resume continuing exactly, and bad input refused
before anything compiles."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxwm.algos import dreamer
from jaxwm.config import ConfigError, load
from jaxwm.loop.trainer import Trainer
from jaxwm.runner import validate

STEPS = 400
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def debug_config(**overrides):
    config = load("dreamer:debug", {"total_env_steps": STEPS, "eval.at_end": False,
                                               "log.progress": False, **overrides})
    validate(config)
    return config


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("dreamer"))
    config = debug_config(**{"checkpoint.every": f"{STEPS} env_steps"})
    trainer = Trainer(config, dreamer.build(config), workdir)
    summary = trainer.run()
    yield config, workdir, trainer, summary
    trainer.algorithm.close()


@pytest.mark.parametrize("ratio, envs, per_collect, batch, length, expected", [
    (256.0, 1, 1, 16, 64, ("collect:4", "update_model:1")),  # atari100k
    (1024.0, 16, 1, 16, 64, ("collect:1", "update_model:16")),  # dmc_proprio
    (8.0, 4, 1, 8, 10, ("collect:5", "update_model:2")),  # debug: 0.4 updates per collect
])
def test_train_ratio_becomes_the_phase_hooks(ratio, envs, per_collect, batch, length, expected):
    config = load("dreamer:debug", {
        "dreamer.train_ratio": ratio, "env.num_envs": envs, "dreamer.steps_per_collect":
        per_collect, "dreamer.batch_size": batch, "dreamer.batch_length": length})
    assert dreamer.phase_hooks(config)["train"] == expected
    assert tuple(config.phases.train.hooks) == ()  # derived, not written into the config


def test_a_train_ratio_the_hooks_cannot_meet_is_refused():
    config = load("dreamer:debug", {"dreamer.train_ratio": 0.001})
    with pytest.raises(ConfigError, match="train_ratio"):
        validate(config)
    config = load("dreamer:debug", {"phases.train.hooks": ("collect:1",
                                                                      "update_model:1")})
    with pytest.raises(ConfigError, match="nearest: collect:5, update_model:2"):
        validate(config)


@pytest.mark.parametrize("override, message", [
    ({"dreamer.model_size": "3m"}, "does not exist"),
    ({"env.pixels": True}, "dm_control"),
    ({"dreamer.prefill": 5}, "prefill"),
    ({"dreamer.twohot": "raw"}, "symexp"),
    ({"dreamer.repval": -0.3}, "repval"),
])
def test_bad_input_is_refused_before_compiling(override, message):
    config = load("dreamer:debug")
    config.env.pixels = False  # a key only dmc_vision sets
    config.update_from_flattened_dict(override)
    with pytest.raises(ConfigError, match=message):
        validate(config)


def test_on_a_jax_env_the_train_phase_is_one_program_of_whole_calls():
    """gymnax: ``collect:1, update_model:1`` twice a call as ``iterate``; a call that would
    run past total_env_steps, or CMA-ES's generations inside one, is refused."""
    pytest.importorskip("gymnax", reason="the gymnax extra (pip install -e '.[dev]')")
    on_jax = {"env.id": "gymnax:CartPole-v1", "iterations_per_call": 2}
    config = load("dreamer:tiny", on_jax)
    assert dreamer.phase_hooks(config) == {"train": ("iterate",)}
    assert dreamer.hook_counts(config)["iterate"] == {"env_steps": 4, "model_updates": 2}
    validate(config)
    with pytest.raises(ConfigError, match="The train phase's 24 env steps .* not a multiple "
                                          "of the 10 of one call"):
        validate(load("dreamer:tiny", {**on_jax, "iterations_per_call": 5}))
    with pytest.raises(ConfigError, match="CMA-ES's generations"):
        validate(load("pairing:tiny_rssm_cmaes", on_jax))


def test_model_size_on_the_command_line_sets_the_model(tmp_path):
    """The issue's spelling, ``--config.model_size``, and ``--config.dreamer.model_size`` are one
    setting; an unknown size stops the launcher before anything is written."""
    for key in ("model_size", "dreamer.model_size"):
        config = load("dreamer:dmc_vision", {key: "25m"})
        assert config.model_size == config.dreamer.model_size == "25m"
    cli = subprocess.run(
        [sys.executable, "-m", "jaxwm.train", "--config=dreamer:dmc_vision",
         "--config.env.id=CheetahRun-v1", "--config.model_size=3m",
         f"--workdir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0
    assert "dreamer.model_size='3m' does not exist; choose one of ['1m', '12m'" in cli.stderr
    assert not (tmp_path / "run").exists()


def test_an_image_size_the_encoder_cannot_take_is_refused():
    config = load("dreamer:debug", {"env.id": "Pong-v5"})
    config.env.update(dict(img_height=84, img_width=84, gray_scale=False, frame_stack=1))
    with pytest.raises(ConfigError, match="64x64"):
        validate(config)


def test_updates_per_env_step_follow_train_ratio(first_run):
    config, _, trainer, summary = first_run
    prefill = config.dreamer.prefill * config.env.num_envs
    assert summary["counters"]["env_steps"] == STEPS
    # debug: collect:5, update_model:2 per 5 x 4 env steps after the prefill.
    assert summary["counters"]["model_updates"] == (STEPS - prefill) // 20 * 2
    assert int(trainer.state.updates) == summary["counters"]["model_updates"]
    np.testing.assert_allclose(summary["replay/train_ratio"], config.dreamer.train_ratio,
                               rtol=0.05)
    assert np.isfinite(summary["model/loss"]) and np.isfinite(summary["agent/critic_loss"])


def test_the_same_seed_gives_the_same_run(first_run, tmp_path):
    config, _, trainer, _ = first_run
    again = Trainer(config, dreamer.build(config), str(tmp_path))
    try:
        again.run()
        jax.tree.map(np.testing.assert_array_equal, again.state.learner.params,
                     trainer.state.learner.params)
        jax.tree.map(np.testing.assert_array_equal, again.state.replay.data,
                     trainer.state.replay.data)
    finally:
        again.algorithm.close()


@pytest.mark.slow
def test_size1m_cartpole_reaches_400_within_50k_steps(tmp_path):
    """dreamer:cartpole (size1m, vector observations, horizon 100), ~15 min on 2
    CPU cores; the measured runs: benchmarks/results/learning_cpu.md."""
    from jaxwm.runner import run

    config = load("dreamer:cartpole", {"log.progress": False})
    summary = run(config, str(tmp_path))
    assert summary["counters"]["env_steps"] == 50_000
    assert summary["eval/episodic_return"] >= 400, summary["eval/episodic_return"]


@pytest.mark.slow  # ~1 min: 64x64 pixels, every hook
def test_pixels_run_end_to_end_and_write_open_loop_videos(tmp_path):
    """64x64 RGB Pong with the atari100k env settings at debug sizes: uint8 replay, the
    convolutional encoder and decoder, and the open-loop GIF."""
    from jaxwm.runner import run

    config = load("dreamer:atari100k", {
        "total_env_steps": 48, "log.progress": False, "eval.at_end": False,
        "log.every": "16 env_steps", "checkpoint.every": "never", "eval.every": "never",
        "dreamer.size_overrides": {"deter": 16, "hidden": 8, "classes": 4, "units": 16,
                                   "depth": 2},
        "dreamer.batch_size": 2, "dreamer.batch_length": 8, "dreamer.prefill": 16,
        "dreamer.train_ratio": 16.0, "dreamer.num_bins": 5, "dreamer.report_every": 2,
        "dreamer.report_batch": 1, "dreamer.report_length": 8, "dreamer.report_context": 3})
    summary = run(config, str(tmp_path))
    assert summary["counters"]["model_updates"] == 32  # 16 / (2 x 8) = 1 update per env step
    assert np.isfinite(summary["model/loss"])
    videos = sorted((tmp_path / "videos").glob("report_openloop_*.gif"))
    assert videos, "no open-loop video written"
