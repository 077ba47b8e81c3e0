"""DreamerV3 side by side with the official code (danijar/dreamerv3): the same task, settings,
env-step budget and seeds on both sides, and one figure and table from both sides' logs.

  # both sides, seeds 1-3, the CPU preset (each run 15-45 min on 2 cores):
  python benchmarks/fidelity/dreamer.py run --side jaxwm --seeds 1 2 3
  python benchmarks/fidelity/dreamer.py run --side official --seeds 1 2 3 \\
      --official-python <venv>/bin/python --src <dreamerv3 checkout>
  # the figure (docs/figures/) and table (benchmarks/results/fidelity/) from the logs:
  python benchmarks/fidelity/dreamer.py plot

One table of settings (``PRESETS``) gives both sides their command lines, so a comparison
cannot drift apart on one side; ``--set key=value`` changes a setting on both. Each side logs
the return of every training episode (the policy sampling its actions, as it collects): jaxwm
as ``charts/episodic_return`` in ``metrics.jsonl`` (the mean of the episodes that ended since
the last log line, every 1000 env steps), the official code as ``episode/score`` in
``scores.jsonl`` (one line per episode). Both are averaged in windows of ``--window`` env
steps, the same windows on both sides. Setting up the official side:
benchmarks/fidelity/README.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
from side_by_side import (
    HERE,
    add_reused,
    band_lines,
    command_line,
    fmt,
    jaxwm_seed,
    largest_fall,
    run_seeds,
    save_figure,
    save_table,
    with_overrides,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from jaxwm.loop.metrics import read_jsonl  # noqa: E402  (a last line cut short is left out)

RUNS = os.path.join("runs", "fidelity", "dreamer_cartpole")
SIDES = ("jaxwm", "official")
LABELS = {"jaxwm": "jaxwm", "official": "danijar/dreamerv3"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What both sides are given. ``horizon`` is the official parameter: the discount is
    1 - 1/horizon on both sides (jaxwm's ``dreamer.gamma``)."""

    task: str = "CartPole-v1"
    steps: int = 40_000  # env steps over all envs
    envs: int = 4
    size: str = "1m"
    batch_size: int = 16
    batch_length: int = 32
    train_ratio: float = 32.0  # replayed steps per env step
    lr: float = 3e-4
    warmup: int = 100  # updates
    horizon: int = 100


PRESETS = {
    # dreamer:cartpole's settings, which fit ~3k updates into a CPU budget.
    "cpu": Settings(),
    # The official defaults for a re-run on an accelerator (~1500 updates per 50k env steps
    # at these settings; the official warm-up alone is 1000).
    "official": Settings(steps=200_000, batch_length=64, lr=4e-5, warmup=1000, horizon=333),
}


def jaxwm_command(s: Settings, seed: int, logdir: str) -> list[str]:
    """jaxwm's command for ``s``, seed ``seed`` of the comparison run at ``--config.seed`` =
    ``side_by_side.jaxwm_seed(seed)`` (1000 x seed), so that its runs share no env: with
    seeds 1, 2, 3 as given, the 4-env training pools of neighbouring seeds share 3 envs."""
    flags = {
        "seed": jaxwm_seed(seed), "env.id": s.task, "env.num_envs": s.envs,
        "total_env_steps": s.steps,
        "dreamer.model_size": s.size, "dreamer.batch_size": s.batch_size,
        "dreamer.batch_length": s.batch_length, "dreamer.train_ratio": s.train_ratio,
        "dreamer.learning_rate": s.lr, "dreamer.warmup": s.warmup,
        "dreamer.gamma": 1.0 - 1.0 / s.horizon, "dreamer.capacity": s.steps + 1000,
        "log.progress": False,
    }
    return [sys.executable, "-m", "jaxwm.train", "--config=dreamer:cartpole",
            f"--workdir={logdir}", *(f"--config.{k}={v}" for k, v in flags.items())]


def official_command(s: Settings, seed: int, logdir: str, python: str, src: str) -> list[str]:
    flags = {
        "configs": f"size{s.size}", "task": f"gym_{s.task}", "seed": seed, "logdir": logdir,
        "jax.platform": "cpu", "jax.compute_dtype": "float32", "run.envs": s.envs,
        "run.steps": s.steps, "batch_size": s.batch_size, "batch_length": s.batch_length,
        "run.train_ratio": s.train_ratio, "agent.opt.lr": s.lr, "agent.opt.warmup": s.warmup,
        "agent.horizon": s.horizon, "logger.outputs": "jsonl",
    }
    args = [a for k, v in flags.items() for a in (f"--{k}", str(v))]
    return [python, os.path.join(HERE, "dreamer_official.py"), "--src", src, *args]


# ----------------------------------------------------------------------------- logs


def episode_returns(side: str, logdir: str) -> tuple[np.ndarray, np.ndarray]:
    """(env steps, training-episode return) as the side logged them."""
    if side == "jaxwm":
        rows = [r for r in read_jsonl(os.path.join(logdir, "metrics.jsonl"))
                if "charts/episodic_return" in r]
        return (np.array([r["counters/env_steps"] for r in rows], float),
                np.array([r["charts/episodic_return"] for r in rows], float))
    rows = [r for r in read_jsonl(os.path.join(logdir, "scores.jsonl")) if "episode/score" in r]
    return (np.array([r["step"] for r in rows], float),
            np.array([r["episode/score"] for r in rows], float))


def windowed(steps: np.ndarray, values: np.ndarray, window: int, total: int) -> np.ndarray:
    """The mean of ``values`` in each window of ``window`` env steps up to ``total`` (NaN
    where a window holds none: the run has not got there)."""
    edges = np.arange(0, total + window, window)
    out = np.full(len(edges) - 1, np.nan)
    which = np.digitize(steps, edges[1:], right=True)
    for i in range(len(out)):
        inside = values[which == i]
        if len(inside):
            out[i] = inside.mean()
    return out


def dip_after_solving(curve: np.ndarray, solved: float) -> float:
    """The lowest windowed return after the first window at or above ``solved`` (NaN if
    never solved): the collapse this comparison is about."""
    hit = np.flatnonzero(curve >= solved)
    if not len(hit) or hit[0] + 1 >= len(curve):
        return float("nan")
    return float(np.nanmin(curve[hit[0] + 1:]))


def summarise(curves: dict, window: int, solved: float, final_windows: int) -> dict:
    """Per side and seed: final (mean of the last ``final_windows`` windows), best window,
    first env step solved, dip after solving, largest fall below the best so far."""
    table = {}
    for side, seeds in curves.items():
        rows = {}
        for seed, curve in seeds.items():
            done = curve[~np.isnan(curve)]
            hit = np.flatnonzero(curve >= solved)
            rows[seed] = dict(
                final=float(done[-final_windows:].mean()) if len(done) else float("nan"),
                best=float(done.max()) if len(done) else float("nan"),
                first_solved=int((hit[0] + 1) * window) if len(hit) else None,
                dip_after_solving=dip_after_solving(curve, solved),
                largest_fall=largest_fall(curve),
                env_steps_logged=int(len(done) * window))
        table[side] = rows
    return table


def markdown(table: dict, settings: Settings, window: int, solved: float) -> str:
    lines = [
        "# DreamerV3 side by side: jaxwm and danijar/dreamerv3 (training episodes)", "",
        "Settings on both sides: " + ", ".join(f"{k} {v}" for k, v in
                                               dataclasses.asdict(settings).items()) + ".",
        f"Training-episode returns averaged in windows of {window} env steps; final: the mean "
        f"of the last windows; solved: the first window >= {solved:.0f}; dip: the lowest "
        "window after it; fall: the largest fall below the best window so far.", "",
        "| side | seed | final | best | first solved (env steps) | dip after solving | "
        "fall | env steps |", "|---|---|---|---|---|---|---|---|"]
    for side, rows in table.items():
        for seed, r in sorted(rows.items()):
            lines.append(f"| {side} | {seed} | {fmt(r['final'])} | {fmt(r['best'])} | "
                         f"{fmt(r['first_solved'])} | {fmt(r['dip_after_solving'])} | "
                         f"{fmt(r['largest_fall'])} | {r['env_steps_logged']} |")
        mean = {key: fmt(float(np.mean([r[key] for r in rows.values()])))
                for key in ("final", "best", "largest_fall")}
        lines.append(f"| {side} | mean | {mean['final']} | {mean['best']} | | | "
                     f"{mean['largest_fall']} | |")
    return "\n".join(lines) + "\n"


def plot(args) -> None:
    settings = with_overrides(PRESETS[args.preset], args.set)
    curves = {}
    for side in SIDES:
        for seed in args.seeds:
            logdir = os.path.join(args.runs, side, f"seed{seed}")
            if not os.path.isdir(logdir):
                continue
            steps, returns = episode_returns(side, logdir)
            curves.setdefault(side, {})[seed] = windowed(steps, returns, args.window,
                                                         settings.steps)
    name = f"dreamer_{settings.task.split('-')[0].lower()}_{args.preset}{args.suffix}"
    labels = dict(LABELS)
    add_reused(curves, labels, os.path.join(args.results, f"{name}.json"), args.reuse)
    if not curves:
        raise SystemExit(f"No runs under {args.runs}/<side>/seed<N>: run them first (--help).")
    x = np.arange(1, settings.steps // args.window + 1) * args.window
    save_figure({f"{settings.task}, size{settings.size}": band_lines(curves, x, labels)},
                os.path.join(args.figures, f"fidelity_{name}.png"), "env steps",
                "training-episode return")
    table = summarise(curves, args.window, args.solved, args.final_windows)
    save_table(args.results, name, dict(settings=dataclasses.asdict(settings), window=args.window,
                                        solved=args.solved, table=table),
               curves, markdown(table, settings, args.window, args.solved))


def run(args) -> None:
    settings = with_overrides(PRESETS[args.preset], args.set)
    if args.side == "official" and not (args.official_python and args.src):
        raise SystemExit("--side official needs --official-python and --src "
                         "(benchmarks/fidelity/README.md says how to set them up)")
    commands = {}
    for seed in args.seeds:
        logdir = os.path.join(args.runs, args.side, f"seed{seed}")
        commands[seed] = (logdir, jaxwm_command(settings, seed, logdir) if args.side == "jaxwm"
                          else official_command(settings, seed, logdir, args.official_python,
                                                args.src))
    run_seeds(commands, args.cpus, args.dry_run)


def main(argv=None) -> None:
    p, r, q = command_line(__doc__, PRESETS, "cpu", RUNS, SIDES, "lr=1e-4")
    r.add_argument("--official-python", help="the official code's Python (its own venv)")
    r.add_argument("--src", help="a checkout of danijar/dreamerv3")
    q.add_argument("--window", type=int, default=2500, help="env steps per averaging window")
    q.add_argument("--solved", type=float, default=475.0,
                   help="CartPole-v1's own threshold for solved")
    q.add_argument("--final-windows", type=int, default=2)
    args = p.parse_args(argv)
    (run if args.command == "run" else plot)(args)


if __name__ == "__main__":
    main()
