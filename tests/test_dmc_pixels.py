"""DMC tasks from pixels through dm_control's renderer (jaxwm.envs.dmc_pixels)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxwm.config
from jaxwm import train
from jaxwm.config import ConfigError
from jaxwm.envs import EpisodeStats, UnknownEnvError, dmc_pixels, make_env
from jaxwm.runner import validate


def _renders_here() -> str:
    try:
        dmc_pixels.check_available()
    except ConfigError as error:
        return str(error)
    return ""


# The dev extra (the README's test command, and CI) installs dm_control, and Mesa's EGL renders
# on a CPU; these skip only where one of them is missing, with the error that says what to
# install (the error itself is tested below, whatever this machine has).
_NO_RENDERER = _renders_here()
needs_renderer = pytest.mark.skipif(bool(_NO_RENDERER), reason=_NO_RENDERER)


def pixel_env(num_envs=2, seed=0, limit=5, **keys):
    return make_env({"id": "CheetahRun-v1", "pixels": True, "max_episode_steps": limit, **keys},
                    num_envs=num_envs, seed=seed)


@needs_renderer
def test_envpool_ids_name_dm_control_tasks():
    assert dmc_pixels.dmc_task("CheetahRun-v1") == ("cheetah", "run")
    assert dmc_pixels.dmc_task("BallInCupCatch-v1") == ("ball_in_cup", "catch")
    assert dmc_pixels.dmc_task("FingerTurnHard-v1") == ("finger", "turn_hard")
    with pytest.raises(UnknownEnvError, match="WalkerWalk-v1"):
        dmc_pixels.dmc_task("WalkerFly-v1")


@needs_renderer
def test_pixel_tasks_follow_envpools_convention_with_continuous_actions():
    env = pixel_env(limit=5)
    spec = env.spec
    assert spec.obs_shape == (3, 64, 64) and spec.obs_dtype == np.uint8
    assert not spec.discrete and spec.action_shape == (6,) and spec.max_episode_steps == 5
    np.testing.assert_array_equal(spec.action_low, -np.ones(6))
    first = env.reset()
    assert first.obs.shape == (2, 3, 64, 64) and first.obs.dtype == np.uint8
    stats = EpisodeStats.create(2)
    results = []
    for _ in range(6):
        result = env.step(np.full((2, 6), 0.5, np.float32))
        stats, completed = stats.update(result)
        results.append((result, completed))
    ended, completed = results[4]
    # dm_control's tasks never terminate: the limit truncates (discount 1).
    assert ended.truncated.all() and not ended.terminated.any() and ended.episode_over.all()
    np.testing.assert_array_equal(completed["length"], [5, 5])
    assert all((r.reward > 0).all() for r, _ in results[:5])  # cheetah-run pays for speed
    after = results[5][0]  # the reset transition
    assert not after.done.any() and (after.reward == 0).all()
    frames = np.stack([r.obs for r, _ in results])
    assert frames.std() > 10 and not np.array_equal(frames[0], frames[3])  # rendered, moving
    assert env.render().shape == (64, 64, 3)
    env.close()


@needs_renderer
def test_actions_are_clipped_to_the_box_and_the_xla_path_equals_the_host_path():
    actions = np.random.default_rng(0).uniform(-3, 3, (4, 2, 6)).astype(np.float32)
    host = pixel_env(seed=3)
    host.reset()
    expected = [host.step(np.clip(a, -1, 1)) for a in actions]

    xla = pixel_env(seed=3)

    @jax.jit
    def rollout(handle):
        def body(handle, action):
            handle, result = xla.xla_step(handle, action)
            return handle, (result.obs, result.reward, result.truncated)
        return jax.lax.scan(body, handle, jnp.asarray(actions))[1]

    handle, _ = xla.xla_reset()
    obs, reward, truncated = rollout(handle)  # unclipped: the env clips
    np.testing.assert_array_equal(obs, np.stack([r.obs for r in expected]))
    np.testing.assert_allclose(reward, np.stack([r.reward for r in expected]), rtol=1e-6)
    np.testing.assert_array_equal(truncated, np.stack([r.truncated for r in expected]))


@needs_renderer
def test_frames_follow_the_config_size_camera_and_action_repeat():
    small = pixel_env(num_envs=1, img_height=32, img_width=48)
    assert small.reset().obs.shape == (1, 3, 32, 48)
    repeat = pixel_env(num_envs=1, limit=0, frame_skip=4)
    assert repeat.spec.max_episode_steps == 250  # cheetah's 1000 steps / 4
    cameras = [pixel_env(num_envs=1, camera=c).reset().obs for c in (0, 1)]
    assert not np.array_equal(*cameras)
    with pytest.raises(ConfigError, match="env.camera=9: CheetahRun-v1 has cameras 0..1"):
        pixel_env(camera=9)


def test_pixels_are_refused_for_envs_dm_control_does_not_render():
    config = jaxwm.config.load("dreamer:dmc_vision", {"env.id": "Pong-v5"})
    with pytest.raises(ConfigError, match="renders DMC tasks with dm_control"):
        validate(config)
    with pytest.raises(ConfigError, match="no asynchronous mode"):
        make_env({"id": "WalkerWalk-v1", "pixels": True}, num_envs=4, seed=0, batch_size=2)


def test_without_dm_control_or_opengl_the_error_says_what_to_install(monkeypatch):
    config = jaxwm.config.load("dreamer:dmc_vision")
    monkeypatch.setitem(sys.modules, "dm_control", None)  # import dm_control -> ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[dmc\]'"):
        validate(config)
    monkeypatch.undo()
    pytest.importorskip("dm_control")
    import mujoco

    def no_display(*_):
        raise RuntimeError("eglInitialize failed")

    monkeypatch.setattr(mujoco, "GLContext", no_display)
    with pytest.raises(ConfigError, match="eglInitialize failed.*apt install libosmesa6"):
        validate(config)


@needs_renderer
@pytest.mark.slow
def test_dreamer_trains_from_dmc_pixels(tmp_path):
    """dreamer:dmc_vision at toy sizes: rendered frames collected from the jitted
    collect (io_callback on the envs' own thread), 16 updates of the image world model with
    the bounded-normal actor, an evaluation episode and the open-loop video (~60 s)."""
    overrides = {"total_env_steps": 48, "dreamer.prefill": 16, "dreamer.batch_size": 2,
                 "dreamer.batch_length": 8, "dreamer.model_size": "1m", "dreamer.capacity": 100,
                 "dreamer.train_ratio": 16.0, "dreamer.num_bins": 5, "dreamer.report_every": 2,
                 "dreamer.report_batch": 1, "dreamer.report_length": 8,
                 "dreamer.report_context": 3, "env.num_envs": 2, "env.max_episode_steps": 10,
                 "eval.num_episodes": 1, "eval.num_envs": 1, "log.every": "8 env_steps",
                 "checkpoint.every": "never", "log.progress": False}
    config = jaxwm.config.load("dreamer:dmc_vision", overrides)
    config.dreamer.size_overrides = dict(deter=16, hidden=8, classes=4, units=16, depth=2)
    summary = train.run(config, str(tmp_path / "run"))
    assert summary["env_steps"] == 48 and summary["counters"]["model_updates"] == 16
    assert np.isfinite(summary["model/loss"]) and summary["eval/episodic_length"] == 10
    assert sorted((tmp_path / "run" / "videos").glob("report_openloop_*.gif"))
