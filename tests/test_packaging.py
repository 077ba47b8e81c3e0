"""Installs people can reproduce: every third-party package that jaxwm/, tests/ and
benchmarks/*.py import is declared in pyproject.toml (core or an extra), and constraints.txt
pins every declared package to the version the suite passed with.

The scan reads each file's syntax tree, so it sees imports inside functions and behind
``try: ... except ImportError`` as well; it does not see imports in strings (the subprocess
scripts some tests write, which import only jax and jaxwm) or ``importlib.import_module``
with a computed name. benchmarks/peers and benchmarks/fidelity are left out: their scripts
import the peers' code (torch, offlinerlkit, dreamerv3, ...) and run in the peers' own
environments.
"""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _sources() -> list[pathlib.Path]:
    return [*sorted((ROOT / "jaxwm").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py")),
            *sorted((ROOT / "benchmarks").glob("*.py"))]


def _local_modules() -> set[str]:
    """Modules that the tests and benchmarks import by putting their own folders on sys.path:
    tests' helpers (contract, conftest), benchmarks' common, and the fidelity scripts that
    tests/test_fidelity.py imports. benchmarks/peers is left out: its shims are named after
    real packages (gym, cv2)."""
    names = {"jaxwm"}
    for folder in (ROOT / "tests", ROOT / "benchmarks", ROOT / "benchmarks" / "fidelity"):
        names.update(p.stem for p in folder.glob("*.py"))
        names.update(p.parent.name for p in folder.glob("*/__init__.py"))
    return names


def top_level_imports(source: str) -> set[str]:
    """The top-level module names of every absolute import in ``source``."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def third_party_imports() -> dict[str, list[str]]:
    """Import name -> the files (relative to the repository) that import it."""
    skip = _local_modules() | set(sys.stdlib_module_names) | {"__future__"}
    found: dict[str, list[str]] = {}
    for path in _sources():
        for name in top_level_imports(path.read_text()) - skip:
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _requirement_name(requirement: str) -> str:
    return _normalize(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0))


def declared() -> dict[str, str]:
    """Normalized distribution name -> where pyproject.toml declares it (core or an extra);
    the ``jaxwm[...]`` self-references are left out."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"dependencies": project["dependencies"]}
    groups.update((f"extra {extra}", requirements)
                  for extra, requirements in project.get("optional-dependencies", {}).items())
    names = {}
    for group, requirements in groups.items():
        for requirement in requirements:
            name = _requirement_name(requirement)
            if name != "jaxwm":
                names.setdefault(name, group)
    return names


def pinned() -> dict[str, str]:
    """Normalized distribution name -> the version constraints.txt pins it to."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            pins[_normalize(name)] = version.strip()
    return pins


def test_the_scan_sees_imports_wherever_they_are():
    source = ("import a.b, c\nfrom d.e import f\nfrom . import g\nfrom .h import i\n"
              "def j():\n    try:\n        import k\n    except ImportError:\n        pass\n")
    assert top_level_imports(source) == {"a", "c", "d", "k"}


def test_every_imported_package_is_a_declared_dependency():
    distributions = importlib.metadata.packages_distributions()
    names = declared()
    missing = {}
    for module, files in sorted(third_party_imports().items()):
        # An import name can differ from its distribution's (absl -> absl-py); one that is not
        # installed here is looked up under its own name.
        candidates = {_normalize(d) for d in distributions.get(module, [])} | {_normalize(module)}
        if not candidates & names.keys():
            missing[module] = (sorted(candidates), files)
    assert not missing, (
        "imported but not declared in pyproject.toml ([project] dependencies, or the extra of "
        "the feature that needs it; test-only imports go in the dev extra): "
        + "; ".join(f"{module} (distribution {'/'.join(dists)}) in {', '.join(files)}"
                    for module, (dists, files) in missing.items()))


def test_constraints_pin_every_declared_dependency():
    pins = pinned()
    unpinned = {name: group for name, group in declared().items() if name not in pins}
    assert not unpinned, (f"declared in pyproject.toml but not pinned (==) in constraints.txt: "
                          f"{unpinned}")
    assert "jaxwm" not in pins, "constraints.txt must not pin jaxwm itself"
