"""Imported by MBARC's real-env module; the benchmark builds no real env."""
from gym import Wrapper


class NoopResetEnv(Wrapper):
    def __init__(self, env, noop_max=30):
        super().__init__(env)
        self.noop_max = noop_max
