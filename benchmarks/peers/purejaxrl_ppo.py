"""PureJaxRL's PPO (``purejaxrl/ppo.py``, Lu et al. 2022) timed as its README runs it, for
``benchmarks/jax_envs.py --purejaxrl-src``.

Imports ``make_train`` from a PureJaxRL checkout (``--src``, kept outside this repository)
unchanged, builds ``jax.jit(make_train(config))`` with the settings given (its CartPole
defaults; ``--env``, ``--num-envs``, ... override them), compiles it ahead of the run
(``lower().compile()``: the compile time apart) and runs the whole training once per
``--repeats``, each from ``PRNGKey(--seed)``. steps/s is ``NUM_UPDATES x NUM_ENVS x
NUM_STEPS`` over the median run's wall time (its program ends in the device sync).

Shims (none changes what is computed): ``wrappers.py`` imports brax and navix at the top for
wrappers of other env suites, which these runs do not use, so empty stand-ins for those
modules are put in ``sys.modules`` when the real ones are not installed; and gymnax 1.0's
``step`` returns ``terminated`` and ``truncated`` apart (six values) where PureJaxRL unpacks
gymnax 0.0.x's five, ``done`` one flag, so ``step`` is wrapped to return
``terminated | truncated`` as that ``done`` (what gymnax 0.0.x computed) and the info gymnax
0.0.x returned (without 1.0's ``terminated``, ``truncated`` and ``final_observation``, which
PureJaxRL would store for every step).

    python benchmarks/peers/purejaxrl_ppo.py --src <purejaxrl checkout> --env CartPole-v1

Prints one JSON line: ``{"env", "num_envs", "num_steps", "env_steps", "compile_s",
"run_s", "steps_per_s", "runs_s", "returns"}``, ``returns`` the mean training return of each
update (``returned_episode_returns`` over the last step's envs, as PureJaxRL plots it), per
seed with ``--num-seeds``; steps/s counts one seed's steps.
"""
import argparse
import importlib.util
import os
import sys
import types

from jax_timing import compile_and_run, report

# What gymnax 1.0's ``step`` adds to the info of gymnax 0.0.x, which PureJaxRL stores for every
# step (its ``traj_batch.info``): the final observation alone is another observation per env
# and step (14 GB for 3 seeds of SpaceInvaders-MinAtar at 2M steps).
NEW_INFO = ("terminated", "truncated", "final_observation")


def _stand_in(name: str, **attributes) -> None:
    if name in sys.modules or (name.split(".")[0] not in sys.modules
                               and importlib.util.find_spec(name) is not None):
        return
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", required=True, help="a PureJaxRL checkout")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--total-timesteps", type=float, default=5e5)
    p.add_argument("--lr", type=float, default=2.5e-4)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--activation", default="tanh")
    p.add_argument("--seed", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-seeds", type=int, default=1,
                   help="> 1: that many runs vmapped, from split(PRNGKey(seed)) (its README's)")
    args = p.parse_args()

    if importlib.util.find_spec("brax") is None:
        for name in ("brax", "brax.envs", "brax.envs.wrappers"):
            sys.modules[name] = types.ModuleType(name)
        _stand_in("brax.envs.wrappers.training", EpisodeWrapper=object,
                  AutoResetWrapper=object)
    _stand_in("navix")
    sys.path.insert(0, os.path.join(args.src, "purejaxrl"))
    import jax
    import numpy as np
    from gymnax.environments import environment

    step = environment.Environment.step

    def five_value_step(self, key, state, action, params=None):
        out = step(self, key, state, action, params)
        if len(out) == 6:  # gymnax >= 1.0: terminated and truncated apart
            obs, state, reward, terminated, truncated, info = out
            info = {k: v for k, v in info.items() if k not in NEW_INFO}
            return obs, state, reward, terminated | truncated, info
        return out

    environment.Environment.step = five_value_step
    import ppo

    config = {"LR": args.lr, "NUM_ENVS": args.num_envs, "NUM_STEPS": args.num_steps,
              "TOTAL_TIMESTEPS": args.total_timesteps, "UPDATE_EPOCHS": args.update_epochs,
              "NUM_MINIBATCHES": args.num_minibatches, "GAMMA": 0.99, "GAE_LAMBDA": 0.95,
              "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5,
              "ACTIVATION": args.activation, "ENV_NAME": args.env, "ANNEAL_LR": True,
              "DEBUG": False}
    key = jax.random.PRNGKey(args.seed)
    train = ppo.make_train(config)
    if args.num_seeds > 1:
        key, train = jax.random.split(key, args.num_seeds), jax.vmap(train)
    compile_s, runs, out = compile_and_run(train, key, args.repeats)
    updates = int(args.total_timesteps // (args.num_envs * args.num_steps))
    # [(seeds,) updates, steps, envs] -> the last step's mean over envs, per update
    returns = np.asarray(out["metrics"]["returned_episode_returns"])[..., -1, :].mean(-1)
    report(args, updates * args.num_envs * args.num_steps, compile_s, runs, returns.tolist())

if __name__ == "__main__":
    main()
