"""Evaluation videos of envpool's MuJoCo and DMC envs (jaxwm.envs.mujoco_video), their
one-line refusal where EGL is missing, and the MP4 written beside each GIF."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxwm.config import ConfigError, base_config
from jaxwm.envs import acting, mujoco_video, probe_spec
from jaxwm.loop import metrics
from jaxwm.loop.evaluate import Evaluator
from jaxwm.media import Video

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# JAX warns at every fork; the subprocesses here (ffmpeg, python) exec at once, which is safe.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")


def _renders_here() -> str:
    try:
        mujoco_video.check("HalfCheetah-v4", mujoco_video.render_kwargs("mujoco", "HalfCheetah-v4"))
    except ConfigError as error:
        return str(error)
    return ""


# Mesa's EGL (libegl1, libegl-mesa0) renders on a CPU, and a GPU driver's EGL on a GPU; these
# skip only where neither is installed, or where a test module imported envpool before
# jaxwm.envs (tests/test_envs.py, collected first), with the refusal as the reason. The
# refusals themselves are tested below whatever this machine has.
_NO_RENDERER = _renders_here()
needs_renderer = pytest.mark.skipif(bool(_NO_RENDERER), reason=_NO_RENDERER)
needs_encoder = pytest.mark.skipif(not metrics.mp4_encoder(),
                                   reason="imageio-ffmpeg is not installed (pip install -e "
                                          "'.[video]'): videos are written as GIFs only")


def video_config(env_id, steps, video=True, **env):
    config = base_config()
    config.env.id = env_id
    config.env.max_episode_steps = steps
    config.env.update(env)
    config.eval.num_envs, config.eval.num_episodes, config.eval.video = 2, 2, video
    return config


def evaluate(config):
    evaluator = Evaluator(config, acting.uniform(probe_spec(config.env)),
                          params_of=lambda state: ())
    try:
        return evaluator.run((), jax.random.PRNGKey(0))
    finally:
        evaluator.close()


def assert_moving_episode(frames, length):
    height, width = mujoco_video.FRAME_SIZE
    # A frame before each step of env 0's first episode, and its last state.
    assert frames.shape == (length + 1, height, width, 3) and frames.dtype == np.uint8
    assert frames.std() > 10  # a rendered scene, not a blank buffer
    changed = [not np.array_equal(a, b) for a, b in zip(frames[:-1], frames[1:], strict=True)]
    assert sum(changed) >= length - 1, changed
    assert np.abs(frames[-1].astype(float) - frames[0]).mean() > 1.0


@needs_renderer
def test_a_mujoco_eval_records_the_evaluated_episode():
    config = video_config("HalfCheetah-v4", 12)
    with_video = evaluate(config)
    video = with_video.pop("eval/video")
    assert isinstance(video, Video)
    assert_moving_episode(np.asarray(video.frames), 12)
    # Rendering reads env 0's state and changes nothing: the same episodes without video.
    assert with_video == evaluate(video_config("HalfCheetah-v4", 12, video=False))


@needs_renderer
def test_a_dmc_eval_records_the_evaluated_episode_with_an_action_repeat():
    metrics_ = evaluate(video_config("CheetahRun-v1", 6, frame_skip=2))
    assert metrics_["eval/episodic_length"] == 6
    assert_moving_episode(np.asarray(metrics_["eval/video"].frames), 6)


def test_dmc_videos_use_the_cameras_that_frame_the_agent():
    assert mujoco_video.render_kwargs("dmc", "QuadrupedRun-v1")["render_camera_id"] == 2
    assert mujoco_video.render_kwargs("dmc", "WalkerWalk-v1")["render_camera_id"] == 0
    assert "render_camera_id" not in mujoco_video.render_kwargs("mujoco", "Hopper-v4")


def _assert_one_line_refusal(message, env_id, remedy="apt install libegl1"):
    assert "\n" not in message, message
    assert message.startswith(f"eval.video for {env_id}: ") and "EGL" in message
    assert remedy in message and message.endswith("or set --config.eval.video=False.")


def test_without_libegl_the_evaluator_refuses_in_one_line_before_anything_runs(monkeypatch):
    with monkeypatch.context() as patch:  # what importing jaxwm.envs finds without libegl1
        patch.setattr(mujoco_video, "EGL_LIBRARY", "libEGL-not-installed.so.1")
        patch.delitem(sys.modules, "envpool")
        problem, remedy = mujoco_video.load_egl()
    assert problem.startswith("libEGL-not-installed.so.1 is not installed: ")
    monkeypatch.setattr(mujoco_video, "EGL_PROBLEM", problem)
    monkeypatch.setattr(mujoco_video, "EGL_REMEDY", remedy)
    with pytest.raises(ConfigError) as error:
        Evaluator(video_config("Hopper-v4", 5), acting.uniform(probe_spec({"id": "Hopper-v4"})))
    _assert_one_line_refusal(str(error.value), "Hopper-v4")
    assert "libEGL-not-installed.so.1 is not installed" in str(error.value)


def _refusal_in_a_subprocess(first_lines: str, env_id: str, remedy="apt install libegl1",
                             **environ) -> str:
    """What ``make_env(..., render=True)`` says in a fresh process after ``first_lines``: one
    line, and the process lives on (envpool's MuJoCo would end it with exit status 1)."""
    script = (f"{first_lines}\n"
              "from jaxwm.config import ConfigError\n"
              "from jaxwm.envs import make_env\n"
              "try:\n"
              f"    make_env({{'id': {env_id!r}}}, num_envs=1, seed=0, render=True).render()\n"
              "except ConfigError as error:\n"
              "    print(error)\n"
              "else:\n"
              "    print('rendered')\n")
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, **environ}, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    _assert_one_line_refusal(lines[0], env_id, remedy)
    return lines[0]


def test_without_an_egl_driver_building_the_pool_refuses_in_one_line():
    """libEGL without a driver behind it (no vendor file: a machine without Mesa's
    libegl-mesa0 or a GPU driver's EGL); EGL reads its vendors once per process."""
    _refusal_in_a_subprocess("", "WalkerWalk-v1", __EGL_VENDOR_LIBRARY_FILENAMES=os.path.join(
        ROOT, "no-such-vendor.json"))


def test_envpool_imported_before_jaxwm_envs_is_refused_not_fatal():
    message = _refusal_in_a_subprocess("import envpool", "HalfCheetah-v4",
                                       remedy="import jaxwm.envs before envpool")
    assert "(envpool was imported before jaxwm.envs, which must load libEGL.so.1 first)" in message


def _write_video(workdir, frames):
    writer = metrics.MetricWriter(str(workdir))
    writer.write(5, {"eval/video": Video(frames, fps=10)})
    writer.close()
    row = json.loads(open(os.path.join(workdir, "metrics.jsonl")).read().splitlines()[-1])
    assert row["eval/video"] == os.path.join("videos", "eval_video_5.gif")
    return os.path.join(workdir, "videos", "eval_video_5")


@needs_encoder
def test_an_mp4_is_written_beside_each_gif(tmp_path):
    import imageio_ffmpeg

    t, y, x = np.meshgrid(np.arange(7), np.arange(21), np.arange(30), indexing="ij")
    frames = np.stack([100 + 80 * np.sin(x / 5 + t), 60 + 5 * y, 128 + 0 * x], -1)
    frames = frames.astype(np.uint8)  # smooth (H.264 is lossy) and moving; an odd height
    stem = _write_video(tmp_path, frames)
    assert os.path.getsize(stem + ".gif") > 0
    reader = imageio_ffmpeg.read_frames(stem + ".mp4")
    meta = next(reader)
    decoded = [np.frombuffer(f, np.uint8).reshape(22, 30, 3) for f in reader]
    assert meta["size"] == (30, 22) and meta["fps"] == 10 and meta["codec"] == "h264"
    assert len(decoded) == 7
    # Lossy, but the frames are the ones given (the padded row repeats the last one).
    for got, want in zip(decoded, frames, strict=True):
        assert np.abs(got[:21].astype(float) - want).mean() < 8
    # Gray and float frames too.
    gray = np.random.default_rng(0).uniform(size=(3, 8, 8, 1))
    assert metrics.write_mp4(str(tmp_path / "gray.mp4"), gray, 5)


def test_without_an_encoder_only_the_gif_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "mp4_encoder", lambda: False)
    stem = _write_video(tmp_path, np.zeros((3, 8, 8, 3), np.uint8))
    assert os.path.exists(stem + ".gif") and not os.path.exists(stem + ".mp4")
    assert sorted(os.listdir(tmp_path / "videos")) == ["eval_video_5.gif"]
