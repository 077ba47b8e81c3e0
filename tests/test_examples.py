"""The scripts of ``examples/`` run as a user runs them (at a few thousand env steps), so the
Python surface they show (``jaxwm.configs``, ``jaxwm.train``, ``jaxwm.load``, ``act``,
``evaluate``, ``jaxwm.report.make_report``) cannot drift from them."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.mark.parametrize("script, expected", [
    ("train_load_evaluate.py", "5 evaluation episodes:"),
    ("compare_settings.py", "Probability of improvement"),
])
def test_example_runs(tmp_path, script, expected):
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--steps", "2048"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout, result.stdout[-2000:]
