"""Envs written in JAX (``jaxwm.envs.native``, ``jaxwm.envs.suites``): jaxwm's auto-reset,
time-limit and seeding conventions against hand-stepped episodes of each suite, observation
layouts, and the one-line refusals."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import algos, runner
from jaxwm.config import ConfigError
from jaxwm.config import load as load_config
from jaxwm.envs import UnknownEnvError, make_env, probe_spec, suites
from jaxwm.envs.stats import EpisodeStats, episode_metrics

gymnax = pytest.importorskip("gymnax", reason="the gymnax extra (pip install -e '.[dev]')")


def split3(key):
    """An env's key each step: (its next key, the step's, a reset's), as ``native`` splits."""
    return tuple(jax.random.split(key, 3))


def hand_stepped_cartpole(actions, seed=0):
    """gymnax's CartPole stepped by hand with jaxwm's conventions spelled out: the final
    observation returned with its flag, then a reset step (reward 0, flags False)."""
    env, params = gymnax.make("CartPole-v1")
    params = params.replace(max_steps_in_episode=suites.UNLIMITED)
    key, reset_key, _ = split3(jax.random.PRNGKey(seed))
    obs, state = env.reset_env(reset_key, params)
    rows, final = [(obs, 0.0, False)], False
    for action in actions:
        key, step_key, reset_key = split3(key)
        if final:
            obs, state = env.reset_env(reset_key, params)
            rows.append((obs, 0.0, False))
            final = False
            continue
        obs, state, reward, done, _ = env.step_env(step_key, state, action, params)
        rows.append((obs, float(reward), bool(done)))
        final = bool(done)
    return rows


def test_cartpole_episode_ends_on_its_final_observation_then_resets_as_envpool_does():
    env = make_env({"id": "gymnax:CartPole-v1"}, num_envs=1, seed=0)
    state, first = env.xla_reset()
    step = jax.jit(env.xla_step)
    actions = [0] * 30  # always left: the pole falls within a few dozen steps
    expected = hand_stepped_cartpole(actions)
    np.testing.assert_array_equal(first.obs[0], expected[0][0])
    stats, returns = EpisodeStats.create(1, awaiting_reset=True), []
    stats, _ = stats.update(first)
    ends = []
    for t, action in enumerate(actions, start=1):
        state, row = step(state, jnp.array([action]))
        # One compiled program against gymnax's eager ops: equal to float32 rounding.
        np.testing.assert_allclose(row.obs[0], expected[t][0], rtol=1e-6, atol=1e-7,
                                   err_msg=f"step {t}")
        assert float(row.reward[0]) == expected[t][1]
        assert bool(row.terminated[0]) == expected[t][2] and not bool(row.truncated[0])
        stats, completed = stats.update(row)
        if bool(completed["mask"][0]):
            returns.append(float(completed["return"][0]))
        if row.terminated[0]:
            ends.append(t)
            x, theta = row.obs[0, 0], row.obs[0, 2]
            assert abs(theta) > 0.2094 or abs(x) > 2.4  # the true final observation
    assert ends, "the pole never fell"
    t = ends[0]
    # The episode's return counts every executed step (gymnax pays 1 per step, the last too).
    assert returns[0] == float(t)
    reset = expected[t + 1]
    assert reset[1] == 0.0 and not reset[2] and np.all(np.abs(reset[0]) <= 0.05)


def test_the_time_limit_truncates_and_is_not_a_termination():
    env = make_env({"id": "gymnax:Pendulum-v1", "max_episode_steps": 5}, num_envs=2, seed=3)
    assert env.spec.max_episode_steps == 5 and not env.spec.discrete
    state, _ = env.xla_reset()
    flags = []
    for _ in range(7):
        state, row = env.xla_step(state, jnp.zeros((2, 1)))
        flags.append((bool(row.terminated[0]), bool(row.truncated[0]), float(row.reward[0])))
    assert [f[:2] for f in flags[:5]] == [(False, False)] * 4 + [(False, True)]
    assert flags[5] == (False, False, 0.0)  # the reset step
    assert int(state.elapsed[0]) == 1  # the new episode's first executed step


def test_the_default_limit_is_the_suites_own_and_episode_metrics_count_it():
    env = make_env({"id": "gymnax:Pendulum-v1"}, num_envs=1, seed=0)
    assert env.spec.max_episode_steps == 200
    state, first = env.xla_reset()
    stats, _ = EpisodeStats.create(1, awaiting_reset=True).update(first)

    def one(carry, _):
        state, stats = carry
        state, row = env.xla_step(state, jnp.zeros((1, 1)))
        stats, completed = stats.update(row)
        return (state, stats), completed

    _, completed = jax.lax.scan(one, (state, stats), None, 201)
    metrics = episode_metrics(completed)
    assert int(metrics["charts/episodes"]) == 1 and float(metrics["charts/episodic_length"]) == 200


def test_env_i_of_a_pool_is_seeded_with_seed_plus_i_and_the_host_path_matches():
    pool = make_env({"id": "gymnax:CartPole-v1"}, num_envs=2, seed=7)
    alone = make_env({"id": "gymnax:CartPole-v1"}, num_envs=1, seed=8)
    (pool_state, pool_first), (_, alone_first) = pool.xla_reset(), alone.xla_reset()
    np.testing.assert_array_equal(pool_first.obs[1], alone_first.obs[0])
    host_first = pool.reset()
    np.testing.assert_array_equal(host_first.obs, pool_first.obs)
    actions = np.array([1, 0])
    np.testing.assert_allclose(pool.step(actions).obs,
                               pool.xla_step(pool_state, jnp.asarray(actions))[1].obs, rtol=1e-6)


def test_minatar_frames_are_channels_first_binary_and_flatten_for_an_mlp():
    frames = make_env({"id": "gymnax:Breakout-MinAtar"}, num_envs=1, seed=0)
    flat = make_env({"id": "gymnax:Breakout-MinAtar", "flatten_obs": True}, num_envs=1, seed=0)
    assert frames.spec.obs_shape == (4, 10, 10) and frames.spec.obs_dtype == np.uint8
    assert frames.spec.family == "minatar" and frames.spec.is_pixels
    assert flat.spec.obs_shape == (400,) and flat.spec.obs_dtype == np.float32
    image, vector = frames.reset().obs[0], flat.reset().obs[0]
    assert set(np.unique(image)) <= {0, 255}
    env, params = gymnax.make("Breakout-MinAtar")
    _, reset_key, _ = split3(jax.random.PRNGKey(0))
    raw, _ = env.reset_env(reset_key, params.replace(max_steps_in_episode=suites.UNLIMITED))
    np.testing.assert_array_equal(vector, np.asarray(raw).reshape(-1))
    np.testing.assert_array_equal(image, np.transpose(np.asarray(raw), (2, 0, 1)) * 255)


@pytest.mark.skipif(importlib.util.find_spec("craftax") is None,
                    reason="the craftax extra (pip install -e '.[craftax]')")
def test_craftax_classic_symbolic_steps_as_craftax_does_without_its_auto_reset():
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_env({"id": "craftax:Craftax-Classic-Symbolic-v1"}, num_envs=1, seed=0)
    assert env.spec.num_actions == 17 and env.spec.obs_shape == (1345,)
    assert env.spec.max_episode_steps == 10_000
    state, first = env.xla_reset()
    first_types = jax.tree.map(jax.typeof, state)
    theirs = make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=False)
    params = theirs.default_params.replace(max_timesteps=suites.UNLIMITED)
    # Compiled, as jaxwm's side is: Craftax's world generation op by op takes seconds.
    reset_env, step_env = jax.jit(theirs.reset_env), jax.jit(theirs.step_env)
    key, reset_key, _ = split3(jax.random.PRNGKey(0))
    obs, inner = reset_env(reset_key, params)
    # Two programs (one vmapped) fuse the float ops apart: equal to float32 rounding.
    np.testing.assert_allclose(first.obs[0], obs, rtol=1e-6, atol=1e-7)
    for action in (1, 5, 5, 2):
        key, step_key, _ = split3(key)
        obs, inner, reward, _, _ = step_env(step_key, inner, action, params)
        state, row = env.xla_step(state, jnp.array([action]))
        np.testing.assert_allclose(row.obs[0], obs, rtol=1e-6, atol=1e-7)
        assert float(row.reward[0]) == float(reward)
    # Craftax's reset leaves weakly typed scalars its step makes strong; the pool's state has
    # one type throughout, or each program taking it would compile twice.
    assert jax.tree.map(jax.typeof, state) == first_types


@pytest.mark.skipif(importlib.util.find_spec("craftax") is None,
                    reason="the craftax extra (pip install -e '.[craftax]')")
def test_craftax_episodes_report_their_achievements_at_their_last_step():
    """Each episode's outcomes are Craftax's ``state.achievements`` at its last step (1:
    unlocked), 0 at every other step; episode statistics average them over episodes."""
    env = make_env({"id": "craftax:Craftax-Classic-Symbolic-v1", "max_episode_steps": 12},
                   num_envs=3, seed=0)
    assert len(env.spec.outcomes) == 22 and "achievements/collect_wood" in env.spec.outcomes
    step = jax.jit(env.xla_step)
    state, row = env.xla_reset()
    stats = EpisodeStats.create(3, awaiting_reset=True)
    stats, _ = stats.update(row)
    ended = 0
    for t in range(25):
        state, row = step(state, jnp.asarray([5, t % 17, 1]))  # 5: DO (collects wood)
        stats, completed = stats.update(row)
        got = np.stack([row.outcomes[n] for n in env.spec.outcomes], -1)
        expected = np.where(np.asarray(row.done)[:, None],
                            np.asarray(state.inner.achievements, np.float32), 0.0)
        np.testing.assert_array_equal(got, expected)
        if row.done.any():
            ended += int(row.done.sum())
            metrics = episode_metrics(completed)
            assert float(metrics["charts/achievements/collect_wood"]) == pytest.approx(
                float(np.mean(np.asarray(completed["outcomes"]["achievements/collect_wood"])[
                    np.asarray(completed["mask"])])))
    assert ended == 6 and state.inner.achievements.shape == (3, 22)


@pytest.mark.slow  # the first import of Craftax's pixel envs renders its textures (~1 min)
@pytest.mark.skipif(importlib.util.find_spec("craftax") is None,
                    reason="the craftax extra (pip install -e '.[craftax]')")
def test_craftax_classic_pixels_are_channels_first_uint8():
    env = make_env({"id": "craftax:Craftax-Classic-Pixels-v1"}, num_envs=2, seed=0)
    assert env.spec.obs_shape == (3, 63, 63) and env.spec.obs_dtype == np.uint8
    assert env.spec.is_pixels and env.spec.family == "craftax"
    state, first = env.xla_reset()
    _, row = env.xla_step(state, jnp.array([0, 5]))
    assert row.obs.dtype == jnp.uint8 and int(row.obs.max()) > 0
    # DreamerV3's encoder takes 64 x 64: env.img_height / img_width resize the frames.
    sized = make_env({"id": "craftax:Craftax-Classic-Pixels-v1", "img_height": 64,
                      "img_width": 64}, num_envs=2, seed=0)
    assert sized.spec.obs_shape == (3, 64, 64) and sized.spec.obs_dtype == np.uint8
    _, resized = sized.xla_reset()
    np.testing.assert_allclose(np.asarray(resized.obs, np.float32).mean(),
                               np.asarray(first.obs, np.float32).mean(), rtol=0.02)


@pytest.mark.skipif(importlib.util.find_spec("mujoco_playground") is None,
                    reason="the playground extra (pip install -e '.[playground]')")
def test_playground_repeats_actions_sums_rewards_and_truncates_at_jaxwms_limit():
    """A Playground DMC task with an action repeat of 2 and a 3-step limit, against
    Playground's env stepped by hand: each agent step is two control steps with their rewards
    summed, the third is truncated (never terminated), and the fourth is a reset step."""
    from mujoco_playground import registry

    env = make_env({"id": "playground:CartpoleBalance", "frame_skip": 2,
                    "max_episode_steps": 3}, num_envs=1, seed=5)
    assert env.spec.family == "dmc" and env.spec.obs_shape == (5,) and not env.spec.discrete
    assert env.spec.action_shape == (1,) and env.spec.action_low[0] == -1.0
    theirs = registry.load("CartpoleBalance", config_overrides={"impl": "jax"})
    reset, step = jax.jit(theirs.reset), jax.jit(theirs.step)
    key, reset_key, _ = split3(jax.random.PRNGKey(5))
    expected = reset(reset_key)
    state, first = env.xla_reset()
    np.testing.assert_allclose(first.obs[0], expected.obs, rtol=1e-6)
    xla_step = jax.jit(env.xla_step)
    for t, action in enumerate((0.5, -1.0, 0.25), start=1):
        key, _, reset_key = split3(key)
        once = step(expected, jnp.array([action]))
        expected = step(once, jnp.array([action]))
        state, row = xla_step(state, jnp.array([[action]]))
        np.testing.assert_allclose(row.obs[0], expected.obs, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row.reward[0], once.reward + expected.reward, rtol=1e-5)
        assert not bool(row.terminated[0]) and bool(row.truncated[0]) == (t == 3)
    _, row = xla_step(state, jnp.array([[1.0]]))  # the reset step: a new episode's start
    np.testing.assert_allclose(row.obs[0], reset(split3(key)[2]).obs, rtol=1e-6)
    assert float(row.reward[0]) == 0.0 and not bool(row.episode_over[0])


def test_a_playground_task_with_dict_observations_is_refused_in_one_line(monkeypatch):
    """Playground's locomotion tasks observe dicts; jaxwm's Playground adapter takes one
    state vector (the DM Control Suite's), and says so before anything is built."""
    import types

    env = types.SimpleNamespace(observation_size={"state": (3,), "privileged_state": (5,)},
                                action_size=1)
    registry = types.SimpleNamespace(load=lambda name, config_overrides: env)
    monkeypatch.setattr(suites, "_playground_registry", lambda: registry)
    with pytest.raises(ConfigError, match=r"observes a dict \(state, privileged_state\)"):
        suites._playground_task("Go1JoystickFlatTerrain", {})


@pytest.mark.parametrize("env_id, error, match", [
    ("gymnax:CartPole-v2", UnknownEnvError, "Did you mean: gymnax:CartPole-v1"),
    ("gym:CartPole-v1", UnknownEnvError, "Unknown env suite 'gym'.*gymnax"),
    ("gymnax:Breakout-v5", UnknownEnvError, "It is an envpool id: Breakout-v5 .no prefix"),
    pytest.param("playground:CartpoleBalance-v1", UnknownEnvError,
                 "envpool id: CartpoleBalance-v1 .no prefix.; or did you mean "
                 "playground:CartpoleBalance,",
                 marks=pytest.mark.skipif(importlib.util.find_spec("mujoco_playground") is None,
                                          reason="the playground extra")),
    pytest.param("gymnax:Craftax-Classic-Symbolic-v1", UnknownEnvError,
                 "It is craftax's: craftax:Craftax-Classic-Symbolic-v1",
                 marks=pytest.mark.skipif(importlib.util.find_spec("craftax") is None,
                                          reason="the craftax extra")),
])
def test_unknown_ids_name_close_matches(env_id, error, match):
    with pytest.raises(error, match=match):
        probe_spec({"id": env_id})


def test_a_suite_that_is_not_installed_names_its_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(suites.importlib.util, "find_spec",
                        lambda name, *a: None if name == "craftax" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'jaxwm\[craftax\]'"):
        probe_spec({"id": "craftax:Craftax-Classic-Symbolic-v1"})


@pytest.mark.parametrize("env, match", [
    ({"id": "gymnax:CartPole-v1", "pixels": True}, "a JAX env"),
    ({"id": "gymnax:CartPole-v1", "flatten_obs": True}, "flattens MinAtar"),
    ({"id": "gymnax:CartPole-v1", "masked_indices": (7,)}, "masked_indices"),
])
def test_settings_that_do_not_fit_the_env_are_one_line(env, match):
    with pytest.raises(ConfigError, match=match):
        make_env(env, num_envs=1, seed=0)


def test_a_jax_env_has_no_asynchronous_pool():
    with pytest.raises(ConfigError, match="no asynchronous pool"):
        make_env({"id": "gymnax:CartPole-v1"}, num_envs=4, seed=0, batch_size=2)


@pytest.mark.parametrize("overrides, match", [
    ({"env.id": "gymnax:CartPole-v1", "ppo.async_collect": True}, "nothing to overlap"),
    ({"iterations_per_call": 2}, "needs an env written in JAX"),
    ({"env.id": "gymnax:CartPole-v1", "iterations_per_call": 3}, "not a multiple"),
    ({"env.id": "gymnax:Breakout-MinAtar", "network.encoder": "mlp"}, "takes vectors"),
    ({"env.id": "gymnax:Breakout-MinAtar", "env.flatten_obs": True,
      "network.encoder": "nature_cnn"}, "takes images"),
])
def test_ppo_refuses_what_a_jax_env_cannot_do_in_one_line(overrides, match):
    config = load_config("ppo:tiny", overrides)
    with pytest.raises(ConfigError, match=match):
        runner.validate(config)


def test_an_algorithm_that_takes_no_jax_env_says_why():
    config = load_config("worldmodels:tiny", {"env.id": "gymnax:Pendulum-v1"})
    entry = algos.get("worldmodels")
    with pytest.raises(ConfigError, match="worldmodels cannot run the JAX env gymnax:Pendul"):
        algos.check_capabilities(config, entry.capabilities, probe_spec(config.env))


SMALL_BACKBONES = {"network.rnn.hidden": 16, "network.trxl.dim": 16, "network.trxl.memory": 8,
                   "network.mamba.dim": 16, "network.mamba.state": 4, "network.mamba2.dim": 16,
                   "network.mamba2.state": 4, "network.mamba2.headdim": 8,
                   "network.mamba2.chunk": 8}


@pytest.mark.parametrize("env_id, backbone", [
    *[("gymnax:CartPole-v1", b) for b in ("ff", "lstm", "gru", "trxl", "gtrxl", "mamba",
                                           "mamba2")],
    ("gymnax:Breakout-MinAtar", "ff"),  # its frames through the MinAtar CNN
])
def test_every_ppo_backbone_trains_in_one_program_on_a_jax_env(env_id, backbone):
    """Two calls of ``iterate``, each two whole iterations compiled as one program."""
    from jaxwm.algos import ppo
    from jaxwm.loop import seeds

    config = load_config("ppo:tiny", {"env.id": env_id, "network.backbone": backbone,
                                      "iterations_per_call": 2, **SMALL_BACKBONES})
    runner.validate(config)
    algo = ppo.build(config)
    assert set(algo.hooks) == {"iterate"} and algo.hooks["iterate"].counts == {
        "env_steps": 2 * 4 * 16, "agent_updates": 2 * 16}
    key, init_key = seeds.split(jax.random.PRNGKey(0))
    state = algo.init(init_key)
    before = jax.tree.map(np.asarray, state.learner.params)
    for _ in range(2):
        key, sub = seeds.split(key)
        state, _, metrics = algo.hooks["iterate"].fn(state, {}, sub)
    assert np.isfinite(float(metrics["losses/value_loss"]))
    assert int(state.actor.env.elapsed.max()) > 0  # the env state travelled in the actor
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), before,
                           jax.tree.map(np.asarray, state.learner.params))
    assert all(jax.tree.leaves(changed))


@pytest.mark.parametrize("env", [
    {"env.id": "gymnax:CartPole-v1"},
    pytest.param({"env.id": "craftax:Craftax-Classic-Symbolic-v1", "env.max_episode_steps": 30},
                 marks=pytest.mark.skipif(importlib.util.find_spec("craftax") is None,
                                          reason="the craftax extra"))], ids=["cartpole", "craftax"])
def test_evaluation_on_the_device_gives_the_host_paths_episodes(env):
    """The evaluator runs a JAX env's episodes as one program; the same seeds, quotas and
    keys as its host path, so the same returns (and Craftax's achievements), evaluation after
    evaluation."""
    from jaxwm.algos import ppo
    from jaxwm.loop.evaluate import Evaluator

    config = load_config("ppo:tiny", {**env, "eval.num_envs": 2, "eval.num_episodes": 3})
    algo = ppo.build(config)
    state = algo.init(jax.random.PRNGKey(0))
    on_device, on_host = Evaluator.for_algorithm(config, algo), Evaluator.for_algorithm(config, algo)
    for key in (jax.random.PRNGKey(1), jax.random.PRNGKey(2)):
        device = on_device.run(state, key)
        host = on_host._run_on_host(state, key)
        assert device["eval/episodes"] == 3 and device.keys() == host.keys()
        if "craftax" in env["env.id"]:
            assert "eval/achievements/collect_wood" in device
        for name in device:
            np.testing.assert_allclose(device[name], host[name], rtol=1e-6, err_msg=name)
