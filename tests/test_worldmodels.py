"""World Models' pieces (models/vae.py, models/mdnrnn.py, agents/cma_es.py): sizes against
the paper, losses against hand numbers, one update lowers each loss, CMA-ES finds a known
optimum."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxwm.agents import cma_es
from jaxwm.models import mdnrnn, vae


def count(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))


def test_vae_shapes_and_parameter_count_match_the_paper():
    """The paper's V has 4,348,547 parameters (Ha & Schmidhuber 2018, appendix A.1)."""
    model = vae.ConvVAE()
    params = vae.init(model, jax.random.key(0))
    assert count(params) == 4_348_547
    frames = jnp.zeros((2, 64, 64, 3))
    mu, logvar = model.apply(params, frames, method=vae.ConvVAE.encode)
    assert mu.shape == logvar.shape == (2, 32)
    out = model.apply(params, mu, method=vae.ConvVAE.decode)
    assert out.shape == (2, 64, 64, 3) and bool(jnp.all((out > 0) & (out < 1)))


def test_kl_and_its_free_bits_by_hand():
    mu, logvar = jnp.zeros((1, 32)), jnp.zeros((1, 32))
    assert float(vae.kl_divergence(mu, logvar)[0]) == 0.0
    # N(3, 1) per dimension: 0.5 * 3^2 each, 144 over 32 dims
    assert float(vae.kl_divergence(mu + 3, logvar)[0]) == pytest.approx(144.0)
    # logvar = log 4: 0.5 * (4 - 1 - log 4) per dimension
    expected = 32 * 0.5 * (4 - 1 - math.log(4))
    assert float(vae.kl_divergence(mu, logvar + math.log(4))[0]) == pytest.approx(expected, 1e-5)


def fit(loss_fn, params, steps, lr):
    opt = optax.adam(lr)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        (value, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, key)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    values = []
    for i in range(steps):
        params, state, value = step(params, state, jax.random.key(i))
        values.append(float(value))
    return values


def test_vae_updates_lower_its_loss_on_a_fixed_batch():
    model = vae.ConvVAE()
    params = vae.init(model, jax.random.key(0))
    frames = jax.random.uniform(jax.random.key(1), (8, 64, 64, 3))
    frames = frames.at[:, 20:40, 10:50].set(0.9)  # some structure to reconstruct
    values = fit(lambda p, k: vae.loss(model, p, frames, k), params, 15, 1e-3)
    assert values[-1] < 0.9 * values[0], values
    _, metrics = vae.loss(model, params, frames, jax.random.key(0))
    assert float(metrics["vae/kl_floored"]) >= 16.0  # 0.5 x 32 free nats


def test_mixture_log_likelihood_by_hand():
    """Two components, weights 0.3 / 0.7, N(0, 1) and N(2, 0.5^2), at y = 1."""
    log_pi = jnp.log(jnp.array([0.3, 0.7]))
    mu = jnp.array([0.0, 2.0])
    log_sigma = jnp.log(jnp.array([1.0, 0.5]))

    def normal(y, m, s):
        return math.exp(-0.5 * ((y - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))

    expected = math.log(0.3 * normal(1, 0, 1) + 0.7 * normal(1, 2, 0.5))
    got = float(mdnrnn.mixture_log_prob(log_pi, mu, log_sigma, jnp.array(1.0)))
    assert got == pytest.approx(expected, 1e-6)


def test_low_temperature_samples_the_heaviest_mixture_at_its_mean():
    outputs = {"log_pi": jnp.log(jnp.array([[0.1, 0.9]] * 4)),
               "mu": jnp.array([[-5.0, 3.0]] * 4), "log_sigma": jnp.zeros((4, 2))}
    z = mdnrnn.sample(outputs, jax.random.key(0), temperature=1e-3)
    np.testing.assert_allclose(z, 3.0, atol=0.2)


def test_mdnrnn_updates_lower_its_loss_and_heads_are_optional():
    hyper = mdnrnn.MDNHyper(z_dim=8, hidden=32, predict_reward=True, predict_done=True)
    model = mdnrnn.MDNRNN(hyper)
    params = mdnrnn.init(model, jax.random.key(0), action_dim=3)
    key = jax.random.key(1)
    t = jnp.arange(11)[None, :, None] * 0.3
    batch = {"z": jnp.sin(t + jnp.arange(8)) * jnp.ones((4, 1, 1)),  # predictable latents
             "action": jax.random.uniform(key, (4, 10, 3)),
             "reward": jnp.ones((4, 10)), "done": jnp.zeros((4, 10), bool)}
    values = fit(lambda p, k: mdnrnn.loss(model, p, batch), params, 30, 3e-3)
    assert values[-1] < values[0] - 1.0, values
    _, metrics = mdnrnn.loss(model, params, batch)
    assert {"rnn/z_nll", "rnn/reward_mse", "rnn/done_bce"} <= set(metrics)
    plain = mdnrnn.MDNRNN(mdnrnn.MDNHyper())
    assert "reward" not in mdnrnn.init(plain, key, 3)["params"]


def test_controller_has_the_papers_867_parameters_and_drives_as_the_reference():
    controller = cma_es.Controller(input_dim=32 + 256, action_dim=3)
    assert controller.num_params == 867
    flat = jnp.zeros(867).at[:3].set(jnp.array([5.0, 5.0, -5.0]))  # biases only
    action = controller.act(flat, jnp.ones(288))
    np.testing.assert_allclose(action, np.tanh([5.0, 5.0, -5.0]), atol=1e-6)
    env = cma_es.carracing_action(action)
    np.testing.assert_allclose(env, [np.tanh(5.0), (np.tanh(5.0) + 1) / 2, 0.0], atol=1e-6)


def test_cma_es_finds_the_maximum_of_a_known_function():
    """Returns -||x - 1.5||^2 over 10 numbers: the mean converges to 1.5 in 60 generations
    of 16, each generation one jitted ask -> evaluate -> tell."""
    evolution = cma_es.Evolution(num_params=10, population=16, sigma=0.5)

    @jax.jit
    def generation(state, key):
        k_ask, k_tell = jax.random.split(key)
        candidates, state = evolution.ask(state, k_ask)
        returns = -jnp.sum((candidates - 1.5) ** 2, -1)
        return evolution.tell(state, candidates, returns, k_tell)

    state = evolution.init(jax.random.key(0))
    for i in range(60):
        state, metrics = generation(state, jax.random.key(i + 1))
    np.testing.assert_allclose(evolution.mean(state), 1.5, atol=0.05)
    assert float(metrics["cma/return_best"]) > -0.01


def test_cma_es_refuses_a_population_it_cannot_use():
    with pytest.raises(ValueError, match="population of at least 4"):
        cma_es.Evolution(num_params=3, population=2)


def test_cma_es_through_a_grouped_pool_finds_a_known_optimum():
    """The mechanism the evolution phase uses: each candidate's controller acts on its own
    group of a pool (``acting.grouped``) in one ``acting.rollout`` over a pure env whose
    reward is -||a - target||^2; one generation (ask -> rollout -> tell) is one jitted
    function. 16 candidates x 2 envs, 5 steps each: the best candidate's actions reach the
    target."""
    from jaxwm.envs import acting
    from jaxwm.envs.types import StepResult

    target = jnp.array([0.5, -0.25, 0.8])
    controller = cma_es.Controller(input_dim=4, action_dim=3)
    features = jnp.array([1.0, -1.0, 0.5, 0.0])  # a constant observation

    def env_step(env_state, action):
        reward = -jnp.sum((action - target) ** 2, -1)
        n = action.shape[0]
        return env_state, StepResult(jnp.tile(features, (n, 1)), reward, jnp.zeros(n, bool),
                                     jnp.zeros(n, bool), jnp.zeros(n, bool), reward)

    population, per_group, steps = 16, 2, 5
    n = population * per_group
    first = StepResult(jnp.tile(features, (n, 1)), jnp.zeros(n), jnp.zeros(n, bool),
                       jnp.zeros(n, bool), jnp.zeros(n, bool), jnp.zeros(n))
    policy = acting.grouped(acting.stateless(
        lambda flat, obs, key, temperature: controller.act(flat, obs)), population)
    evolution = cma_es.Evolution(controller.num_params, population=population, sigma=0.3)

    def evaluate(candidates, key):
        actor = acting.ActorState.start(first, policy.init_carry(candidates, n), n)
        keys = jax.random.split(key, population)
        _, _, record, _ = acting.rollout(policy, acting.sync(env_step), candidates, actor, (),
                                         keys, steps)
        valid = jnp.arange(steps)[:, None] > 0  # the first row's reward precedes any action
        return cma_es.group_returns(record.reward, valid & jnp.ones((steps, n), bool),
                                    population), {}

    run = jax.jit(lambda state, key: evolution.generation(state, evaluate, key))
    state = evolution.init(jax.random.key(0))
    for i in range(80):
        state, metrics = run(state, jax.random.key(i + 1))
    assert float(metrics["cma/return_best"]) > -0.01 * (steps - 1)
    np.testing.assert_allclose(controller.act(evolution.mean(state), features), target,
                               atol=0.05)


def small_agent():
    from jaxwm.agents import worldmodels

    memory = mdnrnn.MDNRNN(mdnrnn.MDNHyper(z_dim=32, hidden=16))
    agent = worldmodels.Agent(vae.ConvVAE(), memory, cma_es.Controller(32 + 16, 3),
                              cma_es.carracing_action, crop_rows=84)
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"vae": vae.init(agent.vision, k1), "rnn": mdnrnn.init(memory, k2, 3)}
    return agent, params


def test_frames_are_read_the_same_channels_first_or_last():
    """envpool's CarRacing frames are [n, 3, 96, 96]: the same picture as [n, 96, 96, 3]."""
    from jaxwm.models.vision_memory import preprocess

    hwc = jax.random.randint(jax.random.key(0), (2, 96, 96, 3), 0, 256).astype(jnp.uint8)
    chw = jnp.moveaxis(hwc, -1, 1)
    np.testing.assert_allclose(preprocess(chw, 84), preprocess(hwc, 84))
    assert preprocess(chw, 84).shape == (2, 64, 64, 3)


def test_the_agent_resets_its_memory_at_episode_starts_and_shares_v_and_m_in_a_population():
    agent, params = small_agent()
    frames = jax.random.randint(jax.random.key(1), (4, 96, 96, 3), 0, 256).astype(jnp.uint8)
    policy = agent.policy()
    flat = 0.1 * jax.random.normal(jax.random.key(2), (agent.controller.num_params,))
    one = {**params, "controller": flat}
    carry = policy.init_carry(one, 4)
    first = jnp.ones(4, bool)
    carry, action, _ = policy.act(one, carry, frames, first, jax.random.key(3))
    assert action.shape == (4, 3) and bool(jnp.all(action[:, 1:] >= 0))
    assert float(jnp.abs(carry[1]).sum()) > 0  # M read [z, a]
    # at an episode start the memory is zeroed before it is read: same as a fresh carry
    fresh = policy.init_carry(one, 4)
    again, action_again, _ = policy.act(one, carry, frames, first, jax.random.key(3))
    _, action_fresh, _ = policy.act(one, fresh, frames, first, jax.random.key(3))
    np.testing.assert_allclose(action_again, action_fresh)
    # a population of 2 controllers over 2 envs each; V and M are not copied per group
    population = agent.population_policy(2)
    both = {**params, "controller": jnp.stack([flat, -flat])}
    carry = population.init_carry(both, 4)
    assert carry[0].shape == (2, 2, 16)
    keys = jax.random.split(jax.random.key(3), 2)
    _, actions, _ = population.act(both, carry, frames, first, keys)
    assert actions.shape == (4, 3)
    assert not np.allclose(actions[:2], actions[2:])  # each group acts with its own C


def test_episode_returns_count_each_envs_first_episode_only():
    """Rewards arrive with the row after the action; a row that ends the episode brings its
    last reward, and nothing after it counts (the next rows are another episode)."""
    from jaxwm.agents.cma_es import first_episode_returns as episode_returns
    from jaxwm.envs.acting import Steps

    reward = jnp.array([[9.0, 9.0], [1.0, 2.0], [1.0, 2.0], [5.0, 2.0], [7.0, 2.0]])
    terminated = jnp.array([[False, False], [False, False], [True, False], [False, False],
                            [False, False]])
    zeros = jnp.zeros_like(terminated)
    steps = Steps(obs=zeros, is_first=zeros, reward=reward, terminated=terminated,
                  truncated=zeros, action=zeros, extras={}, ids=None)
    np.testing.assert_allclose(episode_returns(steps), [2.0, 8.0])  # row 0 precedes acting


def test_the_dream_env_in_the_acting_scan_equals_stepping_it_in_a_loop():
    """V and M as a world model (``models.vision_memory``) and that as an env of the acting
    layer (``protocol.as_env``): the scan's rows are M's steps one at a time, a dream ends
    where M's done head says so and stays ended, and the observation is ``[z, h]``."""
    from jaxwm.envs import acting
    from jaxwm.models import protocol

    memory = mdnrnn.MDNRNN(mdnrnn.MDNHyper(z_dim=4, hidden=8, predict_reward=True,
                                           predict_done=True))
    model = types_agent(memory).model(temperature=1.15)
    params = {"rnn": mdnrnn.init(memory, jax.random.key(0), 3)}
    # Done heads that never end a dream and that end every one at its first step.
    def done_bias(shift):
        return jax.tree_util.tree_map_with_path(
            lambda path, x: x + shift if "done" in jax.tree_util.keystr(path) and "bias" in
            jax.tree_util.keystr(path) else x, params)

    n, steps = 3, 5
    z0 = jax.random.normal(jax.random.key(1), (n, 4))
    state0 = (memory.initialize_carry(n), z0)
    policy = acting.stateless(lambda params, obs, key, temperature: jnp.tanh(obs[:, :3]))
    for p, ends in ((done_bias(-20.0), False), (done_bias(20.0), True)):
        env_state, start = protocol.env_start(model, p, state0, jax.random.key(2))
        np.testing.assert_allclose(start.obs, jnp.concatenate([z0, state0[0][1]], -1))
        actor = acting.ActorState.start(start, (), n)
        _, (final_state, alive, _), record, _ = acting.rollout(
            policy, protocol.as_env(model, p), None, actor, env_state, jax.random.key(3),
            steps)
        state, obs, rewards, key = state0, start.obs, [], jax.random.key(2)
        for _ in range(steps):  # the same steps by hand: act on the last observation
            key, k_step = jax.random.split(key)
            state, reward, _ = model.step(p, state, jnp.tanh(obs[:, :3]), k_step)
            obs = model.features(p, state)
            rewards.append(reward)
        # the scan's row t + 1 holds what step t returned (its last result is pending)
        np.testing.assert_allclose(record.reward[1:], jnp.stack(rewards[:-1]), atol=1e-6)
        np.testing.assert_allclose(final_state[1], state[1], atol=1e-6)  # the same latents
        assert bool(jnp.all(alive != ends))
        if ends:
            assert bool(jnp.all(record.terminated[1:]))


def types_agent(memory):
    from jaxwm.agents import worldmodels

    return worldmodels.Agent(vae.ConvVAE(), memory, cma_es.Controller(4 + 8, 3),
                             cma_es.carracing_action)


@pytest.mark.parametrize("overrides, message", [
    ({"env.id": "Pendulum-v1"}, "worldmodels takes pixels observations; Pendulum-v1 has vector"),
    ({"controller.population": 2}, "CMA-ES needs at least 4 candidates"),
    ({"controller.train_in": "dreams"}, "controller.train_in='dreams'; choose one of"),
    ({"num_seeds": 2}, "one seed per process"),
    ({"worldmodels.crop_rows": 200}, "exceeds the frame's 96 rows"),
])
def test_bad_settings_are_one_line_errors(overrides, message):
    from jaxwm import runner
    from jaxwm.config import ConfigError, load

    config = load("worldmodels:tiny", overrides)
    with pytest.raises(ConfigError, match=message):
        runner.validate(config)


def test_brownian_exploration_moves_by_small_steps_within_the_box_and_restarts():
    from jaxwm.agents.worldmodels import brownian
    from jaxwm.envs.types import EnvSpec

    spec = EnvSpec("CarRacing-v3", "box2d", 3, (96, 96, 3), np.dtype(np.uint8), False, None,
                   (3,), np.array([-1.0, 0.0, 0.0], np.float32),
                   np.array([1.0, 1.0, 1.0], np.float32), 1000)
    policy = brownian(spec)
    carry = policy.init_carry(None, 3)
    first = jnp.array([True, True, True])
    carry, a0, _ = policy.act(None, carry, None, first, jax.random.key(0))
    carry, a1, _ = policy.act(None, carry, None, ~first, jax.random.key(1))
    assert bool(jnp.all(jnp.abs(a1 - a0) < 0.6))  # sqrt(1/50) ~ 0.14 per step, clipped
    assert bool(jnp.all((a1 >= spec.action_low) & (a1 <= spec.action_high)))
    _, a2, _ = policy.act(None, carry, None, jnp.array([True, False, False]),
                          jax.random.key(2))
    from jaxwm.envs import acting

    k_start, k_step = jax.random.split(jax.random.key(2))
    fresh = acting.uniform_action(spec, k_start, 3)
    walked = jnp.clip(a1 + jnp.sqrt(1 / 50) * jax.random.normal(k_step, a1.shape),
                      spec.action_low, spec.action_high)
    np.testing.assert_allclose(a2[0], fresh[0])  # env 0 started an episode: a fresh draw
    np.testing.assert_allclose(a2[1:], walked[1:], rtol=1e-6)  # the others walked on


def test_the_tiny_config_evolves_in_the_dream_end_to_end(tmp_path):
    """``worldmodels:tiny`` with ``controller.train_in=dream``: every phase runs,
    M gets its reward and done heads, the generations log CMA-ES's metrics and the dream's
    return, and the run writes V's reconstructions and M's dream beside the real frames.
    (The real-env evolution runs in the contract suite.)"""
    import json

    from jaxwm import runner
    from jaxwm.config import load

    config = load("worldmodels:tiny", {
        "controller.train_in": "dream", "dream.temperature": 1.15, "log.progress": False,
        "eval.at_end": False})
    summary = runner.run(config, str(tmp_path))
    assert summary["counters"]["generations"] == 2
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    last = rows[-1]
    assert {"cma/return_best", "cma/return_mean", "dream/episode_return"} <= set(last)
    assert any("rnn/reward_mse" in r and "rnn/done_bce" in r for r in rows)
    assert (tmp_path / last["rnn/dream_vs_real"]).exists()
    assert any("vae/reconstructions" in r for r in rows)
