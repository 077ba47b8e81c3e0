"""Evaluation on its own env pool, on the host path (no XLA handle), with optional video.

Runs the algorithm's policy (greedy = distribution mode, or sampled) until ``num_episodes``
real episodes have finished (``episode_over``: for Atari, game over, not a lost life), and
reports their mean/std raw return. A video records env 0's first episode as a GIF (Pillow
ships with matplotlib's dependencies, so no ffmpeg is needed).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from jaxwm.config import ConfigError
from jaxwm.envs import EpisodeStats, make_env


class Evaluator:
    def __init__(self, config, policy, seed_offset: int = 10_000):
        self.config = config.eval
        self.policy = policy
        self.env = make_env(config.env, num_envs=config.eval.num_envs,
                            seed=config.seed + seed_offset)
        if self.config.video and not self.env.can_render:
            self.env.close()
            raise ConfigError(f"eval.video is not available for {config.env.id}: envpool cannot "
                              "render MuJoCo/DMC envs here. Set --config.eval.video=False.")

    def run(self, state, key, video_path: str | None = None) -> dict[str, float]:
        env, cfg = self.env, self.config
        res = env.reset()
        carry = self.policy.init_carry(state, env.spec.num_envs)
        is_first = np.ones(env.spec.num_envs, bool)
        stats = EpisodeStats.create(env.spec.num_envs)
        returns, lengths, frames = [], [], []
        recording = video_path is not None
        # A generous cap so that a policy that never ends an episode cannot hang the run.
        max_steps = cfg.num_episodes * max(env.spec.max_episode_steps, 1) + 1000
        for _ in range(max_steps):
            if recording:
                frames.append(env.render())
            key, act_key = jax.random.split(key)
            carry, action = self.policy.act(state, carry, res.obs, is_first, act_key, cfg.greedy)
            prev_done = res.done
            res = env.step(np.asarray(action))
            stats, completed = stats.update(res)
            is_first = np.asarray(prev_done)
            mask = np.asarray(completed["mask"])
            if recording and mask[0]:
                recording = False
                self._write_video(frames, video_path)
            returns.extend(np.asarray(completed["return"])[mask].tolist())
            lengths.extend(np.asarray(completed["length"])[mask].tolist())
            if len(returns) >= cfg.num_episodes and not recording:  # the video needs its episode
                break
        returns = returns[: cfg.num_episodes]
        if not returns:
            return {}
        return {
            "eval/episodic_return": float(np.mean(returns)),
            "eval/episodic_return_std": float(np.std(returns)),
            "eval/episodic_length": float(np.mean(lengths[: cfg.num_episodes])),
            "eval/episodes": float(len(returns)),
        }

    @staticmethod
    def _write_video(frames, path: str) -> None:
        import imageio.v2 as imageio

        os.makedirs(os.path.dirname(path), exist_ok=True)
        frames = [np.asarray(f, dtype=np.uint8) for f in frames]
        imageio.mimsave(path, frames, duration=1000 / 30, loop=0)

    def close(self) -> None:
        self.env.close()
