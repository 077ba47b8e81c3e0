"""How much the evaluation episodes' starting states alone move a jaxwm run's scores: one fixed
policy evaluated exactly as a jaxwm run with ``--config.seed=S`` evaluates its policy (the
loop's ``Evaluator``, its pool of ``eval.num_envs`` envs seeded from S + 10,000, the
evaluations one after another on that pool), for several S.

    python benchmarks/fidelity/eval_starts.py --seeds 1 2 3 1000 2000 3000 --evaluations 20

The policy is the behaviour SAC that ``jaxwm.tools.make_dataset`` trained for the dataset (its
last snapshot, in the dataset's ``sac-<env>-seed<N>`` folder), acting deterministically: a good
fixed policy, so that what differs between evaluations is where its episodes start. Scores are
normalised with the dataset's reference returns, as the MOPO comparison's are.

What it answers: envpool seeds env i of a pool with seed + i, so runs with ``--config.seed``
1, 2 and 3 evaluate 6-8 of their 10 episodes (5 envs, 2 each) from the same starts at every
evaluation (hence ``side_by_side.JAXWM_SEED_STRIDE``). Their scores then move together, and
their "final" (the mean of the last evaluations) carries the luck of one set of starts instead
of three. The table gives, per seed, the score of each evaluation and of the final window; the
correlation of two seeds' evaluation-by-evaluation scores says how much they share.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import jax  # noqa: E402

from jaxwm.data.datasets import load_dataset  # noqa: E402
from jaxwm.loop.checkpoint import saved_steps  # noqa: E402
from jaxwm.loop.evaluate import Evaluator  # noqa: E402
from jaxwm.loop.metrics import read_jsonl  # noqa: E402
from jaxwm.tools import make_dataset  # noqa: E402

RESULTS = os.path.join(os.path.dirname(HERE), "results", "fidelity")


def behaviour_policy(env_id: str, sac_dir: str):
    """(config, state, algorithm) of the behaviour SAC's last snapshot in ``sac_dir``; the
    caller closes the algorithm."""
    if not saved_steps(sac_dir):
        raise SystemExit(f"{sac_dir} holds no SAC snapshots: make the dataset first "
                         "(benchmarks/fidelity/README.md has the command).")
    with open(os.path.join(sac_dir, "config.json")) as f:
        saved_config = json.load(f)
    config = make_dataset.behaviour_config(env_id, saved_config["total_env_steps"], 1,
                                           saved_config["seed"])
    evaluated = [int(row["step"]) for row in read_jsonl(os.path.join(sac_dir, "metrics.jsonl"))
                 if "eval/episodic_return" in row]  # env steps, as make_dataset reads them
    state, algo = make_dataset.load_snapshot(config, sac_dir, max(evaluated))
    return config, state, algo


def scores_by_evaluation(config, state, algo, seed: int, evaluations: int, episodes: int,
                         envs: int, reference) -> np.ndarray:
    """The normalised score of each of ``evaluations`` evaluations of ``episodes`` episodes on
    ``envs`` envs, as a run with ``--config.seed=seed`` makes them: one pool, the evaluations
    in sequence on it."""
    config.seed, config.eval.num_episodes, config.eval.num_envs = seed, episodes, envs
    config.eval.temperature, config.eval.video = 0.0, False
    evaluator = Evaluator(config, algo.policy, algo.policy_params, reference)
    key = jax.random.PRNGKey(0)
    try:
        out = []
        for _ in range(evaluations):
            key, k = jax.random.split(key)
            out.append(evaluator.run(state, k)["eval/normalized_score"])
        return np.array(out)
    finally:
        evaluator.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--dataset", default="data/pendulum-medium.hdf5")
    p.add_argument("--env", default="Pendulum-v1")
    p.add_argument("--sac-dir", default="", help="the behaviour SAC's folder (default: "
                   "make_dataset's, beside the dataset)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 1000, 2000, 3000])
    p.add_argument("--evaluations", type=int, default=20)
    p.add_argument("--episodes", type=int, default=10, help="per evaluation (eval.num_episodes)")
    p.add_argument("--envs", type=int, default=5, help="the pool's envs (eval.num_envs; "
                   "jaxwm/configs/mopo.py's 5)")
    p.add_argument("--final", type=int, default=5, help="evaluations in the final window")
    p.add_argument("--out", default=os.path.join(RESULTS, "eval_starts_pendulum"))
    args = p.parse_args(argv)
    if not os.path.exists(args.dataset):
        raise SystemExit(f"{args.dataset} does not exist: make it first.")
    sac_dir = args.sac_dir or os.path.join(os.path.dirname(os.path.abspath(args.dataset)),
                                           f"sac-{args.env}-seed0")
    config, state, algo = behaviour_policy(args.env, sac_dir)
    try:
        reference = load_dataset(args.dataset).reference_returns
        curves = {seed: scores_by_evaluation(config, state, algo, seed, args.evaluations,
                                             args.episodes, args.envs, reference)
                  for seed in args.seeds}
    finally:
        algo.close()
    lines = ["# One fixed policy, evaluated as jaxwm runs of these seeds evaluate", "",
             f"Policy: the behaviour SAC's last snapshot ({os.path.basename(sac_dir)}), "
             f"deterministic; {args.episodes} episodes on {args.envs} envs per evaluation, "
             f"{args.evaluations} "
             f"evaluations in sequence on one pool; scores normalised with {args.dataset}'s "
             f"reference returns ({reference[0]:.1f}, {reference[1]:.1f}).", "",
             f"| seed | final (last {args.final}) | mean | min | per evaluation |",
             "|---|---|---|---|---|"]
    for seed, c in curves.items():
        lines.append(f"| {seed} | {c[-args.final:].mean():.1f} | {c.mean():.1f} | "
                     f"{c.min():.1f} | {' '.join(f'{v:.0f}' for v in c)} |")
    pairs = [(a, b) for i, a in enumerate(args.seeds) for b in args.seeds[i + 1:]]
    lines += ["", "Correlation of two seeds' evaluation-by-evaluation scores:", "",
              "| seeds | correlation |", "|---|---|"]
    corr = {}
    for a, b in pairs:
        corr[f"{a},{b}"] = float(np.corrcoef(curves[a], curves[b])[0, 1])
        lines.append(f"| {a}, {b} | {corr[f'{a},{b}']:.2f} |")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    with open(args.out + ".json", "w") as f:
        settings = {k: v for k, v in vars(args).items() if k != "out"}  # no local paths
        json.dump({"settings": settings, "reference": list(reference),
                   "curves": {str(k): v.tolist() for k, v in curves.items()},
                   "correlation": corr}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
