"""The report's figures (matplotlib, and rliable's plot helpers for its own estimates)."""

from __future__ import annotations

import numpy as np

from jaxwm.report import stats


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Axis labels in words for the metrics a report is usually asked for; any other key is spelled
# out from its parts (``eval/success_rate`` -> "eval success rate").
METRIC_WORDS = {"eval/episodic_return": "evaluation return (mean over episodes)",
                "charts/episodic_return": "training return (mean over episodes)",
                "eval/episodic_length": "evaluation episode length"}


def in_words(label: str) -> str:
    """A metric key or counter as an axis label in words; other labels as they are."""
    return METRIC_WORDS.get(label, label.replace("/", " ").replace("_", " "))


def curves(panels: dict, path: str, x_label: str, y_label: str) -> bool:
    """One panel per task: ``panels = {task: {group: (x, mean, low, high, per_seed)}}``, the
    mean over seeds with its 95% CI band and each seed as a thin line. False if nothing to
    draw."""
    fig = draw_curves(panels, x_label, y_label)
    if fig is None:
        return False
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return True


def draw_curves(panels: dict, x_label: str, y_label: str):
    """``curves``' figure, or None if nothing to draw."""
    panels = {task: lines for task, lines in panels.items() if lines}
    if not panels:
        return None
    plt = _pyplot()
    n = len(panels)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    points = False
    for ax, (task, lines) in zip(axes.flat, panels.items(), strict=False):
        for group, (x, mean, low, high, per_seed) in lines.items():
            seeds = len(per_seed)
            name = f"{group} ({seeds} seed{'s' * (seeds > 1)})"
            if len(x) == 1:  # a line through one point draws nothing
                _point(ax, x, mean, low, high, per_seed, name)
                points = True
                continue
            line, = ax.plot(x, mean, label=name)
            if seeds > 1:
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
                for values in per_seed:
                    ax.plot(x, values, color=line.get_color(), alpha=0.3, linewidth=0.6)
        ax.set_title(task)
        ax.set_xlabel(in_words(x_label))
        ax.set_ylabel(in_words(y_label))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("mean over seeds, 95% bootstrap CI shaded, seeds as thin lines"
                 + ("\none evaluation: the mean as a dot, its CI as a bar, seeds as small dots"
                    if points else ""), fontsize=9)
    fig.tight_layout()
    return fig


def _point(ax, x, mean, low, high, per_seed, name: str) -> None:
    """A group with one point on the grid (one evaluation): the mean as a marker, the CI as
    an error bar and each seed as a small dot."""
    line, = ax.plot(x, mean, marker="o", linestyle="none", label=name)
    if len(per_seed) > 1:
        color = line.get_color()
        below, above = np.maximum(mean - low, 0), np.maximum(high - mean, 0)
        ax.errorbar(x, mean, yerr=[below, above], color=color, linestyle="none", capsize=4)
        ax.plot(np.repeat(x, len(per_seed)), per_seed[:, 0], marker=".", linestyle="none",
                color=color, alpha=0.4)


def aggregates(results: dict, path: str, x_label: str, tasks: dict[str, int],
               runs: dict[str, int], reps: int) -> None:
    """``draw_aggregates``' figure, saved to ``path``."""
    fig = draw_aggregates(results, x_label, tasks, runs, reps)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _pyplot().close(fig)


def draw_aggregates(results: dict, x_label: str, tasks: dict[str, int], runs: dict[str, int],
                    reps: int):
    """rliable's interval-estimate plot of ``stats.aggregates``' output, each method named
    with its tasks and runs per task (``tasks``, ``runs``): a method of one task is an
    aggregate over that task's seeds alone, which the title then says."""
    from rliable import plot_utils

    names = list(next(iter(results.values())))
    label = {m: f"{m} ({tasks[m]} task{'s' * (tasks[m] > 1)} x {runs[m]} "
                f"run{'s' * (runs[m] > 1)})" for m in results}
    points = {label[m]: np.array([results[m][n][0] for n in names]) for m in results}
    intervals = {label[m]: np.array([[results[m][n][1] for n in names],
                                     [results[m][n][2] for n in names]]) for m in results}
    rows = len(results)
    fig, _ = plot_utils.plot_interval_estimates(
        points, intervals, metric_names=names, algorithms=list(label.values()),
        xlabel=in_words(x_label), row_height=max(0.5, 1.6 / rows),
        xlabel_y_coordinate=-0.45 / max(1, rows / 2))
    single = [m for m in results if tasks[m] == 1]
    fig.suptitle(f"95% stratified-bootstrap CIs ({reps} resamples)" + (
        f"\n{', '.join(single)}: one task, so each aggregate is over its runs alone"
        if single else ""), fontsize=9, y=1.3 + 0.1 * bool(single))
    return fig


def performance_profile(score_dict: dict, path: str, x_label: str, reps: int,
                        seed: int) -> None:
    """The fraction of runs scoring above each tau, per method (rliable)."""
    from rliable import plot_utils

    plt = _pyplot()
    everything = np.concatenate([s.ravel() for s in score_dict.values()])
    low, high = float(everything.min()), float(everything.max())
    taus = np.linspace(low, high if high > low else low + 1.0, 81)
    profiles, cis = stats.performance_profile(score_dict, taus, reps, seed)
    import seaborn as sns
    from matplotlib.lines import Line2D

    colors = dict(zip(score_dict, sns.color_palette("colorblind", len(score_dict)), strict=True))
    fig, ax = plt.subplots(figsize=(7, 4))
    plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=cis, ax=ax,
                                         xlabel=in_words(x_label), colors=colors)
    ax.legend([Line2D([0], [0], color=c) for c in colors.values()], list(colors), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def achievements(rates: dict, path: str) -> None:
    """Success rates in percent, ``{group: {achievement: rate}}``, as bars per achievement on
    a log scale (Crafter's figure: rare achievements stay visible), one colour per group."""
    plt = _pyplot()
    names = list(dict.fromkeys(n for per in rates.values() for n in per))
    width = 0.8 / max(len(rates), 1)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(names) + 2), 4.5))
    x = np.arange(len(names))
    for i, (group, per) in enumerate(rates.items()):
        values = np.array([per.get(n, np.nan) for n in names], np.float64)
        # log scale: a rate of 0 is drawn at the axis' floor (0.01%)
        ax.bar(x + (i - (len(rates) - 1) / 2) * width, np.maximum(np.nan_to_num(values), 1e-2),
               width, label=group)
    ax.set_yscale("log")
    ax.set_ylim(1e-2, 100)
    ax.set_ylabel("success rate (%)")
    ax.set_xticks(x, [n.replace("_", " ") for n in names], rotation=60, ha="right", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
