"""Results a researcher can publish, from run directories: ``python -m jaxwm.report``.

Reads every run's ``config.json`` and ``metrics.jsonl`` (``report.runs``), groups runs that
differ only by seed, and writes to ``--out``:

* ``table.md`` / ``table.csv``: per group, the seeds, whether every run finished, the final
  and the best evaluation (mean over seeds and its 95% stratified-bootstrap CI), env steps,
  wall time and env steps per second;
* ``curves_env_steps.png`` / ``curves_wall_time.png``: learning curves, one panel per task,
  the mean over seeds with its CI band and each seed as a thin line;
* ``aggregates.md`` / ``.csv`` / ``.png``: across tasks, with rliable (``report.stats``): IQM,
  median, mean and optimality gap (normalised scores only) with stratified-bootstrap CIs, per
  method (a group less its task, ``env.id``); ``performance_profile.png``; and the probability
  of improvement of each method over each other that ran the same tasks.

Scores are the metric's values, normalised by ``--normalize`` (``jaxwm.scores``: raw, Atari
human-normalised, D4RL, DMC / 1000; by default ``auto``, each task's published score, raw for
tasks without one). ``make_report`` is the whole of it, for notebooks.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import os
import sys

import numpy as np

from jaxwm import scores
from jaxwm.report import figures, stats
from jaxwm.report.runs import (
    TASK_FIELD,
    ReportError,
    Run,
    find_runs,
    group_fields,
    group_runs,
    label,
    load_run,
    shared_env_streams,
)

CI_MODES = ("auto", "always", "never")


@dataclasses.dataclass
class Report:
    table: list[dict]  # one row per group
    aggregates: dict  # {method: {aggregate: (point, low, high)}}
    improvement: dict  # {(x, y): (P(X > Y), low, high)}
    skipped: list[tuple[str, str]]  # (run directory, why)
    files: list[str]
    markdown: str


def _fmt(value: float) -> str:
    if not np.isfinite(value):
        return "-"
    return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _estimate(values, ci: bool, reps: int, seed: int) -> tuple[float, float, float]:
    values = np.asarray(values, np.float64)
    if ci and len(values) > 1:
        return stats.mean_ci(values, reps, seed)
    return float(values.mean()), np.nan, np.nan


def _with_ci(point: float, low: float, high: float) -> str:
    if np.isfinite(low):
        return f"{_fmt(point)} [{_fmt(low)}, {_fmt(high)}]"
    return _fmt(point)


def _duration(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "-"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}" if minutes >= 60 else f"{seconds / 60:.1f} min"


def _status(runs: list[Run]) -> str:
    unfinished = [r for r in runs if not r.finished]
    if not unfinished:
        return "finished"
    least = min(r.progress for r in unfinished)
    return f"{len(unfinished)} of {len(runs)} in progress (from {least:.0%})"


def auto_normalization(env_id: str) -> str:
    """The score an env's results are published in: Atari's human-normalised score for the
    26 Atari 100k games, D4RL's for its MuJoCo tasks, DMC's return / 1000, raw otherwise."""
    if scores.atari_game(env_id):
        return "atari_hns"
    if scores.reference_returns(env_id):
        return "d4rl"
    try:
        from jaxwm.envs.families import infer_family

        return "dmc" if infer_family(env_id) == "dmc" else "raw"
    except Exception:  # noqa: BLE001 -- an id envpool does not know (crafter): raw
        return "raw"


def _normalized(run: Run, values, kind: str):
    env_id = str(run.config.get(TASK_FIELD, ""))
    return scores.normalize(values, env_id, auto_normalization(env_id) if kind == "auto"
                            else kind)


def _band(seeds, axis: str, normalize: str, run_of, reps: int, seed: int, ci: bool):
    """A group's curve on a shared grid: x, mean, low, high and each seed's values."""
    xs = [getattr(s, axis) for s in seeds]
    if any(np.isnan(x).all() for x in xs):
        return None
    end = min(x[-1] for x in xs)
    if axis == "env_steps":
        grid = xs[0][xs[0] <= end]
    else:
        grid = np.linspace(max(x[0] for x in xs), end, 60)
    if grid.size < 2:
        return None
    per_seed = np.stack([np.interp(grid, x, _normalized(run_of[id(s)], s.values, normalize))
                         for x, s in zip(xs, seeds, strict=True)])
    if ci and len(seeds) > 1:
        mean, low, high = stats.curve_band(per_seed, reps, seed)
    else:
        mean = low = high = per_seed.mean(0)
    return grid, mean, low, high, per_seed


def make_report(paths, out: str, metric: str = "eval/episodic_return", group_by=None,
                normalize: str = "auto", ci: str = "auto", reps: int = 2000, seed: int = 0,
                log=print) -> Report:
    """Reads the runs under ``paths`` and writes the report to ``out`` (module docstring).
    Bad input raises ``ReportError`` with what to do; unreadable runs are skipped and named."""
    if normalize not in (*scores.NORMALIZATIONS, "auto"):
        raise ReportError(f"unknown normalisation {normalize!r}; choose one of auto, "
                          f"{', '.join(scores.NORMALIZATIONS)}.")
    if ci not in CI_MODES:
        raise ReportError(f"unknown --ci {ci!r}; choose one of {', '.join(CI_MODES)}.")
    runs, skipped = [], []
    for path in find_runs(paths):
        run, why = load_run(path, metric)
        if run is None:
            skipped.append((path, why))
            log(f"jaxwm.report: skipped {path}: {why}")
        else:
            runs.append(run)
    if not runs:
        raise ReportError(f"no run has {metric!r} in its metrics.jsonl ({len(skipped)} run "
                          "directories read); pass --metric with a name from metrics.jsonl, "
                          "e.g. eval/episodic_return or charts/episodic_return.")
    fields = group_fields(runs, group_by)
    groups = dict(sorted(group_runs(runs, fields).items(), key=lambda kv: str(kv[0])))
    shared = [f"{label(fields, key)}: {note}" for key, members in groups.items()
              if (note := shared_env_streams(members))]
    for note in shared:
        log(f"jaxwm.report: {note}")
    if ci == "always":
        lonely = [label(fields, key) for key, members in groups.items()
                  if sum(len(r.seeds) for r in members) < 2]
        if lonely:
            raise ReportError(f"a confidence interval needs 2 or more seeds; {lonely[0]} has "
                              "one. Run more seeds (--config.num_seeds=N, or more --config.seed"
                              " values) or pass --ci auto or never.")
    try:
        for run in runs:
            _normalized(run, run.seeds[0].values[:1], normalize)
    except scores.UnknownNormalization as e:
        raise ReportError(str(e)) from None
    use_ci = ci != "never"
    if normalize == "auto":
        kinds = sorted({auto_normalization(str(r.config.get(TASK_FIELD, ""))) for r in runs})
        unit = ("normalised score (" + ", ".join(kinds) + ")") if kinds != ["raw"] else metric
    else:
        unit = scores.NORMALIZATIONS[normalize][0] if normalize != "raw" else metric
    os.makedirs(out, exist_ok=True)
    files = []

    # ---- the table
    table = []
    for key, members in groups.items():
        seeds = [(run, s) for run in members for s in run.seeds]
        final = [_normalized(r, s.final, normalize) for r, s in seeds]
        best = [_normalized(r, s.best, normalize) for r, s in seeds]
        steps = np.mean([r.env_steps for r in members])
        wall = np.mean([r.wall_seconds for r in members])
        table.append({
            **dict(zip(fields, key, strict=True)), "seeds": len(seeds), "status": _status(members),
            "final": _estimate(final, use_ci, reps, seed), "best": _estimate(best, use_ci, reps, seed),
            "env_steps": steps, "wall_seconds": wall,
            "steps_per_second": steps / wall if wall > 0 else np.nan})
    header = [*fields, "seeds", "status", f"final {unit} (95% CI)", f"best {unit} (95% CI)",
              "env steps", "wall time", "env steps/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table:
        lines.append("| " + " | ".join(
            [str(row[f]) for f in fields] + [str(row["seeds"]), row["status"],
                                             _with_ci(*row["final"]), _with_ci(*row["best"]),
                                             _fmt(row["env_steps"]), _duration(row["wall_seconds"]),
                                             _fmt(row["steps_per_second"])]) + " |")
    markdown = [f"# Report: {metric}" + (f", {unit}" if unit != metric else ""),
                "", f"{len(runs)} runs in {len(groups)} groups"
                + (f", grouped by {', '.join(fields)}" if fields else "") + ".", "", *lines]
    with open(os.path.join(out, "table.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*fields, "seeds", "status", "final", "final_low", "final_high", "best",
                         "best_low", "best_high", "env_steps", "wall_seconds", "env_steps_per_s"])
        for row in table:
            writer.writerow([row[f] for f in fields] + [row["seeds"], row["status"], *row["final"],
                            *row["best"], row["env_steps"], row["wall_seconds"],
                            row["steps_per_second"]])
    files += ["table.md", "table.csv"]

    # ---- learning curves, one panel per task
    method_fields = [f for f in fields if f != TASK_FIELD]
    x_axes = sorted({r.x_axis for r in runs})
    for axis, name, x_label in (("env_steps", "curves_env_steps.png",
                                 " / ".join(a.replace("_", " ") for a in x_axes)),
                                ("wall", "curves_wall_time.png", "wall seconds")):
        panels: dict = {}
        for key, members in groups.items():
            values = dict(zip(fields, key, strict=True))
            task = str(values.get(TASK_FIELD, members[0].config.get(TASK_FIELD, "")))
            seeds = [s for r in members for s in r.seeds]
            run_of = {id(s): r for r in members for s in r.seeds}
            band = _band(seeds, axis, normalize, run_of, reps, seed, use_ci)
            if band is not None:
                method = label(method_fields, [values[f] for f in method_fields])
                panels.setdefault(task, {})[method] = band
        if figures.curves(panels, os.path.join(out, name), x_label, unit):
            files.append(name)

    # ---- aggregates across tasks (rliable)
    score_dict, notes = {}, list(shared)
    methods: dict = {}
    for key, members in groups.items():
        values = dict(zip(fields, key, strict=True))
        method = label(method_fields, [values[f] for f in method_fields])
        for run in members:
            task = str(run.config.get(TASK_FIELD, ""))
            methods.setdefault(method, {}).setdefault(task, []).extend(
                _normalized(run, s.final, normalize) for s in run.seeds)
    if unit == metric and len({t for tasks in methods.values() for t in tasks}) > 1:
        notes.append("aggregates pool raw returns of different tasks as they are; pass "
                     "--normalize (atari_hns, d4rl, dmc) where their scales differ.")
    for method, tasks in methods.items():
        n = min(len(v) for v in tasks.values())
        if any(len(v) != n for v in tasks.values()):
            notes.append(f"{method}: tasks have {sorted({len(v) for v in tasks.values()})} "
                         f"seeds; the aggregates use the first {n} of each.")
        score_dict[method] = np.array([tasks[t][:n] for t in sorted(tasks)], np.float64).T
    gap = unit != metric  # "1 = solved" only means something on normalised scores
    results = stats.aggregates(score_dict, reps, seed, optimality_gap=gap)
    names = list(next(iter(results.values())))
    agg_lines = ["| method | tasks | runs per task | " + " | ".join(f"{n} (95% CI)" for n in names)
                 + " |", "|" + "---|" * (3 + len(names))]
    for method, values in results.items():
        agg_lines.append(f"| {method} | {score_dict[method].shape[1]} | "
                         f"{score_dict[method].shape[0]} | "
                         + " | ".join(_with_ci(*values[n]) for n in names) + " |")
    same_tasks = [(x, y) for x, y in itertools.permutations(methods, 2)
                  if sorted(methods[x]) == sorted(methods[y])]
    improvement = stats.probability_of_improvement(score_dict, same_tasks, reps, seed) \
        if same_tasks else {}
    markdown += ["", f"## Aggregates over tasks ({unit}; rliable, stratified bootstrap, "
                 f"{reps} resamples)", "", *agg_lines]
    if improvement:
        markdown += ["", "## Probability of improvement", "", "| X | Y | P(X > Y) (95% CI) |",
                     "|---|---|---|"]
        markdown += [f"| {x} | {y} | {_with_ci(*v)} |" for (x, y), v in improvement.items()]
    with open(os.path.join(out, "aggregates.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "aggregate", "point", "low", "high"])
        for method, values in results.items():
            for n, v in values.items():
                writer.writerow([method, n, *v])
    figures.aggregates(results, os.path.join(out, "aggregates.png"), unit)
    figures.performance_profile(score_dict, os.path.join(out, "performance_profile.png"), unit,
                                reps, seed)
    files += ["aggregates.csv", "aggregates.png", "performance_profile.png"]
    if notes or skipped:
        markdown += ["", "## Notes", ""] + [f"- {n}" for n in notes] + \
            [f"- skipped {path}: {why}" for path, why in skipped]
    for name in files:
        if name.endswith(".png"):
            markdown += ["", f"![{name}]({name})"]
    text = "\n".join(markdown) + "\n"
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    return Report(table, results, improvement, skipped, files, text)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m jaxwm.report",
        description="Tables and figures (rliable aggregates, seed bands) from jaxwm run "
                    "directories.")
    parser.add_argument("paths", nargs="+", help="run directories or folders holding them")
    parser.add_argument("--out", default="report", help="folder for the report (default: report)")
    parser.add_argument("--metric", default="eval/episodic_return")
    parser.add_argument("--group-by", default="",
                        help="comma-separated config settings (default: those that differ)")
    parser.add_argument("--normalize", default="auto", help="auto (default: each task's "
                        "published score: Atari 100k games human-normalised, D4RL tasks D4RL, "
                        "DMC / 1000, raw otherwise), " + ", ".join(
                            f"{k} ({v[0]})" for k, v in scores.NORMALIZATIONS.items()))
    parser.add_argument("--ci", default="auto", choices=CI_MODES,
                        help="95%% CIs: auto (groups with 2+ seeds), always (error otherwise), "
                             "never")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    args = parser.parse_args(argv)
    group_by = [f.strip() for f in args.group_by.split(",") if f.strip()] or None
    try:
        report = make_report(args.paths, args.out, args.metric, group_by, args.normalize,
                             args.ci, args.reps, args.seed,
                             log=lambda m: print(m, file=sys.stderr))
    except (ReportError, ImportError) as e:
        print(f"jaxwm.report: {e}", file=sys.stderr)
        return 2
    print(report.markdown)
    print(f"Written to {os.path.normpath(args.out)}/: {', '.join(report.files)}")
    return 0
