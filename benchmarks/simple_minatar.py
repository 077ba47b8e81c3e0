"""SimPLe on MinAtar: does a policy trained only inside the learned simulator beat random play
in the real game? (issue: world models on JAX envs; ``simple:minatar``.)

For each game, ``simple:minatar`` trains ``--seeds`` seeds in one process (vmapped:
``num_seeds``), each evaluated at the end of every epoch in the real env (32 episodes at
temperature 0.5); a uniformly random policy is evaluated through the same ``Evaluator`` on
the first seed's evaluation envs. A seed beats random when its mean return exceeds random's by two
standard errors of the difference, ``sqrt((std_policy^2 + std_random^2) / n)``. Writes
``results/simple_minatar_<backend>.{json,md}`` and ``docs/figures/simple_minatar.png``
(every seed's return after each epoch beside random's).

    python benchmarks/simple_minatar.py                       # SpaceInvaders, Freeway: 5 seeds
    python benchmarks/simple_minatar.py --games Breakout --seeds 2 --workdir /tmp/sm
    python benchmarks/simple_minatar.py --quick               # the tiny config, a minute

This is learning, not speed: the table holds returns; wall time per game is reported beside
them (the seeds share the host's cores).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

import common
import jax

from jaxwm import runner
from jaxwm.config import load
from jaxwm.envs import acting
from jaxwm.envs.factory import probe_spec
from jaxwm.loop.evaluate import Evaluator
from jaxwm.loop.seeds import run_seeds

FIGURE = os.path.join(common.ROOT, "docs", "figures", "simple_minatar.png")


def random_play(config) -> dict:
    """Uniform random actions through the run's evaluator (its episodes, quotas, cap)."""
    return Evaluator(config, acting.uniform(probe_spec(config.env))).run(
        None, jax.random.PRNGKey(7))


def evaluations(workdir: str, seeds: int) -> list[dict]:
    """Each evaluation row of a run: env steps and every seed's mean and std of returns."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    out = []
    for r in rows:
        if "eval/episodic_return" not in r:
            continue
        if seeds == 1:
            means, stds = [r["eval/episodic_return"]], [r["eval/episodic_return_std"]]
        else:
            means = [r[f"eval/episodic_return/seed_{k}"] for k in range(seeds)]
            stds = [r[f"eval/episodic_return_std/seed_{k}"] for k in range(seeds)]
        out.append({"env_steps": r["counters/env_steps"], "means": means, "stds": stds})
    return out


def game_rows(game: str, seeds: int, quick: bool, workdir: str) -> tuple[list[dict], dict]:
    spec = "simple:minatar_tiny" if quick else "simple:minatar"
    over = {"env.id": f"gymnax:{game}-MinAtar", "log.progress": not quick,
            "checkpoint.every": "never"}
    # Random play on the first seed's evaluation envs (each seed evaluates on envs of its own:
    # the same distribution of starts, not the same starts).
    baseline = random_play(load(spec, over))
    config = load(spec, {**over, "num_seeds": seeds})
    n = config.eval.num_episodes
    start = time.perf_counter()
    runner.run(config, workdir)
    wall = time.perf_counter() - start
    evals = evaluations(workdir, seeds)
    last = evals[-1]
    rows = []
    for k, seed in enumerate(run_seeds(config)):
        mean, std = last["means"][k], last["stds"][k]
        se = math.sqrt((std ** 2 + baseline["eval/episodic_return_std"] ** 2) / n)
        gap = mean - baseline["eval/episodic_return"]
        margin = gap / se if se > 0 else math.copysign(math.inf, gap) if gap else 0.0
        rows.append({"game": game, "seed": seed, "in-model policy": mean, "policy std": std,
                     "random": baseline["eval/episodic_return"],
                     "random std": baseline["eval/episodic_return_std"],
                     "margin (SE)": margin, "beats random": margin > 2,
                     "env steps": last["env_steps"], "episodes": n,
                     "wall s (all seeds)": wall})
    curve = {"game": game, "random": baseline["eval/episodic_return"],
             "env_steps": [e["env_steps"] for e in evals],
             "seeds": [[e["means"][k] for e in evals] for k in range(seeds)]}
    return rows, curve


def plot(curves: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.4), squeeze=False)
    for ax, c in zip(axes[0], curves, strict=True):
        for k, ys in enumerate(c["seeds"]):
            ax.plot(c["env_steps"], ys, marker="o", alpha=0.8, label=f"seed {k}")
        ax.axhline(c["random"], color="k", ls="--", label="uniform random")
        ax.set_title(f"SimPLe (in-model PPO), {c['game']}-MinAtar")
        ax.set_xlabel("real env steps")
        ax.set_ylabel("eval return (32 episodes)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = common.parser(__doc__, repeats=1)
    p.add_argument("--games", nargs="+", default=["SpaceInvaders", "Freeway"])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--workdir", default="", help="run directories (default: a temporary one)")
    args = p.parse_args()
    root = args.workdir or tempfile.mkdtemp(prefix="simple_minatar_")
    rows, curves = [], []
    for game in args.games:
        game_row, curve = game_rows(game, args.seeds, args.quick, os.path.join(root, game))
        rows += game_row
        curves.append(curve)
    notes = [f"simple:minatar ({'simple:minatar_tiny' if args.quick else '40k real steps'}), "
             f"{args.seeds} seeds vmapped in one process; the last evaluation (after the last "
             "epoch) at temperature 0.5 against uniform random actions through the same "
             "evaluator. margin: (policy - random) / sqrt((std_p^2 + std_r^2) / episodes).",
             *(f"{g}: {sum(r['beats random'] for r in rows if r['game'] == g)} of "
               f"{args.seeds} seeds beat random by 2 SE" for g in args.games)]
    common.write_results("simple_minatar", rows, common.hardware(), notes, quick=args.quick)
    if not args.quick:
        plot(curves, FIGURE)


if __name__ == "__main__":
    main()
