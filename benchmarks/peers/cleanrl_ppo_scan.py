"""CleanRL's JAX + envpool scan PPO (``cleanrl/ppo_atari_envpool_xla_jax_scan.py``) timed as
it runs, for ``benchmarks/ppo_throughput.py --cleanrl-command``.

Runs the script from a CleanRL checkout (``--src``, kept outside this repository) unchanged in
this process, with its own arguments (``--env-id``, ``--num-envs``, ``--total-timesteps``),
and notes the time of each iteration's ``SPS:`` line (printed once per iteration, after
the update's metrics are fetched from the device, so each gap is one whole iteration). The
first iteration (trace + compile) is reported apart; steps/s is the median over the later
iterations of ``num_envs * num_steps / gap``.

Shims for the newer jax, gym and envpool it meets (none touches the timed computation):
``jax.tree_map``, removed from jax, is pointed at ``jax.tree_util.tree_map`` (the same
function); envpool >= 1.0 returns its gymnasium pool with read-only ``num_envs`` and
``single_*_space`` properties, which the script assigns to, and gymnasium's reset and
5-tuple step, so ``envpool.make``'s pool is wrapped in a proxy that keeps such assignments
beside it and answers in the old gym API (``_OldGymPool``); the script's
``isinstance(space, gym.spaces.Discrete)`` check is pointed at gymnasium's ``Discrete``; and
newer flax's ``TrainState`` asks ``"overwrite_with_gradient" in params`` (at trace time), which
the script's ``flax.struct.dataclass`` parameters cannot answer, so such classes answer False.

    python benchmarks/peers/cleanrl_ppo_scan.py --src <cleanrl checkout> --envs 8 --iterations 12

Prints one JSON line: ``{"envs", "num_steps", "steps_per_s", "samples_steps_per_s",
"first_iteration_s"`` (start-up, env creation, compile and the first iteration),
``"iterations"}``.
"""
import argparse
import builtins
import json
import os
import runpy
import statistics
import sys
import tempfile
import time

NUM_STEPS = 128  # the script's default rollout length per env (``--num-steps``)


class _OldGymPool:
    """An envpool >= 1.0 pool as the script expects envpool 0.x's gym pool: it takes the
    script's attribute assignments, ``reset()`` returns the observations alone, and the XLA
    step returns ``(obs, reward, done, info)`` with ``done = terminated | truncated`` and
    ``info["TimeLimit.truncated"]``."""

    def __init__(self, pool):
        object.__setattr__(self, "_pool", pool)

    def reset(self):
        obs, _ = self._pool.reset()
        return obs

    def xla(self):
        handle, recv, send, step = self._pool.xla()

        def old_step(handle, action):
            handle, (obs, reward, terminated, truncated, info) = step(handle, action)
            info = {**info, "TimeLimit.truncated": truncated}
            return handle, (obs, reward, terminated | truncated, info)

        return handle, recv, send, old_step

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def __setattr__(self, name, value):
        try:
            setattr(self._pool, name, value)
        except AttributeError:  # a read-only property of the newer pool
            object.__setattr__(self, name, value)


def install_shims() -> None:
    import envpool
    import flax.struct
    import gym
    import gymnasium
    import jax

    struct_dataclass = flax.struct.dataclass

    def answering_dataclass(cls, *a, **k):
        made = struct_dataclass(cls, *a, **k)
        if not hasattr(made, "__contains__"):
            made.__contains__ = lambda self, key: False
        return made

    flax.struct.dataclass = answering_dataclass
    if not hasattr(jax, "tree_map"):
        jax.tree_map = jax.tree_util.tree_map
    make = envpool.make
    envpool.make = lambda *a, **k: _OldGymPool(make(*a, **k))
    gym.spaces.Discrete = gymnasium.spaces.Discrete


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, help="a CleanRL checkout")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--iterations", type=int, default=12, help="iterations to run (the first is compile)")
    p.add_argument("--env-id", default="Breakout-v5")
    args = p.parse_args()
    script = os.path.join(os.path.abspath(args.src), "cleanrl", "ppo_atari_envpool_xla_jax_scan.py")

    install_shims()

    stamps = []
    real_print = builtins.print

    def stamping_print(*a, **k):
        if a and a[0] == "SPS:":
            stamps.append(time.perf_counter())
        return real_print(*a, file=sys.stderr)  # stdout carries only the JSON line

    start = time.perf_counter()
    sys.argv = [script, "--env-id", args.env_id, "--num-envs", str(args.envs),
                "--num-steps", str(NUM_STEPS),
                "--total-timesteps", str(args.iterations * args.envs * NUM_STEPS)]
    with tempfile.TemporaryDirectory() as workdir:  # its tensorboard files land in runs/
        cwd = os.getcwd()
        os.chdir(workdir)
        builtins.print = stamping_print
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            builtins.print = real_print
            os.chdir(cwd)
    if len(stamps) < 3:
        raise SystemExit(f"CleanRL printed {len(stamps)} SPS lines; need at least 3")
    gaps = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    sps = [args.envs * NUM_STEPS / g for g in gaps]
    print(json.dumps({"envs": args.envs, "num_steps": NUM_STEPS,
                      "steps_per_s": statistics.median(sps), "samples_steps_per_s": sps,
                      "first_iteration_s": stamps[0] - start, "iterations": len(stamps)}))


if __name__ == "__main__":
    main()
