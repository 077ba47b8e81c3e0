"""TD-MPC2: the model's pieces by hand, MPPI on a known objective, the update's losses and
masks, the planner as a policy, configs and bad input. The whole run (every phase, resume,
devices, seeds) is the contract suite's (tests/test_contract.py); learning is
tests/test_tdmpc2_learning.py (slow)."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import runner
from jaxwm.agents import mppi
from jaxwm.agents import tdmpc2 as agent_lib
from jaxwm.config import ConfigError, load
from jaxwm.envs import make_env
from jaxwm.envs.types import EnvSpec
from jaxwm.models import tdmpc2 as wm
from jaxwm.ops.layer_norm import mish
from jaxwm.ops.normalize import RunningScale


def spec(obs_dim=5, action_dim=2, low=-1.0, episode=500):
    return EnvSpec("Fake-v0", "dmc", 1, (obs_dim,), np.float32, False, None, (action_dim,),
                   np.full(action_dim, low, np.float32), np.full(action_dim, -low, np.float32),
                   episode)


def make_agent(episodic=False, size=1, **overrides):
    cfg = agent_lib.config_block(model_size=size, episodic=episodic, **overrides)
    return agent_lib.make(spec(), cfg)


# ----------------------------------------------------------------------------- model pieces


def test_normed_linear_keeps_flax_layer_norm_parameters_and_output():
    """LayerNorm + Mish run as one op (``ops.layer_norm``) under flax's own names, so older
    checkpoints load; the output is Linear -> flax LayerNorm -> Mish."""
    layer = wm.NormedLinear(16)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    params = layer.init(jax.random.PRNGKey(1), x)["params"]
    assert jax.tree.map(jnp.shape, params) == {
        "Dense_0": {"kernel": (8, 16), "bias": (16,)},
        "LayerNorm_0": {"scale": (16,), "bias": (16,)}}
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(2), p.shape),
                          params)
    dense = x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
    expected = mish(nn.LayerNorm().apply({"params": params["LayerNorm_0"]}, dense))
    np.testing.assert_allclose(layer.apply({"params": params}, x), expected, atol=2e-6)


def perturbed(params, key=2, spread=0.1):
    """Every parameter moved off its initial value (zero biases and unit scales hide errors)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(key), len(leaves))
    return jax.tree.unflatten(tree, [p + spread * jax.random.normal(k, p.shape)
                                     for p, k in zip(leaves, keys, strict=True)])


def test_centred_layers_with_centred_weights_compute_the_same_function():
    """The planner's layers (``centred``, with ``centre_weights``): the Linear's outputs come
    mean-free and LayerNorm skips the mean, for Mish and SimNorm layers alike, whatever the
    input's offset; the parameters are the same tree."""
    x = 3.0 + jax.random.normal(jax.random.PRNGKey(0), (6, 24))
    plain = wm.MLP((32, 32), 16, out_act="simnorm")
    params = perturbed(plain.init(jax.random.PRNGKey(1), x))
    centred = wm.centre_weights(params)
    assert jax.tree.map(jnp.shape, centred) == jax.tree.map(jnp.shape, params)
    np.testing.assert_allclose(plain.clone(centred=True).apply(centred, x),
                               plain.apply(params, x), rtol=1e-5, atol=2e-6)


def test_an_mlp_maps_any_batch_shape_row_by_row():
    """``MLP`` flattens its input's batch axes into one (for XLA:CPU's sums in the backward):
    the output keeps the batch shape, and each row's output is that row's alone."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 24))
    net = wm.MLP((32, 32), 16, out_act="simnorm")
    params = perturbed(net.init(jax.random.PRNGKey(1), x))
    out = net.apply(params, x)
    assert out.shape == (2, 3, 16)
    np.testing.assert_allclose(out[1, 2], net.apply(params, x[1, 2]), rtol=1e-5, atol=1e-6)


def test_the_centred_world_model_predicts_what_the_model_does():
    model = wm.WorldModel(2, wm.SIZES[1], episodic=True)
    params = perturbed(wm.init(model, jax.random.PRNGKey(0), 5), spread=0.02)
    centred, centred_params = model.clone(centred=True), wm.centre_weights(params)
    obs, a = jax.random.normal(jax.random.PRNGKey(3), (4, 5)), jnp.full((4, 2), 0.3)
    outputs = [m.apply(p, obs, a, jax.random.PRNGKey(4))
               for m, p in ((model, params), (centred, centred_params))]
    for ours, theirs in zip(jax.tree.leaves(outputs[1]), jax.tree.leaves(outputs[0]),
                            strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    z = outputs[0][0]
    heads = jnp.array([1, 0])
    np.testing.assert_allclose(
        wm.q_heads(wm.q_params(centred_params), z, a, heads,
                   jax.random.PRNGKey(5), centred=True),
        wm.q_heads(wm.q_params(params), z, a, heads, jax.random.PRNGKey(5)),
        rtol=1e-4, atol=1e-5)


def test_simnorm_sums_to_one_per_group_of_eight():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 64)) * 5
    y = wm.simnorm(x).reshape(3, 8, 8)
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-6)
    assert jnp.all(y >= 0)


@pytest.mark.parametrize("value", [-37.0, -1.5, 0.0, 0.3, 2.0, 640.0])
def test_two_hot_round_trip_and_cross_entropy_minimum(value):
    """A scalar encoded over the 101 symlog bins decodes back, and the cross-entropy of the
    encoding itself is below that of a shifted one."""
    weights = wm.twohot.encode(wm.twohot.symlog(jnp.asarray(value)), wm.bins())
    logits = jnp.log(weights + 1e-12)
    assert float(wm.decode(logits)) == pytest.approx(value, rel=1e-4, abs=1e-4)
    shifted = jnp.roll(logits, 3)
    assert wm.soft_cross_entropy(logits, jnp.asarray(value)) < \
        wm.soft_cross_entropy(shifted, jnp.asarray(value))


def test_zero_initialised_heads_predict_zero_reward_and_value():
    agent = make_agent()
    params = agent.init_learner(jax.random.PRNGKey(0)).params

    @jax.jit  # one compilation instead of many small eager ops
    def predictions(params):
        z = agent.encode(params, jnp.ones((4, 5)))
        a = jnp.zeros((4, 2))
        return agent.reward(params, z, a), agent.q_pair(wm.q_params(params), z, a,
                                                        jax.random.PRNGKey(1))

    for prediction in predictions(params):
        np.testing.assert_allclose(prediction, 0.0, atol=1e-6)


def test_a_subset_of_q_heads_equals_those_heads_of_the_ensemble():
    model = wm.WorldModel(2, wm.SIZES[5])
    params = wm.init(model, jax.random.PRNGKey(0), 5)
    # Non-zero outputs: perturb every Q parameter.
    qs = jax.tree.map(lambda x: x + 0.01 * jnp.cos(jnp.arange(x.size).reshape(x.shape)),
                      wm.q_params(params))
    params = {"params": {**params["params"], "qs": qs}}
    z, a = jnp.ones((3, 512)) / 8, jnp.full((3, 2), 0.5)
    every = model.apply(params, z, a, method=wm.WorldModel.q)
    heads = jnp.array([4, 1])
    np.testing.assert_allclose(wm.q_heads(qs, z, a, heads, jax.random.PRNGKey(1)),
                               every[heads], rtol=1e-5, atol=1e-6)


def test_the_q_ensemble_is_each_head_a_q_network_with_its_own_dropout():
    """``q_logits`` runs the stacked heads in one layout (rows-major, then heads first); each
    head must still be Linear -> LayerNorm -> Mish twice, then 101 logits, with that head's
    parameters: forward and gradients against ``MLP`` applied head by head. With dropout,
    the heads draw their masks independently."""
    sizes = wm.SIZES[1]
    model = wm.QEnsemble(sizes)
    z, a = jax.random.normal(jax.random.PRNGKey(0), (3, 4, sizes.latent_dim)), \
        jnp.full((3, 4, 2), 0.5)
    params = perturbed(model.init(jax.random.PRNGKey(1), z, a)["params"])
    head = wm.MLP((sizes.mlp_dim, sizes.mlp_dim), wm.NUM_BINS, zero_out=True)
    weights = jax.random.normal(jax.random.PRNGKey(3), (sizes.num_q, 3, 4, wm.NUM_BINS))

    def ours(params, z):
        return jnp.sum(weights * model.apply({"params": params}, z, a))

    def theirs(params, z):
        x = jnp.concatenate([z, a], -1)
        every = jax.vmap(lambda p: head.apply({"params": p}, x))(params["heads"])
        return jnp.sum(weights * every)

    np.testing.assert_allclose(ours(params, z), theirs(params, z), rtol=1e-5)
    for mine, reference in zip(jax.tree.leaves(jax.grad(ours, (0, 1))(params, z)),
                               jax.tree.leaves(jax.grad(theirs, (0, 1))(params, z)),
                               strict=True):
        np.testing.assert_allclose(mine, reference, rtol=1e-4,
                                   atol=1e-5 * float(jnp.abs(reference).max()))
    same = jax.tree.map(lambda p: jnp.broadcast_to(p[:1], p.shape), params)
    evaluated = model.apply({"params": same}, z, a)
    np.testing.assert_allclose(evaluated[1:], evaluated[:1].repeat(sizes.num_q - 1, 0),
                               rtol=1e-5, atol=1e-5)
    dropped = model.apply({"params": same}, z, a, True, rngs={"dropout": jax.random.PRNGKey(4)})
    assert float(jnp.abs(dropped[0] - dropped[1]).max()) > 1e-2  # rounding alone: ~1e-5


def test_initial_parameters_can_be_donated():
    """Every parameter is a buffer of its own (updates donate the learner; XLA refuses a
    buffer donated twice, which shared zero arrays in the Q heads' init would be)."""
    params = wm.init(wm.WorldModel(2, wm.SIZES[1]), jax.random.PRNGKey(0), 5)
    bumped = jax.jit(lambda p: jax.tree.map(lambda x: x + 1, p), donate_argnums=0)(params)
    assert jax.tree.structure(bumped) == jax.tree.structure(params)


@pytest.mark.parametrize("size,low,high", [(1, 0.5e6, 1.5e6), (5, 4.5e6, 5.5e6)])
def test_model_sizes_have_their_parameter_counts(size, low, high):
    """On a DMC-sized task (walker: 24 observations, 6 actions), as the presets' names say."""
    model = wm.WorldModel(6, wm.SIZES[size])
    count = wm.count_params(wm.init(model, jax.random.PRNGKey(0), 24))
    assert low < count < high, count


def test_policy_prior_actions_are_squashed_with_bounded_log_std():
    agent = make_agent()
    params = agent.init_learner(jax.random.PRNGKey(0)).params
    z = agent.encode(params, jax.random.normal(jax.random.PRNGKey(1), (64, 5)) * 10)
    a, info = agent.pi(params, z, jax.random.PRNGKey(2))
    assert jnp.all(jnp.abs(a) <= 1.0)
    assert jnp.all((info["log_std"] >= wm.LOG_STD_MIN) & (info["log_std"] <= wm.LOG_STD_MAX))
    # The reference's loss entropy: -|A| x the Gaussian log-probability before the squash.
    assert info["scaled_entropy"].shape == (64,)


def test_running_scale_moves_toward_the_clipped_percentile_range():
    scale = RunningScale.create()
    values = jnp.arange(101.0)  # 5th and 95th percentiles 5 and 95
    assert float(scale.update(values, tau=0.5).value) == pytest.approx(1 + 0.5 * (90 - 1))
    assert float(scale.update(jnp.zeros(10), tau=0.5).value) == pytest.approx(1.0)


def test_discount_from_episode_length():
    assert agent_lib.discount(500) == pytest.approx(0.99)
    assert agent_lib.discount(1000) == pytest.approx(0.995)
    assert agent_lib.discount(200) == pytest.approx(0.975)
    assert agent_lib.discount(50) == 0.95


# ----------------------------------------------------------------------------- MPPI


def quadratic(target):
    return lambda seqs, key: -jnp.sum((seqs - target) ** 2, axis=(1, 2))


def test_mppi_returns_the_optimum_of_a_known_quadratic():
    target = jnp.array([[0.3, -0.6], [0.8, 0.1], [-0.2, 0.5]])
    hyper = mppi.MPPIHyper(horizon=3, iterations=8, num_samples=512, num_elites=64,
                           num_pi_trajs=0)
    result = mppi.plan(quadratic(target), jax.random.PRNGKey(0), jnp.zeros((3, 2)), hyper)
    np.testing.assert_allclose(result.prior.mean, target, atol=0.03)
    action = mppi.select(jax.random.PRNGKey(1), result, noise_scale=0.0)
    np.testing.assert_allclose(action, target[0], atol=0.1)


def test_mppi_keeps_fixed_sequences_among_the_candidates():
    """A fixed sequence that is the optimum is found even where sampling from the start
    distribution could not reach it in one round."""
    target = jnp.full((3, 2), 0.9)
    hyper = mppi.MPPIHyper(horizon=3, iterations=1, num_samples=8, num_elites=1,
                           max_std=1e-3, min_std=1e-3)
    result = mppi.plan(quadratic(target), jax.random.PRNGKey(0), jnp.zeros((3, 2)), hyper,
                       fixed=target[None])
    np.testing.assert_allclose(result.elites[0], target)


def test_warm_start_shifts_the_mean_and_restarts_at_episode_starts():
    prev = jnp.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(mppi.warm_start(prev, jnp.asarray(False)),
                                  [[2, 3], [4, 5], [0, 0]])
    np.testing.assert_array_equal(mppi.warm_start(prev, jnp.asarray(True)), jnp.zeros((3, 2)))


def test_the_planner_policy_carries_each_envs_mean_and_resets_it_at_episode_starts():
    """Two envs: the carry after acting is each env's final MPPI mean; an env at an episode's
    first step plans from zeros, the other from its shifted mean (seen through a planner whose
    objective ignores the sequences, so its mean stays where it starts)."""
    hyper = mppi.MPPIHyper(horizon=3, iterations=1, num_samples=16, num_elites=16,
                           num_pi_trajs=0, min_std=1e-6, max_std=1e-6)
    policy = mppi.policy(lambda params, obs, key: (lambda s, k: jnp.zeros(s.shape[0]), None),
                         hyper, action_dim=1)
    carry = jnp.array([[[0.1], [0.2], [0.3]], [[0.4], [0.5], [0.6]]])
    carry, action, extras = policy.act(None, carry, jnp.zeros((2, 1)),
                                       jnp.array([True, False]), jax.random.PRNGKey(0), 0.0)
    np.testing.assert_allclose(carry[0, :, 0], [0, 0, 0], atol=1e-5)
    np.testing.assert_allclose(carry[1, :, 0], [0.5, 0.6, 0.0], atol=1e-5)
    np.testing.assert_allclose(action[:, 0], [0.0, 0.5], atol=1e-5)
    assert extras == {}


@pytest.mark.parametrize("envs_per_batch", [1, 2])
def test_planning_envs_in_turn_equals_planning_them_all_at_once(envs_per_batch):
    """``envs_per_batch`` only changes how the envs are batched (1 or 2 of 5 at a time, a
    remainder included), not their plans: each env keeps its own key."""
    agent = agent_lib.make(spec(), agent_lib.config_block(
        model_size=1, num_samples=16, num_elites=4, num_pi_trajs=2, iterations=2))
    learner = agent.init_learner(jax.random.PRNGKey(0))
    args = (learner, jnp.zeros((5, 3, 2)), jax.random.normal(jax.random.PRNGKey(1), (5, 5)),
            jnp.array([True, False, True, False, False]), jax.random.PRNGKey(2), 1.0)
    outputs = []
    for per_batch in (0, envs_per_batch):
        planning = dataclasses.replace(agent.planning, envs_per_batch=per_batch)
        outputs.append(jax.jit(dataclasses.replace(agent, planning=planning).planner().act)(
            *args))
    for together, in_turn in zip(outputs[0][:2], outputs[1][:2], strict=True):
        np.testing.assert_allclose(in_turn, together, atol=1e-5)


def test_the_planner_batches_envs_by_backend_unless_told():
    block = agent_lib.config_block()
    expected = 1 if jax.default_backend() == "cpu" else 0
    assert agent_lib.planner_hyper(block, 6).envs_per_batch == expected
    block.envs_per_batch = 4
    assert agent_lib.planner_hyper(block, 6).envs_per_batch == 4


def test_planner_maps_actions_to_the_env_box():
    agent = agent_lib.make(spec(low=-2.0), agent_lib.config_block(
        model_size=1, num_samples=16, num_elites=4, num_pi_trajs=2, iterations=1))
    learner = agent.init_learner(jax.random.PRNGKey(0))
    policy = agent.planner()
    carry = policy.init_carry(learner, 3)
    _, action, _ = jax.jit(policy.act)(learner, carry, jnp.ones((3, 5)), jnp.ones(3, bool),
                                       jax.random.PRNGKey(1), 1.0)
    assert action.shape == (3, 2) and jnp.all(jnp.abs(action) <= 2.0)
    assert jnp.any(jnp.abs(action) > 1.0) or jnp.all(jnp.isfinite(action))


# ----------------------------------------------------------------------------- the update


def batch(key, horizon=3, size=32, obs_dim=5, action_dim=2):
    k_obs, k_act, k_rew = jax.random.split(key, 3)
    obs = jax.random.normal(k_obs, (size, horizon + 1, obs_dim))
    action = jax.random.uniform(k_act, (size, horizon + 1, action_dim), minval=-1, maxval=1)
    reward = jnp.tanh(obs[..., 0]) + jax.random.normal(k_rew, (size, horizon + 1)) * 0.01
    return {"obs": obs, "action": action, "reward": reward,
            "terminated": jnp.zeros((size, horizon + 1), bool),
            "is_first": jnp.zeros((size, horizon + 1), bool)}


@pytest.mark.parametrize("episodic", [False, True])
def test_updates_on_a_fixed_batch_lower_each_loss(episodic):
    agent = make_agent(episodic=episodic)
    data = batch(jax.random.PRNGKey(0))
    if episodic:
        data["terminated"] = data["terminated"].at[::3, 2].set(True)
    learner = agent.init_learner(jax.random.PRNGKey(1))
    step = jax.jit(agent.update_step)
    _, first = step(learner, data, jax.random.PRNGKey(2))
    for i in range(60):
        learner, metrics = step(learner, data, jax.random.PRNGKey(3 + i))
    names = ["consistency", "reward", "value"] + (["termination"] if episodic else [])
    for name in names:
        assert metrics[f"losses/{name}"] < first[f"losses/{name}"], (name, first, metrics)
    assert all(np.isfinite(float(v)) for v in metrics.values())


def test_gradients_are_clipped_by_one_norm_over_encoder_and_dynamics():
    """The reference clips ``model.parameters()`` together: with encoder gradients of norm 3
    and the rest of norm 4 (total 5) and a clip of 1, both are divided by 5, not each by its
    own norm. Adam's first moment after one step is 0.1 x the clipped gradient."""
    agent = make_agent(grad_clip_norm=1.0)
    params = agent.init_learner(jax.random.PRNGKey(0)).params
    groups = wm.param_groups(params)

    def constant(group, norm):  # every leaf of ``group`` equal, the group's norm ``norm``
        pairs = zip(jax.tree.leaves(params), jax.tree.leaves(groups), strict=True)
        count = sum(x.size for x, g in pairs if g == group)
        return norm / math.sqrt(count)

    fill = {"encoder": constant("encoder", 3.0), "model": constant("model", 4.0), "policy": 0.0}
    grads = jax.tree.map(lambda x, g: jnp.full_like(x, fill[g]), params, groups)
    model_tx, _ = agent.optimizers()
    _, state = model_tx.update(grads, model_tx.init(params), params)
    mu = {name: inner.inner_state[0].mu for name, inner in state[1].inner_states.items()
          if name != "policy"}
    for name in ("encoder", "model"):
        leaf = jax.tree.leaves(mu[name])[0]
        np.testing.assert_allclose(leaf.ravel()[0], 0.1 * fill[name] / 5.0, rtol=1e-5)


def test_steps_past_an_episodes_end_are_masked_out():
    """A window whose s_2 is a reset row (is_first): the losses do not depend on anything
    from s_2 on, and equal those of the same window with garbage there."""
    agent = make_agent(episodic=True)
    data = batch(jax.random.PRNGKey(0))
    data["is_first"] = data["is_first"].at[:, 2].set(True)
    garbage = dict(data)
    for name in ("obs", "action", "reward"):
        garbage[name] = data[name].at[:, 2:].set(99.0)
    garbage["terminated"] = data["terminated"].at[:, 2:].set(True)
    step = jax.jit(agent.update_step)  # one compilation for both
    _, clean = step(agent.init_learner(jax.random.PRNGKey(1)), data, jax.random.PRNGKey(2))
    _, noisy = step(agent.init_learner(jax.random.PRNGKey(1)), garbage, jax.random.PRNGKey(2))
    for name in ("consistency", "reward", "value", "termination", "pi"):
        assert float(clean[f"losses/{name}"]) == pytest.approx(float(noisy[f"losses/{name}"]),
                                                                rel=1e-5), name
    assert float(clean["agent/inside_episode"]) == pytest.approx(1 / 3)


def test_each_transitions_own_termination_cuts_its_td_target():
    """Terminated at the second transition only: its target is its reward alone; the first and
    third bootstrap (the reference's episodic branch used the last flag for all three)."""
    agent = make_agent(episodic=True)
    learner = agent.init_learner(jax.random.PRNGKey(0))
    # Target Q heads that predict well above 0: output biases rising toward the top bins.
    target_qs = jax.tree.map(lambda x: x + jnp.linspace(0.0, 5.0, wm.NUM_BINS)
                             if x.ndim == 2 and x.shape[-1] == wm.NUM_BINS else x,
                             learner.target_qs)
    next_z = agent.encode(learner.params, jax.random.normal(jax.random.PRNGKey(3), (3, 4, 5)))
    reward = jnp.full((3, 4), 0.5)
    terminated = jnp.array([0.0, 1.0, 0.0])[:, None] * jnp.ones((3, 4))
    target = agent.td_target(learner.params, target_qs, next_z, reward, terminated,
                             jax.random.PRNGKey(4))
    np.testing.assert_allclose(target[1], 0.5, rtol=1e-6)
    assert jnp.all(jnp.abs(target[0] - 0.5) > 1e-4) and jnp.all(jnp.abs(target[2] - 0.5) > 1e-4)


def test_the_encoder_learns_at_a_third_of_the_rate_and_the_policy_apart():
    agent = make_agent()
    params = agent.init_learner(jax.random.PRNGKey(0)).params
    groups = jax.tree.leaves(wm.param_groups(params))
    assert {"encoder", "model", "policy"} == set(groups)
    model_tx, pi_tx = agent.optimizers()
    ones = jax.tree.map(jnp.ones_like, params)
    step = lambda tx: tx.update(ones, tx.init(params), params)[0]  # noqa: E731
    by_group = lambda tree: {g: float(jnp.abs(x).max()) for g, x in zip(  # noqa: E731
        groups, jax.tree.leaves(tree), strict=True)}
    model = by_group(step(model_tx))
    assert model["policy"] == 0.0
    assert model["encoder"] == pytest.approx(0.3 * model["model"], rel=1e-3)
    # The policy prior's optimiser holds moments for the policy's parameters only.
    pi_opt = agent.init_learner(jax.random.PRNGKey(0)).pi_opt
    assert jax.tree.structure(pi_opt[1][0].mu) == jax.tree.structure(wm.policy_params(params))


# ----------------------------------------------------------------------------- configs


def test_dmc_action_repeat_gives_500_step_episodes_with_summed_rewards():
    config = load("tdmpc2:dmc", {"env.id": "CartpoleBalance-v1"})
    env = make_env(config.env, num_envs=1, seed=0)
    try:
        assert env.spec.max_episode_steps == 500
    finally:
        env.close()


def test_model_size_is_one_setting_at_either_path():
    config = load("tdmpc2:dmc", {"model_size": 1})
    assert config.tdmpc2.model_size == 1
    config = load("tdmpc2:dmc", {"tdmpc2.model_size": 19})
    assert config.model_size == 19


@pytest.mark.parametrize("overrides,message", [
    ({"env.id": "Pong-v5"}, "tdmpc2 takes continuous actions; Pong-v5's are discrete "
                            "(algorithms for discrete actions: dreamer, pairing, ppo, simple)"),
    ({"model_size": 3}, "tdmpc2.model_size=3 does not exist; choose one of [1, 5, 19, 48, 317]"),
    ({"tdmpc2.horizon": 0}, "tdmpc2.horizon=0 is a size and must be > 0"),
    ({"tdmpc2.num_pi_trajs": 32}, "must exceed num_pi_trajs=32"),
    ({"env.id": "gymnax:Pendulum-v1", "iterations_per_call": 3},
     "The train phase's 32 env steps (total_env_steps - tdmpc2.seed_steps) are not a multiple "
     "of the 24 of one call (iterations_per_call=3)"),
])
def test_bad_settings_are_one_line_errors_before_anything_compiles(overrides, message):
    config = load("tdmpc2:tiny", overrides)
    with pytest.raises(ConfigError, match=None) as error:
        runner.validate(config)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_issue_commands_validate():
    for spec_, overrides in [
            ("tdmpc2:dmc", {"env.id": "CheetahRun-v1"}),
            ("tdmpc2:dmc", {"model_size": 1, "env.id": "CartpoleSwingup-v1"}),
            ("tdmpc2:mujoco", {"env.id": "Hopper-v4"}),
            ("tdmpc2:tiny", {}),
            ("tdmpc2:tiny", {"env.id": "CartpoleBalance-v1", "tdmpc2.horizon": 5})]:
        runner.validate(load(spec_, overrides))
    assert math.isclose(agent_lib.make(spec(episode=1000), load(
        "tdmpc2:mujoco").tdmpc2).hyper.discount, 0.995)
