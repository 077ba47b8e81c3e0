"""Evaluation: unbiased episode quotas, temperature, and its config checks."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.config import ConfigError, base_config, validate_common
from jaxwm.envs import StepResult
from jaxwm.envs.acting import Policy
from jaxwm.loop.evaluate import Evaluator, episode_quotas
from jaxwm.nets.distributions import Categorical, DiagGaussian, sample_at_temperature


class LengthIsReturnEnv:
    """Each step pays 1, so an episode's return is its length; each env's episode lengths are
    drawn from {2, 40} by its own seeded generator. Follows envpool's auto-reset: the step
    after ``terminated`` is a reset transition (reward 0, no flags)."""

    def __init__(self, num_envs, seed=0):
        self.spec = types.SimpleNamespace(num_envs=num_envs, max_episode_steps=100, outcomes=())
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
    policy = Policy(init_carry=lambda params, n: (),
                    act=lambda params, carry, obs, is_first, key, t: (
                        carry, jnp.zeros(len(obs)), {}))
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


class RecordingEnv:
    """A continuous-action env that records the actions it receives: zero observations,
    reward 1 per step, episodes of 10 steps (envpool's reset step after each)."""

    def __init__(self, num_envs=2, discrete=False):
        self.spec = types.SimpleNamespace(
            num_envs=num_envs, max_episode_steps=10, outcomes=(),
            action_low=None if discrete else np.array([-1.0, -1.0], np.float32),
            action_high=None if discrete else np.array([1.0, 1.0], np.float32))
        self.can_render = False
        self.actions = []

    def _result(self, reward, terminated):
        n = self.spec.num_envs
        return StepResult(obs=np.zeros((n, 3), np.float32), reward=reward,
                          terminated=terminated, truncated=np.zeros(n, bool),
                          episode_over=terminated, raw_reward=reward)

    def reset(self):
        self.t = 0
        return self._result(np.zeros(self.spec.num_envs, np.float32),
                            np.zeros(self.spec.num_envs, bool))

    def step(self, action):
        self.actions.append(np.array(action))
        self.t += 1
        n = self.spec.num_envs
        reset_step = self.t % 11 == 0
        return self._result(np.full(n, 0.0 if reset_step else 1.0, np.float32),
                            np.full(n, self.t % 11 == 10))

    def close(self):
        pass


def _noisy_run(action_noise=0.0, obs_noise=0.0, reference=None):
    config = base_config()
    config.eval.num_envs, config.eval.num_episodes = 2, 20
    config.eval.action_noise, config.eval.obs_noise = action_noise, obs_noise
    seen = []

    def act(params, carry, obs, is_first, key, temperature):
        jax.debug.callback(lambda o: seen.append(np.array(o)), obs)  # runs every call
        return carry, jnp.full((obs.shape[0], 2), 0.5, jnp.float32), {}

    env = RecordingEnv()
    evaluator = Evaluator(config, Policy(lambda params, n: (), act),
                          score_reference=reference, env=env)
    metrics = evaluator.run(None, jax.random.PRNGKey(0))
    return metrics, np.concatenate(seen), np.concatenate(env.actions)


def test_noisy_evaluation_perturbs_actions_and_observations_and_reports_scores():
    metrics, obs, actions = _noisy_run()
    assert np.all(obs == 0) and np.all(actions == 0.5)
    assert metrics["eval/episodic_return"] == 10.0 and "eval/normalized_score" not in metrics

    _, obs, actions = _noisy_run(action_noise=0.3)
    assert np.all(obs == 0)
    assert 0.25 < np.std(actions - 0.5) < 0.32 and actions.max() <= 1.0  # clipped to the box
    assert np.any(actions == 1.0)

    metrics, obs, actions = _noisy_run(obs_noise=0.2, reference=(0.0, 20.0))
    assert np.all(actions == 0.5) and abs(np.std(obs) - 0.2) < 0.02
    assert metrics["eval/normalized_score"] == pytest.approx(50.0)
    assert metrics["eval/normalized_score_std"] == pytest.approx(0.0)


def test_action_noise_needs_continuous_actions():
    config = base_config()
    config.eval.num_envs, config.eval.action_noise = 2, 0.1
    with pytest.raises(ConfigError, match="continuous action space"):
        Evaluator(config, Policy(lambda params, n: (), None), env=RecordingEnv(discrete=True))
    config.eval.action_noise = -1.0
    with pytest.raises(ConfigError, match="standard deviations"):
        validate_common(config)


def test_atari_evaluations_report_the_human_normalised_score():
    """Pong's table: random -20.7, human 14.6; every return here is 10 (RecordingEnv)."""
    from jaxwm.scores import human_normalized_score

    np.testing.assert_allclose(human_normalized_score([-20.7, 14.6, 10.0], "Pong-v5"),
                               [0.0, 1.0, 30.7 / 35.3])
    assert np.isnan(human_normalized_score(10.0, "CartPole-v1"))
    config = base_config()
    config.env.id = "Pong-v5"
    config.eval.num_envs, config.eval.num_episodes = 2, 4
    policy = Policy(lambda params, n: (), lambda params, carry, obs, is_first, key, t:
                    (carry, jnp.zeros((obs.shape[0], 2)), {}))
    metrics = Evaluator(config, policy, env=RecordingEnv()).run(None, jax.random.PRNGKey(0))
    assert metrics["eval/human_normalized_score"] == pytest.approx((10.0 + 20.7) / 35.3)
    config.env.id = "CartPole-v1"
    metrics = Evaluator(config, policy, env=RecordingEnv()).run(None, jax.random.PRNGKey(0))
    assert "eval/human_normalized_score" not in metrics
