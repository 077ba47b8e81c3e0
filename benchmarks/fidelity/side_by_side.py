"""What every side-by-side comparison in this folder shares: settings changed on both sides
at once (``--set key=value``), the runs started one seed after another (pinned to cores so
that two sides share a machine without oversubscribing it), the curve metrics, and the
figure with its mean band."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
from jaxwm.report import figures, stats  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "fidelity")
FIGURES = os.path.join(ROOT, "docs", "figures")


# envpool seeds env i of a pool with seed + i, and jaxwm's evaluation pool is seeded from
# ``--config.seed`` + 10,000: two jaxwm runs whose seeds differ by less than a pool's size share
# env streams. With seeds 1, 2 and 3 and MOPO's 5 evaluation envs (2 episodes each), 8 of seed
# 2's 10 evaluation episodes start where seed 1's do, at every evaluation
# (eval_starts.py measures it). A comparison's seed s therefore runs
# jaxwm with ``--config.seed = JAXWM_SEED_STRIDE * s``: pools of fewer envs than the stride
# share nothing.
JAXWM_SEED_STRIDE = 1000


def jaxwm_seed(seed: int) -> int:
    """jaxwm's ``--config.seed`` for a comparison's seed ``seed`` (``JAXWM_SEED_STRIDE``)."""
    return JAXWM_SEED_STRIDE * seed


def with_overrides(settings, pairs: list[str]):
    """``settings`` (a frozen dataclass) with ``key=value`` pairs applied, each value cast to
    the field's type; an unknown key or an empty value stops with the known keys."""
    fields = {f.name for f in dataclasses.fields(settings)}
    changes = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in fields or not value:
            raise SystemExit(f"--set {pair!r}: expected key=value with key one of {sorted(fields)}")
        changes[key] = type(getattr(settings, key))(value)
    return dataclasses.replace(settings, **changes)


def run_seeds(commands: dict[int, tuple[str, list[str]]], cpus: str | None,
              dry_run: bool) -> None:
    """Run ``{seed: (logdir, command)}`` one after another from the repository root; a log
    folder that exists stops everything before anything runs (nothing is overwritten)."""
    for logdir, _ in commands.values():
        if os.path.exists(os.path.join(ROOT, logdir)):
            raise SystemExit(f"{logdir} exists: move it away or choose another --runs; "
                             "nothing was overwritten.")
    for _, command in commands.values():
        if cpus:  # one process per core: two runs side by side without oversubscription
            command = ["taskset", "-c", cpus, *command]
        print(" ".join(command), flush=True)
        if not dry_run:
            subprocess.run(command, check=True, cwd=ROOT)


def largest_fall(curve: np.ndarray) -> float:
    """The largest fall of a curve below its best so far: the depth of the worst collapse,
    whenever it comes (NaN windows, not reached yet, are left out)."""
    done = curve[~np.isnan(curve)]
    return float(np.max(np.maximum.accumulate(done) - done)) if len(done) else float("nan")


def fmt(x) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    return f"{x:.0f}" if isinstance(x, float) else str(x)


def band_lines(curves: dict, x: np.ndarray, labels: dict) -> dict:
    """{label: (x, mean, low, high, per-seed curves)} for ``figures.curves``: the mean over
    seeds with its bootstrap 95% band, over the points every seed of a side has reached."""
    lines = {}
    for side, seeds in curves.items():
        series = np.stack(list(seeds.values()))
        reached = ~np.isnan(series).any(axis=0)
        mean, low, high = stats.curve_band(series[:, reached], reps=2000, seed=0)
        lines[labels[side]] = (x[reached], mean, low, high, list(series[:, reached]))
    return lines


def save_figure(panels: dict, path: str, x_label: str, y_label: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    figures.curves(panels, path, x_label, y_label)


def save_table(results: str, name: str, payload: dict, curves: dict, text: str) -> None:
    """``<name>.json`` (``payload`` and every curve, NaN as null) and ``<name>.md``."""
    os.makedirs(results, exist_ok=True)
    as_lists = {side: {seed: [None if np.isnan(v) else float(v) for v in curve]
                       for seed, curve in seeds.items()} for side, seeds in curves.items()}
    with open(os.path.join(results, f"{name}.json"), "w") as f:
        json.dump(dict(payload, curves=as_lists), f, indent=1)
    with open(os.path.join(results, f"{name}.md"), "w") as f:
        f.write(text)
    print(text)


def add_reused(curves: dict, labels: dict, path: str, requests: list[str]) -> None:
    """Add to ``curves`` (and ``labels``) each ``SIDE[=LABEL]`` of ``--reuse``: that side's
    curves from the results JSON at ``path`` (an earlier plot's, e.g. the committed one whose
    runs were made on another day), read before this plot overwrites it. Where this plot has
    runs of its own under that label, the stored seeds join them (more seeds for a side whose
    first runs' logs are gone); a seed in both is an error."""
    if not requests:
        return
    if not os.path.exists(path):
        raise SystemExit(f"--reuse: {path} does not exist (an earlier plot writes it)")
    with open(path) as f:
        stored = json.load(f)["curves"]
    for request in requests:
        side, _, label = request.partition("=")
        label = label or side
        if side not in stored:
            raise SystemExit(f"--reuse {request!r}: {path} has the sides {sorted(stored)}")
        reused = {int(seed): np.array([np.nan if v is None else v for v in values], float)
                  for seed, values in stored[side].items()}
        both = sorted(set(reused) & set(curves.get(label, {})))
        if both:
            raise SystemExit(f"--reuse {side}: seeds {both} of {label!r} have runs here too; "
                             "give another label (--reuse SIDE=LABEL)")
        curves[label] = {**reused, **curves.get(label, {})}
        labels[label] = labels.get(side, side) if label == side else label


def command_line(doc: str, presets: dict, default_preset: str, runs: str, sides: tuple,
                 set_example: str):
    """The ``run`` / ``plot`` command line every comparison shares: (parser, run's subparser,
    plot's subparser), each tool adding its own options to the two subparsers."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("run", "plot"):
        q = sub.add_parser(name)
        q.add_argument("--preset", choices=sorted(presets), default=default_preset)
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help=f"change one setting on both sides, e.g. --set {set_example}")
        q.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
        q.add_argument("--runs", default=runs, help=f"log folders' parent (default {runs})")
    r = sub.choices["run"]
    r.add_argument("--side", choices=sides, required=True)
    r.add_argument("--dry-run", action="store_true", help="print the commands only")
    r.add_argument("--cpus", help="pin the runs to these cores (taskset -c), e.g. 0: two "
                                  "sides at once on 2 cores, one core each")
    q = sub.choices["plot"]
    q.add_argument("--suffix", default="", help="appended to the output files' names")
    q.add_argument("--results", default=RESULTS, help="where the table goes (JSON, markdown)")
    q.add_argument("--figures", default=FIGURES, help="where the figure goes")
    q.add_argument("--reuse", action="append", default=[], metavar="SIDE[=LABEL]",
                   help="plot SIDE's curves from the results JSON this plot replaces (runs "
                        "whose logs are not here), under LABEL if given")
    return p, r, q
