"""DreamerV3's world model and actor-critic: the invariants of Hafner et al. 2023 (zero-init heads,
unimix floor, free bits, the dyn/rep stop-gradient split, block-GRU gate, slow-critic EMA,
imagine under scan equals a Python loop, resets in observe)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import backend
from jaxwm.agents import imagination
from jaxwm.models import protocol, rssm
from jaxwm.nets.backbones.recurrent import BlockGRU, BlockLinear
from jaxwm.ops import twohot

TINY = dict(deter=16, hidden=8, classes=4, units=16, depth=2)


def tiny_model(obs_shape=(5,), action_dim=3, discrete=True, **kw):
    return rssm.make(obs_shape, action_dim, discrete, "1m", **{**TINY, **kw})


@pytest.fixture(scope="module")
def model_and_params():
    model = tiny_model()
    return model, model.init(jax.random.key(0), jnp.zeros((2, 5)))


def test_block_gru_with_zero_weights_keeps_sigmoid_minus_one_of_the_state():
    """Zero weights: reset 0.5, candidate tanh(0) = 0, update sigmoid(0 - 1): h' = (1 - s(-1)) h."""
    gru = BlockGRU(16, blocks=4)
    state, x = jnp.linspace(-1, 1, 32).reshape(2, 16), jnp.ones((2, 3))
    params = jax.tree.map(jnp.zeros_like, gru.init(jax.random.key(0), state, x))
    out = gru.apply(params, state, x)
    np.testing.assert_allclose(out, (1 - jax.nn.sigmoid(-1.0)) * state, rtol=1e-6)


def test_block_linear_is_block_diagonal():
    """Output group g depends on input group g only."""
    dense = BlockLinear(8, blocks=4)
    x = jnp.ones((1, 12))
    params = dense.init(jax.random.key(1), x)
    jac = jax.jacobian(lambda v: dense.apply(params, v))(x)[0, :, 0]  # [8 out, 12 in]
    for out_group in range(4):
        for in_group in range(4):
            block = jac[2 * out_group:2 * out_group + 2, 3 * in_group:3 * in_group + 3]
            assert (np.abs(block).sum() > 0) == (out_group == in_group)


def test_block_linear_is_each_groups_own_product():
    dense = BlockLinear(6, blocks=3)
    x = jax.random.normal(jax.random.key(4), (2, 5, 12))  # leading axes pass through
    params = dense.init(jax.random.key(5), x)
    kernel, bias = params["params"]["kernel"], params["params"]["bias"]
    want = jnp.concatenate([x[..., 4 * g:4 * g + 4] @ kernel[g] for g in range(3)], -1) + bias
    np.testing.assert_allclose(dense.apply(params, x), want, rtol=1e-5, atol=1e-6)


def test_block_gru_products_keep_the_batch_rows_major():
    """In a scan on XLA:CPU the block products' results must not put the batch last
    ([G, O, batch]): the GRU's elementwise ops then read them across the grain, which made
    DreamerV3's size1m update ~1.2x slower (benchmarks/README.md, DreamerV3)."""
    batch = 96
    gru = BlockGRU(64, blocks=8)
    state, xs = jnp.zeros((batch, 64)), jnp.ones((5, batch, 16))
    params = gru.init(jax.random.key(6), state, xs[0])

    def run(params, state, xs):
        return jax.lax.scan(lambda h, x: (gru.apply(params, h, x), None), state, xs)[0]

    hlo = backend.jit(run).lower(params, state, xs).compile().as_text()
    dots = re.findall(r"= f32\[([\d,]+)\][^ ]* dot\(", hlo)
    assert dots, "no dot in the compiled scan"
    assert not [d for d in dots if d.endswith(f",{batch}")], dots


def test_zero_initialised_heads_predict_zero(model_and_params):
    model, params = model_and_params
    feat = jax.random.normal(jax.random.key(2), (7, 16 + 32 * 4))
    reward_logits, _ = model.heads(params, feat)
    critic = imagination.critic(units=16)
    critic_logits = critic.apply(critic.init(jax.random.key(3), feat), feat)
    for space in twohot.SPACES:  # symexp: exactly 0 from the mirrored bins
        head = twohot.Regression(space, model.net.num_bins)
        np.testing.assert_allclose(head.predict(reward_logits), 0.0, atol=1e-5)
        np.testing.assert_allclose(head.predict(critic_logits), 0.0, atol=1e-5)


def test_every_latent_class_keeps_probability_of_at_least_unimix_over_k(model_and_params):
    model, params = model_and_params
    deter = 100.0 * jax.random.normal(jax.random.key(4), (9, 16))  # extreme inputs
    prior = model.net.apply(params, deter, method=rssm.WorldModelNet.prior)
    probs = jnp.exp(prior)
    assert probs.shape == (9, 32, 4)
    assert float(probs.min()) >= 0.01 / 4 - 1e-7
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


def test_free_bits_give_zero_gradient_below_the_threshold():
    model = tiny_model()
    near = jnp.zeros((1, 32, 4))
    far = near.at[..., 0].set(3.0)  # KL[far || near] over 32 latents >> 1 nat

    def total(post, prior):
        dyn, rep = model.kl_terms(post, prior)
        return jnp.sum(dyn + rep)

    small = jax.grad(total, argnums=(0, 1))(near + 0.01, near)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in small)
    large = jax.grad(total, argnums=(0, 1))(far, near)
    assert all(float(jnp.abs(g).max()) > 0.0 for g in large)


def test_dyn_trains_only_the_prior_and_rep_only_the_posterior():
    model = tiny_model()
    post = jax.random.normal(jax.random.key(5), (2, 32, 4)) * 3
    prior = jax.random.normal(jax.random.key(6), (2, 32, 4)) * 3
    dyn_grads = jax.grad(lambda q, p: jnp.sum(model.kl_terms(q, p)[0]), (0, 1))(post, prior)
    rep_grads = jax.grad(lambda q, p: jnp.sum(model.kl_terms(q, p)[1]), (0, 1))(post, prior)
    assert float(jnp.abs(dyn_grads[0]).max()) == 0.0 and float(jnp.abs(dyn_grads[1]).max()) > 0
    assert float(jnp.abs(rep_grads[1]).max()) == 0.0 and float(jnp.abs(rep_grads[0]).max()) > 0


def test_imagine_under_scan_equals_a_python_loop():
    """``protocol.imagine`` of the RSSM: its prior steps, rewards and continue probabilities
    are those of ``img_step`` and the heads, one step at a time. (Symlog bins: a zero reward
    head's expectation over symexp bins, ~5e8 wide, is 0 only up to the summation order.)"""
    model = tiny_model(twohot_space="symlog")
    params = model.init(jax.random.key(0), jnp.zeros((2, 5)))
    params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(1), x.shape),
                          params)
    start = {"deter": jax.random.normal(jax.random.key(7), (3, 16)),
             "stoch": jax.nn.one_hot(jax.random.randint(jax.random.key(8), (3, 32), 0, 4), 4)}
    weights = jax.random.normal(jax.random.key(9), (16 + 128, 3))

    def policy(feat, key):
        return jax.nn.one_hot(jax.random.categorical(key, feat @ weights), 3)

    key, horizon = jax.random.key(10), 4
    states, actions, rewards, conts = protocol.imagine(model, params, start, policy, horizon,
                                                       key)
    assert states["deter"].shape == (3, horizon + 1, 16) and actions.shape == (3, horizon, 3)
    state = start
    for t, k in enumerate(jax.random.split(key, horizon)):
        np.testing.assert_allclose(states["deter"][:, t], state["deter"], rtol=1e-5, atol=1e-6)
        k_act, k_img = jax.random.split(k)
        action = policy(rssm.features(state), k_act)
        np.testing.assert_array_equal(actions[:, t], action)
        state = model.img_step(params, state, action, k_img)
        reward_logits, cont_logit = model.heads(params, rssm.features(state))
        np.testing.assert_allclose(rewards[:, t], model.reward_head.predict(reward_logits),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(conts[:, t], jax.nn.sigmoid(cont_logit), rtol=1e-5)
    np.testing.assert_allclose(states["deter"][:, -1], state["deter"], rtol=1e-5, atol=1e-6)


def test_observe_resets_where_an_episode_starts(model_and_params):
    """A step marked is_first gives the same state as starting from the initial one."""
    model, params = model_and_params
    embed = model.net.apply(params, jax.random.normal(jax.random.key(11), (2, 5, 5)),
                            method=rssm.WorldModelNet.encode)
    actions = jax.nn.one_hot(jnp.array([[0, 1, 2, 1, 0], [2, 2, 1, 0, 1]]), 3)
    is_first = jnp.array([[True, False, False, True, False]] * 2)
    key = jax.random.key(12)
    _, states, post, _ = model.observe_sequence(params, model.initial(params, 2), embed, actions,
                                                is_first, key)
    keys = jax.random.split(key, 5)
    fresh, (post_fresh, _) = model.obs_step(params, model.initial(params, 2), actions[:, 3] * 0,
                                            embed[:, 3], jnp.zeros(2, bool), keys[3])
    np.testing.assert_allclose(post[:, 3], post_fresh, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(states["deter"][:, 3], fresh["deter"], rtol=1e-5, atol=1e-6)


def test_slow_critic_is_an_ema_of_the_critic():
    ac = imagination.ActorCritic(None, None, imagination.ActorCriticHyper(slow_rate=0.02))
    slow = ac.slow_update({"w": jnp.array([1.0, 0.0])}, {"w": jnp.array([3.0, 10.0])})
    np.testing.assert_allclose(slow["w"], [0.98 * 1 + 0.02 * 3, 0.02 * 10], rtol=1e-6)


def test_world_model_loss_falls_on_a_fixed_batch():
    """A few optimiser steps on one batch lower the world-model loss (images included)."""
    import optax

    model = tiny_model(obs_shape=(3, 64, 64), action_dim=2)
    obs = jax.random.randint(jax.random.key(13), (2, 6, 3, 64, 64), 0, 255).astype(jnp.uint8)
    batch = {"obs": obs, "action": jnp.zeros((2, 6), jnp.int32),
             "reward": jnp.ones((2, 6)), "is_first": jnp.zeros((2, 6), bool).at[:, 0].set(True),
             "is_terminal": jnp.zeros((2, 6), bool)}
    params = model.init(jax.random.key(14), obs[:, 0])
    opt = optax.adam(1e-3)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state):
        (loss, _), grads = jax.value_and_grad(model.loss, has_aux=True)(
            params, batch, jax.random.key(15))
        updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(15):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < 0.9 * losses[0], losses


def test_open_loop_predictions_make_a_side_by_side_video():
    model = tiny_model(obs_shape=(3, 64, 64), action_dim=2)
    obs = jax.random.randint(jax.random.key(16), (2, 6, 3, 64, 64), 0, 255).astype(jnp.uint8)
    batch = {"obs": obs, "action": jnp.zeros((2, 6), jnp.int32),
             "is_first": jnp.zeros((2, 6), bool).at[:, 0].set(True)}
    params = model.init(jax.random.key(17), obs[:, 0])
    target, recon = rssm.open_loop(model, params, batch, 2, jax.random.key(18))
    assert target.shape == recon.shape == (2, 6, 3, 64, 64)
    np.testing.assert_allclose(target, obs / 255.0 - 0.5, atol=1e-6)
    frames = rssm.video_frames(target[0], recon[0])
    assert frames.shape == (6, 64, 3 * 64, 3) and frames.dtype == jnp.uint8
    np.testing.assert_array_equal(frames[:, :, :64], np.moveaxis(np.asarray(obs[0]), 1, -1))


def test_bfloat16_compute_keeps_float32_parameters_state_and_loss():
    """compute_dtype bfloat16: the same parameters give a loss close to float32's, and the
    parameters, the recurrent state and the loss stay float32."""
    batch = {"obs": jax.random.normal(jax.random.key(20), (2, 6, 5)),
             "action": jnp.zeros((2, 6), jnp.int32), "reward": jnp.ones((2, 6)),
             "is_first": jnp.zeros((2, 6), bool).at[:, 0].set(True),
             "is_terminal": jnp.zeros((2, 6), bool)}
    full, half = tiny_model(), tiny_model(dtype=jnp.bfloat16)
    params = full.init(jax.random.key(21), batch["obs"][:, 0])
    assert jax.tree.structure(params) == jax.tree.structure(
        half.init(jax.random.key(21), batch["obs"][:, 0]))
    loss_full, _ = full.loss(params, batch, jax.random.key(22))
    loss_half, (_, states) = half.loss(params, batch, jax.random.key(22))
    assert loss_half.dtype == jnp.float32 and states["deter"].dtype == jnp.float32
    np.testing.assert_allclose(loss_half, loss_full, rtol=0.05)
