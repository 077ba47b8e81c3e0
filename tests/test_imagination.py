"""DreamerV3's imagination actor-critic (``agents.imagination``), checked against what its
docstring and the paper (Hafner et al. 2023, eq. 11) say, on numbers and gradients:

* discrete actions: the actor's gradient is REINFORCE, -sg((R - v) / S) log pi(a), plus the
  entropy bonus, computed here independently from the same imagined rollout; the actor loss
  sends no gradient to the critic, the world model or the start states, and the imagined
  trajectory carries none to the actor even when the policy's actions are differentiable;
* continuous actions: the actor's gradient is the normalised return backpropagated through
  the imagined dynamics (it scales as 1 / S, differs from REINFORCE's, and is exactly zero
  once the dynamics stop reading the action); in both cases the actor loss sends no gradient
  to the critic or the world model, and the critic's loss none to the actor;
* the bounded normal (mean tanh(mu), std in [min_std, max_std]) and the unimix categorical
  (every action >= unimix / K) for extreme pre-activations;
* the entropy bonus: changing eta changes the actor loss by exactly -delta_eta E[w H];
* ``algos.dreamer`` refuses action spaces it cannot model (``validate_env``, which
  ``jaxwm.runner.validate`` calls before anything is built), a multi-discrete one included.

The losses and gradients are jitted once per setup (``_library``, ``_terms``) and shared by
the tests, with the entropy coefficient a traced argument, to keep the file at ~30 s on CPU.
"""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.agents import imagination
from jaxwm.algos import dreamer
from jaxwm.config import ConfigError, load
from jaxwm.envs.types import EnvSpec
from jaxwm.models import protocol, rssm
from jaxwm.ops.normalize import PercentileScale
from jaxwm.ops.returns import lambda_return

TINY = dict(deter=16, hidden=8, classes=4, units=16, depth=2, stoch=4)
FEAT = 16 + 4 * 4  # deter + stoch x classes
N, HORIZON, UNITS = 3, 4, 16
sg = jax.lax.stop_gradient


def _random_params(init, seed):
    """Random parameters of the shapes ``init(key)`` gives, drawn with numpy (no compilation,
    unlike the eager initialisers): normalisation scales 1, kernels N(0, 1 / fan_in) (fan_in:
    the product of all but the last axis), biases N(0, 0.1^2). So no head starts at zero (the
    library zero-initialises the reward head and the critic, and nearly the actor's output),
    and returns, values and the policy are not trivial."""
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = path[-1].key
        if name == "scale":
            return jnp.ones(leaf.shape, jnp.float32)
        std = 1.0 / np.sqrt(np.prod(leaf.shape[:-1])) if name == "kernel" else 0.1
        return jnp.asarray(rng.normal(0.0, std, leaf.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(fill, jax.eval_shape(init, jax.random.key(0)))


def _setup(discrete: bool, seed: int = 0, **hyper):
    """A tiny world model and actor-critic with random parameters, N start states (one of them
    terminal), and a return normaliser whose scale S ~ 3, so that dividing by it matters."""
    action_dim = 3 if discrete else 2
    # Two-hot in symlog space: with random parameters, a raw-space critic puts mass on bins
    # up to 5e8 and its values (sums of huge terms) differ by ~1e-4 relative between two
    # fusions of the same sum, which the tight tolerances here would read as a wrong gradient.
    model = rssm.make((5,), action_dim, discrete, "1m", twohot_space="symlog", **TINY)
    ac = imagination.ActorCritic(
        imagination.Actor(action_dim, discrete, UNITS, layers=1),
        imagination.critic(UNITS, layers=1),
        imagination.ActorCriticHyper(horizon=HORIZON, twohot="symlog", **hyper))
    model_params = _random_params(lambda k: model.init(k, jnp.zeros((1, 5))), seed)
    params = _random_params(lambda k: ac.init(k, FEAT), seed + 1)
    slow_critic = _random_params(lambda k: ac.init(k, FEAT), seed + 2)["critic"]
    rng = np.random.default_rng(seed + 3)
    starts = {"deter": jnp.asarray(rng.normal(size=(N, 16)), jnp.float32),
              "stoch": jnp.asarray(np.eye(4)[rng.integers(0, 4, (N, 4))], jnp.float32)}
    start_cont = jnp.array([1.0, 0.0, 1.0])  # the second start is terminal: weight 0
    retnorm = PercentileScale(jnp.asarray(-1.5), jnp.asarray(1.5))
    return types.SimpleNamespace(
        ac=ac, model=model, model_params=model_params, params=params, slow=slow_critic,
        starts=starts, start_cont=start_cont, retnorm=retnorm, key=jax.random.key(seed + 100),
        compiled={})


def _library(s, ac_type=imagination.ActorCritic):
    """``ActorCritic.loss`` of setup ``s`` (``ac_type`` its class), jitted once per setup and
    class, as ``f(eta, model_params=None, retnorm=None) -> (losses, actor-loss grads,
    critic-loss grads)``: losses {total, actor, critic, scale} (scale: the return scale S
    used), the grads w.r.t. (params, model_params, starts). The entropy coefficient eta, the
    world model's parameters and the return normaliser are arguments (eta a traced scalar),
    so that trying several compiles once."""
    cache = s.compiled
    if ac_type not in cache:
        def loss(params, model_params, starts, eta, retnorm):
            hyper = dataclasses.replace(s.ac.hyper, entropy=eta)
            ac = ac_type(s.ac.actor, s.ac.critic, hyper)
            total, (metrics, _, _) = ac.loss(params, s.slow, s.model, model_params, starts,
                                          s.start_cont, retnorm, s.key)
            return {"total": total, "actor": metrics["agent/actor_loss"],
                    "critic": metrics["agent/critic_loss"],
                    "scale": metrics["agent/return_scale"]}

        def f(params, model_params, starts, eta, retnorm):
            def parts(*a):
                losses = loss(*a, eta, retnorm)
                return jnp.stack([losses["actor"], losses["critic"]]), losses

            # One backward pass, vmapped over the two losses.
            jac, losses = jax.jacrev(parts, argnums=(0, 1, 2), has_aux=True)(
                params, model_params, starts)
            return (losses, jax.tree.map(lambda g: g[0], jac),
                    jax.tree.map(lambda g: g[1], jac))

        cache[ac_type] = jax.jit(f)
    return lambda eta, model_params=None, retnorm=None: cache[ac_type](
        s.params, s.model_params if model_params is None else model_params, s.starts,
        jnp.float32(eta), s.retnorm if retnorm is None else retnorm)


def _reference(s, actor_params):
    """The imagined rollout and the terms of eq. 11, recomputed from the world model's and
    the ops' public functions (same key, so the same rollout as ``ActorCritic.loss``):
    weights w [N, H + 1], returns R and values v [N, H] (v of the states acted in),
    the scale S, the (stopped) features of the states acted in [N, H, F] and the actions
    taken there [N, H, A]."""
    h = s.ac.hyper
    states, actions, _, _ = protocol.imagine(s.model, s.model_params, s.starts,
                                             s.ac.model_action(s.model, actor_params),
                                             h.horizon, s.key)
    feat = rssm.features(states)
    reward_logits, cont_logit = s.model.heads(s.model_params, feat)
    reward = s.model.reward_head.predict(reward_logits)[:, 1:]
    cont = jnp.concatenate([s.start_cont[:, None], jax.nn.sigmoid(cont_logit[:, 1:])], 1)
    values = h.value_head.predict(s.ac.critic.apply(s.params["critic"], feat))
    returns = jax.vmap(lambda r, v, c: lambda_return(r, v[1:], c[1:], v[-1], h.gamma,
                                                     h.lambda_))(reward, values, cont)
    weight = jnp.cumprod(h.gamma * cont, 1) / h.gamma
    scale = s.retnorm.update(returns, h.return_rate).scale(h.return_limit)
    return types.SimpleNamespace(weight=sg(weight[:, :-1]), returns=returns,
                                 values=sg(values[:, :-1]), scale=sg(scale),
                                 feat=sg(feat[:, :-1]), actions=sg(actions))


def _terms(s):
    """Two terms of eq. 11 as functions of the actor's parameters theta, with their
    values and gradients at ``s.params["actor"]`` (jitted once per setup):

    * ``reinforce``: mean(w * -log pi_theta(a_t) sg((R_t - v_t) / S)), the rollout fixed;
    * ``entropy``: mean(w * H[pi_theta]), the rollout fixed.

    ``s.compiled["ref"]`` keeps the rollout's terms (``_reference``) at ``s.params``."""
    if "terms" not in s.compiled:
        def f(theta):
            ref = _reference(s, theta)  # forward only: its terms are constants below
            advantage = sg((ref.returns - ref.values) / ref.scale)
            action = jnp.argmax(ref.actions, -1) if s.ac.actor.discrete else ref.actions

            def reinforce(theta):
                return jnp.mean(ref.weight * -s.ac.policy(theta, ref.feat).log_prob(action)
                                * advantage)

            def entropy(theta):
                return jnp.mean(ref.weight * s.ac.policy(theta, ref.feat).entropy())

            terms = {name: jax.value_and_grad(fn)(theta) for name, fn in (
                ("reinforce", reinforce), ("entropy", entropy))}
            return terms, vars(ref)

        terms, ref = jax.jit(f)(s.params["actor"])
        s.compiled["terms"], s.compiled["ref"] = terms, types.SimpleNamespace(**ref)
    return s.compiled["terms"]


def _assert_trees_close(a, b, rtol=1e-5, atol=1e-8):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def _max_abs(tree) -> float:
    return max(float(jnp.abs(x).max()) for x in jax.tree.leaves(tree))


def _assert_all_zero(tree):
    for x in jax.tree.leaves(tree):
        np.testing.assert_array_equal(x, 0.0)


@pytest.fixture(scope="module")
def discrete():
    return _setup(discrete=True)  # eta = 3e-4, the paper's


@pytest.fixture(scope="module")
def continuous():
    return _setup(discrete=False)


@pytest.fixture(scope="module")
def continuous_reinforce():
    return _setup(discrete=False, actor_grad_cont="reinforce")


@pytest.mark.parametrize("setup", ["discrete", "continuous_reinforce"])
def test_reinforce_actor_gradient_has_a_constant_normalised_advantage(setup, request):
    """Actor loss and its gradient == those of
    mean(w * -(log pi(a_t) sg((R_t - v_t) / S) + eta H[pi])), recomputed from the rollout:
    discrete actions, and continuous ones with ``actor_grad_cont="reinforce"``."""
    s = request.getfixturevalue(setup)
    eta = s.ac.hyper.entropy
    losses, (grads, _, _), _ = _library(s)(eta)
    terms = _terms(s)
    ref = s.compiled["ref"]
    assert float(ref.scale) > 2.5  # the normalisation is not the identity here
    assert float(jnp.abs(ref.returns - ref.values).max()) > 1e-2  # a nonzero advantage
    (pg, pg_grad), (bonus, bonus_grad) = terms["reinforce"], terms["entropy"]
    assert _max_abs(pg_grad) > 1e-4
    np.testing.assert_allclose(losses["actor"], pg - eta * bonus, rtol=1e-5)
    _assert_trees_close(grads["actor"], jax.tree.map(lambda a, b: a - eta * b, pg_grad,
                                                     bonus_grad))


@pytest.mark.parametrize("is_discrete", [True, False])
def test_actor_loss_sends_no_gradient_to_critic_world_model_or_starts(
        is_discrete, discrete, continuous):
    """The baseline v_t and the returns' values are the critic's, the rollout the world
    model's, but the actor loss trains the actor only: the advantage is a constant for
    discrete actions, and for continuous ones the returns see the critic's parameters
    stopped (their gradient reaches the actor through the features only)."""
    s = discrete if is_discrete else continuous
    _, (grad_params, grad_model, grad_starts), _ = _library(s)(3e-4)
    assert _max_abs(grad_params["actor"]) > 1e-4
    _assert_all_zero(grad_params["critic"])
    _assert_all_zero(grad_model)
    _assert_all_zero(grad_starts)


@pytest.mark.parametrize("is_discrete", [True, False])
def test_critic_loss_sends_no_gradient_to_the_actor(is_discrete, discrete, continuous):
    """The critic's target sg(R_t) depends on the actor (through the rollout); its gradient
    reaches neither the actor nor the world model."""
    s = discrete if is_discrete else continuous
    _, _, (grad_params, grad_model, _) = _library(s)(3e-4)
    assert _max_abs(grad_params["critic"]) > 1e-4
    _assert_all_zero(grad_params["actor"])
    _assert_all_zero(grad_model)


class _StraightThroughActions(imagination.ActorCritic):
    """Discrete actions with straight-through gradients (one-hot + p - sg(p)): the imagined
    trajectory then depends differentiably on the actor; the forward values are unchanged."""

    def model_action(self, world_model, actor_params):
        def act(feat, key):
            dist = self.policy(actor_params, feat)
            probs = jnp.exp(dist.logits)
            return protocol.agent_action(world_model, dist.sample(key)) + (probs - sg(probs))

        return act


def test_discrete_imagined_trajectory_is_stop_gradient_for_the_actor(discrete):
    """REINFORCE: the trajectory carries no gradient. With actions that do pass gradients into
    the dynamics, the actor's gradient is the same as with plain samples."""
    s = discrete
    st = _StraightThroughActions(s.ac.actor, s.ac.critic, s.ac.hyper)
    # Control: the straight-through rollout does depend differentiably on the actor.
    probe = jax.random.normal(jax.random.key(7), (N, 2, FEAT))  # one imagined step
    through = jax.jit(jax.grad(lambda a: jnp.sum(probe * rssm.features(
        protocol.imagine(s.model, s.model_params, s.starts, st.model_action(s.model, a), 1,
                         s.key).states))))(s.params["actor"])
    assert _max_abs(through) > 1e-3
    losses, (grads, _, _), _ = _library(s, _StraightThroughActions)(3e-4)
    plain_losses, (plain, _, _), _ = _library(s)(3e-4)
    np.testing.assert_allclose(losses["actor"], plain_losses["actor"], rtol=1e-6)
    _assert_trees_close(grads["actor"], plain["actor"], rtol=1e-6, atol=1e-9)


def test_continuous_actor_gradient_is_the_normalised_return_backpropagated(continuous):
    """With eta = 0 the actor loss is mean(w * -(R_t - sg(v_t)) / S), R_t depending on the
    actor through the reparameterised actions and the imagined dynamics: the loss and its
    gradient scale as 1 / S, the gradient is not the REINFORCE one of the same rollout (and
    the next test shows it all comes through the dynamics)."""
    s = continuous
    losses, (grads, _, _), _ = _library(s)(0.0)
    _, pg_grad = _terms(s)["reinforce"]
    ref = s.compiled["ref"]
    np.testing.assert_allclose(losses["scale"], ref.scale, rtol=1e-6)
    np.testing.assert_allclose(
        losses["actor"], jnp.mean(ref.weight * -(ref.returns - ref.values)) / ref.scale,
        rtol=1e-5)
    assert _max_abs(grads["actor"]) > 1e-4
    wide = PercentileScale(jnp.asarray(-4.0), jnp.asarray(4.0))  # S ~ 8 instead of ~ 3
    wide_losses, (wide_grads, _, _), _ = _library(s)(0.0, retnorm=wide)
    ratio = float(losses["scale"] / wide_losses["scale"])
    assert ratio < 0.5
    np.testing.assert_allclose(wide_losses["actor"], ratio * losses["actor"], rtol=1e-5)
    _assert_trees_close(wide_grads["actor"], jax.tree.map(lambda g: ratio * g, grads["actor"]),
                        rtol=1e-5, atol=1e-7)
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(
        jax.tree.leaves(grads["actor"]), jax.tree.leaves(pg_grad), strict=True))
    assert diff > 0.1 * _max_abs(grads["actor"])


def test_continuous_actor_gradient_vanishes_when_the_dynamics_ignore_the_action(continuous):
    """The only path from the actor to its eta = 0 loss is the action read by the sequence
    model: zero that input layer's kernel and the actor's gradient is exactly zero."""
    s = continuous
    p = s.model_params["params"]
    layer = p["core_in_2"]  # the sequence model's action input, core_in = (h, z, a)
    assert layer["hidden_0"]["kernel"].shape[0] == s.model.net.action_dim
    deaf = {"params": {**p, "core_in_2": {**layer, "hidden_0": {
        **layer["hidden_0"], "kernel": jnp.zeros_like(layer["hidden_0"]["kernel"])}}}}
    _, (grads, _, _), _ = _library(s)(0.0, model_params=deaf)
    _assert_all_zero(grads["actor"])


def _at_extremes(actor, seed):
    """``actor``'s distribution on 64 random feature vectors, its output layer scaled by 1e4 so
    that the pre-activations reach the extremes."""
    keys = jax.random.split(jax.random.key(seed), 3)
    feat = jax.random.normal(keys[0], (64, FEAT))
    params = actor.init(keys[1], feat)
    out = params["params"]["out"]
    params["params"]["out"] = {**out, "kernel": 1e4 * jax.random.normal(keys[2],
                                                                        out["kernel"].shape)}
    return actor.apply(params, feat)


@pytest.mark.parametrize("min_std, max_std", [(0.1, 1.0), (0.2, 0.5)])
def test_bounded_normal_keeps_std_in_range_and_mean_in_tanh_range(min_std, max_std):
    pre = jnp.array([-1e4, -50.0, -5.0, -1.0, 0.0, 1.0, 5.0, 50.0, 1e4])
    dist = imagination.bounded_normal(pre, pre, min_std, max_std)
    std = np.exp(np.asarray(dist.log_std))
    np.testing.assert_allclose(std, (max_std - min_std) * jax.nn.sigmoid(pre + 2.0) + min_std,
                               rtol=1e-6)
    assert (std >= min_std * (1 - 1e-6)).all() and (std <= max_std * (1 + 1e-6)).all()
    np.testing.assert_allclose(std[[0, -1]], [min_std, max_std], rtol=1e-5)
    np.testing.assert_allclose(std[4], (max_std - min_std) * 0.8807971 + min_std, rtol=1e-6)
    mean = np.asarray(dist.mean)
    np.testing.assert_allclose(mean, np.tanh(np.asarray(pre)), rtol=1e-6)
    assert (np.abs(mean[2:-2]) < 1).all() and (np.abs(mean) <= 1).all()

    # Through the actor, with outputs pushed to the extremes by a huge output layer.
    dist = _at_extremes(imagination.Actor(2, False, UNITS, layers=1, min_std=min_std,
                                          max_std=max_std), seed=1)
    std = np.exp(np.asarray(dist.log_std))
    assert std.shape == (64, 2)
    assert (std >= min_std * (1 - 1e-6)).all() and (std <= max_std * (1 + 1e-6)).all()
    np.testing.assert_allclose([std.min(), std.max()], [min_std, max_std], rtol=1e-4)
    assert (np.abs(np.asarray(dist.mean)) <= 1).all()
    assert np.isfinite(np.asarray(dist.log_prob(jnp.zeros((64, 2))))).all()


@pytest.mark.parametrize("unimix, k", [(0.01, 5), (0.1, 3)])
def test_unimix_policy_keeps_every_action_above_unimix_over_k(unimix, k):
    dist = _at_extremes(imagination.Actor(k, True, UNITS, layers=1, unimix=unimix), seed=4)
    probs = np.exp(np.asarray(dist.logits, np.float64))
    assert probs.shape == (64, k)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert probs.min() >= unimix / k * (1 - 1e-5)
    # The logits are extreme: the floor is reached, and no action holds more than 1 - u + u / K,
    # which rows whose top two logits are far apart reach (not every row: two logits may tie).
    np.testing.assert_allclose(probs.min(), unimix / k, rtol=1e-4)
    assert probs.max() <= (1 - unimix + unimix / k) * (1 + 1e-5)
    saturated = np.isclose(probs.max(-1), 1 - unimix + unimix / k, rtol=1e-5)
    assert saturated.mean() > 0.5, saturated.mean()
    log_probs = jnp.stack([dist.log_prob(jnp.full((64,), a)) for a in range(k)], -1)
    assert np.isfinite(np.asarray(log_probs)).all()
    assert float(log_probs.min()) >= np.log(unimix / k) - 1e-4


def test_entropy_coefficient_defaults_to_the_paper_and_is_read_from_the_config():
    assert imagination.ActorCriticHyper().entropy == 3e-4
    hyper = imagination.ActorCriticHyper.from_config({"entropy": 1e-2, "horizon": 5,
                                                      "not_a_field": 1})
    assert (hyper.entropy, hyper.horizon) == (1e-2, 5)


@pytest.mark.parametrize("is_discrete", [True, False])
def test_entropy_bonus_changes_the_actor_loss_by_exactly_eta_times_the_weighted_entropy(
        is_discrete, discrete, continuous):
    """loss(eta) - loss(0) == -eta mean(w H[pi]), for the loss and its actor gradient; the
    critic's loss does not change."""
    s = discrete if is_discrete else continuous
    eta = 0.5
    losses0, (grads0, _, _), _ = _library(s)(0.0)
    losses, (grads, _, _), _ = _library(s)(eta)
    bonus, bonus_grad = _terms(s)["entropy"]
    assert abs(float(bonus)) > 1e-2 and _max_abs(bonus_grad) > 1e-4
    for part in ("actor", "total"):
        np.testing.assert_allclose(float(losses[part]) - float(losses0[part]),
                                   -eta * float(bonus), rtol=1e-4)
    np.testing.assert_allclose(losses["critic"], losses0["critic"], rtol=1e-6)
    _assert_trees_close(jax.tree.map(lambda a, b: a - b, grads["actor"], grads0["actor"]),
                        jax.tree.map(lambda g: -eta * g, bonus_grad), rtol=1e-4, atol=1e-7)


def _spec(discrete, action_shape, num_actions=None, obs_shape=(4,)):
    low = None if discrete else -np.ones(action_shape, np.float32)
    return EnvSpec(env_id="Fake-v0", family="classic", num_envs=2, obs_shape=obs_shape,
                   obs_dtype=np.float32, discrete=discrete, num_actions=num_actions,
                   action_shape=action_shape, action_low=low,
                   action_high=None if low is None else -low, max_episode_steps=100)


@pytest.mark.parametrize("spec, message", [
    (_spec(False, (2, 3)), r"box action of shape \(2, 3\)"),
    (_spec(False, ()), r"box action of shape \(\)"),
    (_spec(True, (3,), num_actions=4), r"discrete action of shape \(3,\)"),  # multi-discrete
])
def test_dreamer_refuses_an_action_space_it_cannot_model(spec, message):
    with pytest.raises(ConfigError, match=message):
        dreamer.validate_env(load("dreamer:tiny"), spec)


def test_dreamer_accepts_discrete_actions_and_flat_boxes():
    dreamer.validate_env(load("dreamer:tiny"), _spec(True, (), num_actions=4))
    dreamer.validate_env(load("dreamer:tiny"), _spec(False, (6,)))


def test_replay_returns_stop_at_episode_ends_hand_numbers():
    """``replay_returns`` on one replayed sequence of T = 6 (gamma 0.5, lambda 0.5): states 0-2
    of one episode, state 2 terminal, state 3 a reset, state 4 the last of a truncated
    episode (5 is a reset). Returns bootstrap from each state's imagined return ``boot``,
    never cross into the next episode, and the terminal cuts the bootstrap."""
    reward = jnp.array([0.0, 1.0, 2.0, 0.0, 3.0, 0.0])
    is_terminal = jnp.array([False, False, True, False, False, False])
    is_first = jnp.array([True, False, False, True, False, True])
    boot = jnp.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    got = imagination.replay_returns(reward, is_terminal, is_first, boot, 0.5, 0.5)
    r4 = 0.0 + 0.5 * 60.0  # state 4 -> reset 5: weight 0 in the loss
    r3 = 3.0 + 0.5 * 50.0  # state 4 is its episode's last: lambda 0, its own imagined return
    r2 = 0.0 + 0.5 * (0.5 * 40.0 + 0.5 * r3)  # state 2 -> reset 3: weight 0 in the loss
    r1 = 2.0  # reaches the terminal state 2: no bootstrap
    r0 = 1.0 + 0.5 * (0.5 * 20.0 + 0.5 * r1)
    np.testing.assert_allclose(got, [r0, r1, r2, r3, r4], rtol=1e-6)


def test_replay_value_loss_trains_the_critic_and_the_features_only_where_states_continue():
    """The replay value loss reaches the critic and the posterior features (official
    repval_grad), not the slow critic, and a state whose next one is a reset adds nothing."""
    critic = imagination.critic(UNITS, num_bins=15)
    ac = imagination.ActorCritic(imagination.Actor(2, True, UNITS), critic,
                                 imagination.ActorCriticHyper(num_bins=15))
    feat = jax.random.normal(jax.random.key(0), (2, 5, FEAT))
    params = _random_params(lambda k: critic.init(k, feat), 1)
    slow = _random_params(lambda k: critic.init(k, feat), 2)
    batch = {"reward": jnp.ones((2, 5)), "is_terminal": jnp.zeros((2, 5), bool),
             "is_first": jnp.zeros((2, 5), bool).at[1, 3].set(True)}
    boot = jnp.full((2, 5), 5.0)

    def loss(params, slow, feat):
        return ac.replay_value_loss(params, slow, feat, batch, boot)[0]

    g_params, g_slow, g_feat = jax.grad(loss, argnums=(0, 1, 2))(params, slow, feat)
    assert sum_of_squares(g_params) > 0 and sum_of_squares(g_slow) == 0
    g_feat = np.abs(np.asarray(g_feat)).sum(-1)
    assert g_feat[1, 2] == 0  # state 2 of sequence 1 ends its episode: weight 0
    assert np.all(g_feat[:, 4] == 0)  # the last state has no return in the sequence
    assert np.all(g_feat[0, :4] > 0)


def sum_of_squares(tree):
    return float(sum(jnp.sum(x ** 2) for x in jax.tree.leaves(tree)))
