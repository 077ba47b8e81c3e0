"""envpool's asynchronous mode: the pool's recv/send, the stream -> trajectories rebuild that
PPO trains on, the config checks, and learning CartPole through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxwm.config
from jaxwm import runner, train
from jaxwm.agents import ppo
from jaxwm.config import ConfigError
from jaxwm.envs import acting, make_env
from jaxwm.ops.returns import gae


def records(env_ids, **fields) -> acting.Steps:
    """A [T, B] stream as the acting layer records it: env ids as given; value = 10 t +
    column, reward = 100 + value (of the env's previous action); flags False unless given as
    [T, B] lists."""
    env_ids = jnp.asarray(env_ids, jnp.int32)
    steps, rows = env_ids.shape
    value = (10.0 * jnp.arange(steps)[:, None] + jnp.arange(rows)[None]).astype(jnp.float32)
    flags = {k: jnp.asarray(fields.get(k, np.zeros((steps, rows))), bool)
             for k in ("terminated", "truncated")}
    return acting.Steps(obs=value[..., None], is_first=jnp.zeros((steps, rows), bool),
                        reward=100.0 + value, action=env_ids,
                        extras={"log_prob": -value, "value": value}, ids=env_ids, **flags)


def test_stream_becomes_per_env_transitions_by_hand():
    # 3 envs, batches of 2: env 0 at (t0,c0) (t1,c1) (t2,c1); env 1 at (t0,c1) (t2,c0);
    # env 2 at (t1,c0). Env 0's record at t1 reports a termination (of its action at t0).
    stream = records([[0, 1], [2, 0], [1, 0]],
                     terminated=[[0, 0], [0, 1], [0, 0]])
    r = ppo.stream_rollout(stream)
    # Sorted by env, time order kept: values 0, 11, 21 | 1, 20 | 10, cut into 2 rows of 3.
    np.testing.assert_array_equal(r.value, [[0, 11, 21], [1, 20, 10]])
    # A record's result comes with its env's next record; the env's last one has none.
    np.testing.assert_array_equal(r.reward, [[111, 121, 0], [120, 0, 0]])
    np.testing.assert_array_equal(r.next_value, [[11, 21, 0], [20, 0, 0]])
    np.testing.assert_array_equal(r.terminated, [[1, 0, 0], [0, 0, 0]])
    # Invalid: no result (last of its env), or acting from a final observation (env 0, t1).
    np.testing.assert_array_equal(r.valid, [[1, 0, 0], [1, 0, 0]])
    # Cut (bootstrapped) where the env's next record has no result, and wherever none exists.
    np.testing.assert_array_equal(r.truncated, [[0, 1, 1], [1, 1, 1]])
    np.testing.assert_array_equal(r.action, [[0, 0, 0], [1, 1, 2]])


def test_advantages_equal_per_env_gae_on_each_envs_trajectory():
    """One row (B = 1): every valid transition's advantage is what GAE gives on that env's
    own trajectory, cut before its pending last action."""
    rng = np.random.default_rng(0)
    steps, num_envs = 60, 4
    ids = rng.integers(0, num_envs, (steps, 1))
    stream = records(ids, terminated=rng.random((steps, 1)) < 0.1,
                     truncated=rng.random((steps, 1)) < 0.05)
    stream = stream.replace(
        extras={**stream.extras, "value": jnp.asarray(rng.normal(size=(steps, 1)), jnp.float32)},
        reward=jnp.asarray(rng.normal(size=(steps, 1)), jnp.float32))
    hyper = ppo.PPOHyper(num_steps=steps, gamma=0.9, gae_lambda=0.8, num_minibatches=1,
                         update_epochs=1, clip_coef=0.2, clip_vloss=False, ent_coef=0.0,
                         vf_coef=0.5, norm_adv=False, normalize_obs=False,
                         normalize_reward=False, recurrent=False)
    batch = ppo.prepare_batch(hyper, ppo.stream_rollout(stream))
    got = np.asarray(batch["advantages"][:, 0])
    valid = np.asarray(batch["valid"][:, 0])
    position = 0
    for env in range(num_envs):
        t = np.flatnonzero(ids[:, 0] == env)
        if len(t) < 2:
            position += len(t)
            continue
        fields = {"value": stream.extras["value"], "reward": stream.reward,
                  "terminated": stream.terminated, "truncated": stream.truncated,
                  "done": stream.done}
        get = lambda k, at, fields=fields: np.asarray(fields[k][at, 0])  # noqa: E731
        n = len(t) - 1  # transitions with a result
        truncated = get("truncated", t[1:]).copy()
        truncated[-1] = True  # the pending action's result is not known: bootstrap here
        expected, _ = gae(get("reward", t[1:]), get("value", t[:-1]), get("value", t[1:]),
                          get("terminated", t[1:]), truncated, 0.9, 0.8)
        own_valid = ~get("done", t[:-1])
        np.testing.assert_array_equal(valid[position:position + n], own_valid)
        np.testing.assert_allclose(got[position:position + n][own_valid],
                                   np.asarray(expected)[own_valid], rtol=1e-5, atol=1e-6)
        assert not valid[position + n]
        position += len(t)


def test_async_pool_returns_distinct_ready_envs_and_refuses_synchronous_calls():
    env = make_env({"id": "CartPole-v1"}, num_envs=6, seed=0, batch_size=3)
    try:
        assert env.is_async and env.batch_size == 3
        handle = env.xla_async_reset()

        def body(handle, _):
            handle, ids, res = env.xla_recv(handle)
            return env.xla_send(handle, jnp.zeros(3, jnp.int32), ids), (ids, res.obs)

        _, (ids, obs) = jax.jit(lambda h: jax.lax.scan(body, h, None, length=8))(handle)
        ids = np.asarray(ids)
        assert obs.shape == (8, 3, 4)
        assert all(len(set(row)) == 3 for row in ids)  # an env is not ready twice per batch
        assert set(ids[:2].ravel()) == set(range(6))  # the reset brings every env once
        for call in (lambda: env.step(np.zeros(6)), env.reset, env.xla_reset):
            with pytest.raises(RuntimeError, match="asynchronous"):
                call()
    finally:
        env.close()


def ppo_config(**overrides):
    return jaxwm.config.load("ppo:cartpole", {"log.progress": False, **overrides})


@pytest.mark.parametrize("config, message", [
    (ppo_config(**{"env.batch_size": 9}), "must be in [0, env.num_envs=8]"),
    (ppo_config(**{"env.batch_size": 4, "network.backbone": "lstm"}), "memory backbone"),
    (ppo_config(**{"env.batch_size": 4, "num_seeds": 2}), "one seed in one process"),
    (ppo_config(**{"env.batch_size": 4, "ppo.num_minibatches": 3}),
     "must divide env.batch_size * ppo.num_steps"),
    (jaxwm.config.load("sac:pendulum", {"env.num_envs": 2, "env.batch_size": 1}),
     "sac cannot run env.batch_size=1 < env.num_envs=2"),
])
def test_bad_async_settings_stop_before_anything_is_built(config, message):
    with pytest.raises(ConfigError) as error:
        runner.validate(config)
    assert message in str(error.value)


@pytest.mark.slow  # a learning test (~25 s)
def test_ppo_solves_cartpole_through_an_async_pool_overlapped_with_the_update(tmp_path):
    """16 envs, batches of 8, and the next rollout collected while the update runs: both
    kinds of asynchrony at once. Which envs each batch holds depends on thread timing, so runs
    are not reproducible and vary more than synchronous ones, hence 300k steps and a greedy
    evaluation (the runs: benchmarks/results/learning_cpu.md)."""
    config = ppo_config(**{"env.num_envs": 16, "env.batch_size": 8, "ppo.async_collect": True,
                           "total_env_steps": 300_000, "eval.temperature": 0.0})
    summary = train.run(config, str(tmp_path / "run"))
    assert summary["env_steps"] >= config.total_env_steps
    assert summary["eval/episodic_return"] >= 475.0
