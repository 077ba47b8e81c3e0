"""The world-model protocol (``models.protocol``): every world model of jaxwm implements it
(the RSSM, SimPLe's next-frame model, TD-MPC2's latent model, World Models' VAE + MDN-RNN and
the dynamics ensemble), and the functions over it (``imagine``, ``rollout_sequences``,
``as_env``, ``planned_return``, ``through_model``) do what they say on any of them."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxwm.agents import cma_es
from jaxwm.envs import acting
from jaxwm.models import dynamics, ensemble, mdnrnn, nextframe, protocol, rssm, termination, vae
from jaxwm.models import tdmpc2 as tdmpc2_model
from jaxwm.models.dynamics import Normalizer
from jaxwm.models.vision_memory import VisionMemory

N = 3


def rssm_case():
    # Symlog bins: a zero reward head's expectation over symexp bins (~5e8 wide) is 0 only up
    # to the summation order, which differs between a scan and a call.
    model = rssm.make((4,), 2, False, "1m", twohot_space="symlog", deter=16, hidden=8,
                      classes=4, units=16, depth=2, stoch=4)
    params = model.init(jax.random.key(0), jnp.zeros((1, 4)))
    return model, params, jnp.ones((N, 4))


def frames_case():
    net = nextframe.NextFramePredictor(nextframe.SIZES["tiny"], stochastic=False)
    stack = jnp.zeros((1, 16, 16, 12))
    params = net.init({"params": jax.random.key(0), "dropout": jax.random.key(1),
                       "latent": jax.random.key(2)}, stack, jnp.zeros((1, 3)),
                      jnp.zeros((1, 16, 16, 3)), 1.0, True)
    model = nextframe.FrameModel(nextframe.make_apply(net, 3), 3, (12, 16, 16))
    obs = jax.random.randint(jax.random.key(3), (N, 12, 16, 16), 0, 256).astype(jnp.uint8)
    return model, params, obs


def latent_case():
    net = tdmpc2_model.WorldModel(2, tdmpc2_model.SIZES[1], episodic=True)
    params = tdmpc2_model.init(net, jax.random.key(0), 5)
    return tdmpc2_model.LatentModel(net), params, jnp.ones((N, 5))


def vision_memory_case():
    memory = mdnrnn.MDNRNN(mdnrnn.MDNHyper(z_dim=4, hidden=8, predict_reward=True,
                                           predict_done=True))
    vision = vae.ConvVAE(4)
    params = {"vae": vae.init(vision, jax.random.key(0)),
              "rnn": mdnrnn.init(memory, jax.random.key(1), 3)}
    model = VisionMemory(vision, memory, 3, cma_es.carracing_action)
    frames = jax.random.randint(jax.random.key(2), (N, 96, 96, 3), 0, 256).astype(jnp.uint8)
    return model, params, frames


def ensemble_case():
    spec = ensemble.EnsembleSpec(3, 1, num_members=3, num_elites=2, hidden=(8, 8),
                                 weight_decay=(0.0, 0.0, 0.0))
    state = ensemble.init(spec, jax.random.key(0), Normalizer.identity(4))
    model = ensemble.EnsembleModel(spec, termination.termination_fn("Pendulum-v1"),
                                   lambda a: 2.0 * a)
    return model, state, jnp.ones((N, 3))


def dynamics_case():
    net = dynamics.DynamicsMLP(4, (8,))
    state = dynamics.init(net, optax.adam(1e-3), jax.random.key(0), 3, 1)
    return dynamics.DynamicsModel(net, 1, lambda a: 2.0 * a), state, jnp.ones((N, 3))


CASES = {"rssm": rssm_case, "nextframe": frames_case, "tdmpc2": latent_case,
         "vae_mdnrnn": vision_memory_case, "ensemble": ensemble_case, "dynamics": dynamics_case}


def action(model, key):
    if model.discrete:
        return jax.nn.one_hot(jax.random.randint(key, (N,), 0, model.action_dim),
                              model.action_dim)
    return jax.random.uniform(key, (N, model.action_dim), minval=-1.0, maxval=1.0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_world_model_keeps_the_protocol(name):
    model, params, obs = CASES[name]()
    assert isinstance(model, protocol.WorldModel)
    state = model.initial(params, N)
    state = model.observe(params, state, action(model, jax.random.key(1)), obs,
                          jnp.ones(N, bool), jax.random.key(2))
    feat = model.features(params, state)
    assert feat.shape[0] == N
    nxt, reward, cont = jax.jit(model.step)(params, state, action(model, jax.random.key(3)),
                                            jax.random.key(4))
    assert jax.tree.structure(nxt) == jax.tree.structure(state)
    assert reward.shape == (N,) and cont.shape == (N,)
    assert bool(jnp.all((cont >= 0) & (cont <= 1))) and bool(jnp.all(jnp.isfinite(reward)))
    if model.decodes:
        frames = model.decode(params, nxt)
        assert frames.shape[0] == N and frames.shape[-1] == 3
        assert float(frames.min()) >= 0.0 and float(frames.max()) <= 1.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_imagine_and_fixed_sequences_agree_with_stepping_by_hand(name):
    """``imagine`` under a policy that ignores its input, and ``rollout_sequences`` of the
    actions it took, give the rewards and continuations of ``step`` called one at a time
    (with the keys each draws)."""
    model, params, obs = CASES[name]()
    start = model.observe(params, model.initial(params, N), action(model, jax.random.key(1)),
                          obs, jnp.ones(N, bool), jax.random.key(2))
    horizon, key = 3, jax.random.key(5)
    trajectory = jax.jit(lambda p, s, k: protocol.imagine(
        model, p, s, lambda feat, k: action(model, k), horizon, k))(params, start, key)
    assert trajectory.actions.shape == (N, horizon, model.action_dim)
    state = start
    for t, k in enumerate(jax.random.split(key, horizon)):
        k_act, k_step = jax.random.split(k)
        state, reward, cont = model.step(params, state, action(model, k_act), k_step)
        np.testing.assert_allclose(trajectory.rewards[:, t], reward, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(trajectory.conts[:, t], cont, rtol=1e-4, atol=1e-5)
    key = jax.random.key(6)
    rewards, conts, final = jax.jit(lambda p, s, a, k: protocol.rollout_sequences(
        model, p, s, a, k))(params, start, trajectory.actions, key)
    state = start
    for t, k in enumerate(jax.random.split(key, horizon)):
        state, reward, cont = model.step(params, state, trajectory.actions[:, t], k)
        np.testing.assert_allclose(rewards[:, t], reward, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(conts[:, t], cont, rtol=1e-4, atol=1e-5)
    for got, expected in zip(jax.tree.leaves(final), jax.tree.leaves(state), strict=True):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_predict_observes_then_steps_and_decodes_each_state(name):
    """``predict`` (what ``jaxwm.load(...).world_model.imagine`` shows) is ``observe`` from
    ``initial`` with a zero action, then ``step`` one at a time with the keys it draws, and
    where the model decodes, the frame of each state after a step."""
    model, params, obs = CASES[name]()
    horizon, key = 3, jax.random.key(7)
    actions = jnp.stack([action(model, k) for k in jax.random.split(jax.random.key(8), horizon)],
                        axis=1)
    out = jax.jit(lambda p, o, a, k: protocol.predict(model, p, o, a, k))(params, obs, actions,
                                                                           key)
    k_observe, k_steps = jax.random.split(key)
    state = model.observe(params, model.initial(params, N), jnp.zeros_like(actions[:, 0]), obs,
                          jnp.ones(N, bool), k_observe)
    assert set(out) == {"rewards", "continues", "features"} | ({"frames"} if model.decodes
                                                               else set())
    for t, k in enumerate(jax.random.split(k_steps, horizon)):
        state, reward, cont = model.step(params, state, actions[:, t], k)
        np.testing.assert_allclose(out["rewards"][:, t], reward, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["continues"][:, t], cont, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["features"][:, t], model.features(params, state),
                                   rtol=1e-4, atol=1e-4)
        if model.decodes:
            np.testing.assert_allclose(out["frames"][:, t], model.decode(params, state),
                                       rtol=1e-4, atol=1e-4)


def test_as_env_ends_rows_where_the_model_stops_continuing_and_keeps_them_ended():
    model, params, obs = ensemble_case()
    # Pendulum never terminates; a rule that ends rows whose next state's first entry > 1.
    ending = ensemble.EnsembleModel(model.spec, lambda o, a, nxt: nxt[:, 0] > 1.0, model.to_env)
    env_state, first = protocol.env_start(ending, params, obs, jax.random.key(0))
    np.testing.assert_allclose(first.obs, obs)
    start = acting.ActorState.start(first, (), N)
    policy = acting.stateless(lambda p, o, k, t: jnp.zeros((o.shape[0], 1)))
    _, (_, alive, _), steps, _ = acting.rollout(policy, protocol.as_env(ending, params), None,
                                                start, env_state, jax.random.key(1), 6)
    terminated = np.asarray(steps.terminated[1:])  # row t + 1: what step t returned
    assert terminated.any(), "no row ended: the check would be empty"
    for row in range(N):
        ended = np.nonzero(terminated[:, row])[0]
        if len(ended):  # once ended, every later row of it is too
            assert terminated[ended[0]:, row].all()
    assert not np.any(np.asarray(alive) & terminated.any(0))


def test_planned_return_by_hand():
    """Two candidates of 3 steps, discount 0.5: the first never ends (1 + 0.5 * 2 + 0.25 * 3 +
    0.125 * 10); the second ends at its second step: it earns that step's reward, no value."""
    rewards = jnp.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    conts = jnp.array([[1.0, 0.9, 0.8], [1.0, 0.2, 1.0]])
    got = protocol.planned_return(rewards, conts, jnp.array([10.0, 10.0]), 0.5)
    np.testing.assert_allclose(got, [1 + 1 + 0.75 + 1.25, 1 + 1.0])


def test_a_policy_through_a_model_observes_then_acts_on_its_state():
    """``through_model``: the carry is (model state, last action, inner carry); each step
    observes the new observation with the last action into the state, then the inner policy
    acts on that state; where an episode starts the RSSM state restarts."""
    model, params, obs = rssm_case()
    seen = []

    def act(p, carry, state, is_first, key, temperature=1.0):
        seen.append(state)
        return carry, jnp.tanh(model.features(p, state)[:, :2]), {}

    policy = protocol.through_model(model, lambda p: p, acting.Policy(
        init_carry=lambda p, n: (), act=act), lambda a: 3.0 * a)
    carry = policy.init_carry(params, N)
    carry, env_action, _ = policy.act(params, carry, obs, jnp.ones(N, bool), jax.random.key(0))
    state, last, _ = carry
    np.testing.assert_allclose(env_action, 3.0 * last)
    k_obs, _ = jax.random.split(jax.random.key(0))
    expected = model.observe(params, model.initial(params, N), jnp.zeros((N, 2)), obs,
                             jnp.ones(N, bool), k_obs)
    np.testing.assert_allclose(state["deter"], expected["deter"], rtol=1e-5, atol=1e-6)
    again, _, _ = policy.act(params, carry, obs, jnp.ones(N, bool), jax.random.key(0))
    np.testing.assert_allclose(again[0]["deter"], expected["deter"], rtol=1e-5, atol=1e-6)


def test_ppo_trains_in_any_world_model_as_in_an_env():
    """``ppo.rollout_in_model``: PPO's policy acts in a world model through the acting layer
    (here the RSSM, whose features are PPO's observations), and the rollout goes through
    PPO's own finish and update, as SimPLe's PPO does in its simulator."""
    import numpy as np

    from jaxwm.agents import ppo
    from jaxwm.envs.types import EnvSpec
    from jaxwm.nets.actor_critic import config_block, make_actor_critic

    model, params, obs = rssm_case()
    starts = model.observe(params, model.initial(params, N), jnp.zeros((N, 2)), obs,
                           jnp.ones(N, bool), jax.random.key(1))
    feat = model.features(params, starts).shape[-1]
    spec = EnvSpec("dream", "classic", N, (feat,), np.dtype(np.float32), False, None, (2,),
                   -np.ones(2, np.float32), np.ones(2, np.float32), 100)
    network = make_actor_critic(spec, config_block(hidden=(16,)))
    cfg = ppo.config_block(num_steps=4, num_minibatches=1, update_epochs=1, anneal_lr=False)
    hyper = ppo.PPOHyper.from_config(cfg, recurrent=False)
    optimizer = ppo.make_optimizer(cfg, 1)
    learner = ppo.init_learner(network, optimizer, spec, jax.random.key(2), N)
    policy = ppo.policy(network, hyper)
    start, final, steps, completed = ppo.rollout_in_model(
        policy, model, params, learner, starts, jax.random.key(3), jax.random.key(4), 4)
    assert steps.obs.shape == (4, N, feat)
    _, (_, rollout, _) = ppo.make_finish(network, hyper)(learner, start, steps, final,
                                                         completed)
    update = ppo.make_update(network, hyper, optimizer, "scan")
    new, metrics = update(learner, rollout, jax.random.key(5))
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), new.params, learner.params)
    assert any(jax.tree.leaves(changed)) and np.isfinite(float(metrics["losses/policy_loss"]))
