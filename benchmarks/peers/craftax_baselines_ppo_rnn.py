"""Craftax_Baselines' PPO-RNN (``ppo_rnn.py``, Matthews et al. 2024, "Craftax") timed as its
README runs it, for ``benchmarks/jax_envs.py --craftax-src``.

Imports ``make_train`` from a Craftax_Baselines checkout (``--src``, kept outside this
repository) unchanged, with its argparse defaults (GRU of 512 between a 512 ReLU embedding
and two 512 ReLU layers per head; lr 2e-4 annealed, 4 epochs x 8 minibatches, gamma 0.99,
lambda 0.8, clip 0.2, entropy 0.01, grad norm 1.0; optimistic resets, ratio 16) and
``--env``, ``--num-envs``, ``--num-steps``, ``--total-timesteps``, ``--layer-size`` and
``--optimistic-resets/--no-optimistic-resets`` as given. Weights & Biases stays off. It
compiles ``jax.jit(make_train(config))`` ahead of the run (``lower().compile()``: the compile
time apart) and runs the whole training ``--repeats`` times from ``PRNGKey(--seed)``; steps/s
is ``NUM_UPDATES x NUM_ENVS x NUM_STEPS`` over the median run's wall time.

    python benchmarks/peers/craftax_baselines_ppo_rnn.py --src <checkout> --num-envs 64

Prints one JSON line: ``{"env", "num_envs", "num_steps", "env_steps", "compile_s", "run_s",
"steps_per_s", "runs_s", "returns"}``, ``returns`` each update's mean return over the
episodes that finished in it (its logged ``returned_episode_returns``; NaN where none did).
"""
import argparse
import os
import sys

from jax_timing import compile_and_run, report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", required=True, help="a Craftax_Baselines checkout")
    p.add_argument("--env", default="Craftax-Classic-Symbolic-v1")
    p.add_argument("--num-envs", type=int, default=1024)
    p.add_argument("--num-steps", type=int, default=64)
    p.add_argument("--total-timesteps", type=float, default=1e9)
    p.add_argument("--layer-size", type=int, default=512)
    p.add_argument("--optimistic-resets", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()

    sys.path.insert(0, args.src)
    import jax
    import numpy as np
    import ppo_rnn

    config = {"ENV_NAME": args.env, "NUM_ENVS": args.num_envs, "TOTAL_TIMESTEPS":
              int(args.total_timesteps), "LR": 2e-4, "NUM_STEPS": args.num_steps,
              "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 8, "GAMMA": 0.99, "GAE_LAMBDA": 0.8,
              "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5, "MAX_GRAD_NORM": 1.0,
              "ACTIVATION": "tanh", "ANNEAL_LR": True, "DEBUG": False, "JIT": True,
              "SEED": args.seed, "USE_WANDB": False, "SAVE_POLICY": False, "NUM_REPEATS": 1,
              "LAYER_SIZE": args.layer_size, "USE_OPTIMISTIC_RESETS": args.optimistic_resets,
              "OPTIMISTIC_RESET_RATIO": 16}
    key = jax.random.PRNGKey(args.seed)
    compile_s, runs, out = compile_and_run(ppo_rnn.make_train(config), key, args.repeats)
    env_steps = config["NUM_UPDATES"] * args.num_envs * args.num_steps
    returns = np.asarray(out["metric"]["returned_episode_returns"], np.float64)
    report(args, env_steps, compile_s, runs, [None if np.isnan(r) else float(r) for r in returns])

if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
