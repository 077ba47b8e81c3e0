"""Run directories as the report sees them: their config, one series per seed of a metric,
and how far they got.

A run directory is any folder with a ``config.json`` (``jaxwm.train`` writes it first). Its
``metrics.jsonl`` gives, per seed, the metric's values against ``counters/env_steps`` and
against the training wall time (``charts/wall_seconds``); a run of ``--config.num_seeds=N``
holds N seeds, as ``<metric>/seed_<k>`` columns. A line that is not a whole row (cut short
by a crash mid-write, or with a restarted run's first row written onto it) is skipped and
named in the run's ``note``; the rows around it still count.

Groups: runs of one algorithm whose configs agree on every setting that differs among that
algorithm's runs (or on the ``--group-by`` fields) are seeds of one group. Each algorithm
is grouped on its own settings, since two algorithms share few keys and every key one of
them lacks would otherwise "differ". Settings that never change what is learned (the seed,
log and checkpoint cadence, resume, devices) never split groups.

Seeds of a group are independent only if their runs share no env: envpool seeds env i of a
pool with seed + i, so separate runs with ``--config.seed`` 1, 2, 3 start most of their
training and evaluation episodes alike (``shared_env_streams`` names such groups).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import os
from collections.abc import Iterable, Sequence

import numpy as np

from jaxwm.loop.seeds import EVAL_SEED_OFFSET

# Settings that differ between seeds or bookkeeping, not between methods.
NOT_A_GROUP = ("seed", "resume", "num_devices", "num_seeds", "log.", "checkpoint.",
               "eval.every", "eval.video", "eval.num_envs")
TASK_FIELD = "env.id"


class ReportError(ValueError):
    """Bad input to the report: one line that says what to do."""


@dataclasses.dataclass
class Seed:
    """One seed's series: the metric ``values`` at ``env_steps`` (the run's x-axis where it
    takes no env steps: offline runs) and at ``wall`` seconds (NaN where a run predates
    wall-time logging)."""

    env_steps: np.ndarray
    wall: np.ndarray
    values: np.ndarray

    @property
    def final(self) -> float:
        return float(self.values[-1])

    @property
    def best(self) -> float:
        return float(np.max(self.values))


@dataclasses.dataclass
class Run:
    path: str
    config: dict  # flattened: {"env.id": "CartPole-v1", ...}
    seeds: list[Seed]
    progress: float  # fraction of the planned x-axis total reached (1.0: finished)
    env_steps: float
    wall_seconds: float  # NaN if not logged
    x_axis: str = "env_steps"  # what Seed.env_steps holds: the log.x_axis of offline runs
    note: str = ""  # what a reader should know about its files (lines skipped), or ""

    @property
    def finished(self) -> bool:
        return self.progress >= 1.0 - 1e-9

    @property
    def algo(self) -> str:
        return str(self.config.get("algo", ""))


@dataclasses.dataclass
class Group:
    """Runs that are seeds of one setting: ``fields`` name the group, ``values`` are its
    values of them."""

    fields: tuple[str, ...]
    values: tuple
    runs: list[Run]

    @property
    def settings(self) -> dict:
        return dict(zip(self.fields, self.values, strict=True))

    @property
    def label(self) -> str:
        return label(self.fields, self.values)

    @property
    def method(self) -> str:
        """The label less the task: what aggregates across tasks compare."""
        kept = [(f, v) for f, v in zip(self.fields, self.values, strict=True) if f != TASK_FIELD]
        return label([f for f, _ in kept], [v for _, v in kept])

    @property
    def task(self) -> str:
        return str(self.settings.get(TASK_FIELD, self.runs[0].config.get(TASK_FIELD, "")))


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value
    return out


def find_runs(paths: Sequence[str]) -> list[str]:
    """Every run directory at or below ``paths``, sorted; ``ReportError`` if a path does
    not exist or none holds a run."""
    found = []
    for path in paths:
        if not os.path.exists(path):
            raise ReportError(f"{path} does not exist; pass run directories (folders with a "
                              "config.json) or folders that hold them.")
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in ("checkpoints", "videos", "images"))
            if "config.json" in files:
                found.append(os.path.normpath(root))
                dirs[:] = []  # a run's own folders hold no runs
    if not found:
        raise ReportError(f"no run directories (folders with a config.json) under "
                          f"{', '.join(paths)}; point the report at jaxwm.train's --workdir "
                          "folders or at the folder that holds them.")
    return sorted(dict.fromkeys(found))


def seed_columns(rows: Iterable[dict], metric: str) -> list[str]:
    """``<metric>/seed_<k>`` columns present in ``rows``, by k; ``[metric]`` if none."""
    prefix = f"{metric}/seed_"
    ks = sorted({int(name[len(prefix):]) for row in rows for name in row
                 if name.startswith(prefix) and name[len(prefix):].isdigit()})
    return [f"{prefix}{k}" for k in ks] or [metric]


def read_rows(path: str) -> tuple[list[dict], list[int]]:
    """The rows of a ``metrics.jsonl`` and the numbers of its lines that are not whole rows.
    Those are skipped rather than fatal (unlike ``loop.metrics.read_jsonl``, which a resume
    uses to rewrite the file): a crash mid-write leaves a last line cut short, with or without
    its newline, and one broken line must not hide the evaluations before it."""
    rows, broken = [], []
    with open(path, errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                broken.append(number)
    return rows, broken


def _lines(numbers: Sequence[int]) -> str:
    """``line 7`` or ``lines 3, 7``."""
    return f"line{'s' * (len(numbers) > 1)} {', '.join(map(str, numbers))}"


def load_run(path: str, metric: str) -> tuple[Run | None, str]:
    """The run at ``path`` and ``""``, or ``None`` and why it was skipped."""
    with open(os.path.join(path, "config.json")) as f:
        config = flatten(json.load(f))
    metrics_path = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        return None, "no metrics.jsonl yet"
    rows, broken = read_rows(metrics_path)
    if not rows:
        return None, (f"metrics.jsonl has no whole row yet ({_lines(broken)} cut short "
                      "mid-write)" if broken else "metrics.jsonl is empty")
    columns = seed_columns(rows, metric)
    seeds = []
    for column in columns:
        points = [(r.get("counters/env_steps", r["step"]), r.get("charts/wall_seconds", np.nan),
                   r[column]) for r in rows if column in r]
        if points:
            seeds.append(Seed(*(np.asarray(v, np.float64) for v in zip(*points, strict=True))))
    if not seeds:
        return None, f"no {metric} in metrics.jsonl"
    last = rows[-1]
    env_steps = float(last.get("counters/env_steps", np.nan))
    if "charts/progress" in last:
        progress = float(last["charts/progress"])
    else:  # runs logged before progress was: the env-step budget
        total = config.get("total_env_steps")
        progress = env_steps / total if total and np.isfinite(env_steps) else 1.0
    wall = float(last.get("charts/wall_seconds", np.nan))
    x_axis = "env_steps" if "counters/env_steps" in last else str(config.get("log.x_axis", "step"))
    note = (f"skipped metrics.jsonl's {_lines(broken)}: not a whole row (cut short mid-write?)"
            if broken else "")
    return Run(path, config, seeds, progress, env_steps, wall, x_axis, note), ""


def check_group_by(runs: Sequence[Run], group_by: Sequence[str]) -> None:
    """``ReportError`` naming the close matches if a ``--group-by`` field is in no run."""
    known = set().union(*(r.config for r in runs))
    for field in group_by:
        if field not in known:
            close = difflib.get_close_matches(field, sorted(known), n=3)
            raise ReportError(f"--group-by {field!r} is not a config setting of any run"
                              + (f"; did you mean one of {', '.join(close)}?" if close
                                 else "; settings look like algo, env.id, ppo.lr."))


def differing(runs: Sequence[Run]) -> list[str]:
    """The settings whose values differ among ``runs`` (``NOT_A_GROUP`` aside), the task
    first."""
    keys = sorted(set().union(*(r.config for r in runs)))
    differ = [k for k in keys if not k.startswith(NOT_A_GROUP) and k not in NOT_A_GROUP
              and len({json.dumps(r.config.get(k), sort_keys=True, default=str)
                       for r in runs}) > 1]
    return sorted(differ, key=lambda k: (k != TASK_FIELD, k))


def _split(runs: Sequence[Run], fields: Sequence[str]) -> list[Group]:
    """``runs`` as groups by their values of ``fields``, ordered by those values."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.config.get(f) for f in fields), []).append(run)
    return [Group(tuple(fields), values, members)
            for values, members in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def make_groups(runs: Sequence[Run], group_by: Sequence[str] | None = None) -> list[Group]:
    """Runs that are seeds of one setting, by algorithm: with ``group_by``, by those fields
    (each checked to exist); otherwise each algorithm's runs by the settings that differ among
    them, after ``algo`` when there are several, and the task wherever tasks differ at all
    (a reader comparing algorithms needs each one's task even if it ran only one)."""
    if group_by:
        check_group_by(runs, group_by)
        return _split(runs, group_by)
    by_algo: dict[str, list[Run]] = {}
    for run in runs:
        by_algo.setdefault(run.algo, []).append(run)
    if len(by_algo) == 1:
        return _split(runs, differing(runs))
    task = [TASK_FIELD] if TASK_FIELD in differing(runs) else []
    groups = []
    for _, members in sorted(by_algo.items()):
        own = differing(members)
        groups += _split(members, ["algo", *task, *(f for f in own if f not in task)])
    return groups


def label(fields: Sequence[str], values: Sequence) -> str:
    """``algo=ppo, env.id=CartPole-v1`` (or ``all runs`` with no fields)."""
    return ", ".join(f"{f}={v}" for f, v in zip(fields, values, strict=True)) or "all runs"


def env_streams(run: Run) -> dict[str, set[int]]:
    """The envpool seeds of a run's envs (envpool seeds env i of a pool with seed + i): its
    evaluation pool's (``loop.evaluate.Evaluator``: ``num_seeds`` x min(``eval.num_envs``,
    ``eval.num_episodes``) envs, the length of its tiled ``episode_quotas``, from seed +
    ``EVAL_SEED_OFFSET``; restated here so that the report needs no env library) and, where
    it steps an env to train, its training pool's (``num_seeds`` x ``env.num_envs`` envs
    from seed)."""
    c = run.config
    seed, seeds = int(c.get("seed", 0)), int(c.get("num_seeds", 1))
    evaluation = seeds * min(int(c.get("eval.num_envs", 1)), int(c.get("eval.num_episodes", 1)))
    streams = {"evaluation": set(range(seed + EVAL_SEED_OFFSET,
                                       seed + EVAL_SEED_OFFSET + evaluation))}
    if run.x_axis == "env_steps":  # offline runs step no env to train
        streams["training"] = set(range(seed, seed + seeds * int(c.get("env.num_envs", 1))))
    return streams


def shared_env_streams(members: Sequence[Run]) -> str:
    """A note if runs of one group share envs (so their seeds are not independent), else
    ``""``."""
    pairs = []
    for a, b in itertools.combinations(members, 2):
        sa, sb = env_streams(a), env_streams(b)
        shared = {kind: (len(sa[kind] & sb[kind]), len(sa[kind])) for kind in sa
                  if kind in sb and sa[kind] & sb[kind]}
        if shared:
            pairs.append((a, b, shared))
    if not pairs:
        return ""
    a, b, shared = pairs[0]
    what = " and ".join(f"{n} of {total} {kind} envs" for kind, (n, total) in shared.items())
    return (f"{len(pairs)} pair(s) of runs share envs, e.g. {a.path} (seed {a.config.get('seed')}) "
            f"and {b.path} (seed {b.config.get('seed')}): {what} start their episodes alike "
            "(envpool seeds env i with seed + i), so these seeds are not independent. Space "
            "separate runs' seeds by more than their pools (--config.seed=1000, 2000, 3000) or "
            "run them as --config.num_seeds.")
