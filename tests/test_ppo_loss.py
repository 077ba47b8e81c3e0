"""PPO loss pieces against hand-computed numbers, with a stub network whose outputs we set."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxwm import backend
from jaxwm.agents import ppo
from jaxwm.nets.actor_critic import ActorCritic
from jaxwm.nets.distributions import Categorical, DiagGaussian


class StubNetwork:
    """``apply`` returns params' logits and values directly: [M, L, A] and [M, L]."""

    @staticmethod
    def apply(params, carry, obs, is_first):
        del obs, is_first
        return carry, Categorical(params["logits"]), params["value"]


def hyper(**kw):
    base = dict(num_steps=2, gamma=0.99, gae_lambda=0.95, num_minibatches=1, update_epochs=1,
                clip_coef=0.2, clip_vloss=False, ent_coef=0.0, vf_coef=0.5, norm_adv=False,
                normalize_obs=False, normalize_reward=False, recurrent=False)
    base.update(kw)
    return ppo.PPOHyper(**base)


def batch_for(old_log_prob, advantages, returns, value, valid):
    m = len(advantages)
    return dict(obs=jnp.zeros((m, 1, 1)), is_first=jnp.zeros((m, 1), bool),
                initial_carry=(), action=jnp.zeros((m, 1), jnp.int32),
                log_prob=jnp.asarray(old_log_prob)[:, None],
                advantages=jnp.asarray(advantages)[:, None], returns=jnp.asarray(returns)[:, None],
                value=jnp.asarray(value)[:, None], valid=jnp.asarray(valid)[:, None])


def params_with_prob(p_action0, value):
    """Two actions; action 0 has probability p_action0 (per sample)."""
    p = jnp.asarray(p_action0)
    logits = jnp.stack([jnp.log(p), jnp.log(1 - p)], -1)[:, None]
    return {"logits": logits, "value": jnp.asarray(value)[:, None]}


def test_clipped_surrogate_hand_numbers():
    # Old prob of action 0 is 0.5 everywhere. New probs give ratios 1.5, 0.5, 1.1.
    new_p = [0.75, 0.25, 0.55]
    old_lp = np.log([0.5, 0.5, 0.5])
    adv = [1.0, -2.0, 3.0]
    params = params_with_prob(new_p, [0.0, 0.0, 0.0])
    batch = batch_for(old_lp, adv, [1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [True, True, True])
    loss, m = ppo.loss_fn(params, StubNetwork, hyper(), batch)
    # per-sample max(-A r, -A clip(r)): 1.5->clip 1.2: max(-1.5,-1.2)=-1.2;
    # r=0.5, A=-2: max(1.0, 1.6)=1.6; r=1.1 (unclipped), A=3: -3.3.  mean = -2.9/3
    np.testing.assert_allclose(m["losses/policy_loss"], (-1.2 + 1.6 - 3.3) / 3, rtol=1e-5)
    np.testing.assert_allclose(m["losses/value_loss"], 0.5 * (1 + 4 + 9) / 3, rtol=1e-5)
    np.testing.assert_allclose(m["losses/clipfrac"], 2 / 3, rtol=1e-5)
    np.testing.assert_allclose(loss, m["losses/policy_loss"] + 0.5 * m["losses/value_loss"],
                               rtol=1e-5)


def test_value_clipping_hand_numbers():
    params = params_with_prob([0.5], [2.0])
    batch = batch_for(np.log([0.5]), [0.0], [0.0], [1.0], [True])
    _, m = ppo.loss_fn(params, StubNetwork, hyper(clip_vloss=True), batch)
    # unclipped (2-0)^2 = 4, clipped value 1.2 -> 1.44; max = 4 -> 0.5 * 4
    np.testing.assert_allclose(m["losses/value_loss"], 2.0, rtol=1e-6)
    params = params_with_prob([0.5], [0.5])
    batch = batch_for(np.log([0.5]), [0.0], [2.0], [1.0], [True])
    _, m = ppo.loss_fn(params, StubNetwork, hyper(clip_vloss=True), batch)
    # unclipped (0.5-2)^2 = 2.25, clipped value 0.8 -> 1.44; max = 2.25
    np.testing.assert_allclose(m["losses/value_loss"], 0.5 * 2.25, rtol=1e-6)


def test_invalid_reset_transitions_do_not_count():
    params = params_with_prob([0.75, 0.9], [0.0, 5.0])
    valid = [True, False]
    base = batch_for(np.log([0.5, 0.5]), [1.0, 1.0], [1.0, 1.0], [0.0, 0.0], valid)
    changed = batch_for(np.log([0.5, 0.1]), [1.0, -50.0], [1.0, 99.0], [0.0, 3.0], valid)
    for norm_adv in (False, True):
        h = hyper(norm_adv=norm_adv, ent_coef=0.01)
        g1 = jax.grad(lambda p, h=h: ppo.loss_fn(p, StubNetwork, h, base)[0])(params)
        g2 = jax.grad(lambda p, h=h: ppo.loss_fn(p, StubNetwork, h, changed)[0])(params)
        jax.tree.map(np.testing.assert_allclose, g1, g2)
        assert float(jnp.abs(g1["logits"][1]).sum()) == 0.0


def test_entropy_and_log_prob_of_distributions():
    cat = Categorical(jnp.log(jnp.array([0.25, 0.75])))
    np.testing.assert_allclose(cat.entropy(), -(0.25 * np.log(0.25) + 0.75 * np.log(0.75)),
                               rtol=1e-6)
    np.testing.assert_allclose(cat.log_prob(jnp.array(1)), np.log(0.75), rtol=1e-6)
    g = DiagGaussian(jnp.array([0.0, 1.0]), jnp.log(jnp.array([1.0, 2.0])))
    x = jnp.array([1.0, 1.0])
    expected = (-0.5 - 0.5 * np.log(2 * np.pi)) + (-np.log(2.0) - 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(g.log_prob(x), expected, rtol=1e-6)
    np.testing.assert_allclose(g.entropy(), 2 * (0.5 + 0.5 * np.log(2 * np.pi)) + np.log(2.0),
                               rtol=1e-6)


def fake_rollout(key, n=4, t=8, obs_dim=3, discrete=True):
    ks = jax.random.split(key, 6)
    action = (jax.random.randint(ks[1], (n, t), 0, 2) if discrete
              else jax.random.normal(ks[1], (n, t, 2)))
    return ppo.Rollout(
        obs=jax.random.normal(ks[0], (n, t, obs_dim)), action=action,
        log_prob=jnp.full((n, t), -0.7), value=jnp.zeros((n, t)),
        reward=jax.random.normal(ks[2], (n, t)), terminated=jax.random.uniform(ks[3], (n, t)) < 0.1,
        truncated=jnp.zeros((n, t), bool), valid=jax.random.uniform(ks[4], (n, t)) > 0.1,
        is_first=jnp.zeros((n, t), bool), next_value=jnp.zeros((n, t)), initial_carry=((), ()))


@pytest.mark.parametrize("loop_form", ["scan", "unroll"])
@pytest.mark.parametrize("discrete", [True, False])
def test_update_lowers_loss_and_loop_forms_agree(loop_form, discrete):
    net = ActorCritic(discrete=discrete, action_dim=2)
    h = hyper(num_minibatches=2, update_epochs=4, norm_adv=True, clip_vloss=True, num_steps=8)
    cfg = dict(learning_rate=1e-2, anneal_lr=False, max_grad_norm=0.5, update_epochs=4,
               num_minibatches=2)
    optimizer = ppo.make_optimizer(type("C", (), cfg), anneal_updates=8)
    rollout = fake_rollout(jax.random.PRNGKey(0), discrete=discrete)
    params = net.init(jax.random.PRNGKey(1), net.initialize_carry(4), rollout.obs[:, :1],
                      rollout.is_first[:, :1])
    fresh = lambda: ppo.Learner(jax.tree.map(jnp.copy, params), optimizer.init(params), None, None)
    learner = fresh()  # the update donates its input
    batch = ppo.prepare_batch(h, rollout)
    loss_before = ppo.loss_fn(params, net, h, batch)[0]
    update = jax.jit(ppo.make_update(net, h, optimizer, loop_form), donate_argnums=0)
    # The loop forms are compared at exact float32 matmul precision, on every backend. At a GPU's
    # default (TF32, see jaxwm.backend) an intermediate that the forms compute one float32 ulp
    # apart can round to TF32 values ~5e-4 apart; where such a difference is comparable to
    # Adam's eps (1e-5) in a gradient component, that component's step changes by up to ~lr,
    # so parameters could differ by ~1e-2: a TF32 tolerance would say nothing about the loop
    # forms. At float32 what differs is summation order and fusion:
    # float32_tolerance() (1e-5, ~150 roundings of 2**-24) relative, and absolute that fraction
    # of the most Adam can move a parameter (~lr per step, 8 steps). Measured on CPU: 6e-8 at
    # most, against atol 8e-7 (before: rtol 1e-4, atol 1e-6).
    with jax.default_matmul_precision("float32"):
        new, metrics = update(learner, rollout, jax.random.PRNGKey(2))
        reference, _ = jax.jit(ppo.make_update(net, h, optimizer, "scan"))(
            fresh(), rollout, jax.random.PRNGKey(2))
        tol = backend.float32_tolerance()
    loss_after = ppo.loss_fn(new.params, net, h, batch)[0]
    assert float(loss_after) < float(loss_before)
    assert set(metrics) >= {"losses/policy_loss", "losses/value_loss", "losses/approx_kl"}
    reach = h.update_epochs * h.num_minibatches * cfg["learning_rate"]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=tol, atol=tol * reach),
                 new.params, reference.params)


def test_optimizer_anneals_learning_rate_to_zero():
    cfg = type("C", (), dict(learning_rate=1.0, anneal_lr=True, max_grad_norm=1e9,
                             update_epochs=1, num_minibatches=1))
    opt = ppo.make_optimizer(cfg, anneal_updates=2)
    params = jnp.zeros(())
    state = opt.init(params)
    for _ in range(2):
        updates, state = opt.update(jnp.ones(()), state, params)
    updates, state = opt.update(jnp.ones(()), state, params)
    assert float(updates) == 0.0  # the schedule reached zero after 2 updates
    assert isinstance(opt, optax.GradientTransformation)
