"""baselines.common.vec_env.util (openai/baselines), as MBARC's DummyVecEnv imports it."""
import gym
import numpy as np


def copy_obs_dict(obs):
    return {k: np.copy(v) for k, v in obs.items()}


def dict_to_obs(obs_dict):
    if set(obs_dict.keys()) == {None}:
        return obs_dict[None]
    return obs_dict


def obs_space_info(obs_space):
    if isinstance(obs_space, gym.spaces.Dict):
        subspaces = obs_space.spaces
    elif isinstance(obs_space, gym.spaces.Tuple):
        subspaces = {i: s for i, s in enumerate(obs_space.spaces)}
    else:
        subspaces = {None: obs_space}
    keys = list(subspaces)
    return (keys, {k: subspaces[k].shape for k in keys}, {k: subspaces[k].dtype for k in keys})
