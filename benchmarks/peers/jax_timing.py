"""Timing shared by the JAX peers (``purejaxrl_ppo.py``, ``craftax_baselines_ppo_rnn.py``):
a whole training program compiled ahead of its runs, so compile time stays apart. Imported
from this directory (each peer script's own), in the peer's environment: no jaxwm import."""
import json
import statistics
import time


def compile_and_run(train, key, repeats: int):
    """``jax.jit(train)`` compiled for ``key``, then run ``repeats`` times to the device sync:
    ``(compile_s, each run's seconds, the last run's output)``."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(train).lower(key).compile()
    compile_s = time.perf_counter() - start
    runs, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(key))
        runs.append(time.perf_counter() - start)
    return compile_s, runs, out


def report(args, env_steps: int, compile_s: float, runs: list, returns: list) -> None:
    """The one JSON line ``benchmarks/jax_envs.py`` reads (``common.run_peer``)."""
    run_s = statistics.median(runs)
    print(json.dumps({"env": args.env, "num_envs": args.num_envs, "num_steps": args.num_steps,
                      "env_steps": env_steps, "compile_s": compile_s, "run_s": run_s,
                      "steps_per_s": env_steps / run_s, "runs_s": runs, "returns": returns}))
