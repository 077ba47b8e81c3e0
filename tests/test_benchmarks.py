"""The benchmark scripts keep running as the library changes under them.

Benchmarks are not timed here (speed lives in benchmarks/ and its results). These tests only
check that each script still works: the default suite imports every script and takes one
Nature-CNN gradient step of ``conv_grad``'s problem at a tiny batch (an API change once broke
that script unnoticed); the ``slow`` test runs every script's ``--quick`` smoke mode, whose
results are written with a ``_quick`` suffix that git ignores.
"""

import importlib
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
SCRIPTS = ("backbones", "conv_grad", "dreamer", "offline", "ppo_throughput")


@pytest.fixture(scope="module")
def benchmark_modules():
    sys.path.insert(0, BENCHMARKS)  # the scripts import their shared ``common`` module
    try:
        yield {name: importlib.import_module(name) for name in SCRIPTS}
    finally:
        sys.path.remove(BENCHMARKS)


def test_every_script_imports_and_has_a_main(benchmark_modules):
    for name, module in benchmark_modules.items():
        assert callable(getattr(module, "main", None)), name
        assert module.__doc__ and "python benchmarks/" in module.__doc__, name


def test_conv_grad_problem_takes_a_gradient_step(benchmark_modules):
    conv_grad = benchmark_modules["conv_grad"]
    for canonical in (True, False):
        params, data, step = conv_grad.make_problem(canonical, batch=2, minibatches=2)
        run, steps = conv_grad.loop_runner("scan rolled", step, params, data, jax.jit)
        new = run()
        assert steps == 2
        changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                               params, new)
        assert any(jax.tree.leaves(changed))


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_quick_mode_runs(name):
    """``python benchmarks/<name>.py --quick`` (seconds to a minute or two each)."""
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, f"{name}.py"), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "|" in proc.stdout  # the markdown table it printed
