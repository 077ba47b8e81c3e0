"""Python-package envs behind the envpool interface (jaxwm.envs.host): Crafter."""

import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxwm.config
from jaxwm import train
from jaxwm.config import ConfigError
from jaxwm.envs import EnvSpec, EpisodeStats, make_env
from jaxwm.envs.host import HostEnv
from jaxwm.runner import validate

# The HostEnv tests (Countdown) need no package; the Crafter ones need it, and the dev extra
# (the README's test command, and CI) installs it: they skip only where it was left out.
needs_crafter = pytest.mark.skipif(importlib.util.find_spec("crafter") is None,
                                   reason="crafter not installed (pip install -e '.[dev]' has it)")


def crafter_env(num_envs=2, seed=0, limit=12):
    return make_env({"id": "crafter", "max_episode_steps": limit}, num_envs=num_envs, seed=seed)


@needs_crafter
def test_crafter_follows_envpools_auto_reset_convention():
    env = crafter_env(limit=12)
    first = env.reset()
    assert env.spec.obs_shape == (3, 64, 64) and first.obs.dtype == np.uint8
    assert env.spec.num_actions == 17 and env.spec.max_episode_steps == 12
    stats = EpisodeStats.create(2)
    results = []
    for _ in range(13):  # noop: nobody dies in 12 steps, so the limit truncates
        res = env.step(np.zeros(2, np.int32))
        stats, completed = stats.update(res)
        results.append((res, completed))
    ended, completed = results[11]
    assert ended.truncated.all() and not ended.terminated.any() and ended.episode_over.all()
    np.testing.assert_array_equal(completed["length"], [12, 12])
    after = results[12][0]  # the reset transition: new first observation, reward 0, no flags
    assert not after.done.any() and (after.reward == 0).all()
    assert not np.array_equal(after.obs, ended.obs)
    assert env.render().shape == (64, 64, 3)
    # Crafter's 22 achievements, read at the episode's end (a noop unlocks none of them)
    assert len(env.spec.outcomes) == 22 and "achievements/collect_diamond" in env.spec.outcomes
    assert set(completed["outcomes"]) == set(env.spec.outcomes)
    assert all(not v.any() for v in completed["outcomes"].values())


class Countdown:
    """A deterministic old-Gym-API env: obs is [t, action, episode]; an episode lasts
    ``die`` steps and ends in death (discount 0) on odd episodes, at the limit (discount 1)
    on even ones."""

    def __init__(self, seed, die=4):
        self.episode, self.die, self.seed = seed - 1, die, seed

    def reset(self):
        self.episode, self.t = self.episode + 1, 0
        return np.array([0, 0, self.episode], np.float32)

    def step(self, action):
        self.t += 1
        done = self.t == self.die + self.seed
        discount = 0.0 if done and self.episode % 2 else 1.0
        return np.array([self.t, action, self.episode], np.float32), float(action), done, \
            {"discount": discount, "achievements": {"odd_episode": self.episode % 2}}


def countdown_env(num_envs=2):
    """Countdowns whose episodes report one outcome: whether the episode was odd."""
    spec = EnvSpec(env_id="countdown", family="test", num_envs=num_envs, obs_shape=(3,),
                   obs_dtype=np.dtype(np.float32), discrete=True, num_actions=3, action_shape=(),
                   action_low=None, action_high=None, max_episode_steps=10,
                   outcomes=("achievements/odd_episode",))
    return HostEnv(spec, Countdown, seed=0, observe=lambda obs: obs,
                   outcomes=lambda info: {"achievements/odd_episode":
                                          float(info["achievements"]["odd_episode"] > 0)})


def test_host_env_reports_termination_truncation_and_the_reset_step_like_envpool():
    env = countdown_env()
    env.reset()
    results = [env.step(np.array([1, 2])) for _ in range(6)]
    # Env 0 (seed 0, episode 0: even) ends at its 4th step by the limit: truncated.
    assert results[3].truncated[0] and not results[3].terminated[0]
    np.testing.assert_array_equal(results[3].obs[0], [4, 1, 0])
    # Its next step is the reset step: action ignored, reward 0, a new episode's first obs.
    np.testing.assert_array_equal(results[4].obs[0], [0, 0, 1])
    assert results[4].reward[0] == 0 and not results[4].done[0]
    # Env 1 (seed 1, episode 1: odd) dies at its 5th step: terminated.
    assert results[4].terminated[1] and not results[4].truncated[1]
    assert results[4].reward[1] == 2.0
    # Outcomes at an episode's last step only: env 0's even episode 0, env 1's odd episode 1.
    odd = np.stack([r.outcomes["achievements/odd_episode"] for r in results])
    np.testing.assert_array_equal(odd[:, 0], 0)
    np.testing.assert_array_equal(odd[:, 1], [0, 0, 0, 0, 1, 0])


def test_host_env_xla_step_in_a_scan_equals_the_host_path():
    actions = np.random.default_rng(0).integers(0, 3, (20, 2)).astype(np.int32)
    host = countdown_env()
    host.reset()
    expected = [host.step(a) for a in actions]
    xla = countdown_env()
    handle, _ = xla.xla_reset()
    _, got = jax.jit(lambda h, a: jax.lax.scan(xla.xla_step, h, a))(handle, jnp.asarray(actions))
    for t, res in enumerate(expected):
        for field in ("obs", "reward", "terminated", "truncated", "episode_over"):
            np.testing.assert_array_equal(np.asarray(getattr(got, field)[t]), getattr(res, field))
        np.testing.assert_array_equal(np.asarray(got.outcomes["achievements/odd_episode"][t]),
                                      res.outcomes["achievements/odd_episode"])


def test_crafter_without_the_package_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "crafter", None)  # import crafter -> ImportError
    config = jaxwm.config.load("dreamer:crafter")
    with pytest.raises(ConfigError, match="pip install crafter"):
        validate(config)


@needs_crafter
def test_dreamer_collects_and_evaluates_on_crafter(tmp_path):
    """dreamer:crafter at toy sizes, its prefill phase: Crafter stepped from the
    jitted collect (io_callback), its frames in the uint8 replay, and an evaluation episode
    through the policy. (Training on 64x64 images is test_dreamer.py's Pong test.)"""
    overrides = {"total_env_steps": 16, "dreamer.prefill": 16, "dreamer.batch_size": 2,
                 "dreamer.batch_length": 8, "dreamer.model_size": "1m", "dreamer.capacity": 100,
                 "dreamer.num_bins": 5, "dreamer.report_length": 8, "dreamer.report_context": 3,
                 "env.max_episode_steps": 10, "eval.num_episodes": 1,
                 "eval.num_envs": 1, "log.every": "8 env_steps", "checkpoint.every": "never",
                 "log.progress": False, "phase_order": ("prefill",)}
    config = jaxwm.config.load("dreamer:crafter", overrides)
    config.dreamer.size_overrides = dict(deter=16, hidden=8, classes=4, units=16, depth=2)
    summary = train.run(config, str(tmp_path / "run"))
    assert summary["env_steps"] == 16 and summary["counters"]["model_updates"] == 0
    assert summary["eval/episodic_length"] == 10  # a 10-step episode, truncated
