"""Dynamics ensemble: loss and log-variance bounds against hand computation, elites on a
synthetic problem with a bad member, early stopping, termination rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.models import ensemble, termination
from jaxwm.models.dynamics import Normalizer
from jaxwm.models.patience import Patience, observe


def _spec(**kw):
    return ensemble.EnsembleSpec(obs_dim=2, action_dim=1, **{"num_members": 3, "num_elites": 2,
                                                             "hidden": (16, 16),
                                                             "weight_decay": (1e-3, 2e-3, 3e-3),
                                                             **kw})


def _linear_data(n, rng):
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    action = rng.uniform(-1, 1, size=(n, 1)).astype(np.float32)
    next_obs = obs + 0.1 * np.concatenate([action, -action], 1)
    reward = obs[:, 0] - action[:, 0]
    return {"obs": jnp.asarray(obs), "action": jnp.asarray(action),
            "next_obs": jnp.asarray(next_obs), "reward": jnp.asarray(reward)}


def test_logvar_stays_inside_learned_bounds_and_loss_matches_hand_computation():
    spec = _spec()
    state = ensemble.init(spec, jax.random.key(0), Normalizer.identity(3))
    member = jax.tree.map(lambda v: v[0], state.params)
    # Push the raw log-variance far out both ways: the soft clamp keeps it inside the bounds.
    p = member["params"]
    for scale in (1e3, -1e3):
        pushed = {"params": {**p, "layer_2": {"kernel": p["layer_2"]["kernel"],
                                              "bias": p["layer_2"]["bias"].at[3:].set(scale)}}}
        _, logvar = spec.member.apply(pushed, jnp.ones((4, 3)))
        assert np.all(np.asarray(logvar) <= 0.5 + 1e-4)  # soft: the lower clamp adds softplus(-10.5)
        assert np.all(np.asarray(logvar) >= -10 - 1e-4)

    x, y = jnp.ones((4, 3)), jnp.zeros((4, 3))
    loss, nll = ensemble.member_loss(spec, member, x, y)
    mean, logvar = spec.member.apply(member, x)
    want_nll = np.mean(np.asarray(mean) ** 2 * np.exp(-np.asarray(logvar))) + np.mean(logvar)
    decay = sum(wd / 2 * np.sum(np.asarray(p[f"layer_{i}"]["kernel"]) ** 2)
                for i, wd in enumerate(spec.weight_decay))
    bounds = 0.01 * (3 * 0.5 - 3 * -10.0)
    np.testing.assert_allclose(nll, want_nll, rtol=1e-5)
    np.testing.assert_allclose(loss, want_nll + decay + bounds, rtol=1e-5)


def test_kit_init_has_a_quarter_of_flaxs_weight_variance():
    """OfflineRL-Kit's EnsembleLinear: weights N(0, 1 / (2 sqrt(fan_in))^2), zero biases."""
    x = jnp.zeros((1, 10))
    params = ensemble.GaussianMLP(4, (200, 200), weight_init="kit").init(jax.random.PRNGKey(0), x)
    for name, fan_in in (("layer_0", 10), ("layer_1", 200), ("layer_2", 200)):
        layer = params["params"][name]
        assert float(layer["kernel"].std()) == pytest.approx(0.5 / np.sqrt(fan_in), rel=0.1)
        assert not np.any(np.asarray(layer["bias"]))
    with pytest.raises(ValueError, match="Unknown ensemble weight_init 'torch'"):
        ensemble.EnsembleSpec(3, 1, weight_init="torch")


def test_training_fits_and_elites_exclude_a_sabotaged_member():
    spec = _spec(batch_size=64)
    rng = np.random.default_rng(0)
    data = _linear_data(2000, rng)
    train, holdout = ensemble.split_indices(2000, rng)
    assert len(holdout) == 400
    bootstrap = rng.integers(0, len(train), size=(spec.num_members, len(train)))
    x = ensemble.inputs(data["obs"][train], data["action"][train])
    state = ensemble.init(spec, jax.random.key(1), Normalizer.fit(x))
    epoch = jax.jit(lambda s, k: ensemble.train_epoch(spec, s, data, jnp.asarray(train),
                                                      jnp.asarray(bootstrap),
                                                      jnp.asarray(holdout), k))
    first = None
    for i in range(15):
        state, metrics = epoch(state, jax.random.key(i))
        first = first if first is not None else float(metrics["model/holdout_mse"])
    assert float(metrics["model/holdout_mse"]) < 0.1 * first
    # One pair of log-variance bounds for the ensemble: the members' copies moved together.
    for name, start in (("max_logvar", 0.5), ("min_logvar", -10.0)):
        bounds = np.asarray(state.params["params"][name])
        np.testing.assert_array_equal(bounds, np.broadcast_to(bounds[0], bounds.shape))
        assert np.abs(bounds - start).max() > 1e-3, name
    # Sabotage member 1's snapshot: its held-out MSE is then the worst, so it is no elite.
    bad = jax.tree.map(lambda v: v.at[1].multiply(-3.0), state.patience.best_params)
    mse = ensemble.holdout_mse(spec, bad, state.scaler,
                               jax.tree.map(lambda v: v[holdout], data))
    state = state.replace(patience=state.patience.replace(best_params=bad, best_loss=mse))
    assert 1 not in np.asarray(state.elite_indices(2)).tolist()
    # Rollout steps only ever use elites: with member 1 far off, samples stay near the truth.
    next_obs, reward, std = ensemble.sample_step(spec, state, data["obs"][:256],
                                                 data["action"][:256], jax.random.key(9))
    assert std.shape == (3, 256, 3)
    assert float(jnp.mean((next_obs - data["next_obs"][:256]) ** 2)) < 0.05


def test_tied_bounds_gradient_is_the_members_sum_with_the_penalty_counted_once():
    # member_loss adds 0.01 (sum max - sum min) to each of 3 members: the shared pair's
    # gradient keeps one of those 3 penalties, i.e. removes 2 x (+0.01) from max, 2 x (-0.01)
    # from min. Layer gradients are untouched.
    grads = {"params": {"max_logvar": jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
                        "min_logvar": jnp.array([[0.5, 0.0], [0.5, 0.0], [0.5, 1.0]]),
                        "layer_0": {"kernel": jnp.arange(6.0).reshape(3, 2)}}}
    tied = ensemble.tie_logvar_bounds(grads, 3)["params"]
    np.testing.assert_allclose(tied["max_logvar"], [[8.98, 11.98]] * 3, rtol=1e-6)
    np.testing.assert_allclose(tied["min_logvar"], [[1.52, 1.02]] * 3, rtol=1e-6)
    np.testing.assert_array_equal(tied["layer_0"]["kernel"], grads["params"]["layer_0"]["kernel"])


def test_patience_snapshots_each_member_and_counts_epochs_without_improvement():
    params = {"w": jnp.zeros((2, 3))}
    p = Patience.start(params, members=2)
    p = observe(p, jnp.array([1.0, 1.0]), {"w": jnp.ones((2, 3))})
    assert int(p.epochs_since_improvement) == 0
    # Member 0 improves by 0.5% (below 1%): not snapshotted; member 1 by 50%: snapshotted.
    p = observe(p, jnp.array([0.995, 0.5]), {"w": 2 * jnp.ones((2, 3))})
    np.testing.assert_array_equal(p.best_params["w"][:, 0], [1.0, 2.0])
    np.testing.assert_allclose(p.best_loss, [1.0, 0.5])
    assert int(p.epochs_since_improvement) == 0
    p = observe(p, jnp.array([2.0, 2.0]), {"w": 3 * jnp.ones((2, 3))})
    p = observe(p, jnp.array([2.0, 2.0]), {"w": 3 * jnp.ones((2, 3))})
    assert int(p.epochs_since_improvement) == 2 and bool(p.exhausted(2))


def test_termination_rules():
    obs = jnp.zeros((3, 11))
    next_obs = jnp.zeros((3, 11)).at[:, 0].set(jnp.array([1.2, 0.5, 1.2]))
    next_obs = next_obs.at[2, 1].set(0.3)
    np.testing.assert_array_equal(termination.termination_fn("Hopper-v4")(obs, None, next_obs),
                                  [False, True, True])
    walker = next_obs.at[:, 0].set(jnp.array([1.0, 2.5, 1.0]))
    np.testing.assert_array_equal(termination.termination_fn("Walker2d-v4")(obs, None, walker),
                                  [False, True, False])
    ant = next_obs.at[:, 0].set(jnp.array([0.5, 0.1, jnp.nan]))
    np.testing.assert_array_equal(termination.termination_fn("Ant-v4")(obs, None, ant),
                                  [False, True, True])
    assert not termination.termination_fn("HalfCheetah-v4")(obs, None, next_obs).any()
    with pytest.raises(ValueError, match="known env families"):
        termination.termination_fn("Humanoid-v4")


def test_an_epoch_keeps_the_state_types_so_the_second_call_does_not_recompile():
    spec = _spec(batch_size=64)
    rng = np.random.default_rng(0)
    data = _linear_data(500, rng)
    train, holdout = ensemble.split_indices(500, rng)
    bootstrap = jnp.asarray(rng.integers(0, len(train), size=(3, len(train))))
    state = ensemble.init(spec, jax.random.key(1), Normalizer.identity(3))
    epoch = jax.jit(lambda s, k: ensemble.train_epoch(spec, s, data, jnp.asarray(train),
                                                      bootstrap, jnp.asarray(holdout), k))
    after, _ = epoch(state, jax.random.key(0))
    assert jax.tree.map(lambda a: (a.dtype, a.weak_type), state) == \
        jax.tree.map(lambda a: (a.dtype, a.weak_type), after)
