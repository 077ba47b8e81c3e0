"""Evaluation on its own env pool, on the host path (no XLA handle), with optional video;
for an env written in JAX, as one compiled program.

Runs the algorithm's policy (the ``jaxwm.envs.acting.Policy`` its training collection acts
with, jitted here, its ``extras`` dropped) at ``eval.temperature`` (0: the distribution's mode; 1: the
policy as trained; SimPLe evaluates at 0.5) and reports the mean/std raw return of
``eval.num_episodes`` real episodes (``episode_over``: for Atari, game over, not a lost life).

Unbiased by construction: each env owes a fixed quota of episodes (``num_episodes`` split as
evenly as possible, so the pool has at most ``num_episodes`` envs) and only its first
``quota`` episodes count. Keeping "the first N episodes to finish across the pool" instead
would over-sample short episodes, and so bias the return toward whatever makes episodes end
early (in CartPole, failing).

An env written in JAX (``envs.native``) is evaluated on the device: the same loop as one
``lax.while_loop`` (``_run_on_device``), with the same episodes (the pool's next reset seed),
quotas and step cap, so its results equal the host path's; with a video or noise the host
path runs instead.

With several seeds (``config.num_seeds``; the policy is then ``acting.grouped``) the pool
holds each seed's envs in turn, every seed gets the same quotas, and the metrics are
``PerSeed``: each seed's mean.

Noisy evaluation (GORMPO's robustness wrappers, ``RandomNormalNoisyActions`` /
``RandomNormalNoisyTransitions``): ``eval.action_noise`` adds N(0, sigma^2) to every action
dimension before the env sees it (then clipped to the action box) and ``eval.obs_noise``
adds N(0, sigma^2) to the observations the policy sees; both at once is their combined
wrapper. The noise has its own generator seeded from the run's seed, so evaluations repeat.

Where the algorithm knows reference returns (``Algorithm.score_reference``, an offline dataset's),
D4RL's normalised score is reported beside the return: ``eval/normalized_score`` and its std
over episodes. For the 26 Atari 100k games, whatever the algorithm, the human-normalised
score (``jaxwm.scores``) is: ``eval/human_normalized_score``. Where the env reports outcomes
of its episodes (``EnvSpec.outcomes``: Craftax's and Crafter's achievements), each one's mean
over the evaluated episodes is too: ``eval/achievements/<name>``, a success rate in [0, 1].

A video records env 0's first episode, a frame before each step and the episode's last one,
and is returned as a ``metrics.Video``, which the loop writes as a GIF (Pillow ships with
matplotlib's dependencies, so no ffmpeg is needed) and as an MP4 beside it where an encoder is
installed (``pip install -e '.[video]'``). envpool's envs give envpool's rendered frames,
MuJoCo and DMC through EGL (``jaxwm.envs.mujoco_video``: the evaluated episode itself, drawn
from env 0's own state; building the pool checks that EGL works here, and otherwise stops
before training with one ``ConfigError`` line saying what to install); host envs (Crafter,
DMC from pixels) give their observed frames.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm import backend
from jaxwm.config import ConfigError
from jaxwm.envs import EpisodeStats, acting, make_env
from jaxwm.loop import seeds
from jaxwm.loop.metrics import PerSeed, Video
from jaxwm.scores import atari_game, human_normalized_score, normalized_score


def episode_quotas(num_episodes: int, num_envs: int) -> np.ndarray:
    """``num_episodes`` split over ``min(num_envs, num_episodes)`` envs, the first ones
    taking one more where it does not divide."""
    envs = min(num_envs, num_episodes)
    return np.array([num_episodes // envs + (i < num_episodes % envs) for i in range(envs)])


class Evaluator:
    """Evaluates ``policy`` with the parameters ``params_of(state)``."""

    def __init__(self, config, policy, params_of=lambda state: state, score_reference=None,
                 env=None, seed_offset: int = seeds.EVAL_SEED_OFFSET):
        num_seeds = config.num_seeds
        self.config = config.eval
        self.policy = policy = acting.grouped(policy, num_seeds)
        self.params_of = params_of
        self.score_reference = score_reference
        self.env_id = config.env.id
        self.act = backend.jit(lambda params, carry, obs, is_first, key, temperature:
                               policy.act(params, carry, obs, is_first, key, temperature)[:2])
        self.num_seeds = num_seeds
        self.quotas = np.tile(episode_quotas(config.eval.num_episodes, config.eval.num_envs),
                              self.num_seeds)
        self.env = env if env is not None else make_env(
            config.env, num_envs=len(self.quotas), seed=config.seed + seed_offset,
            render=bool(config.eval.video))
        if self.env.spec.num_envs != len(self.quotas):
            raise ValueError(f"The evaluation pool has {self.env.spec.num_envs} envs; "
                             f"{len(self.quotas)} are needed for the quotas {self.quotas}.")
        if self.config.video and not self.env.can_render:
            self.env.close()
            raise ConfigError(f"eval.video is not available for {config.env.id}: its env cannot "
                              "render. Set --config.eval.video=False.")
        self.action_noise = float(self.config.action_noise)
        self.obs_noise = float(self.config.obs_noise)
        if self.action_noise and self.env.spec.action_low is None:
            self.env.close()
            raise ConfigError(f"eval.action_noise needs a continuous action space; "
                              f"{config.env.id}'s is discrete. Set --config.eval.action_noise=0.")
        self.noise = np.random.default_rng(config.seed + seed_offset)
        self._device_episodes = None

    @classmethod
    def for_algorithm(cls, config, algorithm) -> Evaluator:
        return cls(config, algorithm.policy, algorithm.policy_params,
                   algorithm.score_reference)

    def run(self, state, key) -> dict:
        if getattr(self.env, "in_state", False) and not self.config.video \
                and not self.action_noise and not self.obs_noise:
            return self._run_on_device(state, key)
        return self._run_on_host(state, key)

    def _run_on_host(self, state, key) -> dict:
        env, quotas = self.env, self.quotas
        temperature = jnp.float32(self.config.temperature)
        res = env.reset()
        params = self.params_of(state)
        carry = self.policy.init_carry(params, env.spec.num_envs)
        is_first = np.ones(env.spec.num_envs, bool)
        stats = EpisodeStats.create(env.spec.num_envs)
        returns = [[] for _ in quotas]
        lengths = [[] for _ in quotas]
        outcomes = {name: [[] for _ in quotas] for name in env.spec.outcomes}
        frames = []
        recording = bool(self.config.video)
        # A generous cap so that a policy that never ends an episode cannot hang the run.
        max_steps = int(quotas.max()) * max(env.spec.max_episode_steps, 1) + 1000
        for _ in range(max_steps):
            if recording:
                frames.append(env.render())
            key, act_key = seeds.split(key)
            obs = res.obs
            if self.obs_noise:
                obs = obs + self.noise.normal(0.0, self.obs_noise, obs.shape).astype(obs.dtype)
            carry, action = self.act(params, carry, obs, is_first, act_key, temperature)
            action = np.asarray(action)
            if self.action_noise:
                action = np.clip(action + self.noise.normal(0.0, self.action_noise, action.shape),
                                 env.spec.action_low, env.spec.action_high).astype(action.dtype)
            prev_done = res.done
            res = env.step(action)
            stats, completed = stats.update(res)
            completed = jax.device_get(completed)
            is_first = np.asarray(prev_done)
            for i in np.flatnonzero(completed["mask"]):
                if len(returns[i]) < quotas[i]:
                    returns[i].append(float(completed["return"][i]))
                    lengths[i].append(float(completed["length"][i]))
                    for name, per_env in outcomes.items():
                        per_env[i].append(float(completed["outcomes"][name][i]))
                if i == 0 and recording:
                    frames.append(env.render())  # the episode's last state (reset next step)
                    recording = False
            if not recording and all(len(r) >= q for r, q in zip(returns, quotas, strict=True)):
                break
        metrics = self._summarise(returns, lengths, outcomes)
        if frames:
            metrics["eval/video"] = Video(np.stack([np.asarray(f, np.uint8) for f in frames]),
                                          fps=30)
        return metrics

    def _run_on_device(self, state, key) -> dict:
        """``run`` for an env written in JAX (``envs.native``): the same episodes, quotas and
        cap, as one compiled ``lax.while_loop`` of env and policy steps (the host path's
        per-step calls and syncs left out); the pool's next reset seed as the host path's."""
        env = self.env
        if self._device_episodes is None:
            self._device_episodes = backend.jit(self._episodes_program())
        seed = env.next_host_seed()
        returns, lengths, outcomes, counts = jax.device_get(self._device_episodes(
            self.params_of(state), key, jnp.int32(seed), jnp.float32(self.config.temperature)))
        counted = lambda per_env: [list(x[:c]) for x, c in zip(per_env, counts, strict=True)]  # noqa: E731
        return self._summarise(counted(returns), counted(lengths),
                               {name: counted(v) for name, v in outcomes.items()})

    def _episodes_program(self):
        env, policy, quotas = self.env, self.policy, jnp.asarray(self.quotas)
        n, most = len(self.quotas), int(self.quotas.max())
        max_steps = most * max(env.spec.max_episode_steps, 1) + 1000  # as ``run``'s cap

        def episodes(params, key, seed, temperature):
            env_state, rows = env.start(seed)
            rows_of = jnp.arange(n)

            def more(loop):
                return (loop["t"] < max_steps) & jnp.any(loop["counts"] < quotas)

            def step(loop):
                key, act_key = seeds.split(loop["key"])
                carry, action, _ = policy.act(params, loop["carry"], loop["rows"].obs,
                                              loop["is_first"], act_key, temperature)
                env_state, rows = env.xla_step(loop["env"], action)
                stats, completed = loop["stats"].update(rows)
                counts = loop["counts"]
                take = completed["mask"] & (counts < quotas)
                slot = jnp.minimum(counts, most - 1)
                keep = lambda old, new: old.at[rows_of, slot].set(  # noqa: E731
                    jnp.where(take, new, old[rows_of, slot]))
                return dict(t=loop["t"] + 1, key=key, env=env_state, rows=rows, carry=carry,
                            is_first=loop["rows"].done, stats=stats, counts=counts + take,
                            returns=keep(loop["returns"], completed["return"]),
                            lengths=keep(loop["lengths"], completed["length"]),
                            outcomes={name: keep(loop["outcomes"][name], value)
                                      for name, value in completed["outcomes"].items()})

            zeros = jnp.zeros((n, most), jnp.float32)
            start = dict(t=jnp.int32(0), key=key, env=env_state, rows=rows,
                         carry=policy.init_carry(params, n), is_first=jnp.ones(n, bool),
                         stats=EpisodeStats.create(n), counts=jnp.zeros(n, jnp.int32),
                         returns=zeros, lengths=zeros,
                         outcomes={name: zeros for name in env.spec.outcomes})
            out = jax.lax.while_loop(more, step, start)
            return out["returns"], out["lengths"], out["outcomes"], out["counts"]

        return episodes

    def _summarise(self, returns, lengths, outcomes) -> dict:
        """Per seed, from ``[env][episode]`` lists: the mean return (and its std) and length,
        normalised scores where known, and each outcome's mean over episodes
        (``eval/achievements/<name>``: the share of episodes that unlocked it)."""
        def by_seed(per_env):  # [env][episode] -> [seed][episode]
            group = len(per_env) // self.num_seeds
            return [[x for per in per_env[k * group:(k + 1) * group] for x in per]
                    for k in range(self.num_seeds)]

        returns, lengths = by_seed(returns), by_seed(lengths)
        if not all(returns):
            return {}
        stats = {"eval/episodic_return": [np.mean(r) for r in returns],
                 "eval/episodic_return_std": [np.std(r) for r in returns],
                 "eval/episodic_length": [np.mean(n) for n in lengths],
                 **{f"eval/{name}": [np.mean(x) for x in by_seed(per_env)]
                    for name, per_env in outcomes.items()}}
        if self.score_reference is not None:
            scores = [normalized_score(r, self.score_reference) for r in returns]
            stats["eval/normalized_score"] = [np.mean(s) for s in scores]
            stats["eval/normalized_score_std"] = [np.std(s) for s in scores]
        if atari_game(self.env_id) is not None:
            stats["eval/human_normalized_score"] = [
                np.mean(human_normalized_score(r, self.env_id)) for r in returns]
        wrap = (lambda v: float(v[0])) if self.num_seeds == 1 else \
            (lambda v: PerSeed(np.asarray(v, np.float64)))
        return {**{name: wrap(v) for name, v in stats.items()},
                "eval/episodes": float(sum(len(r) for r in returns))}

    def close(self) -> None:
        self.env.close()
