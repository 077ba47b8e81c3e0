"""Several seeds in one process: seed-updates/s at 1, 4 and 16 seeds (``--config.num_seeds``).

Each row times an algorithm's update hook exactly as training calls it (the learner vmapped
over seeds, state donated), after its collect hook has filled every seed's replay; compile
time (the first call) apart, steady state the median of ``--repeats`` windows.
``seed_updates_per_s`` = seeds x updates per call x calls per second: the work done for all
seeds together.

* SAC at its Pendulum size (``sac:pendulum``: 256x256 actor and twin critics, batch
  256), ``updates_per_call`` updates per jitted scan. Its dense layers' FLOPs per update
  (``offline.update_flops``) give ``gflop_per_s``, compared with this machine's rate for the
  256x256x256 matmuls the update is made of, measured here (a scanned chain of them, one
  program; for S seeds the same matmuls batched S at a time).
* DreamerV3 at ``dreamer:debug`` sizes.

Goal on a CPU: one SAC seed already runs at ~75% of the matmul rate (benchmarks/README.md),
so vmapping seeds can gain at most 1 / 0.75 = 1.33x; the goal is >= 90% of the matmul rate at
4 seeds, i.e. >= 0.90 / 0.75 = 1.2x one seed's seed-updates/s. On a GPU, where one seed
leaves the device mostly idle, the goal is >= 3x at 4 seeds.

    python benchmarks/seeds.py            # ~7 min on 2 CPU cores
    python benchmarks/seeds.py --quick    # smoke run (~40 s)
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from common import block, hardware, median, parser, peak_memory, write_results
from offline import update_flops

from jaxwm import backend, runner
from jaxwm.algos import dreamer, sac
from jaxwm.config import load
from jaxwm.loop import seeds

CONFIGS = {"sac": ("sac:pendulum", sac), "dreamer": ("dreamer:debug",
                                                                  dreamer)}


def matmul_gflops(size: int, batch: int, repeats: int, chain: int = 200) -> float:
    """GFLOP/s of ``chain`` [size, size] @ [size, size] matmuls in one scanned program, ``batch``
    of them at a time (vmapped, as over seeds)."""
    x = jax.random.normal(jax.random.key(0), (batch, size, size)) / size ** 0.5
    w = jax.random.normal(jax.random.key(1), (batch, size, size)) / size ** 0.5

    @backend.jit
    def run(x, w):
        return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), x, None, length=chain)[0]

    block(run(x, w))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(run(x, w))
        samples.append(time.perf_counter() - start)
    return 2.0 * size ** 3 * batch * chain / median(samples) / 1e9


def measure(algo: str, num_seeds: int, repeats: int, window_s: float, quick: bool) -> dict:
    spec, module = CONFIGS[algo]
    overrides = {"num_seeds": num_seeds, "log.progress": False}
    if algo == "sac":  # enough updates per call that dispatch is noise
        overrides.update({"sac.steps_per_collect": 32, "sac.learning_starts": 256})
        if quick:
            overrides.update({"sac.actor_hidden": (32, 32), "sac.critic_hidden": (32, 32),
                              "sac.batch_size": 32, "sac.learning_starts": 64})
    config = load(spec, overrides)
    runner.validate(config)
    algorithm = module.build(config)
    collect, update = algorithm.hooks["collect"].fn, algorithm.hooks["update_agent" if algo ==
                                                                          "sac" else
                                                                          "update_model"].fn
    key = seeds.loop_key(0, num_seeds, config.env.num_envs)
    try:
        state = algorithm.init(key)
        fill = config.sac.learning_starts if algo == "sac" else config.dreamer.prefill
        per_collect = algorithm.hooks["collect"].counts["env_steps"] // config.env.num_envs
        for i in range(-(-fill // per_collect) + 1):
            state, _, _ = collect(state, {}, seeds.fold_in(key, i))
        start = time.perf_counter()
        state, _, metrics = update(state, {}, seeds.fold_in(key, 10_000))
        block((state, metrics))
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        state, _, metrics = update(state, {}, seeds.fold_in(key, 10_001))
        block((state, metrics))
        calls = max(1, round(window_s / (time.perf_counter() - start)))
        samples = []
        for r in range(repeats):
            start = time.perf_counter()
            for i in range(calls):
                state, _, metrics = update(state, {}, seeds.fold_in(key, 20_000 + r * calls + i))
            block((state, metrics))
            samples.append(calls / (time.perf_counter() - start))
    finally:
        algorithm.close()
    per_call = sac.updates_per_collect(config) if algo == "sac" else 1
    row = {"algo": algo, "config": spec, "seeds": num_seeds, "updates_per_call": per_call,
           "seed_updates_per_s": num_seeds * per_call * median(samples),
           "compile_s": compile_s, "peak_mib": peak_memory()[0],
           "samples_calls_per_s": samples}
    if algo == "sac":
        s = config.sac
        flops = update_flops(s.batch_size, 3, 1, s.actor_hidden[0])
        row["gflop_per_s"] = row["seed_updates_per_s"] * flops / 1e9
    return row


def main() -> None:
    p = parser(__doc__, repeats=5)
    p.add_argument("--algos", default="sac,dreamer")
    p.add_argument("--seeds", default="1,4,16")
    p.add_argument("--window", type=float, default=10.0, help="seconds per timed window")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.window, args.seeds = 1, 0.5, "1,2"
    counts = [int(n) for n in args.seeds.split(",")]
    rows = []
    for algo in args.algos.split(","):
        for n in counts:
            row = measure(algo, n, args.repeats, args.window, args.quick)
            base = next(r for r in rows + [row] if r["algo"] == algo and r["seeds"] == counts[0])
            row["over_one_seed"] = row["seed_updates_per_s"] / base["seed_updates_per_s"]
            rows.append(row)
    hw = hardware()
    size = 32 if args.quick else 256
    rates = {n: matmul_gflops(size, n, args.repeats) for n in counts}
    for row in rows:
        if "gflop_per_s" in row:
            row["matmul_gflop_per_s"] = rates[row["seeds"]]
            row["of_matmul_rate"] = row["gflop_per_s"] / rates[1]
    notes = [
        "seed_updates_per_s: seeds x updates per call x calls/s of the update hook (learner "
        f"vmapped over seeds, state donated), median of {args.repeats} windows of >= "
        f"{args.window} s; compile_s: the first call.",
        f"matmul_gflop_per_s: {size}x{size}x{size} matmuls in one scanned program, as many at a "
        "time as seeds; of_matmul_rate: SAC's dense-layer GFLOP/s over the one-at-a-time rate.",
    ]
    sac_rows = {r["seeds"]: r for r in rows if r["algo"] == "sac"}
    if 4 in sac_rows and 1 in sac_rows and not args.quick:
        four, one = sac_rows[4], sac_rows[1]
        goal = 3.0 if hw["backend"] != "cpu" else 0.90
        met = (four["over_one_seed"] >= goal) if hw["backend"] != "cpu" else \
            (four["of_matmul_rate"] >= goal)
        notes.append(
            f"SAC: one seed at {one['of_matmul_rate']:.0%} of the matmul rate; 4 seeds at "
            f"{four['of_matmul_rate']:.0%} ({four['over_one_seed']:.2f}x one seed's "
            f"seed-updates/s). Goal ({hw['backend']}): "
            + ("4 seeds >= 90% of the matmul rate" if hw["backend"] == "cpu" else
               "4 seeds >= 3x one seed") + f": {'PASS' if met else 'not met'}.")
    columns = ["algo", "seeds", "updates_per_call", "seed_updates_per_s", "over_one_seed",
               "gflop_per_s", "matmul_gflop_per_s", "of_matmul_rate", "compile_s", "peak_mib"]
    write_results("seeds", rows, hw, notes, columns=columns, quick=args.quick)


if __name__ == "__main__":
    main()
