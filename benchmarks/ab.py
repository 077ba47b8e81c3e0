"""A/B throughput of two jaxwm trees on this host, interleaved: is a change a regression?

Each measurement runs in a fresh process of its own, with ``PYTHONPATH`` set to one tree (its
``jaxwm`` package), the two trees alternating (A B, then B A, ...) so that drifts of a noisy
host fall on both. Every measurement goes through the algorithms' hooks as training calls them,
which both trees have:

* ``ppo_cartpole`` / ``ppo_breakout``: PPO end to end (collect + update_agent), steps/s,
  ``ppo:cartpole`` and ``:atari`` (Breakout, 8 envs), timed as
  ``common.ppo_end_to_end`` times a log window;
* ``sac``: SAC's ``update_agent`` hook on ``sac:pendulum`` sizes (256x256, batch
  256) with 256 updates per call, after ``collect`` filled the replay; updates/s;
* ``dreamer`` / ``dreamer_pong``: DreamerV3's ``update_model`` hook at size1m, batch 16 x 64
  on vector CartPole and on 64x64 RGB Pong (its convolutional encoder and decoder), as
  ``benchmarks/dreamer.py``; updates/s.
* ``mopo_rollout``: MOPO's model rollout as the tree's own ``benchmarks/offline.py`` times it
  (50k starts x horizon 5 on a HalfCheetah-sized 7 x 4x200 ensemble); transitions/s.
* ``tdmpc2_plan``: TD-MPC2's ``collect`` hook once the seed steps are in, every env step an
  MPPI plan (``tdmpc2:pendulum``: the 1M model, 1 env, 256 samples); env steps/s.

Checkpoints (not in the default list; ``--only=save_ppo,restore_ppo,save_dreamer,
restore_dreamer --name ab_checkpoints``): seconds per save (five saves of the algorithm's
``persistent`` state through the tree's ``loop.checkpoint.Checkpointer``, finished and, where
the tree writes them, their manifests written) and per restore of the newest (verified where
the tree verifies), for ``ppo:cartpole`` and ``dreamer:debug``; the median
of 6 repeats after one untimed.

    python benchmarks/ab.py --before ../jaxwm-before --after . --rounds 5   # ~60 min on 2 cores
    python benchmarks/ab.py --quick      # smoke run: this tree against itself (~20 s)

The medians of ``--rounds`` runs per tree and their ratio (after / before) go to
``results/ab_<backend>.{json,md}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MEASUREMENTS = ("ppo_cartpole", "ppo_breakout", "sac", "dreamer", "dreamer_pong", "mopo_rollout",
                "tdmpc2_plan")
CHECKPOINTS = ("save_ppo", "restore_ppo", "save_dreamer", "restore_dreamer")
UNITS = {"sac": "updates/s", "dreamer": "updates/s", "dreamer_pong": "updates/s",
         "mopo_rollout": "transitions/s", "tdmpc2_plan": "env steps/s",
         **{name: "s per save" if name.startswith("save") else "s per restore"
            for name in CHECKPOINTS}}


def checkpoint_seconds(name: str, load) -> float:
    """Seconds per save or per restore (module docstring), through the tree's Checkpointer."""
    import importlib
    import shutil
    import tempfile

    import jax

    from jaxwm.loop.checkpoint import Checkpointer
    from jaxwm.runner import validate

    algo_name = name.split("_")[1]
    config = load({"ppo": "ppo:cartpole", "dreamer": "dreamer:debug"}[
        algo_name])
    validate(config)
    algo = importlib.import_module(f"jaxwm.algos.{algo_name}").build(config)
    try:
        state = jax.block_until_ready(algo.persistent(algo.init(jax.random.PRNGKey(0))))
        loop = {"key": [0, 1], "scheduler": {}, "processes": 1, "artifacts": {}}
        seconds = []
        for _ in range(7):
            workdir = tempfile.mkdtemp()
            checkpointer = Checkpointer(workdir, keep=3)
            start = time.perf_counter()
            for step in range(1, 6):
                checkpointer.save(step, state, loop)
            checkpointer.wait()
            saved = (time.perf_counter() - start) / 5
            checkpointer.close()
            checkpointer = Checkpointer(workdir, keep=3)
            start = time.perf_counter()
            jax.block_until_ready(checkpointer.restore(state)[0])
            restored = time.perf_counter() - start
            checkpointer.close()
            shutil.rmtree(workdir)
            seconds.append(saved if name.startswith("save") else restored)
        seconds = sorted(seconds[1:])
        return (seconds[2] + seconds[3]) / 2
    finally:
        algo.close()


def measure(name: str, root: str, window: float) -> float:
    """Runs in the child process, whose ``jaxwm`` is ``root``'s."""
    import jax
    from common import block, ppo_end_to_end

    import jaxwm.config

    def load(spec, **overrides):
        # Trees from before configs were packaged (``algo:variant``) keep them as files.
        algo, variant = spec.split(":")
        old_file = os.path.join(root, "configs", f"{algo}.py")
        if os.path.exists(old_file):
            spec = f"{old_file}:{variant}"
        return jaxwm.config.load(spec, {"log.progress": False, **overrides})

    if name in CHECKPOINTS:
        return checkpoint_seconds(name, load)
    if name == "mopo_rollout":  # the tree's own row (its rollout code, its offline.py)
        sys.path.insert(0, os.path.join(root, "benchmarks"))
        from offline import rollout_row
        return rollout_row(50_000, 5, 200, repeats=5)["transitions_per_s"]
    if name.startswith("ppo"):
        config = load("ppo:cartpole" if name == "ppo_cartpole" else
                      "ppo:atari")
        return ppo_end_to_end(config, window, repeats=3, max_iterations=10_000)["steps_per_s"]
    if name == "sac":
        from jaxwm.algos import sac as algo_module
        config = load("sac:pendulum", **{"sac.learning_starts": 1024,
                                                     "sac.steps_per_collect": 256})
        hook, counted = "update_agent", 256
    elif name == "tdmpc2_plan":
        from jaxwm.algos import tdmpc2 as algo_module
        config = load("tdmpc2:pendulum", **{"env.num_envs": 1,
                                                       "tdmpc2.seed_steps": 64,
                                                       "tdmpc2.steps_per_collect": 8})
        hook, counted = "collect", 8
    else:
        from jaxwm.algos import dreamer as algo_module
        config = load("dreamer:atari100k" if name == "dreamer_pong" else
                      "dreamer:cartpole", **{
                          "dreamer.report_every": 0, "env.num_envs": 1, "dreamer.model_size": "1m",
                          "dreamer.batch_size": 16, "dreamer.batch_length": 64})
        hook, counted = "update_model", 1
    from jaxwm.runner import validate
    validate(config)
    algo = algo_module.build(config)
    try:
        key = jax.random.PRNGKey(0)
        state = algo.init(key)
        fill = {"sac": 1024, "tdmpc2_plan": 64}.get(name, 65)
        per_collect = algo.hooks["collect"].counts["env_steps"]
        for i in range(-(-fill // per_collect) + 1):
            state, _, _ = algo.hooks["collect"].fn(state, {}, jax.random.fold_in(key, i))
        update = algo.hooks[hook].fn
        for i in range(2):  # compile, then one warm call
            state, _, metrics = update(state, {}, jax.random.fold_in(key, 1000 + i))
            block((state, metrics))
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < window:
            state, _, metrics = update(state, {}, jax.random.fold_in(key, 2000 + calls))
            calls += 1
        block((state, metrics))
        return counted * calls / (time.perf_counter() - start)
    finally:
        algo.close()


def child(name: str, tree: str, window: float) -> float:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, os.path.join(HERE, "ab.py"), "--measure", name,
                          "--tree", os.path.abspath(tree), "--window", str(window)], env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{name} in {tree}:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["value"])


def main() -> None:
    from common import hardware, median, parser, write_results

    p = parser(__doc__, repeats=5)
    p.add_argument("--before", help="the tree before the change (a git worktree)")
    p.add_argument("--after", default=os.path.dirname(HERE))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--window", type=float, default=20.0, help="seconds per timed window")
    p.add_argument("--only", default=",".join(MEASUREMENTS),
                   help=f"comma-separated, of {', '.join(MEASUREMENTS + CHECKPOINTS)}")
    p.add_argument("--name", default="ab", help="results/<name>_<backend>.{json,md}")
    p.add_argument("--measure", help=argparse_hidden())
    p.add_argument("--tree", help=argparse_hidden())
    args = p.parse_args()
    if args.measure:  # the child
        sys.path.insert(0, HERE)
        print(json.dumps({"value": measure(args.measure, args.tree, args.window)}))
        return
    if args.quick:  # a smoke run: the tree against itself, one measurement
        args.rounds, args.window, args.only = 1, 2.0, "ppo_cartpole"
        args.before = args.before or args.after
    if not args.before:
        p.error("--before is required: the tree to compare with")
    unknown = sorted(set(args.only.split(",")) - set(MEASUREMENTS + CHECKPOINTS))
    if unknown:  # else measure() would time DreamerV3 under the unknown name
        p.error(f"--only: unknown measurement(s) {', '.join(unknown)}; choose from "
                f"{', '.join(MEASUREMENTS + CHECKPOINTS)}")
    rows = []
    for name in args.only.split(","):
        runs = {"before": [], "after": []}
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for which in order:
                runs[which].append(child(name, getattr(args, which), args.window))
                print(f"{name} round {r + 1} {which}: {runs[which][-1]:.4g}", flush=True)
        before, after = median(runs["before"]), median(runs["after"])
        rows.append({"measurement": name, "unit": UNITS.get(name, "env steps/s"),
                     "before": before, "after": after,
                     "after_over_before": after / before, "runs_before": runs["before"],
                     "runs_after": runs["after"]})
    notes = [f"Medians of {args.rounds} runs per tree, each a fresh process, the trees "
             f"alternating; windows of {args.window} s after compilation.",
             f"before: {os.path.basename(os.path.abspath(args.before))}; after: this tree."]
    write_results(args.name, rows, hardware(), notes,
                  columns=["measurement", "unit", "before", "after", "after_over_before"],
                  quick=args.quick)


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
