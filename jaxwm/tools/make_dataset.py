"""Make D4RL-format datasets with jaxwm's own SAC; no download needed.

    python -m jaxwm.tools.make_dataset --env=Hopper-v4 --level=medium --out=data/hopper-medium.hdf5
    python -m jaxwm.tools.make_dataset --env=Pendulum-v1 --level=medium-replay --out=data/p.hdf5

Levels as D4RL defines them (Fu et al. 2020, sec. 5):

* ``random``: a uniformly random policy.
* ``medium``: an early-stopped SAC policy, the first snapshot whose evaluation return reaches
  1/3 of the way from the random to the expert return.
* ``medium-replay``: that SAC run's replay buffer at the medium snapshot.
* ``expert``: the fully trained SAC policy (the run's last snapshot).
* ``medium-expert``: medium and expert concatenated (2x the size).

The behaviour SAC (``jaxwm/configs/sac.py``; ``pendulum`` for Pendulum, ``mujoco`` otherwise) trains
once per env and seed in ``--workdir`` (default ``<out dir>/sac-<env>-seed<seed>``), saving a
snapshot at every evaluation, and later levels reuse it. Policies act stochastically (SAC's
sampled actions, as D4RL's were). Each env's steps are written contiguously, so row i+1 is
row i's next state unless row i ends an episode (``terminals`` / ``timeouts``, the latter also
on each env's cut-off last step), and ``next_observations`` is exact everywhere.

Metadata (``metadata/*``): env_id, level, size, and ``generation`` (JSON: how it was made:
the SAC run, snapshot steps and returns, seed, jaxwm version). For envs without D4RL
reference returns, ``ref_min_score`` / ``ref_max_score`` hold this generator's random and
expert returns, which the normalised score then uses.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile

import jax
import numpy as np
from tqdm import tqdm

import jaxwm
import jaxwm.config
from jaxwm import runner
from jaxwm.agents import sac
from jaxwm.data import datasets
from jaxwm.envs import acting, make_env
from jaxwm.loop.checkpoint import Checkpointer, saved_steps
from jaxwm.loop.metrics import read_jsonl

LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")
MEDIUM_FRACTION = 1 / 3
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_missing_inputs(config) -> None:
    """Makes the files a config says how to make when they are missing, before anything is
    built: a dataset (``config.dataset`` with ``config.dataset_make.level`` set), its
    behaviour agent trained in a run of its own (``make``)."""
    recipe = config.get("dataset_make")
    path = os.path.expanduser(str(config.get("dataset", "") or ""))
    if recipe is None or not recipe.level or not path or os.path.exists(path):
        return
    if jax.process_count() > 1:  # its behaviour agent would be one more multi-process run
        from jaxwm.config import ConfigError

        raise ConfigError(
            f"{path} does not exist, and a run of {jax.process_count()} processes does not make "
            f"datasets: make it first in one process (python -m jaxwm.tools.make_dataset "
            f"--env={config.env.id} --level={recipe.level} --size={recipe.size} --out={path}), "
            "then launch again.")
    tqdm.write(f"{path} does not exist: making it ({config.env.id}, {recipe.level}, "
               f"{recipe.size} transitions) with python -m jaxwm.tools.make_dataset.")
    make(config.env.id, recipe.level, path, size=recipe.size, train_steps=recipe.train_steps,
         seed=config.seed)


def behaviour_config(env_id: str, train_steps: int, snapshot_every: int, seed: int):
    variant = "pendulum" if env_id.startswith("Pendulum") else "mujoco"
    config = jaxwm.config.load(f"sac:{variant}", {
        "env.id": env_id, "total_env_steps": train_steps, "seed": seed,
        "eval.every": f"{snapshot_every} env_steps",
        "checkpoint.every": f"{snapshot_every} env_steps", "checkpoint.keep": 1_000_000})
    config.sac.learning_starts = min(config.sac.learning_starts, snapshot_every)
    return config


def train_behaviour(config, workdir: str) -> list[tuple[int, float]]:
    """Trains (or finishes, or reuses) the behaviour SAC; returns [(env_steps, eval return)]
    at every snapshot."""
    config.resume = bool(saved_steps(workdir))
    runner.run(config, workdir)
    evals = {int(row["step"]): float(row["eval/episodic_return"])
             for row in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
             if "eval/episodic_return" in row}
    return sorted(evals.items())


def load_snapshot(config, workdir: str, env_steps: int):
    """The SAC state (learner and replay) saved at ``env_steps``."""
    from jaxwm.algos import sac as sac_algo

    algo = sac_algo.build(config)
    try:
        template = algo.persistent(algo.init(jax.random.PRNGKey(0)))
        checkpointer = Checkpointer(workdir, keep=config.checkpoint.keep)
        step = checkpointer.step_at("env_steps", env_steps)
        state, _, _, _ = checkpointer.restore(template, step=step)
        checkpointer.close()
        return state, algo
    except Exception:
        algo.close()
        raise


def rollout(env_config, policy_for, params, size: int, num_envs: int, seed: int, desc: str):
    """``size`` valid transitions from ``num_envs`` envs acting by ``policy_for(spec)`` (an
    ``acting.Policy``) with ``params``, through the acting layer's collect in chunks of 1000
    steps, each env's steps contiguous; plus the returns of the episodes completed."""
    chunk = 1000

    def finish(params, start, steps, final, completed):
        del params, start
        nxt = acting.successors(steps, final)
        row = {"observations": steps.obs, "actions": steps.action, "rewards": nxt["reward"],
               "terminals": nxt["terminated"], "next_observations": nxt["obs"]}
        return final.carry, (row, steps.valid, completed)

    env = make_env(env_config, num_envs=num_envs, seed=seed)
    actor = acting.Actor(env, policy_for(env.spec), chunk, finish=finish)
    rows, valids, returns = [], [], []
    key = jax.random.PRNGKey(seed)
    steps_per_env = -(-size // num_envs) + 1  # + the reset transitions dropped below
    try:
        state = actor.init(params)
        with tqdm(total=size, desc=desc, unit="step", disable=None) as bar:
            collected = 0
            while collected < size:
                key, k = jax.random.split(key)
                state, out = actor.collect(params, state, k)
                row, valid, completed = jax.device_get(out)
                rows.append(row)
                valids.append(valid)
                returns.extend(completed["return"][completed["mask"]].tolist())
                gained = int(valid.sum())
                collected += gained
                bar.update(min(gained, size - bar.n))
                if len(rows) * chunk > 50 * steps_per_env:
                    raise RuntimeError("too many reset transitions; is the env ending at once?")
    finally:
        actor.close()
    time_major = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}  # [T, n, ...]
    valid = np.concatenate(valids)  # [T, n]
    per_env = [{k: v[valid[:, i], i] for k, v in time_major.items()} for i in range(num_envs)]
    arrays = {k: np.concatenate([p[k] for p in per_env]) for k in per_env[0]}
    # Keep whole env streams first, then cut to size (the cut ends one stream early).
    arrays = {k: v[:size] for k, v in arrays.items()}
    return finish_rows(arrays), returns


def finish_rows(arrays):
    """Adds ``timeouts``: a step that ends its episode without terminating (its next state is
    not the following row's state), including the last row."""
    obs, next_obs, terminals = arrays["observations"], arrays["next_observations"], \
        np.asarray(arrays["terminals"], bool)
    breaks = np.ones(len(obs), bool)
    breaks[:-1] = np.any(next_obs[:-1] != obs[1:], axis=tuple(range(1, obs.ndim)))
    return {**arrays, "terminals": terminals, "timeouts": breaks & ~terminals,
            "rewards": np.asarray(arrays["rewards"], np.float32)}


def replay_rows(state):
    """The replay's transitions in insertion order, as D4RL rows."""
    buffer = jax.device_get(state.replay)
    size, insert, capacity = int(buffer.size), int(buffer.insert), buffer.capacity
    order = np.arange(size) if size < capacity else (insert + np.arange(capacity)) % capacity
    data = {k: np.asarray(v)[order] for k, v in buffer.data.items()}
    return finish_rows({"observations": data["obs"], "actions": data["action"],
                        "rewards": data["reward"], "terminals": data["terminated"],
                        "next_observations": data["next_obs"]})


def episode_returns(arrays) -> list[float]:
    ends = np.nonzero(arrays["terminals"] | arrays["timeouts"])[0]
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [float(arrays["rewards"][s:e + 1].sum()) for s, e in zip(starts, ends, strict=True)]


def check(env_id: str, level: str, out: str, size: int, num_envs: int, overwrite: bool):
    """Everything a user can get wrong, before any env steps or any agent trains: the level,
    the sizes, the env (continuous actions from vector observations: the behaviour agent is
    SAC, and D4RL's layout is for such tasks) and the output path."""
    if level not in LEVELS:
        raise ValueError(f"Unknown level {level!r}; choose one of {LEVELS}.")
    if size <= 0 or num_envs <= 0:
        raise ValueError(f"--size ({size}) and --num_envs ({num_envs}) must be > 0.")
    probe = make_env({"id": env_id}, num_envs=1, seed=0)
    spec = probe.spec
    probe.close()
    if spec.discrete or len(spec.obs_shape) != 1:
        raise ValueError(
            f"{env_id} has {'discrete actions' if spec.discrete else 'pixel observations'}; "
            "make_dataset writes D4RL-style datasets of continuous-control tasks with vector "
            "observations (its behaviour agent is SAC), e.g. Pendulum-v1 or Hopper-v4.")
    path = os.path.expanduser(out)
    if os.path.isdir(path):
        raise datasets.DatasetError(f"--out={out} is a directory; name the HDF5 file to write.")
    if os.path.exists(path) and not overwrite:
        raise datasets.DatasetError(f"{out} exists; choose another --out or pass --overwrite.")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".jaxwm_write_test"):
            pass
    except OSError as e:
        raise datasets.DatasetError(f"--out={out} cannot be written ({e.strerror or e}); "
                                    "choose a directory you can write to.") from None


def make(env_id: str, level: str, out: str, size: int = 1_000_000, train_steps: int = 0,
         snapshot_every: int = 0, num_envs: int = 10, seed: int = 0, workdir: str = "",
         overwrite: bool = False) -> str:
    check(env_id, level, out, size, num_envs, overwrite)
    pendulum = env_id.startswith("Pendulum")
    train_steps = train_steps or (20_000 if pendulum else 1_000_000)
    snapshot_every = snapshot_every or max(1, train_steps // 20)
    workdir = workdir or os.path.join(os.path.dirname(os.path.abspath(out)),
                                      f"sac-{env_id}-seed{seed}")
    config = behaviour_config(env_id, train_steps, snapshot_every, seed)
    env_config = dict(config.env)
    random_arrays, random_returns = rollout(env_config, acting.uniform, None,
                                            size if level == "random" else
                                            min(size, 20 * 1000), num_envs, seed + 1,
                                            "random policy")
    random_return = float(np.mean(random_returns or episode_returns(random_arrays)))
    generation = {"made_by": f"jaxwm {getattr(jaxwm, '__version__', '')} make_dataset",
                  "made_at": datetime.datetime.now().isoformat(timespec="seconds"),
                  "seed": seed, "num_envs": num_envs, "random_return": random_return,
                  "policy": "uniform random" if level == "random" else
                  "SAC, sampled actions (temperature 1)"}
    meta = {"env_id": env_id, "level": level}
    expert_return = None
    if level == "random":
        arrays = random_arrays
    else:
        evals = train_behaviour(config, workdir)
        expert_step, expert_return = evals[-1]
        if expert_return <= random_return:
            raise ValueError(
                f"The behaviour SAC in {workdir} did not beat the random policy (last "
                f"evaluation {expert_return:.1f} at {expert_step} env steps, random "
                f"{random_return:.1f}), so there is no medium or expert policy: raise "
                "--train_steps (the run resumes from where it stopped).")
        threshold = random_return + MEDIUM_FRACTION * (expert_return - random_return)
        medium_step, medium_return = next((s, r) for s, r in evals if r >= threshold)
        generation.update(sac_workdir=os.path.abspath(workdir), train_steps=train_steps,
                          expert_step=expert_step, expert_eval_return=expert_return,
                          medium_threshold=threshold, medium_step=medium_step,
                          medium_eval_return=medium_return, snapshots=evals)

        def policy_rows(step, desc, rollout_seed):
            state, algo = load_snapshot(config, workdir, step)
            algo.close()

            def policy_for(spec):  # SAC's sampled actions (temperature 1)
                box = sac.ActionBox(np.asarray(spec.action_low), np.asarray(spec.action_high))
                return sac.policy(sac.SACNets.from_config(box, config.sac))

            return rollout(env_config, policy_for, state.learner, size, num_envs,
                           rollout_seed, desc)[0]

        if level == "medium-replay":
            state, algo = load_snapshot(config, workdir, medium_step)
            algo.close()
            arrays = replay_rows(state)
        elif level == "medium":
            arrays = policy_rows(medium_step, f"medium policy (step {medium_step})", seed + 2)
        elif level == "expert":
            arrays = policy_rows(expert_step, f"expert policy (step {expert_step})", seed + 3)
        else:
            parts = [policy_rows(medium_step, "medium policy", seed + 2),
                     policy_rows(expert_step, "expert policy", seed + 3)]
            arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    returns = episode_returns(arrays)
    generation["dataset_return_mean"] = float(np.mean(returns)) if returns else float("nan")
    generation["episodes"] = len(returns)
    meta.update(size=len(arrays["rewards"]), generation=generation)
    if datasets.reference_returns(env_id) is None and expert_return is not None:
        meta.update(ref_min_score=random_return, ref_max_score=expert_return)
    return datasets.write_d4rl(out, arrays, meta, overwrite=overwrite)


def main(argv=None, prog: str = "python -m jaxwm.tools.make_dataset") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--env", required=True, help="envpool env id, e.g. Hopper-v4")
    parser.add_argument("--level", required=True, choices=LEVELS)
    parser.add_argument("--out", required=True, help="HDF5 file to write")
    parser.add_argument("--size", type=int, default=1_000_000, help="transitions (D4RL: 1M)")
    parser.add_argument("--train_steps", type=int, default=0,
                        help="behaviour SAC's env steps (0: 20k Pendulum, 1M otherwise)")
    parser.add_argument("--snapshot_every", type=int, default=0,
                        help="env steps between SAC snapshots (0: train_steps / 20)")
    parser.add_argument("--num_envs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="", help="behaviour SAC run directory")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        path = make(args.env, args.level, args.out, args.size, args.train_steps,
                    args.snapshot_every, args.num_envs, args.seed, args.workdir, args.overwrite)
    except (datasets.DatasetError, jaxwm.config.ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    data = datasets.load_dataset(path)
    generation = data.metadata["generation"]
    print(f"Wrote {path}: {len(data)} transitions ({data.metadata['level']}), "
          f"{generation['episodes']} episodes, mean return "
          f"{generation['dataset_return_mean']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
