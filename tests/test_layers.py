"""The architecture, checked: imports only go down the layers of docs/architecture.md
(import-linter's layers contract in pyproject.toml), algorithms are wiring (short files of
short functions, the learning in agents/ and models/), and nothing outside an algorithm's
registry entry keeps a table of its settings."""

import ast
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from jaxwm import algos

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGOS_DIR = os.path.join(ROOT, "jaxwm", "algos")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 250, 80
# algos/ held 2,828 lines when it was a closure per system; wiring is at least 25% smaller.
MAX_TOTAL_LINES = 2_121


def test_imports_only_go_down_the_layers():
    lint = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable),
                                                        "lint-imports")
    if not os.path.exists(lint):
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' installs import-linter")
    proc = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def algos_files():
    return sorted(glob.glob(os.path.join(ALGOS_DIR, "*.py")))


def test_algorithms_are_wiring_in_short_files_of_short_functions():
    total = 0
    for path in algos_files():
        source = open(path).read()
        lines = source.count("\n")
        total += lines
        name = os.path.relpath(path, ROOT)
        assert lines <= MAX_FILE_LINES, f"{name}: {lines} lines (at most {MAX_FILE_LINES})"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, \
                    f"{name}: {node.name} is {length} lines (at most {MAX_FUNCTION_LINES})"
    assert total <= MAX_TOTAL_LINES, f"jaxwm/algos holds {total} lines"


def test_no_algorithm_imports_another():
    modules = {os.path.splitext(os.path.basename(p))[0] for p in algos_files()} - {"__init__"}
    for path in algos_files():
        own = os.path.splitext(os.path.basename(path))[0]
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                others = {m for m in modules - {own} for n in names
                          if n == f"jaxwm.algos.{m}"}
                assert not others, f"algos/{own}.py imports {sorted(others)}"


def test_no_table_outside_the_registry_names_an_algorithms_settings():
    """What the rest of the code asks of an algorithm is on its ``algos.Entry``: the loop,
    the config's shared checks and the runner name no algorithm's settings."""
    blocks = "|".join(sorted(set(algos.names()) | {"sac", "gormpo", "simple"}))
    setting = re.compile(rf"({blocks})\.[a-z_.]+")
    for path in [os.path.join(ROOT, "jaxwm", f) for f in ("config.py", "runner.py")] + \
            glob.glob(os.path.join(ROOT, "jaxwm", "loop", "*.py")):
        found = [node.value for node in ast.walk(ast.parse(open(path).read()))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and setting.fullmatch(node.value)]
        assert not found, f"{os.path.relpath(path, ROOT)} names the settings {found}"
