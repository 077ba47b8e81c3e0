"""MOPO / GORMPO end to end on a small Pendulum dataset: an epoch of every hook, GORMPO's
density fit in a phase of its own, bad settings; learning (slow). Resume, donation, devices and seeds:
tests/test_contract.py."""

import os

import jax
import numpy as np
import pytest

import jaxwm.config
from jaxwm import train
from jaxwm.agents import mopo as mopo_agent
from jaxwm.algos import mopo
from jaxwm.data import datasets
from jaxwm.envs import acting
from jaxwm.loop.metrics import read_jsonl
from jaxwm.tools import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"mopo.model_hidden": (32, 32, 32, 32), "phases.model.duration": 3,
         "mopo.rollout_batch": 200, "mopo.updates_per_epoch": 50, "phases.policy.duration": 100,
         "sac.actor_hidden": (32, 32), "sac.critic_hidden": (32, 32), "sac.batch_size": 64,
         "gormpo.hidden": (32, 32), "gormpo.num_couplings": 2, "gormpo.max_epochs": 3,
         "log.every": "1 model_epochs, 50 agent_updates", "checkpoint.every": "never",
         "eval.every": "50 agent_updates", "eval.num_episodes": 2, "eval.num_envs": 2}


@pytest.fixture(scope="module")
def pendulum_random(tmp_path_factory):
    """4000 uniformly random Pendulum transitions in a D4RL-format file (seconds to make)."""
    path = str(tmp_path_factory.mktemp("data") / "pendulum-random.hdf5")
    env = {"id": "Pendulum-v1", "num_envs": 4, "max_episode_steps": 0, "masked_indices": ()}
    arrays, _ = make_dataset.rollout(env, acting.uniform, None, 4000, 4, 0, "random")
    return datasets.write_d4rl(path, arrays, {"env_id": "Pendulum-v1", "level": "random",
                                              "ref_min_score": -1200.0, "ref_max_score": -150.0})


def mopo_config(path, tmp_path, **overrides):
    del tmp_path
    return jaxwm.config.load("mopo:pendulum_tiny",
                             {"log.progress": False, "dataset": path, **SMALL, **overrides})


def test_branch_rollout_stops_rows_at_termination_and_penalises_rewards():
    """MOPO's rollouts through the acting layer: a row's transitions are valid up to and
    including the one the termination rule ends, never after; each valid transition's
    ``next_obs`` is the next one's ``obs``; rewards are raw - coef * u; the metrics are means
    over valid transitions."""
    import jax
    import jax.numpy as jnp

    from jaxwm.agents import sac
    from jaxwm.models import ensemble
    from jaxwm.models.dynamics import Normalizer

    n, horizon, coef = 64, 6, 0.5
    spec = ensemble.EnsembleSpec(3, 1, hidden=(16, 16), num_members=3, num_elites=2,
                                 weight_decay=(0.0, 0.0, 0.0))
    model = ensemble.init(spec, jax.random.key(0), Normalizer.identity(4))
    box = sac.ActionBox(-np.ones(1, np.float32), np.ones(1, np.float32))
    nets = sac.SACNets.create(box, (16,), (16,))
    learner = sac.init_learner(nets, sac.SACHyper(), jax.random.key(1), 3)
    obs = jax.random.normal(jax.random.key(2), (n, 3))
    ends = lambda o, a, nxt: nxt[:, 0] > 0.5  # noqa: E731  (about a third of rows a step)
    penalty = lambda std, o, a, nxt: jnp.abs(o[:, 1])  # noqa: E731

    batch, valid, metrics = jax.jit(lambda key: mopo_agent.branch_rollout(
        spec, model, sac.policy(nets), learner, obs, key, horizon, penalty, ends, coef))(
        jax.random.key(3))
    per_row = lambda x: np.asarray(x).reshape((horizon, n) + np.shape(x)[1:])  # noqa: E731
    valid, obs_t, next_obs = per_row(valid), per_row(batch["obs"]), per_row(batch["next_obs"])
    terminated = per_row(batch["terminated"])
    np.testing.assert_array_equal(obs_t[0], np.asarray(obs))
    assert valid[0].all()
    alive = np.ones(n, bool)
    for t in range(horizon):
        np.testing.assert_array_equal(valid[t], alive)
        np.testing.assert_array_equal(terminated[t][alive],
                                      np.asarray(ends(None, None, next_obs[t]))[alive])
        alive = alive & ~terminated[t]
        if t + 1 < horizon:
            np.testing.assert_array_equal(obs_t[t + 1][valid[t + 1]], next_obs[t][valid[t + 1]])
    assert 0 < valid.sum() < valid.size  # some rows ended, some ran the whole horizon
    u = np.abs(obs_t[..., 1])
    raw = per_row(batch["reward"]) + coef * u
    np.testing.assert_allclose(metrics["rollout/penalty"], u[valid].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["rollout/raw_reward"], raw[valid].mean(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(metrics["rollout/penalised_reward"],
                               per_row(batch["reward"])[valid].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["rollout/length"], valid.sum() / n)


def test_mopo_runs_every_phase_and_reports_normalised_scores(pendulum_random, tmp_path):
    summary = train.run(mopo_config(pendulum_random, tmp_path), str(tmp_path / "run"))
    assert summary["model_epochs"] == 3 and summary["agent_updates"] == 100
    assert summary["model_rollouts"] == 2
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    for name in ("losses/model_nll", "model/holdout_mse", "rollout/penalty", "rollout/length",
                 "losses/q_loss", "eval/normalized_score"):
        assert any(name in r for r in rows), name
    score = summary["eval/normalized_score"]
    assert score == pytest.approx(100 * (summary["eval/episodic_return"] + 1200) / 1050)
    with open(tmp_path / "run" / "eval.csv") as f:
        header, *lines = f.read().splitlines()
    assert "eval/normalized_score_std" in header.split(",") and len(lines) == 2
    assert os.path.exists(tmp_path / "run" / "normalized_score.png")
    # Pendulum never terminates: every rollout runs its full horizon, so the buffer holds
    # 2 rollouts x 200 starts x 5 steps.
    assert [r["rollout/buffer_size"] for r in rows if "rollout/buffer_size" in r][-1] == 2000


@pytest.mark.parametrize("shape", ["linear", "softplus"])
def test_gormpo_fits_its_density_in_a_phase_of_its_own(pendulum_random, tmp_path, shape):
    """GORMPO's RealNVP trains epoch by epoch in phase ``density`` before the ensemble's; its
    NLL is logged, it is part of the checkpointed state, and the penalties it gives are
    finite and >= 0. MOPO leaves the phase out."""
    config = mopo_config(pendulum_random, tmp_path, algo="gormpo", penalty=shape,
                         **{"phases.policy.duration": 50, "eval.at_end": False})
    summary = train.run(config, str(tmp_path / "run"))
    assert summary["density_epochs"] == 3 and summary["model_epochs"] == 3
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert any("losses/density_nll" in r and "density/val_nll" in r for r in rows)
    penalties = [r["rollout/penalty"] for r in rows if "rollout/penalty" in r]
    assert penalties and all(p >= 0 for p in penalties)
    assert np.isfinite(summary["losses/q_loss"])
    assert not os.path.exists(tmp_path / "density")  # nothing written outside the run
    algo = mopo.build(config)
    assert set(algo.data) == {"model_split", "density_split"}
    assert set(algo.artifacts) == {"dataset"} and "fit_density" in algo.hooks
    algo.close()
    plain = mopo.build(mopo_config(pendulum_random, tmp_path))
    assert "fit_density" not in plain.hooks and plain.phase_hooks == {"density": ()}
    plain.close()


def test_every_run_fits_the_same_density(pendulum_random, tmp_path):
    """The density describes the data: its split and key come from ``gormpo.density_seed``
    alone, so runs of other seeds (and each seed of a run) fit the same one."""
    import contract

    states = []
    for seed in (1, 2):
        config = mopo_config(pendulum_random, tmp_path, algo="gormpo", seed=seed)
        algo = contract.build(contract.entry_of_config(config), config)
        drive = contract.Drive.start(config, algo)
        while drive.scheduler.current.name == "density":
            drive.call()
        states.append(drive.state.density)
        algo.close()
    contract.assert_trees_equal(states[0], states[1], "density of seeds 1 and 2")


def test_a_density_that_scores_next_states_is_fit_on_next_states(pendulum_random, tmp_path):
    """gormpo.score_next_state: GORMPO's code scores (predicted s', a) with a RealNVP fit on
    the dataset's (s', a) rows. On a copy of the data whose next states are shifted by +5,
    the density's input scaler shows which rows it saw."""
    import shutil

    import h5py

    shifted = str(tmp_path / "shifted.hdf5")
    shutil.copy(pendulum_random, shifted)
    with h5py.File(shifted, "r+") as f:
        f["next_observations"][...] = f["next_observations"][()] + 5.0
    obs_mean = datasets.load_dataset(pendulum_random).transitions["obs"].mean(0)
    for score_next, offset in ((False, 0.0), (True, 5.0)):
        config = mopo_config(shifted, tmp_path, algo="gormpo", penalty="linear",
                             **{"gormpo.score_next_state": score_next})
        algo = mopo.build(config)
        state_mean = np.asarray(algo.init(jax.random.PRNGKey(0)).density.scaler.mean)[:3]
        np.testing.assert_allclose(state_mean, obs_mean + offset, atol=0.3)
        algo.close()


def test_d4rl_variants_carry_mopos_horizon_and_lambda():
    want = {"halfcheetah_medium": (5, 0.5), "hopper_medium": (5, 5.0), "walker2d_medium": (5, 0.5),
            "halfcheetah_medium_replay": (5, 0.5), "hopper_medium_replay": (5, 2.5),
            "walker2d_medium_replay": (1, 2.5), "halfcheetah_medium_expert": (5, 2.5),
            "hopper_medium_expert": (5, 5.0), "walker2d_medium_expert": (1, 2.5)}
    for variant, (horizon, coef) in want.items():
        c = jaxwm.config.load(f"mopo:{variant}")
        assert (c.mopo.horizon, c.penalty_coef) == (horizon, coef), variant
        assert c.dataset == f"data/{variant.replace('_', '-')}.hdf5"
        assert c.env.id.split("-")[0].lower() == variant.split("_")[0]


@pytest.fixture(scope="module")
def pendulum_medium(tmp_path_factory):
    """A Pendulum medium dataset made by jaxwm's own SAC (about 3 min on 2 cores)."""
    path = str(tmp_path_factory.mktemp("medium") / "pendulum-medium.hdf5")
    return make_dataset.make("Pendulum-v1", "medium", path, size=20_000, train_steps=20_000)


@pytest.mark.slow
# The inverse shape is e^(tau - logp): unbounded, so it needs a small coefficient (at 1.0 the
# penalty averaged 60-500 per step against rewards of about -2 and the Q-values ran away; at
# 0.01 it passed on one dataset, -272.4 against -275.6, and failed on this host's current one,
# -371.0 against -268.0). softplus(-logp) grows with -logp too: at 1.0 it passed on the first
# dataset (-185.9) and failed on the current one (-444.5). On the current dataset (2026-11-27):
# inverse at 0.001 -171.1 and -240.6 (seed 2), one core each, and passed again in this test;
# softplus at 0.1 -233.9 and -250.2 (seed 2), one core each, but -339.7 (seed 1 again) in this
# test with two runs sharing 2 cores. So softplus stays marginal at this budget: runs of one
# seed differ by ~100 with how XLA splits the work over threads.
@pytest.mark.parametrize("algo, shape, coef", [("mopo", "", 1.0), ("gormpo", "linear", 1.0),
                                               ("gormpo", "inverse", 0.001),
                                               ("gormpo", "tanh", 1.0),
                                               ("gormpo", "softplus", 0.1)])
def test_pendulum_tiny_beats_the_behaviour_policy(pendulum_medium, tmp_path, algo, shape, coef):
    """mopo:pendulum_tiny with each shape's coefficient (inverse 0.001, softplus 0.1,
    the others 1.0): the final evaluation return (10 episodes, deterministic policy) beats the mean episode
    return of the dataset it learned from."""
    behaviour = datasets.load_dataset(pendulum_medium).metadata["generation"][
        "dataset_return_mean"]
    config = jaxwm.config.load("mopo:pendulum_tiny",
                               {"log.progress": False, "dataset": pendulum_medium,
                                "algo": algo, "penalty": shape, "penalty_coef": coef})
    summary = train.run(config, str(tmp_path / "run"))
    print(f"{algo} {shape or 'uncertainty'} coef {coef}: final eval "
          f"{summary['eval/episodic_return']:.1f}, behaviour {behaviour:.1f}")
    assert summary["eval/episodic_return"] > behaviour, (summary["eval/episodic_return"],
                                                         behaviour)
