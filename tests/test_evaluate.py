"""Evaluation: unbiased episode quotas, temperature, and its config checks."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.config import ConfigError, base_config, validate_common
from jaxwm.envs import StepResult
from jaxwm.loop.algorithm import Policy
from jaxwm.loop.evaluate import Evaluator, episode_quotas
from jaxwm.nets.distributions import Categorical, DiagGaussian, sample_at_temperature


class LengthIsReturnEnv:
    """Each step pays 1, so an episode's return is its length; each env's episode lengths are
    drawn from {2, 40} by its own seeded generator. Follows envpool's auto-reset: the step
    after ``terminated`` is a reset transition (reward 0, no flags)."""

    def __init__(self, num_envs, seed=0):
        self.spec = types.SimpleNamespace(num_envs=num_envs, max_episode_steps=100)
        self.can_render = False
        rngs = [np.random.default_rng(seed + i) for i in range(num_envs)]
        self.lengths = [rng.choice([2, 40], size=50).tolist() for rng in rngs]

    def _result(self, reward, terminated):
        n = self.spec.num_envs
        return StepResult(obs=np.zeros((n, 1), np.float32), reward=reward,
                          terminated=terminated, truncated=np.zeros(n, bool),
                          episode_over=terminated, raw_reward=reward)

    def reset(self):
        n = self.spec.num_envs
        self.t = np.zeros(n, int)
        self.episode = np.zeros(n, int)
        self.after_done = np.zeros(n, bool)
        return self._result(np.zeros(n, np.float32), np.zeros(n, bool))

    def step(self, action):
        del action
        reward = np.where(self.after_done, 0.0, 1.0).astype(np.float32)
        self.t = np.where(self.after_done, 0, self.t + 1)
        length = np.array([self.lengths[i][e] for i, e in enumerate(self.episode)])
        terminated = ~self.after_done & (self.t == length)
        self.episode = self.episode + terminated
        self.after_done = terminated
        return self._result(reward, terminated)

    def close(self):
        pass


def eval_config(num_envs, num_episodes, temperature=1.0):
    c = base_config()
    c.eval.num_envs, c.eval.num_episodes, c.eval.temperature = num_envs, num_episodes, temperature
    return c


def test_quotas_split_the_episodes_over_at_most_that_many_envs():
    np.testing.assert_array_equal(episode_quotas(10, 4), [3, 3, 2, 2])
    np.testing.assert_array_equal(episode_quotas(3, 8), [1, 1, 1])


def test_every_env_contributes_its_first_episodes_not_the_quickest():
    env = LengthIsReturnEnv(4)
    policy = Policy(init_carry=lambda state, n: (),
                    act=lambda state, carry, obs, is_first, key, t: (carry, np.zeros(len(obs))))
    evaluator = Evaluator(eval_config(4, 10), policy, env=env)
    metrics = evaluator.run(None, jax.random.PRNGKey(0))

    quotas = [3, 3, 2, 2]
    unbiased = [length for lengths, q in zip(env.lengths, quotas, strict=True)
                for length in lengths[:q]]
    assert metrics["eval/episodes"] == 10
    assert metrics["eval/episodic_return"] == pytest.approx(np.mean(unbiased))
    assert metrics["eval/episodic_length"] == pytest.approx(np.mean(unbiased))
    # What "the first 10 episodes to finish" would have reported (an episode of length L
    # ends L + 1 steps after the previous one: the reset transition): biased short.
    finish = sorted((sum(ls[:j + 1]) + j, ls[j]) for ls in env.lengths for j in range(10))
    first_to_finish = np.mean([length for _, length in finish[:10]])
    assert first_to_finish < 0.7 * np.mean(unbiased)  # 17.2 vs 28.6 with these seeds


def test_sampling_at_a_temperature():
    key = jax.random.PRNGKey(3)
    logits = jnp.array([[0.1, 2.0, -1.0], [1.5, 0.0, 0.2]])
    cat = Categorical(logits)
    np.testing.assert_array_equal(sample_at_temperature(cat, key, 0.0), [1, 0])
    np.testing.assert_array_equal(sample_at_temperature(cat, key, 1.0), cat.sample(key))
    np.testing.assert_array_equal(sample_at_temperature(cat, key, 0.5),
                                  Categorical(logits * 2).sample(key))
    gauss = DiagGaussian(jnp.array([0.5, -1.0]), jnp.log(jnp.array([0.2, 1.0])))
    np.testing.assert_allclose(sample_at_temperature(gauss, key, 0.0), [0.5, -1.0])
    noise = jax.random.normal(key, (2,))
    np.testing.assert_allclose(sample_at_temperature(gauss, key, 2.0),
                               jnp.array([0.5, -1.0]) + 2 * jnp.array([0.2, 1.0]) * noise,
                               rtol=1e-6)
    # Low temperatures concentrate on the mode.
    keys = jax.random.split(key, 2000)
    cold = jax.vmap(lambda k: sample_at_temperature(Categorical(logits[0]), k, 0.2))(keys)
    warm = jax.vmap(lambda k: sample_at_temperature(Categorical(logits[0]), k, 1.0))(keys)
    assert float(jnp.mean(cold == 1)) > 0.99 > float(jnp.mean(warm == 1))


def test_negative_temperature_is_refused():
    with pytest.raises(ConfigError, match="eval.temperature must be >= 0"):
        validate_common(eval_config(4, 10, temperature=-0.5))
