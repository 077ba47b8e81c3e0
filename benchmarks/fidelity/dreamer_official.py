"""Run the official DreamerV3 (danijar/dreamerv3) on a Gymnasium task, for the side-by-side
fidelity comparison (benchmarks/fidelity/README.md). Run it with the official code's own
Python environment, never jaxwm's:

  <official-venv>/bin/python benchmarks/fidelity/dreamer_official.py --src <dreamerv3 checkout> \
      --configs size1m --task gym_CartPole-v1 --seed 1 --logdir runs/fidelity/official/s1 ...

Everything after ``--src`` goes to the official ``dreamerv3/main.py`` unchanged. The one
thing this file adds: the official ``embodied/envs/from_gym.py`` speaks the old Gym API
(``reset() -> obs``, ``step() -> (obs, reward, done, info)``), which no maintained Gym or
Gymnasium release returns any more, so ``gym.make`` is replaced with a Gymnasium env behind
that API. ``is_terminal`` comes from Gymnasium's ``terminated`` (FromGym reads it from
``info``), so a time-limit truncation is not a terminal, as in jaxwm. No official code is
copied or changed.
"""

import argparse
import sys


class OldGymAPI:
    """A Gymnasium env behind the pre-0.26 Gym API that the official FromGym expects."""

    def __init__(self, env):
        self._env = env
        self.observation_space = env.observation_space
        self.action_space = env.action_space

    def reset(self):
        obs, _ = self._env.reset()
        return obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self._env.step(action)
        info = dict(info, is_terminal=bool(terminated))
        return obs, reward, bool(terminated or truncated), info

    def close(self):
        self._env.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="a checkout of danijar/dreamerv3")
    args, official_args = parser.parse_known_args()
    sys.path.insert(0, args.src)
    sys.path.insert(1, f"{args.src}/dreamerv3")

    import gymnasium
    from embodied.envs import from_gym

    from_gym.gym.make = lambda name, **kw: OldGymAPI(gymnasium.make(name, **kw))
    from dreamerv3 import main as official_main

    official_main.main(official_args)


if __name__ == "__main__":
    main()
