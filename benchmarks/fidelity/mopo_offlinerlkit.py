"""Run OfflineRL-Kit's MOPO (yihaosun1124/OfflineRL-Kit, ``run_example/run_mopo.py``) on a
jaxwm-made D4RL-format dataset, for the side-by-side fidelity comparison
(benchmarks/fidelity/README.md). Run it with the kit's own Python environment (PyTorch),
never jaxwm's:

  <kit-venv>/bin/python benchmarks/fidelity/mopo_offlinerlkit.py --src <OfflineRL-Kit checkout> \\
      --dataset data/pendulum-medium.hdf5 --env Pendulum-v1 --logdir runs/fidelity/x/s1 \\
      -- --task pendulum-medium --seed 1 --epoch 20 ...

Everything after ``--`` goes to the kit's ``run_mopo.py`` unchanged. What this file adds,
without copying or changing any kit code:

- ``d4rl`` is not installable beside a current MuJoCo or Gymnasium, so a stand-in module is
  registered whose ``qlearning_dataset`` is the kit's own (``offlinerlkit.utils.load_dataset``:
  it keeps ``next_observations`` and drops each timeout-final step, as D4RL's does).
- ``gym.make(task)`` returns the Gymnasium env behind the pre-0.26 Gym API that the kit
  steps (``reset() -> obs``, ``step() -> (obs, reward, done, info)``, ``seed(s)``), with
  ``get_dataset()`` reading the HDF5 file. Its ``get_normalized_score`` is the return over
  100, so that the kit's ``eval/normalized_episode_reward`` column (it multiplies by 100)
  holds the raw return: the comparison (``mopo.py``) normalises both sides' returns with one
  reference.
GORMPO (``--gormpo-src <aysintumay/GORMPO checkout>``): the kit's uncertainty penalty is
replaced with GORMPO's own linear density penalty (``TransitionModel._return_kde_penalty``,
called unchanged) on the predicted next state and the action, as GORMPO's
``transition_model.py`` scores them, from GORMPO's own ``RealNVP`` fitted here before
training the way its ``realnvp_module/realnvp.py`` main does (the (next observation, action)
rows split 0.6 / 0.2 / 0.2, 6 couplings of [256, 256], 60 epochs, batch 128, lr 1e-3,
patience 15; ``fit`` sets the threshold itself at its default 1% quantile of the validation
log-probabilities). Everything else is the kit's MOPO.

``--model-max-epochs`` caps the dynamics' training (the kit's own ``max_epochs`` argument,
which ``run_mopo.py`` leaves unset) so that both sides stop at the same cap. Imagined
rollouts end where the kit's own ``get_termination_fn(task)`` says (its pendulum
function never ends one), so the task name must contain the env's family (``pendulum-...``,
``hopper-...``), with one fix: the kit's pendulum function returns float zeros, which its
rollout's ``~terminals`` refuses (a TypeError), so every termination function's answer is
cast to bool.
"""

import argparse
import functools
import os
import sys
import types

import numpy as np


class OfflineEnv:
    """A Gymnasium env behind the Gym <= 0.24 API with D4RL's ``get_dataset`` and
    ``get_normalized_score`` (here the return / 100): what the kit expects of
    ``gym.make(<d4rl task>)``."""

    def __init__(self, env, dataset_path: str):
        self._env = env
        self._dataset_path = dataset_path
        self._seed = None
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self._max_episode_steps = env.spec.max_episode_steps

    def seed(self, seed):
        self._seed = seed
        self.action_space.seed(seed)

    def reset(self):
        obs, _ = self._env.reset(seed=self._seed)
        self._seed = None  # seed the first reset only, as Gym's env.seed did
        return obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self._env.step(action)
        return obs, reward, bool(terminated or truncated), info

    def get_dataset(self):
        import h5py

        with h5py.File(self._dataset_path, "r") as f:
            return {key: f[key][()] for key in ("observations", "actions", "rewards",
                                                 "terminals", "timeouts", "next_observations")}

    def get_normalized_score(self, score):
        return score / 100.0  # the kit logs 100x this: the raw return


def fit_gormpo_density(rows: np.ndarray, seed: int):
    """GORMPO's RealNVP on (next observation, action) ``rows``, as its
    ``realnvp_module/realnvp.py`` main trains it (settings: ``configs/realnvp/*_normal.yaml``)."""
    import torch
    from realnvp_module.realnvp import RealNVP

    order = np.random.default_rng(seed).permutation(len(rows))
    train, val = rows[order[:int(0.6 * len(rows))]], rows[order[int(0.6 * len(rows)):
                                                                int(0.8 * len(rows))]]
    torch.manual_seed(seed)
    model = RealNVP(input_dim=rows.shape[1], num_layers=6, hidden_dims=[256, 256], device="cpu")
    model.fit(torch.from_numpy(train), torch.from_numpy(val), epochs=60, batch_size=128,
              lr=1e-3, patience=15, verbose=True)
    model.eval()
    return model


def penalty_holder(model) -> types.SimpleNamespace:
    """What GORMPO's ``TransitionModel._return_kde_penalty`` reads of its ``self``: the
    density and its threshold, no log-prob standardisation (GORMPO's ``RealNVP.load_model``
    returns no mean / std)."""
    return types.SimpleNamespace(classifier_name=None, classifier_model=model,
                                 classifier_thr=model.threshold, classifier_mean=None,
                                 classifier_std=None, device="cpu")


def install_gormpo_penalty(gormpo_src: str, env, seed: int) -> None:
    """The kit's ``EnsembleDynamics.step`` with its own penalty off and GORMPO's linear
    density penalty, times the kit's ``--penalty-coef``, subtracted from the reward."""
    import torch
    from offlinerlkit.dynamics import EnsembleDynamics

    sys.path.append(gormpo_src)
    sys.modules.setdefault("wandb", types.ModuleType("wandb"))  # imported, never used here
    from offlinerlkit.utils.load_dataset import qlearning_dataset
    from transition_model import TransitionModel

    data = qlearning_dataset(env)
    model = fit_gormpo_density(np.concatenate([data["next_observations"], data["actions"]], 1)
                               .astype(np.float32), seed)
    holder = penalty_holder(model)
    kit_step = EnsembleDynamics.step

    def step(self, obs, action):
        coef, self._penalty_coef = self._penalty_coef, 0.0
        next_obs, reward, terminal, info = kit_step(self, obs, action)
        self._penalty_coef = coef
        with torch.no_grad():
            penalty = TransitionModel._return_kde_penalty(holder, next_obs, action,
                                                          type="linear")
        penalty = np.asarray(penalty, np.float32).reshape(reward.shape)
        info["penalty"] = penalty
        return next_obs, reward - coef * penalty, terminal, info

    EnsembleDynamics.step = step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="a checkout of OfflineRL-Kit")
    parser.add_argument("--dataset", required=True, help="a D4RL-format HDF5 file")
    parser.add_argument("--env", required=True, help="its Gymnasium env id, e.g. Pendulum-v1")
    parser.add_argument("--logdir", required=True, help="the kit writes log/<task>/... here")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--model-max-epochs", type=int, default=0,
                        help="cap on the dynamics' training epochs (0: the kit's, none)")
    parser.add_argument("--gormpo-src", help="a checkout of aysintumay/GORMPO: its linear "
                                             "density penalty instead of MOPO's")
    parser.add_argument("--density-seed", type=int, default=0,
                        help="seed of GORMPO's density fit (one per dataset, as jaxwm's)")
    args, kit_args = parser.parse_known_args()
    kit_args = [a for a in kit_args if a != "--"]
    dataset = os.path.abspath(args.dataset)
    sys.path.insert(0, args.src)
    sys.path.insert(1, os.path.join(args.src, "run_example"))

    import gymnasium
    import torch

    torch.set_num_threads(args.threads)
    gym = types.ModuleType("gym")
    gym.Env, gym.spaces = object, gymnasium.spaces  # type hints in the kit's modules
    gym.make = lambda task, **kw: OfflineEnv(gymnasium.make(args.env), dataset)
    sys.modules["gym"] = gym
    # The kit's MujocoOracleDynamics (not used by MOPO) imports gym.envs.mujoco at import time.
    for name in ("gym.envs", "gym.envs.mujoco", "gym.envs.mujoco.mujoco_env"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["gym.envs.mujoco"].mujoco_env = sys.modules["gym.envs.mujoco.mujoco_env"]
    sys.modules["gym.envs.mujoco.mujoco_env"].MujocoEnv = object
    from offlinerlkit.utils import load_dataset, termination_fns

    kit_termination_fn = termination_fns.get_termination_fn
    termination_fns.get_termination_fn = lambda task: (
        lambda *a: np.asarray(kit_termination_fn(task)(*a), bool))
    d4rl = types.ModuleType("d4rl")
    d4rl.qlearning_dataset = load_dataset.qlearning_dataset
    sys.modules["d4rl"] = d4rl
    if args.model_max_epochs:  # run_mopo.py passes no max_epochs: set its default
        from offlinerlkit.dynamics import EnsembleDynamics

        EnsembleDynamics.train = functools.partialmethod(EnsembleDynamics.train,
                                                         max_epochs=args.model_max_epochs)
    if args.gormpo_src:
        install_gormpo_penalty(args.gormpo_src, gym.make(args.env), args.density_seed)
    os.makedirs(args.logdir, exist_ok=True)
    os.chdir(args.logdir)  # the kit logs under ./log/<task>/<algo>/...
    sys.argv = ["run_mopo.py", *kit_args]  # run_mopo parses sys.argv when it is imported
    import run_mopo

    run_mopo.train()


if __name__ == "__main__":
    main()
