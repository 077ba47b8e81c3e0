"""DreamerV3 training throughput: updates/s of jaxwm's one jitted training step.

One update = a [batch 16 x length 64] sequence batch from the replay, the world-model loss
(posterior scan over 64 steps), imagination of 15 steps from all 1024 posterior states, the
actor-critic losses, one optimiser step and the slow critic's EMA: the ``update_model`` hook
of ``jaxwm.algos.dreamer`` exactly as training calls it (state donated). The replay is first
filled by the ``collect`` hook (random actions). Compile time (the first update) is reported
apart; steady state is the median over ``--repeats`` windows of updates.

Rows: size1m on vector CartPole (``dreamer:cartpole``) and on 64x64 RGB Pong
(``dreamer:atari100k``); ``--sizes`` adds larger models (size12m is the GPU row).
Reference (benchmarks/REFERENCES.md, this machine class: 2 CPU cores): the official JAX DreamerV3 at
size1m, batch 16 x 64: ~0.06-0.14 updates/s; the PyTorch port at a comparable size
~0.06-0.07. Goals: at least the official implementation's speed and 3x the port's.

    python benchmarks/dreamer.py                 # ~5 min on 2 CPU cores
    python benchmarks/dreamer.py --sizes 1m,12m  # on a GPU
    python benchmarks/dreamer.py --quick         # smoke run: debug sizes (~35 s)
"""

from __future__ import annotations

import time

import jax
from common import block, hardware, median, parser, peak_memory, write_results

from jaxwm.algos import dreamer
from jaxwm.config import load
from jaxwm.runner import validate

OFFICIAL_JAX = (0.06, 0.14)  # updates/s, size1m, 2 CPU cores (benchmarks/REFERENCES.md)
PYTORCH_PORT = (0.06, 0.07)
ENVS = {"CartPole-v1": "dreamer:cartpole", "Pong-v5": "dreamer:atari100k"}


def measure(env_id: str, size: str, repeats: int, window_s: float, quick: bool) -> dict:
    # The reference figures' setting on every row: batch 16 x 64 (dreamer:cartpole
    # trains on 16 x 32; the benchmark does not follow it).
    overrides = {"dreamer.model_size": size, "dreamer.report_every": 0, "log.progress": False,
                 "env.num_envs": 1, "dreamer.batch_size": 16, "dreamer.batch_length": 64}
    if quick:
        overrides.update({"dreamer.batch_size": 4, "dreamer.batch_length": 8,
                          "dreamer.size_overrides": {"deter": 16, "hidden": 8, "classes": 4,
                                                     "units": 16, "depth": 2}})
    config = load(ENVS[env_id], overrides)
    validate(config)
    d = config.dreamer
    algo = dreamer.build(config)
    try:
        key = jax.random.key(0)
        state = algo.init(key)
        collect, update = algo.hooks["collect"].fn, algo.hooks["update_model"].fn
        for i in range(d.batch_length + 1):  # enough steps for one sequence
            state, _, _ = collect(state, {}, jax.random.fold_in(key, i))
        start = time.perf_counter()
        state, _, metrics = update(state, {}, jax.random.fold_in(key, 10_000))
        block((state, metrics))
        compile_s = time.perf_counter() - start
        start = time.perf_counter()  # a second update sizes the windows
        state, _, metrics = update(state, {}, jax.random.fold_in(key, 10_001))
        block((state, metrics))
        per_update = time.perf_counter() - start
        n = max(1, round(window_s / per_update))
        samples = []
        for r in range(repeats):
            start = time.perf_counter()
            for i in range(n):
                state, _, metrics = update(state, {}, jax.random.fold_in(key, 20_000 + r * n + i))
            block((state, metrics))
            samples.append(n / (time.perf_counter() - start))
        mib, label = peak_memory()
        return {"env": env_id, "size": size, "batch": f"{d.batch_size}x{d.batch_length}",
                "horizon": d.horizon, "updates_per_s": median(samples),
                "s_per_update": 1 / median(samples), "compile_s": compile_s,
                "peak_mib": mib, "memory": label, "samples": samples,
                "model_loss": float(metrics["model/loss"])}
    finally:
        algo.close()


def main() -> None:
    p = parser(__doc__, repeats=3)
    p.add_argument("--envs", default="CartPole-v1,Pong-v5")
    p.add_argument("--sizes", default="1m", help="comma-separated model sizes")
    p.add_argument("--window", type=float, default=20.0, help="seconds per timed window")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.window = 1, 1.0
    rows = [measure(env, size, args.repeats, args.window, args.quick)
            for size in args.sizes.split(",") for env in args.envs.split(",")]
    hw = hardware()
    notes = [
        "updates_per_s: jaxwm's update_model hook (world model + imagination + actor-critic "
        f"+ optimiser, state donated), median of {args.repeats} windows of >= {args.window} s; "
        "compile_s: the first update (trace, compile, run).",
        "peak_mib: " + rows[0]["memory"] + " (on CPU the whole process, host side).",
        f"Reference (benchmarks/REFERENCES.md, 2 CPU cores, size1m, 16 x 64): official JAX DreamerV3 "
        f"{OFFICIAL_JAX[0]}-{OFFICIAL_JAX[1]} updates/s; the PyTorch port "
        f"{PYTORCH_PORT[0]}-{PYTORCH_PORT[1]}.",
    ]
    for row in rows:
        if row["size"] == "1m" and hw["backend"] == "cpu" and not args.quick:
            ups = row["updates_per_s"]
            notes.append(
                f"{row['env']} size1m: {ups:.3g} updates/s = {ups / OFFICIAL_JAX[1]:.1f}x the "
                f"official JAX upper figure (goal >= 1x: "
                f"{'PASS' if ups >= OFFICIAL_JAX[1] else 'not reached'}), "
                f"{ups / PYTORCH_PORT[1]:.1f}x the PyTorch port's upper figure (goal >= 3x: "
                f"{'PASS' if ups >= 3 * PYTORCH_PORT[1] else 'not reached'}).")
    columns = ["env", "size", "batch", "horizon", "updates_per_s", "s_per_update", "compile_s",
               "peak_mib"]
    write_results("dreamer", rows, hw, notes, columns=columns, quick=args.quick)


if __name__ == "__main__":
    main()
