"""The report's statistics, through rliable (Agarwal et al. 2021, "Deep Reinforcement
Learning at the Edge of the Statistical Precipice", NeurIPS; google-research/rliable).

rliable is the field's reference for these estimates: the interquartile mean, the optimality
gap, stratified bootstrap confidence intervals (resampling runs within each task, so every
task keeps its weight), performance profiles and the probability of improvement. Writing
them again here would only add a second, less trusted copy.

Every estimate takes a ``seed``: the same runs give the same intervals. rliable's
resampling draws from NumPy's global generator (its ``random_state`` argument reaches arch's
bootstrap but not rliable's own index sampling), so ``seeded`` sets that generator for the
call and puts its state back after.
"""

from __future__ import annotations

import contextlib

import numpy as np


@contextlib.contextmanager
def seeded(seed: int):
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _rliable():
    try:
        from rliable import library, metrics
    except ImportError as e:
        raise ImportError("jaxwm.report needs rliable: pip install 'jaxwm[report]'.") from e
    return library, metrics


def interval(score_dict: dict, func, reps: int, seed: int, ci: float = 0.95):
    """``(points, intervals)``: ``func``'s value per key of ``score_dict`` ([runs, tasks, ...]
    arrays) and its stratified-bootstrap CI, ``[2, ...]`` (low, high)."""
    library, _ = _rliable()
    with seeded(seed):
        return library.get_interval_estimates(score_dict, func, reps=reps,
                                              confidence_interval_size=ci)


def mean_ci(values, reps: int, seed: int) -> tuple[float, float, float]:
    """The mean of ``values`` (one per seed) and its 95% bootstrap CI over seeds."""
    _, metrics = _rliable()
    points, intervals = interval({"x": np.asarray(values, np.float64)[:, None]},
                                 lambda x: np.array([metrics.aggregate_mean(x)]), reps, seed)
    return float(points["x"][0]), float(intervals["x"][0, 0]), float(intervals["x"][1, 0])


def curve_band(series: np.ndarray, reps: int, seed: int):
    """Mean over seeds of ``series`` [seeds, points] and its 95% bootstrap CI per point."""
    points, intervals = interval({"x": series[:, None, :]},
                                 lambda x: np.mean(x[:, 0, :], axis=0), reps, seed)
    return points["x"], intervals["x"][0], intervals["x"][1]


AGGREGATES = ("IQM", "Median", "Mean", "Optimality gap")


def aggregates(score_dict: dict, reps: int, seed: int, optimality_gap: bool = True) -> dict:
    """``{method: {aggregate: (point, low, high)}}`` over ``score_dict``'s [runs, tasks]
    normalised scores: IQM, median, mean and (on scores where 1 means solved) the optimality
    gap at 1."""
    _, metrics = _rliable()
    names = AGGREGATES if optimality_gap else AGGREGATES[:3]

    def func(x):
        values = [metrics.aggregate_iqm(x), metrics.aggregate_median(x), metrics.aggregate_mean(x)]
        if optimality_gap:
            values.append(metrics.aggregate_optimality_gap(x, 1.0))
        return np.array(values)

    points, intervals = interval(score_dict, func, reps, seed)
    return {method: {name: (float(points[method][i]), float(intervals[method][0, i]),
                            float(intervals[method][1, i])) for i, name in enumerate(names)}
            for method in score_dict}


def probability_of_improvement(score_dict: dict, pairs, reps: int, seed: int) -> dict:
    """``{(x, y): (P(X > Y), low, high)}``: the chance that a run of ``x`` beats a run of
    ``y`` on a task, averaged over tasks, for each pair of methods."""
    _, metrics = _rliable()
    pair_dict = {f"{x}\t{y}": (score_dict[x], score_dict[y]) for x, y in pairs}
    points, intervals = interval(pair_dict, metrics.probability_of_improvement, reps, seed)
    return {tuple(key.split("\t")): tuple(float(np.ravel(v)[0]) for v in
                                           (points[key], intervals[key][0], intervals[key][1]))
            for key in pair_dict}


def performance_profile(score_dict: dict, taus: np.ndarray, reps: int, seed: int):
    """``(profiles, cis)``: per method, the fraction of runs scoring above each tau, with its
    bootstrap CI."""
    library, _ = _rliable()
    with seeded(seed):
        return library.create_performance_profile(score_dict, taus, reps=reps)
