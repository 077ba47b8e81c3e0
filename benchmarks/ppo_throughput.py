"""PPO throughput against raw envpool: CartPole-v1 (MLP) and Breakout-v5 (Nature CNN).

On the current backend, at the same number of envs (``--envs``, default 8):

1. raw envpool steps/s with random actions, through the host path (``env.step``) and the XLA
   path (``env.xla_step`` inside a jitted ``lax.scan``);
2. PPO end to end (``collect`` + ``update_agent`` hooks of ``jaxwm.algos.ppo``, jaxwm/configs/ppo.py
   variants ``cartpole`` and ``atari``): the first iteration timed apart as compile time, then
   the median steps/s of ``--repeats`` windows of >= ``--window`` seconds, with the median
   seconds of collect and of update per iteration; Breakout once per ``ppo.loop_form``;
3. the ratio PPO / raw envpool (XLA path);
4. the wall time of the default CartPole job (``jaxwm.train.run``, in this process: compile
   and evaluation included, Python imports not), its env steps and final eval return;
5. comparisons with the reference figures of benchmarks/REFERENCES.md for this machine class, with the
   project's goals marked pass/fail;
6. scaling rows, Breakout at ``--scale-envs`` (default 8, 64, 128) envs N: the limits, raw
   envpool synchronous (N envs) and asynchronous (2N envs, batches of N; XLA scan, random
   actions), then PPO on a synchronous pool of N and on an asynchronous pool of 2N in batches
   of N (``env.batch_size``; the same rollout and update sizes), each over both limits;
7. processes 1 vs 2 (``jaxwm.launch``), Breakout at 8 envs in all: ``charts/SPS`` of the
   training loop's log windows after the first (compile), median.

    python benchmarks/ppo_throughput.py               # full (~5-10 min on 2 CPU cores)
    python benchmarks/ppo_throughput.py --skip-scan   # without the rolled-scan Breakout row
    python benchmarks/ppo_throughput.py --quick       # smoke run (~1 min; not a measurement)
    python benchmarks/ppo_throughput.py --only-scale  # just the rows of 6 and 7
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from common import (
    ROOT,
    Timing,
    between_peer_runs,
    hardware,
    median,
    parser,
    ppo_end_to_end,
    timed,
    write_results,
)

import jaxwm.config
from jaxwm import train
from jaxwm.agents.ppo import resolve_loop_form
from jaxwm.envs import make_env
from jaxwm.loop.metrics import read_jsonl

CONFIG_FILE = "ppo"  # jaxwm/configs/ppo.py
ENVS = {"cartpole": "CartPole-v1", "atari": "Breakout-v5"}
BREAKOUT_FORMS = ("scan", "unroll")
SOLVED_RETURN = 475.0


@dataclasses.dataclass(frozen=True)
class Reference:
    """A published or measured figure to compare with (benchmarks/REFERENCES.md): a short label for the
    table, the value, and what exactly was measured (for the notes)."""

    label: str
    value: float
    detail: str


# benchmarks/REFERENCES.md, "Measured on this machine class" (2 CPU cores, no GPU, loaded machine) and "PPO".
REF_RAW = {
    "cartpole": Reference("envpool ~128k", 128_000.0,
                          "envpool raw CartPole, 8 envs, random actions, 2 CPU cores"),
    "atari": Reference("envpool Pong ~4.4k", 4_400.0,
                       "envpool raw Pong (nearest Atari figure), 8 envs, random actions, 2 CPU cores"),
}
REF_PPO_CPU = {
    "cartpole": Reference("BenchNetRL ~1.1k", 1_100.0,
                          "BenchNetRL PyTorch PPO FF, velocity-masked CartPole, one thread"),
    "atari": Reference("CleanRL ~12", 12.0, "CleanRL JAX+envpool scan PPO, Breakout, 8 envs, 2 CPU cores"),
}
REF_BENCHNETRL_BREAKOUT = Reference("BenchNetRL ~175", 175.0,
                                    "BenchNetRL PyTorch PPO FF (4 frames), Breakout, one thread")
REF_PUREJAXRL_WALL = Reference("PureJaxRL 16 s", 16.0,
                               "PureJaxRL PPO CartPole (gymnax), 5e5 steps, wall incl. 3.5 s compile, "
                               "return 500, 2 CPU cores")
REF_CLEANRL_GPU = Reference("CleanRL GPU ~4.5k", 4_500.0,
                            "CleanRL JAX+envpool scan PPO, Breakout, 1 GPU + 10 CPUs, 8 envs: "
                            "10M steps in 35-40 min (4.2-4.8k steps/s)")
REFERENCES = (*REF_RAW.values(), *REF_PPO_CPU.values(), REF_BENCHNETRL_BREAKOUT, REF_PUREJAXRL_WALL,
              REF_CLEANRL_GPU)


def versus(value: float, ref: Reference) -> dict:
    """The reference columns of a row: label, value and ratio ``value / ref.value``."""
    return {"reference": ref.label, "reference_value": ref.value, "ratio": value / ref.value}


def load_config(variant: str, **overrides):
    """ppo:<variant>, unlocked, with dotted-path overrides."""
    return jaxwm.config.load(f"{CONFIG_FILE}:{variant}", overrides)


# ----------------------------------------------------------------------------- raw envpool


def random_actions(spec, steps: int, rng: np.random.Generator) -> np.ndarray:
    """[steps, num_envs, *action_shape] uniformly random actions for ``spec``."""
    shape = (steps, spec.num_envs)
    if spec.discrete:
        return rng.integers(0, spec.num_actions, size=shape).astype(np.int32)
    return rng.uniform(spec.action_low, spec.action_high, shape + spec.action_shape).astype(np.float32)


def raw_env(variant: str, num_envs: int, steps: int, repeats: int,
            host: bool = True) -> dict[str, Timing]:
    """Timings of ``steps`` random-action steps of every env, host path (if ``host``) and
    XLA-scan path."""
    config = load_config(variant)
    env = make_env(config.env, num_envs=num_envs, seed=0)
    actions = random_actions(env.spec, steps, np.random.default_rng(0))
    timings = {}
    try:
        if host:
            env.reset()
            timings["host"] = timed(lambda: [env.step(a) for a in actions], repeats)

        carry = {"handle": env.xla_reset()[0]}
        xla_actions = jnp.asarray(actions)

        @jax.jit
        def rollout(handle, acts):
            def body(h, a):
                h, result = env.xla_step(h, a)
                return h, result.reward
            return jax.lax.scan(body, handle, acts)

        def run_xla():
            carry["handle"], rewards = rollout(carry["handle"], xla_actions)
            return rewards

        timings["xla"] = timed(run_xla, repeats)
    finally:
        env.close()
    return timings


def raw_async(variant: str, num_envs: int, batch_size: int, steps: int, repeats: int) -> Timing:
    """Timing of ``steps`` recv/send rounds of an asynchronous pool (``batch_size`` of
    ``num_envs`` envs per round, random actions) inside a jitted ``lax.scan``."""
    config = load_config(variant)
    env = make_env(config.env, num_envs=num_envs, seed=0, batch_size=batch_size)
    spec = dataclasses.replace(env.spec, num_envs=batch_size)
    actions = jnp.asarray(random_actions(spec, steps, np.random.default_rng(0)))
    carry = {"handle": env.xla_async_reset()}

    @jax.jit
    def rounds(handle, acts):
        def body(h, a):
            h, ids, result = env.xla_recv(h)
            return env.xla_send(h, a, ids), result.reward
        return jax.lax.scan(body, handle, acts)

    def run():
        carry["handle"], rewards = rounds(carry["handle"], actions)
        return rewards

    try:
        return timed(run, repeats)
    finally:
        env.close()


def scale_rows(args, on_rows: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Breakout at each of ``args.scale_envs``: raw synchronous and asynchronous limits, PPO
    on a synchronous pool of N and an asynchronous pool of 2N in batches of N, with ratios;
    with ``--cleanrl-command``, CleanRL's scan PPO at N envs run before and after them.
    ``on_rows`` gets the rows so far after each N."""
    rows = []
    for n in args.scale_envs:
        command = args.cleanrl_command.format(envs=n)
        measured, peers = between_peer_runs(command, lambda n=n: scale_rows_at(args, n))
        if peers:
            peer_sps = median([p["steps_per_s"] for p in peers])
            samples = [s for p in peers for s in p["samples_steps_per_s"]]
            rows.append({"env": ENVS["atari"], "measurement": "peer: CleanRL scan PPO",
                         "envs": n, "steps_per_s": peer_sps,
                         "compile_s": median([p["first_iteration_s"] for p in peers]),
                         "samples_s": samples})
            for r in measured:
                if r["measurement"].startswith("PPO"):
                    r["over_cleanrl"] = r["steps_per_s"] / peer_sps
            print(f"Breakout CleanRL scan PPO, {n} envs: {peer_sps:,.0f} steps/s", flush=True)
        rows += measured
        on_rows(rows)
    return rows


def scale_rows_at(args, n: int) -> list[dict]:
    """The limit and PPO rows of ``scale_rows`` at ``n`` envs."""
    rows = []
    repeats = 1 if args.quick else args.repeats
    steps = max(16, (32 if args.quick else 2048) // n)
    limits = {"sync": raw_env("atari", n, steps, repeats, host=False)["xla"],
              "async": raw_async("atari", 2 * n, n, steps, repeats)}
    sps = {k: steps * n / t.median for k, t in limits.items()}
    for kind, label in (("sync", f"raw envpool sync, {n} envs"),
                        ("async", f"raw envpool async, {2 * n} envs in batches of {n}")):
        rows.append({"env": ENVS["atari"], "measurement": f"limit: {label}", "envs": n,
                     "steps_per_s": sps[kind], "compile_s": limits[kind].compile_s,
                     "samples_s": limits[kind].samples})
        print(f"Breakout {label}: {sps[kind]:,.0f} steps/s", flush=True)
    pools = (("sync", {"env.num_envs": n}),
             ("async", {"env.num_envs": 2 * n, "env.batch_size": n}))
    for pool, overrides in pools[:1] if args.skip_async_ppo else pools:
        if args.quick:
            overrides["ppo.num_steps"] = 32
        config = load_config("atari", **overrides)
        result = ppo_end_to_end(config, 0.0 if args.quick else args.window,
                                1 if args.quick else args.scale_repeats, args.max_iterations)
        what = "PPO, sync pool" if pool == "sync" else f"PPO, async pool ({2 * n} envs)"
        rows.append({"env": ENVS["atari"], "measurement": what, "loop_form": "auto", "envs": n,
                     **result, "over_sync_limit": result["steps_per_s"] / sps["sync"],
                     "over_async_limit": result["steps_per_s"] / sps["async"]})
        print(f"Breakout {what}, batches of {n}: {result['steps_per_s']:,.0f} steps/s",
              flush=True)
    return rows


def process_rows(args) -> list[dict]:
    """Breakout PPO through ``jaxwm.launch`` with 1 and 2 processes (8 envs in all): median
    ``charts/SPS`` of the log windows after the first, which holds compilation."""
    rows = []
    iterations = 3 if args.quick else 12
    steps = (32 if args.quick else 128) * args.envs
    for processes in (1, 2):
        with tempfile.TemporaryDirectory() as workdir:
            command = [sys.executable, "-m", "jaxwm.launch", f"--num_processes={processes}", "--",
                       f"--config={CONFIG_FILE}:atari", f"--workdir={workdir}/run",
                       f"--config.env.num_envs={args.envs}", "--config.log.progress=False",
                       f"--config.ppo.num_steps={steps // args.envs}",
                       f"--config.total_env_steps={iterations * steps}",
                       f"--config.log.every={steps} env_steps", "--config.eval.at_end=False",
                       "--config.eval.every=never", "--config.checkpoint.every=never"]
            start = time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if done.returncode:
                raise RuntimeError(f"{processes} processes failed:\n{done.stderr[-3000:]}")
            windows = [r["charts/SPS"] for r in read_jsonl(os.path.join(workdir, "run",
                                                                        "metrics.jsonl"))
                       if "charts/SPS" in r][1:]
        sps = statistics.median(windows)
        rows.append({"env": ENVS["atari"], "measurement": f"PPO, {processes} process(es) "
                     "(jaxwm.launch)", "loop_form": "auto", "envs": args.envs, "steps_per_s": sps,
                     "wall_s": wall, "env_steps": iterations * steps, "samples_s": windows})
        print(f"Breakout PPO, {processes} process(es): {sps:,.0f} steps/s", flush=True)
    rows[1]["over_first"] = rows[1]["steps_per_s"] / rows[0]["steps_per_s"]
    return rows


def audit_rows(variant: str, num_envs: int, steps: int, repeats: int) -> list[dict]:
    """What each piece of jaxwm's host env path costs against envpool itself (random actions,
    host path): envpool with and without its renderer (training envs never render), then
    jaxwm's ``env.step`` (action cast, observation transform, result dtypes), then that plus
    the episode statistics."""
    from envpool import make as envpool_make

    from jaxwm.envs import EpisodeStats
    from jaxwm.envs.families import envpool_kwargs, infer_family

    config = load_config(variant)
    env = make_env(config.env, num_envs=num_envs, seed=0)
    actions = random_actions(env.spec, steps, np.random.default_rng(0))
    timings = {}
    for render in (True, False):
        raw = envpool_make(config.env.id, env_type="gymnasium", num_envs=num_envs,
                           batch_size=num_envs, seed=0, render_mode="rgb_array" if render else None,
                           **envpool_kwargs(infer_family(config.env.id), config.env))
        raw.reset()
        timings[f"envpool step, render_mode={'rgb_array' if render else None}"] = timed(
            lambda raw=raw: [raw.step(a) for a in actions], repeats)
        raw.close()
    env.reset()
    timings["jaxwm env.step (casts, obs transform)"] = timed(
        lambda: [env.step(a) for a in actions], repeats)
    update = jax.jit(EpisodeStats.update)

    def with_stats():
        stats = EpisodeStats.create(num_envs)
        for a in actions:
            stats, _ = update(stats, env.step(a))
        return stats

    timings["jaxwm env.step + episode statistics"] = timed(with_stats, repeats)
    env.close()
    base = None
    rows = []
    for label, timing in timings.items():
        sps = steps * num_envs / timing.median
        base = base or sps
        rows.append({"env": ENVS[variant], "measurement": f"env path: {label}", "envs": num_envs,
                     "steps_per_s": sps, "over_first": sps / base, "samples_s": timing.samples})
        print(f"{ENVS[variant]} {label}: {sps:,.0f} steps/s", flush=True)
    return rows


def raw_rows(variant: str, num_envs: int, steps: int, repeats: int) -> list[dict]:
    """The two raw-envpool rows for one env."""
    timings = raw_env(variant, num_envs, steps, repeats)
    ref = REF_RAW[variant]
    rows = []
    for path, label in (("host", "raw envpool, host path"), ("xla", "raw envpool, XLA scan")):
        sps = steps * num_envs / timings[path].median
        rows.append({"env": ENVS[variant], "measurement": label, "envs": num_envs,
                     "steps_per_s": sps, "compile_s": timings[path].compile_s if path == "xla" else None,
                     "samples_s": timings[path].samples, **versus(sps, ref)})
    return rows


# ----------------------------------------------------------------------------- PPO


def ppo_rows(variant: str, forms: list[str], args, raw_xla_sps: float, backend: str,
             async_collect: bool = False) -> list[dict]:
    """One PPO row per loop form for one env."""
    overrides = {"env.num_envs": args.envs, "ppo.async_collect": async_collect}
    if args.quick and variant == "atari":
        overrides["ppo.num_steps"] = 32  # smoke run only: a quarter of the rollout
    auto = resolve_loop_form("auto")
    ref = REF_CLEANRL_GPU if backend == "gpu" and variant == "atari" else REF_PPO_CPU[variant]
    rows = []
    for form in forms:
        config = load_config(variant, **overrides, **{"ppo.loop_form": form})
        result = ppo_end_to_end(config, 0.0 if args.quick else args.window,
                                1 if args.quick else args.repeats, args.max_iterations)
        label = f"auto (= {auto})" if form == "auto" else f"{form} (= auto)" if form == auto else form
        what = "PPO end to end" + (", async collect" if async_collect else "")
        rows.append({"env": ENVS[variant], "measurement": what, "loop_form": label,
                     "is_auto": form in ("auto", auto), "envs": args.envs, **result,
                     "ppo_over_raw_xla": result["steps_per_s"] / raw_xla_sps,
                     **versus(result["steps_per_s"], ref)})
        print(f"{ENVS[variant]} {what} {label}: {result['steps_per_s']:,.0f} steps/s", flush=True)
    return rows


# ----------------------------------------------------------------------------- CartPole solve


def solve_cartpole(total_env_steps: int | None) -> dict:
    """The default CartPole job through ``train.run`` in this process: wall seconds (build,
    compile, training and evaluations; not Python imports), env steps and final eval return."""
    overrides = {"log.progress": False}
    if total_env_steps:
        overrides["total_env_steps"] = total_env_steps
    config = load_config("cartpole", **overrides)
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        summary = train.run(config, os.path.join(workdir, "run"))
        wall = time.perf_counter() - start
    ret = float(summary.get("eval/episodic_return", float("nan")))
    return {"env": ENVS["cartpole"], "measurement": "default job: train.run wall time",
            "envs": config.env.num_envs, "wall_s": wall, "env_steps": int(summary["env_steps"]),
            "eval_return": ret, "solved": bool(ret >= SOLVED_RETURN),
            **versus(wall, REF_PUREJAXRL_WALL)}


# ----------------------------------------------------------------------------- goals


def headline_breakout(rows: list[dict]) -> dict:
    """The Breakout PPO row to compare: the form ``auto`` picks if measured, else the fastest."""
    breakout = [r for r in rows if r["env"] == ENVS["atari"] and r["measurement"] == "PPO end to end"]
    auto = [r for r in breakout if r["is_auto"]]
    return auto[0] if auto else max(breakout, key=lambda r: r["steps_per_s"])


def goal_row(what: str, value_key: str, row: dict, ref: Reference, goal: str, met: bool | None,
             verdict_note: str = "") -> dict:
    """A comparison row: jaxwm's figure, the reference, the ratio and pass/fail."""
    value = row[value_key]
    verdict = verdict_note or ("n/a" if met is None else "PASS" if met else "FAIL")
    return {"env": row["env"], "measurement": f"goal: {what}", "loop_form": row.get("loop_form"),
            "envs": row["envs"], value_key: value, **versus(value, ref), "goal": goal,
            "verdict": verdict}


def goal_rows(rows: list[dict], solve: dict | None, backend: str, quick: bool) -> list[dict]:
    """Pass/fail rows for the project's goals (defined for the 2-CPU-core machine class), plus
    the CleanRL GPU comparison on a GPU backend."""
    skip = "n/a (quick run)" if quick else "" if backend == "cpu" else "n/a (goal is for 2 CPU cores)"
    out = []
    if any(r["env"] == ENVS["atari"] and r["measurement"] == "PPO end to end" for r in rows):
        best = headline_breakout(rows)
        for ref, goal in ((REF_PPO_CPU["atari"], 5.0), (REF_BENCHNETRL_BREAKOUT, 1.5)):
            ratio = best["steps_per_s"] / ref.value
            out.append(goal_row(f">= {goal}x {ref.label.split(' ')[0]}", "steps_per_s",
                                best, ref, f">= {goal}x", ratio >= goal, skip))
        if backend == "gpu":
            out.append(goal_row("vs CleanRL on GPU", "steps_per_s", best,
                                REF_CLEANRL_GPU, "", None))
    if solve is not None:
        met = solve["solved"] and solve["ratio"] < 2.0
        out.append(goal_row("solved, < 2x PureJaxRL wall", "wall_s", solve,
                            REF_PUREJAXRL_WALL, "< 2x and solved", met, skip))
    return out


def goal_notes(goals: list[dict]) -> list[str]:
    """One sentence per goal row."""
    notes = []
    for g in goals:
        value = g.get("steps_per_s", g.get("wall_s"))
        unit = "steps/s" if "steps_per_s" in g else "s"
        notes.append(f"{g['env']} {g['measurement']}: jaxwm {value:,.1f} {unit} "
                     f"({g['loop_form'] or 'default config'}) vs {g['reference']} -> "
                     f"{g['ratio']:.2f}x; {g['verdict']}.")
    return notes


# ----------------------------------------------------------------------------- main


def breakout_forms(args) -> list[str]:
    """Loop forms to measure for Breakout (unroll, slow to compile, is left out of --quick)."""
    forms = [f for f in BREAKOUT_FORMS if not (f == "scan" and args.skip_scan)]
    return [f for f in forms if not (args.quick and f == "unroll")]


def notes_for(args, hw: dict, rows: list[dict]) -> list[str]:
    """Method notes printed under the table."""
    mem_kind = next((r["mem_kind"] for r in rows if "mem_kind" in r), "peak memory")
    notes = [
        f"steps_per_s: env steps / wall seconds, median of {1 if args.quick else args.repeats} "
        "windows; compile_s: first iteration (trace + compile + run), excluded from steps_per_s; "
        "collect_s / update_s: median seconds per iteration of each hook (each blocked on).",
        f"peak_mem_mib: {mem_kind}, a peak since the process started (rows run in table order).",
        f"ppo.loop_form=auto resolves to '{resolve_loop_form('auto')}' on backend {hw['backend']}.",
        "env path rows: host-path steps/s of envpool itself (with and without its renderer) "
        "and of jaxwm's env path; over_first: the ratio to the first of them.",
        "async collect: ppo.async_collect=True, the next rollout collected on a second thread "
        "during the update (collect_s is then the wait for it).",
        f"CartPole-v1 (MLP, ppo:cartpole) and Breakout-v5 (Nature CNN, "
        f"ppo:atari), {args.envs} envs each; raw envpool uses random actions.",
    ]
    notes += [f"Reference '{r.label}': {r.detail}." for r in REFERENCES
              if hw["backend"] == "gpu" or r is not REF_CLEANRL_GPU]
    if args.quick:
        notes.append("QUICK smoke run: Breakout PPO uses ppo.num_steps=32, one short window, no "
                     "unroll row, and a budget-limited CartPole job; not a measurement.")
    if hw["backend"] == "gpu":
        notes.append(f"CleanRL's GPU figure used 8 envs and 10 CPU threads; this run used "
                     f"{args.envs} envs and {hw['logical_cores']} logical cores.")
    return notes


def main() -> None:
    p = parser(__doc__, repeats=3)
    p.add_argument("--envs", type=int, default=8, help="envs for every measurement (default 8)")
    p.add_argument("--skip-scan", action="store_true", help="leave out the rolled-scan Breakout row")
    p.add_argument("--skip-solve", action="store_true", help="leave out the CartPole solve run")
    p.add_argument("--window", type=float, default=10.0,
                   help="seconds each steady-state window lasts at least (default 10)")
    p.add_argument("--max-iterations", type=int, default=5000, help="cap on iterations per window")
    p.add_argument("--scale-envs", type=lambda s: [int(n) for n in s.split(",")],
                   default=[8, 64, 128], help="env counts of the scaling rows (default 8,64,128)")
    p.add_argument("--scale-repeats", type=int, default=2,
                   help="windows per PPO scaling row (default 2: 64+ envs take ~30 s per iteration "
                        "on 2 cores)")
    p.add_argument("--cleanrl-command", default="",
                   help="a command printing one JSON line of CleanRL's scan PPO at {envs} envs "
                        "(benchmarks/peers/cleanrl_ppo_scan.py), run before and after each "
                        "scaling env count")
    p.add_argument("--skip-async-ppo", action="store_true",
                   help="leave out PPO on the asynchronous pool in the scaling rows")
    p.add_argument("--skip-processes", action="store_true",
                   help="leave out the 1-vs-2-process rows")
    p.add_argument("--only-scale", action="store_true",
                   help="only the scaling and process rows (written to ppo_scaling_<backend>)")
    args = p.parse_args()
    hw = hardware()
    repeats = 1 if args.quick else args.repeats
    if args.quick:
        args.scale_envs = [8]

    if args.only_scale:
        def write(rows):  # after each env count too, so a run cut short keeps what it measured
            write_results("ppo_scaling", rows, hw, scale_notes(args), columns=SCALE_COLUMNS,
                          quick=args.quick)
        rows = scale_rows(args, on_rows=write)
        write(rows + ([] if args.skip_processes else process_rows(args)))
        return
    rows = []
    for variant, raw_steps in (("cartpole", 256 if args.quick else 8192),
                               ("atari", 32 if args.quick else 256)):
        raw = raw_rows(variant, args.envs, raw_steps, repeats)
        forms = ["auto"] if variant == "cartpole" else breakout_forms(args)
        xla_sps = raw[1]["steps_per_s"]  # raw rows: host path, then XLA path
        if variant == "atari":
            rows += audit_rows(variant, args.envs, raw_steps, repeats)
        rows += raw + ppo_rows(variant, forms, args, xla_sps, hw["backend"])
        if variant == "atari":  # the default form with ppo.async_collect
            rows += ppo_rows(variant, ["auto"], args, xla_sps, hw["backend"], async_collect=True)
    solve = None
    if not args.skip_solve:
        solve = solve_cartpole(16_384 if args.quick else None)
        rows.append(solve)
    goals = goal_rows(rows, solve, hw["backend"], args.quick)
    rows += goals
    scaling = scale_rows(args) + ([] if args.skip_processes else process_rows(args))

    columns = ["env", "measurement", "loop_form", "envs", "steps_per_s", "over_first", "compile_s",
               "collect_s", "update_s", "ppo_over_raw_xla", "peak_mem_mib", "wall_s", "env_steps",
               "eval_return", "solved", "reference", "ratio", "goal", "verdict"]
    write_results("ppo_throughput", rows, hw, notes_for(args, hw, rows) + goal_notes(goals),
                  columns=columns, quick=args.quick)
    write_results("ppo_scaling", scaling, hw, scale_notes(args), columns=SCALE_COLUMNS,
                  quick=args.quick)


SCALE_COLUMNS = ["env", "measurement", "loop_form", "envs", "steps_per_s", "over_first",
                 "compile_s", "collect_s", "update_s", "over_sync_limit", "over_async_limit", "over_cleanrl",
                 "peak_mem_mib", "wall_s", "env_steps"]


def scale_notes(args) -> list[str]:
    notes = [
        "envs: the batch each step acts on (N). Limits: random actions in a jitted lax.scan; "
        "sync: N envs stepped together; async: 2N envs, recv of the first N ready, send.",
        "PPO rows: ppo:atari (128 steps per env row, 4 x 4 minibatches); the async "
        "pool has env.num_envs=2N, env.batch_size=N, so rollouts and updates are the same size; "
        f"median of {1 if args.quick else args.scale_repeats} windows of >= {args.window} s after "
        "compilation; over_*_limit: PPO steps/s over that limit's.",
        "peer: CleanRL's ppo_atari_envpool_xla_jax_scan.py (benchmarks/peers/cleanrl_ppo_scan.py, "
        "the same 128 steps per env and 4 x 4 minibatches), run before and after jaxwm's rows "
        "at each N; steps_per_s: median over both runs of its per-iteration rates after the "
        "first; compile_s there: start-up and its first iteration; over_cleanrl: PPO / peer.",
        "Process rows: python -m jaxwm.launch --num_processes=P, Breakout, "
        f"{args.envs} envs in all (each process steps its share; the update all-reduces "
        "over gloo); steps_per_s: median charts/SPS of the log windows after the first "
        "(one per iteration); wall_s includes start-up and compilation; over_first: 2 vs 1.",
    ]
    return notes[:-1] if args.skip_processes else notes


if __name__ == "__main__":
    main()
