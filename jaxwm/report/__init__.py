"""Results a researcher can publish, from run directories: ``python -m jaxwm.report``.

Reads every run's ``config.json`` and ``metrics.jsonl`` (``report.runs``), groups runs that
differ only by seed, and writes to ``--out``:

* ``table.md`` / ``table.csv``: per group, the seeds, whether every run finished, the final
  and the best evaluation (mean over seeds and its 95% stratified-bootstrap CI), env steps,
  wall time and env steps per second; over several algorithms, ``table.md`` has a table per
  algorithm, its columns the settings that differ among that algorithm's runs;
* ``curves_env_steps.png`` / ``curves_wall_time.png``: learning curves, one panel per task,
  the mean over seeds with its CI band and each seed as a thin line (one evaluation: a dot
  with a CI bar). Runs that count no env steps (offline: MOPO, diffusion) are drawn against
  their own counter instead (``curves_<log.x_axis>.png``, e.g. ``curves_agent_updates.png``),
  and a line on stderr and in the notes says so, as for any figure not written;
* ``aggregates.md`` / ``.csv`` / ``.png``: across tasks, with rliable (``report.stats``): IQM,
  median, mean and optimality gap (normalised scores only) with stratified-bootstrap CIs, per
  method (a group less its task, ``env.id``); ``performance_profile.png``; and the probability
  of improvement of each method over each other that ran the same tasks;
* ``achievements.csv`` / ``.png`` and a table in ``table.md``, for envs that log achievements
  (Craftax, Crafter): each achievement's success rate per group and Crafter's score
  (``report.achievements``).

Scores are the metric's values, normalised by ``--normalize`` (``jaxwm.scores``: raw, Atari
human-normalised, D4RL, DMC / 1000, Craftax's % of max; by default ``auto``, each task's
published score, raw for tasks without one, MinAtar's among them). ``make_report`` is the
whole of it, for notebooks.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import os
import sys

import numpy as np

from jaxwm import scores
from jaxwm.report import achievements, figures, stats
from jaxwm.report.runs import (
    TASK_FIELD,
    Group,
    ReportError,
    Run,
    find_runs,
    load_run,
    make_groups,
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
    26 Atari 100k games, D4RL's for its MuJoCo tasks, DMC's return / 1000 (envpool's and
    Playground's DM Control tasks), Craftax's % of max for Craftax and Crafter, raw otherwise
    (MinAtar's and classic control's returns are published raw)."""
    if scores.atari_game(env_id):
        return "atari_hns"
    if scores.reference_returns(env_id):
        return "d4rl"
    if scores.craftax_max_return(env_id):
        return "craftax"
    if env_id.startswith("playground:"):  # jaxwm takes Playground's DM Control Suite tasks
        return "dmc"
    try:
        from jaxwm.envs.families import infer_family

        return "dmc" if infer_family(env_id) == "dmc" else "raw"
    except Exception:  # noqa: BLE001 -- an id envpool does not know (crafter): raw
        return "raw"


def _normalized(run: Run, values, kind: str):
    env_id = str(run.config.get(TASK_FIELD, ""))
    return scores.normalize(values, env_id, auto_normalization(env_id) if kind == "auto"
                            else kind)


def _grid(xs, axis: str) -> np.ndarray:
    """Where a group's seeds are compared: the first seed's own points on a counter, 60
    times across the stretch every seed covers on the wall clock; one point (their mean final
    x) where they cover no stretch together, e.g. one evaluation each."""
    start, end = max(x[0] for x in xs), min(x[-1] for x in xs)
    if axis == "env_steps":
        grid = xs[0][xs[0] <= end]
    else:
        grid = np.linspace(start, end, 60) if end > start else np.empty(0)
    return grid if grid.size else np.array([np.mean([x[-1] for x in xs])])


def _band(seeds, axis: str, normalize: str, run_of, reps: int, seed: int, ci: bool):
    """A group's curve on a shared grid: x, mean, low, high and each seed's values. ``axis``
    is the ``Seed`` attribute: ``env_steps`` (the run's counter) or ``wall``."""
    xs = [getattr(s, axis) for s in seeds]
    if any(np.isnan(x).all() for x in xs):
        return None
    grid = _grid(xs, axis)
    per_seed = np.stack([np.interp(grid, x, _normalized(run_of[id(s)], s.values, normalize))
                         for x, s in zip(xs, seeds, strict=True)])
    if ci and len(seeds) > 1:
        mean, low, high = stats.curve_band(per_seed, reps, seed)
    else:
        mean = low = high = per_seed.mean(0)
    return grid, mean, low, high, per_seed


def _load(paths, metric: str, log) -> tuple[list[Run], list[tuple[str, str]]]:
    """The runs under ``paths`` that have ``metric``, and (path, why) for those skipped."""
    runs, skipped = [], []
    for path in find_runs(paths):
        run, why = load_run(path, metric)
        if run is None:
            skipped.append((path, why))
            log(f"jaxwm.report: skipped {path}: {why}")
            continue
        runs.append(run)
        if run.note:
            log(f"jaxwm.report: {path}: {run.note}")
    return runs, skipped


def _table_row(group: Group, normalize: str, ci: bool, reps: int, seed: int) -> dict:
    seeds = [(run, s) for run in group.runs for s in run.seeds]
    final = [_normalized(r, s.final, normalize) for r, s in seeds]
    best = [_normalized(r, s.best, normalize) for r, s in seeds]
    steps = np.mean([r.env_steps for r in group.runs])
    wall = np.mean([r.wall_seconds for r in group.runs])
    return {**group.settings, "seeds": len(seeds), "status": _status(group.runs),
            "final": _estimate(final, ci, reps, seed), "best": _estimate(best, ci, reps, seed),
            "env_steps": steps, "wall_seconds": wall,
            "steps_per_second": steps / wall if wall > 0 else np.nan}


def _markdown_table(fields, rows: list[dict], unit: str) -> list[str]:
    header = [*fields, "seeds", "status", f"final {unit} (95% CI)", f"best {unit} (95% CI)",
              "env steps", "wall time", "env steps/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(
            [str(row[f]) for f in fields] + [str(row["seeds"]), row["status"],
                                             _with_ci(*row["final"]), _with_ci(*row["best"]),
                                             _fmt(row["env_steps"]), _duration(row["wall_seconds"]),
                                             _fmt(row["steps_per_second"])]) + " |")
    return lines


def _grouped_by(groups: list[Group], fields) -> str:
    """``3 runs in 2 groups, grouped by ppo.lr.``"""
    runs = sum(len(g.runs) for g in groups)
    return (f"{runs} run{'s' * (runs != 1)} in {len(groups)} group{'s' * (len(groups) != 1)}"
            + (f", grouped by {', '.join(fields)}" if fields else "") + ".")


def _table_markdown(groups: list[Group], rows: list[dict], unit: str,
                    per_algo: bool) -> list[str]:
    """One table; or, ``per_algo``, a section per algorithm whose columns are the settings
    that differ among its runs (another algorithm's keys would be empty columns)."""
    if not per_algo:
        fields = groups[0].fields
        return [_grouped_by(groups, fields), "", *_markdown_table(fields, rows, unit)]
    algos = list(dict.fromkeys(g.runs[0].algo for g in groups))
    lines = [f"{sum(len(g.runs) for g in groups)} runs of {len(algos)} algorithms in "
             f"{len(groups)} groups; each algorithm's table shows the settings that differ "
             "among its runs."]
    for algo in algos:
        mine = [(g, row) for g, row in zip(groups, rows, strict=True) if g.runs[0].algo == algo]
        fields = [f for f in mine[0][0].fields if f != "algo"]
        lines += ["", f"## {algo}", "", _grouped_by([g for g, _ in mine], fields), "",
                  *_markdown_table(fields, [row for _, row in mine], unit)]
    return lines


def _write_table_csv(path: str, groups: list[Group], rows: list[dict]) -> None:
    """Every group's settings as columns (blank where a group has no such setting)."""
    fields = list(dict.fromkeys(f for g in groups for f in g.fields))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*fields, "seeds", "status", "final", "final_low", "final_high", "best",
                         "best_low", "best_high", "env_steps", "wall_seconds", "env_steps_per_s"])
        for row in rows:
            writer.writerow([row.get(f, "") for f in fields] + [
                row["seeds"], row["status"], *row["final"], *row["best"], row["env_steps"],
                row["wall_seconds"], row["steps_per_second"]])


def _curve_figures(groups: list[Group]) -> list[tuple[str, str, str, list[Group]]]:
    """(axis, file, x label, groups) per figure: env steps for the runs that count them,
    one per other counter that runs are logged against (offline runs: ``log.x_axis``, e.g.
    agent_updates), and wall time for every run."""
    by_axis: dict[str, list[Group]] = {"env_steps": []}
    for group in groups:
        axes = {r.x_axis for r in group.runs}
        if len(axes) == 1:
            by_axis.setdefault(axes.pop(), []).append(group)
    figures_ = [(axis, f"curves_{axis}.png", axis.replace("_", " "), members)
                for axis, members in by_axis.items()]
    return [*figures_, ("wall", "curves_wall_time.png", "wall seconds", list(groups))]


def _env_steps_note(groups: list[Group], drawn: list[Group], files: list[str]) -> str:
    """One line on the groups ``curves_env_steps.png`` lacks (they count no env steps), or
    ``""``."""
    left = [g for g in groups if g not in drawn]
    if not left:
        return ""
    instead = sorted(f"curves_{a}.png" for a in {r.x_axis for g in left for r in g.runs}
                     if f"curves_{a}.png" in files)
    where = f"; {', '.join(instead)} draws them against their own counter" if instead else ""
    if not drawn:
        return f"no curves_env_steps.png: no run counts env steps (offline runs){where}."
    return (f"curves_env_steps.png leaves out {', '.join(g.label for g in left)}: "
            f"{'its' if len(left) == 1 else 'their'} runs count no env steps (offline "
            f"runs){where}.")


def _write_curves(groups: list[Group], out: str, unit: str, band) -> tuple[list[str], list[str]]:
    """The learning-curve figures, one panel per task (``_curve_figures``), and one line for
    each figure not written or that leaves groups out. ``band(seeds, axis, run_of)``."""
    files, notes, env_steps_groups = [], [], []
    for axis, name, x_label, members in _curve_figures(groups):
        panels: dict = {}
        for group in members:
            seeds = [s for r in group.runs for s in r.seeds]
            curve = band(seeds, "wall" if axis == "wall" else "env_steps",
                         {id(s): r for r in group.runs for s in r.seeds})
            if curve is not None:
                panels.setdefault(group.task, {})[group.method] = curve
        if figures.curves(panels, os.path.join(out, name), x_label, unit):
            files.append(name)
        elif axis == "wall":
            notes.append("no curves_wall_time.png: no run logs charts/wall_seconds (runs "
                         "written before jaxwm logged it).")
        if axis == "env_steps":
            env_steps_groups = members
    note = _env_steps_note(groups, env_steps_groups, files)
    return files, [note, *notes] if note else notes


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
    runs, skipped = _load(paths, metric, log)
    if not runs:
        raise ReportError(f"no run has {metric!r} in its metrics.jsonl ({len(skipped)} run "
                          "directories read); pass --metric with a name from metrics.jsonl, "
                          "e.g. eval/episodic_return or charts/episodic_return.")
    groups = make_groups(runs, group_by)
    shared = [f"{g.label}: {note}" for g in groups if (note := shared_env_streams(g.runs))]
    for note in shared:
        log(f"jaxwm.report: {note}")
    if ci == "always":
        lonely = [g.label for g in groups if sum(len(r.seeds) for r in g.runs) < 2]
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

    # ---- the table: per algorithm when several (and --group-by not given)
    table = [_table_row(g, normalize, use_ci, reps, seed) for g in groups]
    per_algo = not group_by and len({r.algo for r in runs}) > 1
    markdown = [f"# Report: {metric}" + (f", {unit}" if unit != metric else ""), "",
                *_table_markdown(groups, table, unit, per_algo)]
    _write_table_csv(os.path.join(out, "table.csv"), groups, table)
    files = ["table.md", "table.csv"]

    # ---- learning curves, one panel per task
    curve_files, curve_notes = _write_curves(
        groups, out, unit, lambda seeds, axis, run_of: _band(seeds, axis, normalize, run_of,
                                                             reps, seed, use_ci))
    files += curve_files
    for note in curve_notes:
        log(f"jaxwm.report: {note}")

    # ---- aggregates across tasks (rliable)
    score_dict = {}
    notes = [*shared, *curve_notes, *(f"{r.path}: {r.note}" for r in runs if r.note)]
    methods: dict = {}
    for group in groups:
        for run in group.runs:
            task = str(run.config.get(TASK_FIELD, ""))
            methods.setdefault(group.method, {}).setdefault(task, []).extend(
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
    figures.aggregates(results, os.path.join(out, "aggregates.png"), unit,
                       tasks={m: s.shape[1] for m, s in score_dict.items()},
                       runs={m: s.shape[0] for m, s in score_dict.items()}, reps=reps)
    figures.performance_profile(score_dict, os.path.join(out, "performance_profile.png"), unit,
                                reps, seed)
    files += ["aggregates.csv", "aggregates.png", "performance_profile.png"]
    achievement_lines, achievement_files = achievements.write(groups, metric, out, reps, seed,
                                                              use_ci)
    markdown += achievement_lines
    files += achievement_files
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


def main(argv=None, prog: str = "python -m jaxwm.report") -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Tables and figures (rliable aggregates, seed bands) from jaxwm run "
                    "directories.")
    parser.add_argument("paths", nargs="+", help="run directories or folders holding them")
    parser.add_argument("--out", default="report", help="folder for the report (default: report)")
    parser.add_argument("--metric", default="eval/episodic_return")
    parser.add_argument("--group-by", default="",
                        help="comma-separated config settings (default: those that differ)")
    parser.add_argument("--normalize", default="auto", help="auto (default: each task's "
                        "published score: Atari 100k games human-normalised, D4RL tasks D4RL, "
                        "DMC / 1000, Craftax and Crafter %% of max, raw otherwise), " + ", ".join(
                            f"{k} ({v[0]})".replace("%", "%%")  # argparse's % formatting
                            for k, v in scores.NORMALIZATIONS.items()))
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
