"""Shared test helpers."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# On a GPU, JAX preallocates 75% of the device's memory when its backend starts. The suite runs
# one process per core (pytest-xdist), so the second worker on one GPU would find no memory
# left. Allocate on demand instead. Set here, before any test starts a JAX backend (the variable
# is read then), and in os.environ, so the subprocesses of _run_script and the CLI tests inherit
# it. setdefault: a value the user set wins, as does XLA_PYTHON_CLIENT_MEM_FRACTION if set.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# The suite checks mathematics, so it runs float32 matmuls and convolutions exactly on every
# backend (jaxwm.backend's precision policy: training keeps XLA's default, TF32 on a GPU). Its
# tolerances are float32 ones (backend.float32_tolerance()); under TF32 an input that two equal
# programs compute one ulp apart rounds ~5e-4 apart, and Adam turns that into parameter changes
# of order the learning rate. JAX reads the variable when it is imported, which is after this.
# To run the suite at a GPU's default precision instead: JAX_DEFAULT_MATMUL_PRECISION=default.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")

# Tests build the same small programs many times over (every build of an algorithm makes new
# closures, so jit's in-memory cache misses): JAX's persistent compilation cache serves the
# repeats from disk, shared by pytest-xdist's workers and the subprocesses of _run_script.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "jaxwm-tests-compilation-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# envpool renders MuJoCo and DMC through EGL only if libEGL is loaded before envpool is
# imported (jaxwm/envs/mujoco_video.py); jaxwm.envs loads it first, so import it here (after the
# variables above, which JAX reads when imported), before any test module imports envpool directly.
import jaxwm.envs  # noqa: E402, F401


def pytest_collection_modifyitems(config, items):
    """Slow learning tests run up to an hour: no per-test timeout for them (pyproject.toml's
    ``timeout`` guards the default suite against hangs)."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(0))


def _run_script(script: str, devices: int | None = None) -> dict:
    """Runs ``script`` (formatted with ``root``, the repository) in a fresh Python, on
    ``devices`` fake CPU devices if given (JAX fixes the count when it starts), and returns
    the JSON object its last line prints."""
    env = dict(os.environ)
    if devices:
        env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                   JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script.format(root=ROOT)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def run_script():
    return _run_script


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """The offline algorithms' tiny dataset, made once per test process."""
    from jaxwm.tools import make_dataset

    path = str(tmp_path_factory.mktemp("data") / "pendulum-random-tiny.hdf5")
    return make_dataset.make("Pendulum-v1", "random", path, size=2_000, num_envs=2)
