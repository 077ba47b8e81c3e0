"""GORMPO's linear density penalty on fixed probes: jaxwm's RealNVP and GORMPO's own
(aysintumay/GORMPO's ``realnvp_module``), each fitted on the same dataset's (s', a) rows, score
the same rows, so the two densities are compared without the policies and rollouts of a run
(benchmarks/fidelity/README.md, "GORMPO"). Each side runs in its own Python:

  python benchmarks/fidelity/gormpo_density_probe.py --side jaxwm            # the description
  python benchmarks/fidelity/gormpo_density_probe.py --side jaxwm \\
      --set gormpo.threshold_quantile=0.01 --set gormpo.max_epochs=16 --set gormpo.patience=16
  <kit-venv>/bin/python benchmarks/fidelity/gormpo_density_probe.py --side gormpo \\
      --gormpo-src <aysintumay/GORMPO checkout> --seeds 1 2

Probes (5,000 rows drawn with seed 0, the same on both sides): the dataset's own rows; the
same with Gaussian noise on the action (std 0.25, 0.5, 1.0, clipped to the dataset's action
range), what a policy leaving the data does; and with noise of std 0.1 on the next state,
what a dynamics model's error does (Pendulum's (cos, sin) then leaves the unit circle, where
a density fitted on the circle falls fast). Printed per probe: the mean penalty and the
fraction of rows below the threshold tau. jaxwm's side fits the density its runs fit (the
same split, key and epochs as GORMPO's ``density`` phase); GORMPO's side fits its RealNVP with
``mopo_offlinerlkit.py``'s function and seed (on the rows read here, which may differ from
the kit's ``qlearning_dataset`` by its last row, so a seed's fit need not be the run's).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import types

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ACTION_NOISE = (0.25, 0.5, 1.0)
STATE_NOISE = 0.1


def dataset_rows(path: str) -> tuple[np.ndarray, int]:
    """The (next observation, action) rows the runs fit on (timeout-final steps dropped, as
    D4RL's ``qlearning_dataset`` and jaxwm's loader do) and the observation size."""
    with h5py.File(path) as f:
        keep = ~np.asarray(f["timeouts"][:], bool)
        nxt, act = f["next_observations"][:][keep], f["actions"][:][keep]
    return np.concatenate([nxt, act], 1).astype(np.float32), nxt.shape[1]


def probes(rows: np.ndarray, obs_dim: int, num: int = 5000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    base = rows[rng.choice(len(rows), num, replace=False)]
    low, high = rows[:, obs_dim:].min(0), rows[:, obs_dim:].max(0)
    out = {"dataset rows": base}
    for std in ACTION_NOISE:
        noisy = base.copy()
        noisy[:, obs_dim:] = np.clip(noisy[:, obs_dim:] + rng.normal(0, std, noisy[:, obs_dim:]
                                                                      .shape), low, high)
        out[f"action noise {std}"] = noisy
    noisy = base.copy()
    noisy[:, :obs_dim] += rng.normal(0, STATE_NOISE, noisy[:, :obs_dim].shape)
    out[f"next-state noise {STATE_NOISE}"] = noisy
    return out


def fit_density(config, rows: np.ndarray):
    """GORMPO's density on ``rows`` as its phase fits it (``algos.mopo``'s ``fit_density``
    hook, epoch by epoch until the patience runs out): (spec, best params, scaler, tau)."""
    import jax
    import jax.numpy as jnp

    from jaxwm import backend
    from jaxwm.agents import mopo
    from jaxwm.models import realnvp
    from jaxwm.models.dynamics import Normalizer

    seed = config.gormpo.density_seed
    spec = mopo.density_spec(config, rows.shape[1])
    train, val, _ = realnvp.split_indices(len(rows), np.random.default_rng(seed))
    x = jnp.asarray(rows, jnp.float32)
    state = realnvp.init_density(spec, jax.random.PRNGKey(seed), Normalizer.fit(x[train]))
    epoch = backend.jit(lambda s, k: realnvp.train_density_epoch(spec, s, x, train, val, k))
    key = jax.random.PRNGKey(seed + 1)
    for _ in range(spec.max_epochs):
        key, k = jax.random.split(key)
        state, _ = epoch(state, k)
        if bool(state.patience.exhausted(spec.patience)):
            break
    return spec, state.patience.best_params, state.scaler, float(state.tau)


def jaxwm_side(rows: np.ndarray, obs_dim: int, overrides: list[str]):
    sys.path.insert(0, ROOT)
    import jax.numpy as jnp

    import jaxwm.config
    from jaxwm.models import realnvp

    def value(text: str):  # as on the command line: 0.01 a number, True a bool, else text
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text

    settings = {k: value(v) for k, v in (kv.split("=", 1) for kv in overrides)}
    config = jaxwm.config.load("mopo:pendulum_tiny",
                               {"algo": "gormpo", "log.progress": False, **settings})
    spec, params, scaler, tau = fit_density(config, rows)

    def score(x):
        logp = realnvp.log_prob(spec, params, scaler, jnp.asarray(x))
        return (float(jnp.mean(realnvp.penalty("linear", logp, tau))),
                float(jnp.mean(logp < tau)))

    return {"jaxwm " + (" ".join(overrides) or "(description)"): (tau, score)}


def gormpo_side(rows: np.ndarray, obs_dim: int, src: str, seeds: list[int]):
    import torch

    # GORMPO's modules import these at the top and use none of them on this path.
    for name in ("gym", "d4rl", "wandb"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.path += [src, HERE]
    from mopo_offlinerlkit import fit_gormpo_density, penalty_holder
    from transition_model import TransitionModel

    torch.set_num_threads(1)
    sides = {}
    for seed in seeds:
        model = fit_gormpo_density(rows, seed)
        holder = penalty_holder(model)

        def score(x, model=model, holder=holder):
            with torch.no_grad():
                pen = TransitionModel._return_kde_penalty(holder, x[:, :obs_dim], x[:, obs_dim:],
                                                          type="linear")
                logp = np.asarray(model.score_samples(torch.from_numpy(x)))
            return float(np.mean(pen)), float(np.mean(logp < model.threshold))

        sides[f"GORMPO's code, seed {seed}"] = (float(model.threshold), score)
    return sides


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", choices=("jaxwm", "gormpo"), required=True)
    p.add_argument("--dataset", default="data/pendulum-medium.hdf5")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="jaxwm config setting (jaxwm side), e.g. gormpo.threshold_quantile=0.01")
    p.add_argument("--gormpo-src", help="a checkout of aysintumay/GORMPO (gormpo side)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = p.parse_args(argv)
    if not os.path.exists(args.dataset):
        raise SystemExit(f"{args.dataset} does not exist: make it first (benchmarks/fidelity/"
                         "mopo.py's --help has the command).")
    if args.side == "gormpo" and not args.gormpo_src:
        raise SystemExit("--side gormpo needs --gormpo-src <aysintumay/GORMPO checkout>.")
    rows, obs_dim = dataset_rows(args.dataset)
    sides = (jaxwm_side(rows, obs_dim, args.set) if args.side == "jaxwm" else
             gormpo_side(rows, obs_dim, args.gormpo_src, args.seeds))
    named = probes(rows, obs_dim)
    print("| density | tau | " + " | ".join(named) + " |")
    print("|---|---|" + "---|" * len(named))
    for label, (tau, score) in sides.items():
        cells = (f"{pen:.3f} ({frac:.1%})" for pen, frac in map(score, named.values()))
        print(f"| {label} | {tau:.2f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
