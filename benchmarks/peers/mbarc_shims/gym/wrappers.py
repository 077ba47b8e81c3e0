"""gym 0.15's TimeLimit (imported by MBARC's real-env module, unused on the timed paths)."""
from . import Wrapper


class TimeLimit(Wrapper):
    def __init__(self, env, max_episode_steps=None):
        super().__init__(env)
        self._max_episode_steps = max_episode_steps
