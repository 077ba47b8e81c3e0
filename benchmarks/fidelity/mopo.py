"""MOPO side by side with OfflineRL-Kit's (yihaosun1124/OfflineRL-Kit, ``run_mopo.py``): the
same D4RL-format dataset, settings, update budget and seeds on both sides, and one figure and
table from both sides' logs.

  # the dataset both sides read (jaxwm's own tool, fixed seed; about 4 minutes):
  python -m jaxwm.tools.make_dataset --env=Pendulum-v1 --level=medium \\
      --out=data/pendulum-medium.hdf5 --size=20000 --train_steps=20000 --seed=0
  # both sides, seeds 1-3, one core each (each run 5-15 min):
  python benchmarks/fidelity/mopo.py run --side jaxwm --seeds 1 2 3 --cpus 1
  python benchmarks/fidelity/mopo.py run --side offlinerlkit --seeds 1 2 3 --cpus 0 \\
      --kit-python <venv>/bin/python --src <OfflineRL-Kit checkout>
  # the figure (docs/figures/) and table (benchmarks/results/fidelity/) from the logs:
  python benchmarks/fidelity/mopo.py plot

One table of settings (``PRESETS``) gives both sides their command lines; ``--set key=value``
changes a setting on both. Both sides evaluate the deterministic policy (tanh of the mean)
for ``eval_episodes`` episodes after every epoch of ``updates_per_epoch`` SAC updates, as the
kit does: jaxwm logs ``eval/episodic_return`` in ``metrics.jsonl``, the kit its
``eval/normalized_episode_reward`` column in ``policy_training_progress.csv``, which holds
the raw return (``mopo_offlinerlkit.py``). Both are normalised here with one reference: the
dataset's own (``metadata/ref_min_score``, ``ref_max_score``, which jaxwm's generator
writes), else D4RL's for the env, as jaxwm's evaluator does
(``jaxwm.data.datasets.Dataset.reference_returns``). Setting up the kit's side:
benchmarks/fidelity/README.md.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import os
import sys
from collections.abc import Sequence

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
from jaxwm.data.datasets import load_dataset  # noqa: E402
from jaxwm.loop.metrics import read_jsonl  # noqa: E402
from jaxwm.scores import normalized_score, reference_returns  # noqa: E402

RUNS = os.path.join("runs", "fidelity")  # then <algo>/<side>/seed<N>
SIDES = ("jaxwm", "offlinerlkit")
LABELS = {"jaxwm": "jaxwm", "offlinerlkit": "OfflineRL-Kit"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What both sides are given: the kit's ``run_mopo.py`` flags under jaxwm's names.
    Everything not here is each side's MOPO default (ensemble 7 / elites 5 of 4x200, SAC
    256x256, lr 1e-4 / 3e-4 / 1e-4, batch 256, 5% real data, model buffer of 5 rollout
    batches, rollouts every 1000 updates, dynamics stopped after 5 epochs without a 1%
    improvement)."""

    env: str = "Pendulum-v1"
    task: str = "pendulum-medium"  # the kit's task name: picks its termination function
    dataset: str = "data/pendulum-medium.hdf5"
    horizon: int = 5
    penalty_coef: float = 1.0
    rollout_batch: int = 5_000
    epochs: int = 20
    updates_per_epoch: int = 1_000
    eval_episodes: int = 10
    model_max_epochs: int = 100  # dynamics epochs at most (the kit: none; patience 5 alone)
    # "mopo", or "gormpo": GORMPO's linear density penalty on (predicted next state, action)
    # in place of MOPO's (the kit's side: GORMPO's own RealNVP and penalty code).
    algo: str = "mopo"


PRESETS = {
    # mopo:pendulum_tiny's budget: one run in minutes on one core.
    "pendulum": Settings(),
    # hopper-medium at the kit's budget, for a re-run on an accelerator (make the dataset
    # with --env=Hopper-v4 --level=medium first).
    "hopper": Settings(env="Hopper-v4", task="hopper-medium", dataset="data/hopper-medium.hdf5",
                       penalty_coef=5.0, rollout_batch=50_000, epochs=3000,
                       model_max_epochs=100_000),
}


def jaxwm_command(s: Settings, seed: int, logdir: str, extra: Sequence[str] = ()) -> list[str]:
    """jaxwm's command for ``s`` and the comparison's seed ``seed`` (jaxwm's own seed is
    ``side_by_side.jaxwm_seed(seed)``, so that runs share no env streams); ``extra``
    ("key=value") sets jaxwm config keys beyond the shared settings, e.g. GORMPO's code's
    density choices (benchmarks/fidelity/README.md)."""
    flags = {
        "seed": jaxwm_seed(seed), "env.id": s.env, "dataset": s.dataset,
        "mopo.horizon": s.horizon,
        "penalty_coef": s.penalty_coef, "mopo.rollout_batch": s.rollout_batch,
        "mopo.updates_per_epoch": s.updates_per_epoch,
        "phases.policy.duration": s.epochs * s.updates_per_epoch,
        "phases.model.duration": s.model_max_epochs,
        "eval.every": f"{s.updates_per_epoch} agent_updates",
        "eval.num_episodes": s.eval_episodes, "log.progress": False,
    }
    if s.algo == "gormpo":
        flags.update({"algo": "gormpo", "penalty": "linear", "gormpo.score_next_state": True})
    return [sys.executable, "-m", "jaxwm.train", "--config=mopo:pendulum_tiny",
            f"--workdir={logdir}", *(f"--config.{k}={v}" for k, v in flags.items()),
            *(f"--config.{kv}" for kv in extra)]


def kit_command(s: Settings, seed: int, logdir: str, python: str, src: str,
                gormpo_src: str | None = None) -> list[str]:
    flags = {
        "task": s.task, "seed": seed, "rollout-length": s.horizon,
        "penalty-coef": s.penalty_coef, "rollout-batch-size": s.rollout_batch,
        "epoch": s.epochs, "step-per-epoch": s.updates_per_epoch,
        "eval_episodes": s.eval_episodes, "device": "cpu",
    }
    return [python, os.path.join(HERE, "mopo_offlinerlkit.py"), "--src", src,
            "--dataset", s.dataset, "--env", s.env, "--logdir", logdir,
            "--model-max-epochs", str(s.model_max_epochs),
            *(["--gormpo-src", gormpo_src] if s.algo == "gormpo" else []), "--",
            *(a for k, v in flags.items() for a in (f"--{k}", str(v)))]


# ----------------------------------------------------------------------------- logs


def reference(s: Settings) -> tuple[float, float] | None:
    """The (min, max) returns that normalise scores: the dataset's, else D4RL's."""
    if os.path.exists(s.dataset):
        return load_dataset(s.dataset).reference_returns
    return reference_returns(s.env)


def eval_returns(side: str, logdir: str) -> tuple[np.ndarray, np.ndarray]:
    """(SAC updates, mean evaluation return) as the side logged them."""
    if side == "jaxwm":
        key = "eval/episodic_return"
        rows = [r for r in read_jsonl(os.path.join(logdir, "metrics.jsonl")) if key in r]
        return (np.array([r["counters/agent_updates"] for r in rows], float),
                np.array([r[key] for r in rows], float))
    found = glob.glob(os.path.join(glob.escape(logdir), "log", "**",
                                   "policy_training_progress.csv"), recursive=True)
    if not found:
        return np.zeros(0), np.zeros(0)
    with open(found[0]) as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval/normalized_episode_reward")]
    return (np.array([r["timestep"] for r in rows], float),
            np.array([r["eval/normalized_episode_reward"] for r in rows], float))


def on_epochs(updates: np.ndarray, scores: np.ndarray, s: Settings) -> np.ndarray:
    """The score at the end of each epoch (NaN where the run has not logged it)."""
    out = np.full(s.epochs, np.nan)
    for u, v in zip(updates, scores, strict=True):
        epoch = int(round(u / s.updates_per_epoch))
        if 1 <= epoch <= s.epochs and u == epoch * s.updates_per_epoch:
            out[epoch - 1] = v
    return out


def summarise(curves: dict, final_epochs: int) -> dict:
    """Per side and seed: final (mean of the last ``final_epochs`` evaluations), best
    evaluation, largest fall below the best so far, epochs logged."""
    table = {}
    for side, seeds in curves.items():
        rows = {}
        for seed, curve in seeds.items():
            done = curve[~np.isnan(curve)]
            rows[seed] = dict(
                final=float(done[-final_epochs:].mean()) if len(done) else float("nan"),
                best=float(done.max()) if len(done) else float("nan"),
                largest_fall=largest_fall(curve), epochs_logged=int(len(done)))
        table[side] = rows
    return table


def markdown(table: dict, s: Settings, final_epochs: int, ref, labels: dict) -> str:
    unit = (f"normalised score 100 (R - {ref[0]:.1f}) / ({ref[1]:.1f} - {ref[0]:.1f}) of the "
            "mean return R" if ref else "mean return")
    lines = [
        f"# {s.algo.upper()} side by side: jaxwm and OfflineRL-Kit ({s.task})", "",
        "Settings on both sides: " + ", ".join(f"{k} {v}" for k, v in
                                               dataclasses.asdict(s).items()) + ".",
        f"Score: {unit} of {s.eval_episodes} deterministic episodes after every epoch of "
        f"{s.updates_per_epoch} SAC updates; final: the mean of the last {final_epochs} "
        "evaluations; fall: the largest fall below the best evaluation so far.", "",
        "| side | seed | final | best | fall | epochs |", "|---|---|---|---|---|---|"]
    for side, rows in table.items():
        for seed, r in sorted(rows.items()):
            lines.append(f"| {labels[side]} | {seed} | {fmt(r['final'])} | {fmt(r['best'])} | "
                         f"{fmt(r['largest_fall'])} | {r['epochs_logged']} |")
        mean = {k: fmt(float(np.mean([r[k] for r in rows.values()])))
                for k in ("final", "best", "largest_fall")}
        lines.append(f"| {labels[side]} | mean | {mean['final']} | {mean['best']} | "
                     f"{mean['largest_fall']} | |")
    return "\n".join(lines) + "\n"


def plot(args) -> None:
    s = with_overrides(PRESETS[args.preset], args.set)
    ref = reference(s)
    unit = "normalised score" if ref else "return"
    score = (lambda r: normalized_score(r, ref)) if ref else (lambda r: r)
    labels, folders = dict(LABELS), {side: os.path.join(args.runs, s.algo, side)
                                     for side in SIDES}
    for extra in args.also_jaxwm:  # e.g. a run of jaxwm's code before a fix
        label, _, folder = extra.partition("=")
        if not folder:
            raise SystemExit(f"--also-jaxwm {extra!r}: expected LABEL=FOLDER")
        labels[label], folders[label] = label, folder
    curves = {}
    for side, folder in folders.items():
        for seed in args.seeds:
            logdir = os.path.join(folder, f"seed{seed}")
            if os.path.isdir(logdir):
                updates, returns = eval_returns(side if side in SIDES else "jaxwm", logdir)
                curves.setdefault(side, {})[seed] = on_epochs(updates, score(returns), s)
    name = f"{s.algo}_{s.task.replace('-', '_')}{args.suffix}"
    add_reused(curves, labels, os.path.join(args.results, f"{name}.json"), args.reuse)
    if not curves:
        raise SystemExit(f"No runs under {args.runs}/{s.algo}/<side>/seed<N>: run them first "
                         "(--help).")
    x = np.arange(1, s.epochs + 1) * s.updates_per_epoch
    title = "MOPO" if s.algo == "mopo" else "GORMPO, linear penalty"
    save_figure({f"{title}, {s.task} ({s.env})": band_lines(curves, x, labels)},
                os.path.join(args.figures, f"fidelity_{name}.png"), "SAC updates",
                f"evaluation {unit}")
    table = summarise(curves, args.final_epochs)
    save_table(args.results, name, dict(settings=dataclasses.asdict(s), unit=unit,
                                        reference=ref, table=table),
               curves, markdown(table, s, args.final_epochs, ref, labels))


def run(args) -> None:
    s = with_overrides(PRESETS[args.preset], args.set)
    if s.algo not in ("mopo", "gormpo"):
        raise SystemExit(f"--set algo={s.algo}: choose mopo or gormpo")
    if args.side == "offlinerlkit" and not (args.kit_python and args.src and
                                            (s.algo == "mopo" or args.gormpo_src)):
        raise SystemExit("--side offlinerlkit needs --kit-python and --src (and --gormpo-src "
                         "with algo=gormpo): benchmarks/fidelity/README.md says how to set "
                         "them up")
    if not os.path.exists(s.dataset):
        raise SystemExit(f"{s.dataset} does not exist: make it first (the command is in "
                         "this file's --help).")
    commands = {}
    for seed in args.seeds:
        logdir = os.path.join(args.runs, s.algo, args.side, f"seed{seed}")
        commands[seed] = (logdir, jaxwm_command(s, seed, logdir, args.jaxwm_set)
                          if args.side == "jaxwm" else
                          kit_command(s, seed, logdir, args.kit_python, args.src,
                                      args.gormpo_src))
    run_seeds(commands, args.cpus, args.dry_run)


def main(argv=None) -> None:
    p, r, q = command_line(__doc__, PRESETS, "pendulum", RUNS, SIDES, "epochs=30")
    r.add_argument("--kit-python", help="OfflineRL-Kit's Python (its own venv, with torch)")
    r.add_argument("--src", help="a checkout of OfflineRL-Kit")
    r.add_argument("--gormpo-src", help="a checkout of aysintumay/GORMPO (--set algo=gormpo)")
    r.add_argument("--jaxwm-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a jaxwm config setting for the jaxwm side only, e.g. "
                        "gormpo.threshold_quantile=0.01 (GORMPO's code's threshold)")
    q.add_argument("--final-epochs", type=int, default=5)
    q.add_argument("--also-jaxwm", action="append", default=[], metavar="LABEL=FOLDER",
                   help="plot jaxwm runs from FOLDER/seed<N> too, e.g. before a fix")
    args = p.parse_args(argv)
    (run if args.command == "run" else plot)(args)


if __name__ == "__main__":
    main()
