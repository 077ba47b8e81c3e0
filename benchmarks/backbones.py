"""PPO with every memory backbone (BenchNetRL's comparison): throughput, memory, latency, return.

For each env and backbone (``--backbones all``: FF with 1 and 4 frames, LSTM, GRU, TrXL, GTrXL,
Mamba, Mamba-2), in a fresh process each so that peaks do not carry over:

* ``steps_per_s``: PPO end to end (collect + update), median of ``--repeats`` windows after the
  first iteration, which is reported apart as ``compile_s``;
* ``update_mib``: the PPO update's memory as XLA compiled it (arguments + outputs + temporaries
  - donated aliases: ``compiled.memory_analysis()``), the same measure on every backend; on a
  GPU also ``device_peak_mib``, the device's ``peak_bytes_in_use``, the figure BenchNetRL's
  "GPU memory allocated" corresponds to;
* ``latency_ms`` / ``latency_p95_ms``: one policy step for the whole env batch (``Policy.act``,
  ``block_until_ready``), median and 95th percentile of ``--latency-calls`` calls;
* ``train_s`` / ``eval_return``: a ``jaxwm.train`` run of ``--train-steps`` env steps
  (compile and evaluation included) and its final evaluation (0 skips it).

Settings: CartPole-v1 runs ``ppo:cartpole_masked`` (velocities zeroed; BenchNetRL's
classic-control sizes), Breakout-v5 ``ppo:atari`` with BenchNetRL's Atari settings
(16 envs, 8 minibatches, 1 frame except FF-4). Breakout adds ``mamba@256``, Mamba at the LSTM's
hidden size, for the equal-size throughput goal. ``gymnax:Breakout-MinAtar`` (a JAX env) runs
``ppo:minatar`` (PureJaxRL's MinAtar settings, the frames flattened) with collection and update
one program, timed per call of 4 iterations; its ``update_mib`` is that whole program's.
``--seeds 1,4,8`` measures steps/s per seed
with ``--config.num_seeds`` (``--seed-backbone`` on the first env). The goals of the BenchNetRL
issue are checked against benchmarks/REFERENCES.md and marked pass/fail. Writes ``<out>_<backend>.json``,
``.md`` and ``.png`` (bar charts like BenchNetRL's figures).

    python benchmarks/backbones.py --envs CartPole-v1,Breakout-v5 --backbones all \\
        --out benchmarks/results/backbones
    python benchmarks/backbones.py --quick        # smoke run, results suffixed _quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import RESULTS, block, hardware, median, parser, ppo_end_to_end, write_results

import jaxwm.config

BACKBONES = ("ff1", "ff4", "lstm", "gru", "trxl", "gtrxl", "mamba", "mamba2")
VARIANTS = {"CartPole-v1": "cartpole_masked", "Breakout-v5": "atari",
            "gymnax:Breakout-MinAtar": "minatar"}
# MinAtar in JAX (PureJaxRL's settings, ppo:minatar): collect and update one program, timed
# per call of this many iterations.
MINATAR = {"iterations_per_call": 4}
# BenchNetRL's Atari runs: 16 envs, 8 minibatches, one frame (its "PPO-4" stacks four).
ATARI = {"env.num_envs": 16, "ppo.num_minibatches": 8, "env.frame_stack": 1}
# PyTorch, one thread, velocity-masked CartPole (benchmarks/REFERENCES.md, "Measured ... CPU").
CPU_REFERENCE_SPS = {"lstm": 34, "gru": 154, "trxl": 66, "gtrxl": 72}
# BenchNetRL's own table (hardware unstated): SPS, GB allocated, latency ms (benchmarks/REFERENCES.md).
PAPER_SPS = {"ff1": 3540, "ff4": 3310, "mamba": 2730, "mamba2": 2460, "gtrxl": 1890,
             "trxl": 1860, "gru": 700, "lstm": 605}


def overrides_for(env_id: str, backbone: str, quick: bool) -> dict:
    """Config overrides of one row: the backbone, and BenchNetRL's settings for the env."""
    name, _, size = backbone.partition("@")
    o = {"network.backbone": "ff" if name.startswith("ff") else name, "log.progress": False}
    if VARIANTS[env_id] == "atari":
        o.update(ATARI)
        if name == "ff4":
            o["env.frame_stack"] = 4
    elif VARIANTS[env_id] == "minatar":
        o.update(MINATAR)
        if name == "ff4":
            o["network.frames"] = 4
    elif name == "ff4":
        o["network.frames"] = 4
    if size:
        o[{"mamba": "network.mamba.dim", "lstm": "network.rnn.hidden",
           "gru": "network.rnn.hidden"}[name]] = int(size)
    if quick:
        o.update({"ppo.num_steps": 16, "env.num_envs": 8, "ppo.num_minibatches": 2})
    return o


def load(env_id: str, overrides: dict):
    return jaxwm.config.load(f"ppo:{VARIANTS[env_id]}", overrides)


# ----------------------------------------------------------------------------- one row


def update_memory_mib(algo, config, state) -> float:
    """The update step's memory as compiled: the same update PPO runs, lowered on a real
    rollout (see the module docstring)."""
    from jaxwm import backend
    from jaxwm.agents import ppo
    from jaxwm.algos.ppo import anneal_updates
    from jaxwm.loop import seeds
    from jaxwm.nets import backbones
    from jaxwm.nets.actor_critic import make_actor_critic

    # The algorithm's update is a closure: build the same one, then lower it on its inputs.
    network = make_actor_critic(env_spec(config), config.network)
    hyper = ppo.PPOHyper.from_config(config.ppo, recurrent=network.has_memory)
    optimizer = ppo.make_optimizer(config.ppo, anneal_updates(config),
                                   backbones.learning_rate_scale(config.network))
    update = backend.jit(seeds.vmap(ppo.make_update(network, hyper, optimizer,
                                                    ppo.resolve_loop_form("auto")),
                                    config.num_seeds), donate_argnums=0)
    key, _ = seeds.split(seeds.loop_key(0, config.num_seeds, config.env.num_envs))
    if "iterate" in algo.hooks:  # a JAX env: the whole call's program, env included
        analysis = algo.hooks["iterate"].fn.lower(state, {}, key).compile().memory_analysis()
    else:
        state, passed, _ = algo.hooks["collect"].fn(state, {}, key)
        analysis = update.lower(state.learner, passed["rollout"], key).compile() \
            .memory_analysis()
    total = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
             + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)
    return total / 2**20


def env_spec(config):
    """The env spec PPO builds its network for (the network does not depend on the pool size)."""
    from jaxwm.envs import make_env

    env = make_env(config.env, num_envs=config.env.num_envs, seed=config.seed)
    try:
        return env.spec
    finally:
        env.close()


def policy_latency(algo, state, calls: int) -> dict:
    """One jitted policy step over the training batch, timed per call after a warm-up."""
    from jaxwm import backend

    obs = state.actor.pending.obs  # the synchronous pool's rows waiting to be acted on
    n = obs.shape[0]
    params = algo.policy_params(state)
    act = backend.jit(algo.policy.act)
    carry = algo.policy.init_carry(params, n)
    first = jnp.zeros(n, bool)
    key, temperature = jax.random.PRNGKey(0), jnp.float32(1.0)
    block(act(params, carry, obs, first, key, temperature))
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        carry, _, _ = block(act(params, carry, obs, first, key, temperature))
        samples.append((time.perf_counter() - start) * 1e3)
    return {"latency_ms": median(samples), "latency_p95_ms": float(np.percentile(samples, 95)),
            "latency_batch": n}


def measure_row(env_id: str, backbone: str, args) -> dict:
    """Everything for one (env, backbone, seeds): run in its own process by ``main``."""
    overrides = {**overrides_for(env_id, backbone, args.quick), "num_seeds": args.num_seeds}
    config = load(env_id, overrides)

    def probe(algo, state):
        out = {} if args.num_seeds > 1 else policy_latency(algo, state, args.latency_calls)
        out["update_mib"] = update_memory_mib(algo, config, state)
        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            out["device_peak_mib"] = stats["peak_bytes_in_use"] / 2**20
        return out

    row = {"env": env_id, "backbone": backbone, "seeds": args.num_seeds,
           "envs": config.env.num_envs, "steps": config.ppo.num_steps,
           **ppo_end_to_end(config, args.window, args.repeats, args.max_iterations, probe)}
    row["steps_per_s_all_seeds"] = row["steps_per_s"] * args.num_seeds
    train_steps = args.train_steps.get(env_id, 0)
    if train_steps and args.num_seeds == 1:
        from jaxwm import train

        config = load(env_id, {**overrides, "total_env_steps": train_steps,
                               "checkpoint.every": "never", "eval.every": "never"})
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            summary = train.run(config, workdir)
        row.update(train_s=time.perf_counter() - start, train_env_steps=summary["env_steps"],
                   eval_return=summary.get("eval/episodic_return"))
    return row


# ----------------------------------------------------------------------------- goals


def goal(what, value, target, met, detail) -> dict:
    return {"env": "goal", "backbone": what, "value": value, "target": target,
            "verdict": "n/a" if met is None else ("PASS" if met else "not reached"),
            "detail": detail}


def goals_for(rows: list[dict], backend: str) -> list[dict]:
    by = {(r["env"], r["backbone"], r["seeds"]): r for r in rows}
    out = []
    lstm, mamba = by.get(("Breakout-v5", "lstm", 1)), by.get(("Breakout-v5", "mamba@256", 1))
    if lstm and mamba:
        ratio = mamba["steps_per_s"] / lstm["steps_per_s"]
        out.append(goal("Mamba / LSTM steps/s, Breakout, hidden 256", round(ratio, 2), ">= 4",
                        ratio >= 4, "BenchNetRL claims 4.5x"))
    if backend == "cpu":
        for name, ref in CPU_REFERENCE_SPS.items():
            row = by.get(("CartPole-v1", name, 1))
            if row:
                ratio = row["steps_per_s"] / ref
                out.append(goal(f"{name} steps/s vs PyTorch CPU, masked CartPole",
                                round(ratio, 2), ">= 3x", ratio >= 3,
                                f"{row['steps_per_s']:.0f} vs {ref} (one thread; here "
                                f"{os.cpu_count()} cores)"))
    trxl, mamba2 = by.get(("Breakout-v5", "trxl", 1)), by.get(("Breakout-v5", "mamba2", 1))
    if trxl and mamba2:
        key = "device_peak_mib" if "device_peak_mib" in trxl else "update_mib"
        ratio = trxl[key] / mamba2[key]
        out.append(goal(f"TrXL / Mamba-2 memory ({key}), Breakout", round(ratio, 2), ">= 8",
                        ratio >= 8, f"{trxl[key]:.0f} vs {mamba2[key]:.0f} MiB; BenchNetRL: "
                        "1.765 vs 0.219 GB"))
    for name, paper in (("lstm", 605), ("gru", 700)):
        row = by.get(("Breakout-v5", name, 1))
        if row and backend == "gpu":
            ratio = row["steps_per_s"] / paper
            out.append(goal(f"{name} steps/s vs BenchNetRL's GPU table, Breakout",
                            round(ratio, 2), ">= 3x", ratio >= 3,
                            f"{row['steps_per_s']:.0f} vs {paper}"))
    return out


# ----------------------------------------------------------------------------- figures


def bar_charts(rows: list[dict], png: str, title: str) -> None:
    """Per env: steps/s, update memory and latency per backbone (BenchNetRL's figures)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env"] for r in rows if r["seeds"] == 1))
    panels = (("steps_per_s", "steps/s (higher is better)"),
              ("update_mib", "update memory, MiB (XLA)"),
              ("latency_ms", "policy step latency, ms"))
    fig, axes = plt.subplots(len(envs), len(panels), figsize=(4.2 * len(panels), 3.2 * len(envs)),
                             squeeze=False)
    for i, env in enumerate(envs):
        env_rows = [r for r in rows if r["env"] == env and r["seeds"] == 1]
        names = [r["backbone"] for r in env_rows]
        for j, (key, label) in enumerate(panels):
            ax = axes[i][j]
            values = [r.get(key) or 0.0 for r in env_rows]
            ax.bar(names, values, color=plt.cm.tab10(np.arange(len(names)) % 10))
            ax.set_title(f"{env}: {label}", fontsize=9)
            ax.tick_params(axis="x", labelrotation=45, labelsize=8)
            if key == "latency_ms":
                p95 = [r.get("latency_p95_ms") or 0.0 for r in env_rows]
                ax.errorbar(names, values, yerr=[np.zeros(len(values)),
                                                 np.maximum(np.subtract(p95, values), 0)],
                            fmt="none", ecolor="black", capsize=2, linewidth=0.8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def parse_args():
    p = parser(__doc__, repeats=3)
    p.add_argument("--envs", default="CartPole-v1,Breakout-v5", help="comma-separated env ids")
    p.add_argument("--backbones", default="all", help=f"'all' or a list of {BACKBONES}; "
                   "name@H sets the hidden size (lstm, gru, mamba)")
    p.add_argument("--out", default=os.path.join(RESULTS, "backbones"),
                   help="output stem; _<backend>.json/.md/.png are appended")
    p.add_argument("--window", type=float, default=5.0, help="seconds per timed window")
    p.add_argument("--max-iterations", type=int, default=200)
    p.add_argument("--latency-calls", type=int, default=200)
    p.add_argument("--train-steps", default="CartPole-v1=0,Breakout-v5=0",
                   help="env=steps of the training run per row (0 skips it)")
    p.add_argument("--seeds", default="1,4,8", help="seed counts for the per-seed scaling rows")
    p.add_argument("--seed-backbone", default="gru")
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--num-seeds", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.train_steps = {k: int(v) for k, v in (kv.split("=") for kv in args.train_steps.split(","))}
    if args.quick:
        args.repeats, args.window, args.latency_calls = 1, 0.5, 20
    return args


def run_row(env_id: str, backbone: str, num_seeds: int) -> dict:
    """``measure_row`` in a fresh Python, so that memory peaks and caches start empty."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, os.path.abspath(__file__), "--row", f"{env_id}:{backbone}:{out.name}",
               "--num-seeds", str(num_seeds), *forwarded_args()]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return {"env": env_id, "backbone": backbone, "seeds": num_seeds,
                    "error": proc.stderr.strip().splitlines()[-1][:200] if proc.stderr else "?"}
        with open(out.name) as f:
            row = json.load(f)
    print(f"{env_id:12s} {backbone:10s} seeds={num_seeds}: {row['steps_per_s']:9.0f} steps/s, "
          f"compile {row['compile_s']:.1f} s, {time.perf_counter() - start:.0f} s in all",
          flush=True)
    return row


def forwarded_args() -> list[str]:
    keep, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if arg in ("--envs", "--backbones", "--out", "--seeds", "--seed-backbone"):
            skip = True
            continue
        if not arg.startswith(("--envs=", "--backbones=", "--out=", "--seeds=",
                               "--seed-backbone=")):
            keep.append(arg)
    return keep


def main() -> None:
    args = parse_args()
    if args.row:
        env_id, backbone, out = args.row.rsplit(":", 2)  # env ids may hold a colon
        row = measure_row(env_id, backbone, args)
        with open(out, "w") as f:
            json.dump(row, f)
        return
    envs = args.envs.split(",")
    unknown = [e for e in envs if e not in VARIANTS]
    if unknown:
        raise SystemExit(f"--envs: no benchmark settings for {unknown}; choose from "
                         f"{list(VARIANTS)}.")
    names = list(BACKBONES) if args.backbones == "all" else args.backbones.split(",")
    hw = hardware()
    rows = []
    for env_id in envs:
        extra = ["mamba@256"] if env_id == "Breakout-v5" and args.backbones == "all" else []
        for backbone in names + extra:
            rows.append(run_row(env_id, backbone, 1))
    for n in [int(s) for s in args.seeds.split(",") if s]:
        if n > 1 or args.seed_backbone not in names:
            rows.append(run_row(envs[0], args.seed_backbone, n))
    goals = goals_for([r for r in rows if "error" not in r], hw["backend"])
    stem_dir, stem_name = os.path.split(args.out)
    notes = [
        f"steps_per_s: env steps per wall second of PPO (collect + update), median of "
        f"{args.repeats} windows of >= {args.window} s after the first iteration (compile_s). "
        "With seeds > 1 it counts each seed's steps; steps_per_s_all_seeds is the pool's.",
        "update_mib: XLA's compiled memory of one PPO update (arguments + outputs + temporaries "
        "- donated aliases); device_peak_mib (GPU only): the device's peak_bytes_in_use.",
        "latency_ms: one jitted policy step for the whole env batch, median (p95 in "
        "latency_p95_ms), block_until_ready after each call.",
        "CartPole-v1: ppo:cartpole_masked (velocities zeroed; BenchNetRL's classic "
        "sizes: LSTM/GRU 512, TrXL 384x3 layers, Mamba/Mamba-2 512). Breakout-v5: "
        "ppo:atari with 16 envs, 8 minibatches, 1 frame (FF-4: 4), BenchNetRL's Atari "
        "sizes (LSTM/GRU 256, TrXL 512 mem 64, Mamba 450, Mamba-2 512). "
        "gymnax:Breakout-MinAtar (a JAX env): ppo:minatar (64 envs x 128 steps, the frames "
        "flattened, the default network sizes), collection and update one program timed per "
        "call of 4 iterations, update_mib that whole program's.",
        "Reference (benchmarks/REFERENCES.md): BenchNetRL PyTorch on one CPU thread, masked CartPole: LSTM "
        "~34, GRU ~154, TrXL ~66, GTrXL ~72 steps/s; its paper's table (hardware unstated): "
        + ", ".join(f"{k} ~{v}" for k, v in PAPER_SPS.items()) + " steps/s.",
    ]
    notes += [f"{g['backbone']}: {g['value']} (goal {g['target']}): {g['verdict']}; {g['detail']}"
              for g in goals]
    columns = ["env", "backbone", "seeds", "envs", "steps_per_s", "steps_per_s_all_seeds",
               "compile_s", "collect_s", "update_s", "update_mib", "device_peak_mib",
               "latency_ms", "latency_p95_ms", "train_s", "eval_return", "error"]
    write_results(stem_name, rows, hw, notes, columns=columns, quick=args.quick,
                  directory=stem_dir or RESULTS)
    png = os.path.join(stem_dir or RESULTS, f"{stem_name}_{hw['backend']}"
                       + ("_quick" if args.quick else "") + ".png")
    bar_charts([r for r in rows if "error" not in r], png,
               f"jaxwm PPO backbones on {', '.join(hw['device_kinds'])} ({hw['backend']})")
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
