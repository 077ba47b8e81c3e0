"""jaxwm installed as a user installs it: a wheel built from this tree, installed
(non-editable) into a fresh virtual environment, used from an empty directory, where no
checkout is in reach: ``jaxwm --help``, ``jaxwm configs``, a short training run, ``jaxwm eval``
of it, and an offline run that makes its own dataset (``mopo:tiny``).

The environment sees this interpreter's packages (``--system-site-packages``) so that no
dependency is downloaded; the wheel itself is installed without them (``--no-deps``) and must
be the jaxwm that runs (checked), not this checkout's."""

import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, cwd, timeout=600, env=None):
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env=env)
    assert result.returncode == 0, f"{args}: {result.stderr[-3000:]}"
    return result.stdout


def test_the_wheel_installs_and_runs_from_an_empty_directory(tmp_path):
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(dist), ROOT], cwd=tmp_path)
    (wheel,) = glob.glob(str(dist / "jaxwm-*.whl"))
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path)
    python, jaxwm_bin = str(venv / "bin" / "python"), str(venv / "bin" / "jaxwm")
    # Without PYTHONPATH throughout: a checkout on it would make pip take jaxwm as installed.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    run([python, "-m", "pip", "install", "-q", "--no-deps", wheel], cwd=tmp_path, env=env)

    where = run([python, "-c", "import jaxwm; print(jaxwm.__file__)"], cwd=work, env=env)
    assert where.startswith(str(venv)), where
    assert "commands:" in run([jaxwm_bin, "--help"], cwd=work, env=env)
    assert "ppo:cartpole" in run([jaxwm_bin, "configs"], cwd=work, env=env)
    run([jaxwm_bin, "train", "--config=ppo:tiny", "--workdir=runs/ppo",
         "--config.log.progress=False"], cwd=work, env=env)
    evaluated = run([jaxwm_bin, "eval", "--workdir=runs/ppo", "--episodes=2", "--video"],
                    cwd=work, env=env)
    assert "2 episodes on CartPole-v1" in evaluated
    assert glob.glob(str(work / "runs" / "ppo" / "eval" / "*" / "video.gif"))
    run([jaxwm_bin, "train", "--config=mopo:tiny", "--workdir=runs/mopo",
         "--config.dataset=data/pendulum-random.hdf5", "--config.log.progress=False"],
        cwd=work, env=env)
    assert (work / "data" / "pendulum-random.hdf5").exists()
