"""Craftax's and Crafter's achievements in the report: each achievement's success rate and
Crafter's score, per group (Hafner 2022, "Benchmarking the Spectrum of Agent Capabilities",
sec. 3.3; Matthews et al. 2024, Craftax).

An env that reports its episodes' achievements (``EnvSpec.outcomes``) logs, per achievement,
the share of episodes that unlocked it: ``charts/achievements/<name>`` over the training
episodes of each log window and ``eval/achievements/<name>`` over each evaluation's. The
report reads the namespace of its ``--metric``:

* ``eval/...``: each seed's last evaluation (the policy at the end of the run);
* ``charts/...``: each seed's training episodes over the whole run, every window weighted by
  its episodes (``charts/episodes``): Crafter's protocol, whose success rates are over all
  episodes of the 1M-step budget.

Success rates are in percent; Crafter's score is ``scores.crafter_score`` of a seed's rates,
its mean over seeds given with a 95% bootstrap CI where a group has two or more seeds.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from jaxwm import scores
from jaxwm.report import figures, stats
from jaxwm.report.runs import Group, Run, read_rows, seed_columns

SPACES = ("eval", "charts")


def space_of(metric: str) -> str | None:
    """``eval`` or ``charts``: the namespace of ``metric`` whose achievements go with it."""
    head = metric.split("/", 1)[0]
    return head if head in SPACES else None


def achievement_names(rows: list[dict], space: str) -> list[str]:
    """The achievements logged under ``<space>/achievements/``, in the order first logged
    (per-seed columns and their spread left out)."""
    prefix = f"{space}/achievements/"
    names = {}
    for row in rows:
        for column in row:
            if column.startswith(prefix):
                names.setdefault(column[len(prefix):].split("/", 1)[0], None)
    return list(names)


def _last(rows, column):
    values = [r[column] for r in rows if column in r]
    return values[-1] if values else np.nan


def _over_episodes(rows, column, episodes):
    points = [(r[column], r[episodes]) for r in rows
              if column in r and episodes in r and r[episodes] > 0 and np.isfinite(r[column])]
    if not points:
        return np.nan
    values, weights = np.asarray(points, np.float64).T
    return float(np.sum(values * weights) / np.sum(weights))


def seed_rates(run: Run, space: str) -> tuple[list[str], np.ndarray]:
    """The achievements of ``run`` and their success rates in percent, ``[seeds,
    achievements]`` (module docstring); no names where the run logged none."""
    rows, _ = read_rows(os.path.join(run.path, "metrics.jsonl"))
    names = achievement_names(rows, space)
    if not names:
        return [], np.zeros((0, 0))
    episodes = seed_columns(rows, "charts/episodes")
    rates = []
    for name in names:
        columns = seed_columns(rows, f"{space}/achievements/{name}")
        if space == "eval":
            rates.append([_last(rows, c) for c in columns])
        else:
            per_seed = episodes if len(episodes) == len(columns) else episodes[:1] * len(columns)
            rates.append([_over_episodes(rows, c, e) for c, e in zip(columns, per_seed,
                                                                     strict=True)])
    return names, 100.0 * np.asarray(rates, np.float64).T


def group_rates(groups: list[Group], space: str) -> dict[str, tuple[list[str], np.ndarray]]:
    """``{group label: (achievements, rates [seeds, achievements])}`` for the groups whose
    runs all logged the same achievements."""
    out = {}
    for group in groups:
        per_run = [seed_rates(run, space) for run in group.runs]
        names = per_run[0][0]
        if names and all(n == names for n, _ in per_run):
            out[group.label] = (names, np.concatenate([r for _, r in per_run]))
    return out


def _cell(mean: float, low: float, high: float) -> str:
    if not np.isfinite(mean):
        return "-"
    return f"{mean:.1f}" + (f" [{low:.1f}, {high:.1f}]" if np.isfinite(low) else "")


def write(groups: list[Group], metric: str, out: str, reps: int, seed: int,
          ci: bool) -> tuple[list[str], list[str]]:
    """The achievements section of ``table.md`` (its lines) and the files written
    (``achievements.csv``, ``achievements.png``); nothing where no run logged achievements
    in ``metric``'s namespace."""
    space = space_of(metric)
    rates = group_rates(groups, space) if space else {}
    if not rates:
        return [], []
    score = {}
    for label, (_, r) in rates.items():
        per_seed = scores.crafter_score(np.nan_to_num(r))
        score[label] = stats.mean_ci(per_seed, reps, seed) if ci and len(per_seed) > 1 else \
            (float(np.mean(per_seed)), np.nan, np.nan)
    which = ("each seed's last evaluation" if space == "eval" else
             "each seed's training episodes over the whole run, Crafter's protocol")
    labels = list(rates)
    lines = ["", "## Achievements", "",
             f"Success rates in % of episodes ({which}), the mean over seeds; Crafter's score "
             "is exp(mean ln(1 + rate)) - 1 of each seed's rates (Hafner 2022), with its 95% "
             "bootstrap CI over seeds.", "",
             "| achievement | " + " | ".join(labels) + " |", "|" + "---|" * (1 + len(labels)),
             "| **Crafter score** | " + " | ".join(_cell(*score[g]) for g in labels) + " |"]
    names = list(dict.fromkeys(n for names, _ in rates.values() for n in names))
    mean_rate = {g: dict(zip(names_, np.nanmean(r, axis=0), strict=True))
                 for g, (names_, r) in rates.items()}
    for name in names:
        lines.append(f"| {name} | " + " | ".join(
            _cell(mean_rate[g].get(name, np.nan), np.nan, np.nan) for g in labels) + " |")
    with open(os.path.join(out, "achievements.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["group", "seeds", "achievement", "success_rate_percent",
                         "score_low", "score_high"])
        for g in labels:
            seeds = rates[g][1].shape[0]
            writer.writerow([g, seeds, "crafter_score", *score[g]])
            for name in rates[g][0]:
                writer.writerow([g, seeds, name, mean_rate[g][name], "", ""])
    figures.achievements({g: mean_rate[g] for g in labels},
                         os.path.join(out, "achievements.png"))
    return lines, ["achievements.csv", "achievements.png"]
