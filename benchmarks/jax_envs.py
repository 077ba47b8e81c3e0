"""PPO on envs written in JAX: jaxwm beside PureJaxRL and Craftax_Baselines on the same host,
and beside jaxwm on envpool's version of the same task.

Rows (each side's training run at the peer's settings, from one seed):

* ``jaxwm`` on ``gymnax:CartPole-v1`` (``ppo:gymnax_cartpole``, 4 envs x 128 steps, its whole
  500k-step budget), ``gymnax:Breakout-MinAtar`` (``ppo:minatar``, 64 x 128, its first 4 calls
  of 61 iterations, 2.0M steps) and ``craftax:Craftax-Classic-Symbolic-v1``
  (``ppo:craftax_classic``, the GRU agent, ``--craftax-envs`` x 64 steps, 3 calls of 6
  iterations): the ``iterate`` hook (``iterations_per_call`` whole iterations in one program,
  ``algos.ppo``) called until the budget is spent. ``compile_s`` is the first call's time
  less a steady call's; steps/s is the steady calls' env steps over their time.
* ``purejaxrl``: ``purejaxrl/ppo.py``'s ``make_train`` with the same settings
  (``peers/purejaxrl_ppo.py``, a checkout outside this repository given by
  ``--purejaxrl-src``, run in ``--purejaxrl-python``'s environment), compiled ahead, then the
  whole run; steps/s over the run.
* ``craftax``: Craftax_Baselines' ``ppo_rnn.py`` the same way (``peers/craftax_baselines_ppo_rnn.py``,
  ``--craftax-src``, ``--craftax-python``), its defaults but the pool (64 envs on a CPU; its
  own 1024 on a GPU: ``--craftax-envs 1024``).
* ``jaxwm envpool``: the same PPO settings on envpool's ``CartPole-v1``, whose steps are host
  custom calls (``collect`` and ``update_agent`` hooks, ``common.ppo_end_to_end``).

The sides alternate, ``--rounds`` times (peer, jaxwm, peer, jaxwm, ...), each in a fresh
process; the medians are reported with their ratio. ``time_to_return_s``: steady-state
seconds until the training return (mean over the envs' last finished episodes, as PureJaxRL
plots it; jaxwm's ``charts/episodic_return``, the mean over a call's finished episodes) first
reaches ``threshold``, counted in whole calls on both sides (the peer's iterations grouped
as jaxwm's calls), assuming every iteration costs the same (all are one XLA program).

    python benchmarks/jax_envs.py --purejaxrl-src ../purejaxrl --purejaxrl-python ../venv/bin/python \
        --craftax-src ../Craftax_Baselines --craftax-python ../venv/bin/python
    python benchmarks/jax_envs.py --quick   # smoke run (jaxwm rows only unless a peer is given)

``--learning``: PPO on two MinAtar games (Breakout, Asterix) beside PureJaxRL with the
same settings and budget (``--budget`` env steps a seed, ``--num-seeds`` seeds vmapped on
each side): each seed's final training return (the mean over its last 10% of points) and the
curves, in ``results/jax_envs_learning_<backend>`` and ``docs/figures/jax_envs_minatar.png``.
The peers' environment needs gymnax and distrax (their scripts import them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import common

HERE = os.path.dirname(os.path.abspath(__file__))
# PureJaxRL's runs of SpaceInvaders and Asterix (3 seeds vmapped) hung here in an XLA:CPU
# futex (docs/notes/2026-12-01-jax-envs.md); pick games with --games.
LEARNING_GAMES = ("Breakout-MinAtar", "Asterix-MinAtar")
LEARNING_CALL_ITERATIONS = 4  # a point of jaxwm's curve every 4 iterations (32,768 steps)
CRAFTAX_ENVS = 64  # the CPU row's pool (Craftax_Baselines' own: 1024, --craftax-envs on a GPU)


@dataclasses.dataclass(frozen=True)
class Task:
    config: str  # jaxwm's config
    peer: str  # "purejaxrl" or "craftax" (Craftax_Baselines)
    settings: dict  # the peer's flags: the same settings as the config's
    threshold: float  # the training return the time is measured to
    calls: int | None  # calls of the config's iterations_per_call timed; None: its budget
    overrides: tuple = ()  # jaxwm's overrides of the config (as the peer's flags change it)


TASKS = {
    "cartpole": Task("ppo:gymnax_cartpole", "purejaxrl", dict(
        env="CartPole-v1", num_envs=4, lr=2.5e-4, num_minibatches=4, activation="tanh"),
        475.0, None),
    "minatar_breakout": Task("ppo:minatar", "purejaxrl", dict(
        env="Breakout-MinAtar", num_envs=64, lr=5e-3, num_minibatches=8, activation="relu"),
        20.0, 4),
    "craftax_classic": Task("ppo:craftax_classic", "craftax", dict(
        env="Craftax-Classic-Symbolic-v1", num_envs=CRAFTAX_ENVS, num_steps=64),
        2.0, 3, (("env.num_envs", CRAFTAX_ENVS),)),
}


def with_envs(task: str, envs: int) -> None:
    """``--craftax-envs``: both sides' pool for the Craftax row."""
    t = TASKS[task]
    TASKS[task] = dataclasses.replace(t, settings=dict(t.settings, num_envs=envs),
                                      overrides=(("env.num_envs", envs),))


def budget(task: str, quick: bool) -> int:
    """The env steps both sides run for the speed rows (``TASKS``)."""
    config = common_config(task)
    if quick:
        return quick_budget(config)
    calls = TASKS[task].calls
    per_call = config.iterations_per_call * config.env.num_envs * config.ppo.num_steps
    return calls * per_call if calls else config.total_env_steps


def iterate_calls(name: str, overrides: dict) -> tuple:
    """Builds PPO from the config ``name`` with ``overrides``, then calls its
    ``iterate`` hook until the budget is spent: ``(config, env steps per call, each call's
    seconds, each call's training return per seed)`` (child process)."""
    import jax
    import numpy as np

    import jaxwm.config
    from jaxwm.algos import ppo
    from jaxwm.loop import seeds
    from jaxwm.runner import validate

    config = jaxwm.config.load(name, overrides)
    validate(config)
    algo = ppo.build(config)
    try:
        key = seeds.loop_key(config.seed, config.num_seeds, config.env.num_envs)
        key, init_key = seeds.split(key)
        state = jax.block_until_ready(algo.init(init_key))
        hook = algo.hooks["iterate"]
        per_call = hook.counts["env_steps"]
        times, returns = [], []
        for _ in range(-(-config.total_env_steps // per_call)):
            key, sub = seeds.split(key)
            start = time.perf_counter()
            state, _, metrics = hook.fn(state, {}, sub)
            returns.append(np.atleast_1d(jax.device_get(metrics["charts/episodic_return"])))
            times.append(time.perf_counter() - start)
    finally:
        algo.close()
    return config, per_call, times, np.stack(returns)


def jaxwm_run(task: str, quick: bool) -> dict:
    """The run of the task's config's ``iterate`` hook over ``budget`` (child process)."""
    import numpy as np

    overrides = {"log.progress": False, "total_env_steps": budget(task, quick),
                 **dict(TASKS[task].overrides)}
    if quick:  # two calls of two iterations
        overrides["iterations_per_call"] = 2
    config, per_call, times, returns = iterate_calls(TASKS[task].config, overrides)
    steady = times[1:] or times
    return {"compile_s": times[0] - float(np.median(steady)), "run_s": float(sum(steady)),
            "steps_per_s": per_call * len(steady) / sum(steady),
            "env_steps": per_call * len(times), "per_call_iterations": config.iterations_per_call,
            "returns": returns[:, 0].tolist(), "steady_call_s": steady}


def jaxwm_learning(game: str, budget: int, num_seeds: int, quick: bool) -> dict:
    """``ppo:minatar`` on ``game`` for ``budget`` env steps per seed, ``num_seeds`` seeds
    vmapped in one process: each call's training return per seed (child process)."""
    per_iteration = 64 * 128
    _, per_call, times, returns = iterate_calls("ppo:minatar", {
        "log.progress": False, "env.id": f"gymnax:{game}", "num_seeds": num_seeds,
        "total_env_steps": (budget // per_iteration) * per_iteration,
        "iterations_per_call": 1 if quick else LEARNING_CALL_ITERATIONS})
    return {"env_steps_per_call": per_call, "wall_s": sum(times),
            "returns": returns.T.tolist()}  # [seeds, calls]


def envpool_row(task: str, quick: bool) -> dict:
    """jaxwm's PPO on envpool's version of the task (child process)."""
    import jaxwm.config

    config = jaxwm.config.load(TASKS[task].config, {"log.progress": False, "iterations_per_call": 1,
                                             "env.id": "CartPole-v1"})
    row = common.ppo_end_to_end(config, 1.0 if quick else 10.0, repeats=1 if quick else 3,
                                max_iterations=10_000)
    return {"steps_per_s": row["steps_per_s"], "compile_s": row["compile_s"]}


def child(kind: str, task: str, quick: bool, *more: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", kind, "--task", task, *more]
                         + ["--quick"] * quick, capture_output=True, text=True, cwd=common.ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{kind} {task} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_to(returns_per_call: list, threshold: float, seconds_per_call: float):
    for i, value in enumerate(returns_per_call):
        if value is not None and value >= threshold:
            return (i + 1) * seconds_per_call
    return None


def quick_budget(config) -> int:
    """A smoke run's budget: four iterations."""
    return 4 * config.env.num_envs * config.ppo.num_steps


PEERS = {  # peer -> (its script in peers/, the --*-src and --*-python arguments' prefix)
    "purejaxrl": ("purejaxrl_ppo.py", "purejaxrl"),
    "craftax": ("craftax_baselines_ppo_rnn.py", "craftax"),
}


def peer_source(args, task: str) -> str:
    """The peer checkout given for the task's peer ('' when none)."""
    return getattr(args, f"{PEERS[TASKS[task].peer][1]}_src")


def peer_command(args, task: str) -> str:
    script, prefix = PEERS[TASKS[task].peer]
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in TASKS[task].settings.items())
    total = budget(task, args.quick)
    return (f"{getattr(args, prefix + '_python')} {os.path.join(HERE, 'peers', script)} "
            f"--src {peer_source(args, task)} {flags} --total-timesteps {total} --repeats 1")


def common_config(task: str):
    import jaxwm.config
    return jaxwm.config.load(TASKS[task].config, dict(TASKS[task].overrides))


def main() -> None:
    p = common.parser(__doc__, repeats=1)
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two sides")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--purejaxrl-src", default="", help="a PureJaxRL checkout (outside)")
    p.add_argument("--purejaxrl-python", default=sys.executable,
                   help="the Python whose environment runs PureJaxRL (gymnax, distrax)")
    p.add_argument("--craftax-src", default="", help="a Craftax_Baselines checkout (outside)")
    p.add_argument("--craftax-python", default=sys.executable,
                   help="the Python whose environment runs Craftax_Baselines (craftax, distrax)")
    p.add_argument("--craftax-envs", type=int, default=CRAFTAX_ENVS,
                   help="both sides' envs in the Craftax row (Craftax_Baselines' own: 1024)")
    p.add_argument("--learning", action="store_true",
                   help="the learning comparison on MinAtar instead (seeds vmapped, a figure)")
    p.add_argument("--budget", type=int, default=2_000_000, help="--learning: env steps a seed")
    p.add_argument("--num-seeds", type=int, default=3, help="--learning: seeds per side")
    p.add_argument("--games", default=",".join(LEARNING_GAMES), help="--learning: MinAtar games")
    p.add_argument("--peer-seeds-apart", action="store_true",
                   help="--learning: PureJaxRL's seeds one run each, not vmapped")
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure and args.craftax_envs != CRAFTAX_ENVS:
        with_envs("craftax_classic", args.craftax_envs)
    if args.measure == "learning":
        print(json.dumps(jaxwm_learning(args.task, args.budget, args.num_seeds, args.quick)))
        return
    if args.measure:
        run = jaxwm_run if args.measure == "jaxwm" else envpool_row
        print(json.dumps(run(args.task, args.quick)))
        return
    if args.learning:
        return learning(args)
    if args.craftax_envs != CRAFTAX_ENVS:
        with_envs("craftax_classic", args.craftax_envs)

    rows = []
    for task in args.tasks.split(","):
        config = common_config(task)
        threshold = TASKS[task].threshold
        ours, peers = [], []
        for _ in range(1 if args.quick else args.rounds):
            if peer_source(args, task):
                peers.append(common.run_peer(peer_command(args, task), timeout=20 * 60))
            ours.append(child("jaxwm", task, args.quick,
                              "--craftax-envs", str(args.craftax_envs)))
        med = lambda runs, key: common.median([r[key] for r in runs])  # noqa: E731
        calls_k = ours[0]["per_call_iterations"]
        per_call_s = med(ours, "run_s") / max(len(ours[0]["steady_call_s"]), 1)
        row = {"task": task, "env": config.env.id, "envs": config.env.num_envs,
               "env_steps": ours[0]["env_steps"], "side": "jaxwm",
               "steps_per_s": med(ours, "steps_per_s"), "compile_s": med(ours, "compile_s"),
               "final_return": ours[0]["returns"][-1], "threshold": threshold,
               "time_to_return_s": time_to(ours[0]["returns"][1:], threshold, per_call_s)}
        rows.append(row)
        if peers:
            peer = peer_row(task, config, peers, calls_k)
            rows.append(peer)
            row[f"vs_{peer['side']}"] = row["steps_per_s"] / peer["steps_per_s"]
        if task == "cartpole":
            pooled = child("envpool", task, args.quick)
            rows.append({"task": task, "env": "CartPole-v1 (envpool)",
                         "envs": config.env.num_envs, "side": "jaxwm envpool",
                         "steps_per_s": pooled["steps_per_s"], "compile_s": pooled["compile_s"]})
            row["vs_envpool"] = row["steps_per_s"] / pooled["steps_per_s"]
    notes = [f"Medians of {len(ours)} runs per side, the sides alternating, each a fresh "
             "process; compile time apart; steps/s over the steady state (jaxwm: every call "
             "after the first; the peers: the compiled run).",
             f"PureJaxRL: purejaxrl/ppo.py at {peer_commit(args.purejaxrl_src)}, unchanged "
             "(benchmarks/peers/purejaxrl_ppo.py for the shims)." if args.purejaxrl_src else
             "No PureJaxRL checkout given: no purejaxrl rows.",
             f"Craftax_Baselines: ppo_rnn.py at {peer_commit(args.craftax_src)}, unchanged, "
             "its defaults (optimistic resets, ratio 16: a step resets num_envs / 16 fresh "
             "worlds shared among the envs that finished; jaxwm resets each such env from its "
             "own key) and the pool of the row." if args.craftax_src else
             "No Craftax_Baselines checkout given: no craftax rows."]
    columns = ["task", "env", "envs", "side", "env_steps", "steps_per_s", "compile_s",
               "final_return", "threshold", "time_to_return_s", "vs_purejaxrl", "vs_craftax",
               "vs_envpool"]
    common.write_results("jax_envs", rows, common.hardware(), notes, columns, quick=args.quick)


def mean_of(values: list) -> float | None:
    """The mean of the values that are there (a peer's iteration without a finished
    episode has none)."""
    present = [v for v in values if v is not None and v == v]
    return sum(present) / len(present) if present else None


def peer_row(task: str, config, peers: list[dict], calls_k: int) -> dict:
    """The peer's row: its medians, and its curve grouped in jaxwm's calls of ``calls_k``
    iterations for the time to the threshold."""
    med = lambda key: common.median([r[key] for r in peers])  # noqa: E731
    curve = peers[0]["returns"]
    grouped = [mean_of(curve[i:i + calls_k]) for i in range(calls_k, len(curve), calls_k)]
    per_call_s = med("run_s") * calls_k / len(curve)
    threshold = TASKS[task].threshold
    return {"task": task, "env": config.env.id, "envs": config.env.num_envs,
            "env_steps": peers[0]["env_steps"], "side": TASKS[task].peer,
            "steps_per_s": med("steps_per_s"), "compile_s": med("compile_s"),
            "final_return": mean_of(curve[-calls_k:]), "threshold": threshold,
            "time_to_return_s": time_to(grouped, threshold, per_call_s)}


def peer_commit(source: str) -> str:
    out = subprocess.run(["git", "-C", source, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "an unknown commit"


def final_return(curve, share: float = 0.1) -> float:
    """The mean of a curve's last ``share`` of points: a run's final training return."""
    tail = max(1, round(len(curve) * share))
    return float(sum(curve[-tail:]) / tail)


def peer_learning(args, game: str, budget: int) -> tuple:
    """PureJaxRL's curves on ``game``: its seeds vmapped in one run (its README's way), or with
    ``--peer-seeds-apart`` one run a seed (``--seed 30 + i``), for the games whose vmapped runs
    hang on XLA:CPU: ``(curves [seeds, iterations], env steps a point, wall seconds)``."""
    import numpy as np

    settings = dict(TASKS["minatar_breakout"].settings, env=game)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in settings.items())
    command = (f"{args.purejaxrl_python} {os.path.join(HERE, 'peers', 'purejaxrl_ppo.py')} "
               f"--src {args.purejaxrl_src} {flags} --total-timesteps {budget} --repeats 1")
    if args.peer_seeds_apart:
        runs = [common.run_peer(f"{command} --seed {30 + i}", timeout=8 * 60, tries=2)
                for i in range(args.num_seeds)]
    else:
        runs = [common.run_peer(f"{command} --num-seeds {args.num_seeds}", timeout=8 * 60,
                                tries=2)]
    curves = np.concatenate([np.atleast_2d(run["returns"]) for run in runs])
    return curves, 64 * 128, sum(run["run_s"] + run["compile_s"] for run in runs)


def learning(args) -> None:
    """PPO on MinAtar games beside PureJaxRL's, same settings and budget, seeds vmapped on
    both sides: curves (a figure), each seed's final return, and the comparison."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    games = LEARNING_GAMES[:1] if args.quick else args.games.split(",")
    budget = 64 * 128 * 2 if args.quick else args.budget
    rows, fig = [], plt.figure(figsize=(5 * len(games), 3.6))
    for i, game in enumerate(games):
        ours = child("learning", game, args.quick, "--budget", str(budget), "--num-seeds",
                     str(args.num_seeds))
        curves = {"jaxwm": (np.asarray(ours["returns"]), ours["env_steps_per_call"],
                            ours["wall_s"])}
        if args.purejaxrl_src:
            curves["purejaxrl"] = peer_learning(args, game, budget)
        ax = fig.add_subplot(1, len(games), i + 1)
        for side, (curve, per_point, wall_s) in curves.items():
            x = per_point * np.arange(1, curve.shape[1] + 1)
            mean, std = curve.mean(0), curve.std(0)
            ax.plot(x, mean, label=f"{side} ({curve.shape[0]} seeds)")
            ax.fill_between(x, mean - std, mean + std, alpha=0.25)
            finals = [final_return(c) for c in curve]
            rows.append({"game": game, "side": side, "seeds": len(finals),
                         "env_steps": int(per_point * curve.shape[1]), "wall_s": wall_s,
                         "final_mean": float(np.mean(finals)),
                         "final_sem": float(np.std(finals, ddof=1) / np.sqrt(len(finals)))
                         if len(finals) > 1 else 0.0,
                         "finals": [round(f, 2) for f in finals]})
        ax.set(title=f"gymnax:{game}", xlabel="env steps per seed", ylabel="training return")
        ax.legend()
        # written after each game, so a run cut short keeps the games it finished
        write_learning(args, rows, fig, budget)


def write_learning(args, rows: list, fig, budget: int) -> None:
    """The learning rows' results file and figure (``learning``)."""
    fig.tight_layout()
    hw = common.hardware()
    backend = hw["backend"]  # the CPU figure keeps its name; others get theirs
    figure = os.path.join(common.ROOT, "docs", "figures", "jax_envs_minatar"
                          + ("" if backend == "cpu" else f"_{backend}")
                          + ("_quick" if args.quick else "") + ".png")
    fig.savefig(figure, dpi=110)
    notes = [f"PPO at PureJaxRL's MinAtar settings (ppo:minatar: 64 envs x 128 steps, lr 5e-3 "
             f"annealed, 8 minibatches, relu MLP on the flattened frames), {budget:,} env steps "
             "per seed; jaxwm's seeds vmapped in one program (PureJaxRL's: the last note).",
             "final: the mean training return over each run's last 10% of points (jaxwm: its "
             "calls' mean over finished episodes, 4 iterations a call; PureJaxRL: each "
             "iteration's mean over its envs' last finished episodes).",
             f"Figure: docs/figures/{os.path.basename(figure)}."]
    if args.purejaxrl_src:
        seeds = ("one run a seed, PRNGKey(30 + i)" if args.peer_seeds_apart
                 else "its seeds vmapped over split(PRNGKey(30), seeds)")
        notes.append(f"PureJaxRL: purejaxrl/ppo.py at {peer_commit(args.purejaxrl_src)}, "
                     f"unchanged, {seeds}.")
    common.write_results("jax_envs_learning", rows, hw, notes,
                         ["game", "side", "seeds", "env_steps", "wall_s", "final_mean",
                          "final_sem", "finals"], quick=args.quick)


if __name__ == "__main__":
    main()
