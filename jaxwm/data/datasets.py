"""Offline datasets from local files: D4RL-format HDF5 and Minari datasets, one result.

``load_dataset(path)`` returns a ``Dataset`` of transitions whatever the file's layout, with
the batch keys SAC's update reads (``jaxwm.agents.sac``): ``obs``, ``action``, ``reward``,
``next_obs``, ``terminated``. Nothing is downloaded: a user with real D4RL or Minari files
points the config at them; ``python -m jaxwm.tools.make_dataset`` writes D4RL-format files.

D4RL (Fu et al. 2020, "D4RL: Datasets for Deep Data-Driven RL"): one HDF5 file with
``observations``, ``actions``, ``rewards``, ``terminals``, ``timeouts`` (and often
``next_observations``), ``infos/*``, ``metadata/*``. Timeouts follow ``d4rl.qlearning_dataset``:
a step whose ``timeouts`` flag is set is dropped (its successor row starts a new episode, so
without ``next_observations`` it has no next state), and terminals never bootstrap. Where the
file has ``next_observations`` they are used; otherwise row i+1's observation is row i's next
state, and the last row is dropped.

Minari (Farama; ``<namespace>/<env>/<name>-vK/data/main_data.hdf5``): one group
``episode_<i>`` per episode holding ``observations`` (T+1 rows), ``actions``, ``rewards``,
``terminations``, ``truncations`` (T rows). Every step has its true next observation, so
truncated last steps are kept (they bootstrap).

Why h5py: both formats are HDF5, and h5py is the maintained reader the formats are written
with.

D4RL-normalised score (``jaxwm.scores``): 100 (R - min) / (max - min) with D4RL's reference
returns for hopper, halfcheetah and walker2d; other envs use the ``metadata/ref_min_score`` /
``metadata/ref_max_score`` that ``make_dataset`` records (its own random and expert returns).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxwm.scores import D4RL_REFERENCE, normalized_score, reference_returns  # noqa: F401

D4RL_KEYS = ("observations", "actions", "rewards", "terminals")
MINARI_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")


class DatasetError(ValueError):
    """The dataset file is missing or malformed; the message says what and where."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Transitions (numpy, leading axis N) and what is known about where they came from."""

    transitions: Mapping[str, np.ndarray]  # obs, action, reward, next_obs, terminated
    path: str
    format: str  # "d4rl" | "minari"
    metadata: Mapping[str, Any]

    def __len__(self) -> int:
        return len(self.transitions["reward"])

    @property
    def obs_dim(self) -> int:
        return self.transitions["obs"].shape[1]

    @property
    def action_dim(self) -> int:
        return self.transitions["action"].shape[1]

    @property
    def reference_returns(self) -> tuple[float, float] | None:
        """(min, max) returns for the normalised score, or None where none is known."""
        meta = self.metadata
        if "ref_min_score" in meta and "ref_max_score" in meta:
            return float(meta["ref_min_score"]), float(meta["ref_max_score"])
        env_id = str(meta.get("env_id", "")) or os.path.basename(self.path)
        return reference_returns(env_id)

    def episode_starts(self) -> np.ndarray:
        """Row indices where an episode starts: row 0, and every row after a terminal step or
        after a step whose next state is not the following row's (a timeout, or a dropped
        timeout row: ``load_dataset`` keeps only steps with a next state)."""
        t = self.transitions
        breaks = t["terminated"][:-1] | np.any(t["next_obs"][:-1] != t["obs"][1:], axis=1)
        return np.concatenate([[0], np.nonzero(breaks)[0] + 1]).astype(np.int64)

    def check_matches(self, obs_shape, action_shape, env_id: str = "") -> None:
        """Refuses a dataset whose observation or action sizes differ from the env's."""
        want = (tuple(obs_shape), tuple(action_shape))
        got = (self.transitions["obs"].shape[1:], self.transitions["action"].shape[1:])
        if want != got:
            raise DatasetError(
                f"{self.path}: observations {got[0]} / actions {got[1]} per step, but the env "
                f"{env_id or ''} has {want[0]} / {want[1]}: the dataset was made for another "
                "env; set --config.env.id to its env (metadata env_id: "
                f"{self.metadata.get('env_id', 'not recorded')}).")


def load_dataset(path: str) -> Dataset:
    """D4RL-format HDF5 file, or a Minari dataset (its directory or its main_data.hdf5)."""
    import h5py

    path = os.path.expanduser(path)
    file = _locate(path)
    try:
        f = h5py.File(file, "r")
    except OSError as e:
        size = os.path.getsize(file)
        raise DatasetError(
            f"{file} is not an HDF5 file ({'empty' if size == 0 else f'{size} bytes'}; h5py: "
            f"{e}); a dataset is a D4RL or Minari HDF5 file: point --config.dataset at one, or "
            "make one with `python -m jaxwm.tools.make_dataset`.") from None
    with f:
        if any(name.startswith("episode_") for name in f.keys()):
            return _minari(f, file)
        return _d4rl(f, file)


def _locate(path: str) -> str:
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        for candidate in (os.path.join(path, "data", "main_data.hdf5"),
                          os.path.join(path, "main_data.hdf5")):
            if os.path.isfile(candidate):
                return candidate
        found = glob.glob(os.path.join(path, "*.hdf5"))
        if len(found) == 1:
            return found[0]
        raise DatasetError(f"{path} is a directory without data/main_data.hdf5 (Minari) or "
                           f"exactly one .hdf5 file (found {len(found)}): pass the file itself.")
    raise DatasetError(
        f"No dataset at {path} (looked for that file or directory; relative paths start at "
        f"{os.getcwd()}). Make one with `python -m jaxwm.tools.make_dataset --env=... "
        "--level=... --out=...`, or point --config.dataset at a D4RL/Minari file.")


def _metadata(group) -> dict[str, Any]:
    out: dict[str, Any] = dict(group.attrs) if group is not None else {}
    if group is not None:
        for name, item in group.items():
            if hasattr(item, "shape") and item.shape == ():
                value = item[()]
                out[name] = value.decode() if isinstance(value, bytes) else value
    if isinstance(out.get("generation"), str):  # make_dataset's record, written as JSON
        out["generation"] = json.loads(out["generation"])
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in out.items()}


def _require(f, keys, where: str) -> None:
    missing = [k for k in keys if k not in f]
    if missing:
        raise DatasetError(f"{where} lacks {missing} (it has {sorted(f.keys())}); a D4RL file "
                           f"needs {list(D4RL_KEYS)} (+ timeouts, next_observations), a Minari "
                           f"episode {list(MINARI_KEYS)}.")


def _d4rl(f, file: str) -> Dataset:
    _require(f, D4RL_KEYS, file)
    data = {k: np.asarray(f[k]) for k in D4RL_KEYS}
    n = len(data["rewards"])
    timeouts = np.asarray(f["timeouts"], bool) if "timeouts" in f else np.zeros(n, bool)
    has_next = "next_observations" in f
    lengths = {k: len(v) for k, v in data.items()}
    lengths["timeouts"] = len(timeouts)
    if has_next:
        data["next_observations"] = np.asarray(f["next_observations"])
        lengths["next_observations"] = len(data["next_observations"])
    if len(set(lengths.values())) != 1:
        raise DatasetError(f"{file}: arrays of different lengths {lengths}; every key must "
                           "have one row per step.")
    if has_next:
        next_obs = data["next_observations"]
        keep = ~timeouts
    else:  # qlearning_dataset: row i+1 is row i's next state; the last row has none
        next_obs = np.concatenate([data["observations"][1:], data["observations"][-1:]])
        keep = ~timeouts & (np.arange(n) < n - 1)
    transitions = {"obs": data["observations"], "action": data["actions"],
                   "reward": data["rewards"], "next_obs": next_obs,
                   "terminated": data["terminals"]}
    transitions = {k: v[keep] for k, v in transitions.items()}
    file_rows = np.nonzero(keep)[0]  # the file's own row of each transition kept
    return _finish(transitions, file, "d4rl", _metadata(f.get("metadata")),
                   lambda index: [f"row {file_rows[i]}" for i in index])


def _minari(f, file: str) -> Dataset:
    episodes = sorted((k for k in f.keys() if k.startswith("episode_")),
                      key=lambda k: int(k.split("_")[1]))
    parts, places = [], []
    for name in episodes:
        ep = f[name]
        _require(ep, MINARI_KEYS, f"{file}:{name}")
        if not hasattr(ep["observations"], "shape"):
            raise DatasetError(f"{file}:{name}: observations are a group (dict observations); "
                               "only array observations are supported.")
        obs = np.asarray(ep["observations"])
        t = len(ep["actions"])
        if len(obs) != t + 1 or any(len(ep[k]) != t for k in MINARI_KEYS[2:]):
            raise DatasetError(f"{file}:{name}: a Minari episode has T+1 observations and T of "
                               f"everything else; got {len(obs)} observations for {t} actions.")
        parts.append({"obs": obs[:-1], "action": np.asarray(ep["actions"]),
                      "reward": np.asarray(ep["rewards"]), "next_obs": obs[1:],
                      "terminated": np.asarray(ep["terminations"])})
        places += [f"{name} step {step}" for step in range(t)]
    if not parts:
        raise DatasetError(f"{file} has no episode_<i> groups.")
    transitions = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    meta = dict(f.attrs)
    meta = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in meta.items()}
    if "env_spec" in meta:  # Minari stores the gymnasium EnvSpec as JSON
        try:
            meta.setdefault("env_id", json.loads(meta["env_spec"]).get("id", ""))
        except (TypeError, ValueError):
            pass
    return _finish(transitions, file, "minari", meta,
                   lambda index: [places[i] for i in index])


def _finish(transitions, file: str, fmt: str, metadata, locate) -> Dataset:
    """The transitions as float32/bool arrays, checked; ``locate(indices)`` names where in the
    file transitions are (for messages: a D4RL row, a Minari episode's step)."""
    out = {"obs": np.asarray(transitions["obs"], np.float32),
           "action": np.asarray(transitions["action"], np.float32),
           "reward": np.asarray(transitions["reward"], np.float32).reshape(-1),
           "next_obs": np.asarray(transitions["next_obs"], np.float32),
           "terminated": np.asarray(transitions["terminated"], bool).reshape(-1)}
    if out["obs"].ndim != 2 or out["action"].ndim != 2:
        raise DatasetError(f"{file}: observations and actions must be [N, dim] vectors; got "
                           f"{out['obs'].shape} and {out['action'].shape}.")
    if len(out["reward"]) == 0:
        raise DatasetError(f"{file} holds no transitions after dropping timeouts.")
    for key in ("obs", "action", "reward", "next_obs"):
        bad = ~np.isfinite(out[key])
        if bad.any():
            rows = np.unique(np.nonzero(bad)[0])
            raise DatasetError(f"{file}: {bad.sum()} non-finite values in {key} (at "
                               f"{', '.join(locate(rows[:5]))}{'...' if len(rows) > 5 else ''}"
                               "); clean or drop those steps.")
    return Dataset(out, file, fmt, metadata)


def write_d4rl(path: str, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, Any],
               overwrite: bool = False) -> str:
    """Writes a D4RL-format file: ``arrays`` holds observations, actions, rewards, terminals,
    timeouts and next_observations (one row per step, each env's steps contiguous so that row
    i+1 follows row i unless row i ends an episode); ``metadata`` scalars go to
    ``metadata/<key>`` (dicts as JSON). An existing file is never replaced unless asked."""
    import h5py

    path = os.path.expanduser(path)
    if os.path.exists(path) and not overwrite:
        raise DatasetError(f"{path} exists; choose another --out or pass --overwrite.")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial_path = path + ".partial"  # renamed on success: no half-written file at `path`
    try:
        with h5py.File(partial_path, "w") as f:
            for key in D4RL_KEYS + ("timeouts", "next_observations"):
                f.create_dataset(key, data=np.asarray(arrays[key]), compression="gzip")
            group = f.create_group("metadata")
            for key, value in metadata.items():
                group[key] = json.dumps(value) if isinstance(value, dict | list) else value
    except BaseException:
        if os.path.exists(partial_path):
            os.remove(partial_path)
        raise
    os.replace(partial_path, path)
    return path


def sequence_windows(episode_starts: np.ndarray, num_rows: int, length: int, pad_before: int = 0,
                     pad_after: int = 0) -> np.ndarray:
    """``[W, 3]`` int32 rows ``(start, episode_start, episode_end)``: every window of ``length``
    steps inside one episode, starting up to ``pad_before`` steps before the episode's first
    and ending up to ``pad_after`` after its last, as Diffusion Policy's ``SequenceSampler``
    (``diffusion_policy/common/sampler.py``). A window's rows are
    ``clip(start + arange(length), episode_start, episode_end - 1)``: steps outside the
    episode repeat its first or last step, and no window crosses an episode boundary."""
    ends = np.concatenate([episode_starts[1:], [num_rows]])
    rows = []
    for begin, end in zip(episode_starts, ends, strict=True):
        first, last = begin - pad_before, end - length + pad_after
        starts = np.arange(first, max(last, first - 1) + 1)
        rows.append(np.stack([starts, np.full_like(starts, begin), np.full_like(starts, end)], 1))
    return np.concatenate(rows).astype(np.int32) if rows else np.zeros((0, 3), np.int32)


def window_rows(windows, length: int):
    """The row indices ``[..., length]`` of ``sequence_windows`` rows ``[..., 3]`` (NumPy or
    JAX arrays alike)."""
    import jax.numpy as jnp  # here: the dataset readers need no JAX

    xp = np if isinstance(windows, np.ndarray) else jnp
    steps = windows[..., :1] + xp.arange(length)
    return xp.clip(steps, windows[..., 1:2], windows[..., 2:3] - 1)


def load_configured(config, batches: tuple[str, ...] = ()):
    """``(dataset, env spec)`` for an offline run: ``config.dataset`` (made beforehand by
    ``jaxwm.runner`` where the config says how to make a missing one: ``dataset_make``), checked
    against ``config.env``'s spaces (the env is made only to read them: offline, nothing is
    stepped) and against the dotted settings ``batches``, batches drawn from its transitions,
    none of which may be larger than the dataset. Problems are ``ConfigError``s that say how
    to fix them."""
    from jaxwm.config import ConfigError
    from jaxwm.envs import probe_spec

    path = os.path.expanduser(config.dataset)
    try:
        dataset = load_dataset(path)
    except DatasetError as e:
        hint = "" if os.path.exists(path) else (
            f" Point --config.dataset at a D4RL or Minari file, or make one: python -m "
            f"jaxwm.tools.make_dataset --env={config.env.id} --level=medium --out={path}")
        raise ConfigError(str(e) + hint) from e
    spec = probe_spec(config.env)
    try:
        dataset.check_matches(spec.obs_shape, spec.action_shape, config.env.id)
    except DatasetError as e:
        raise ConfigError(str(e)) from e
    for dotted in batches:
        node = config
        for part in dotted.split("."):
            node = node[part]
        if node > len(dataset):
            raise ConfigError(f"{dotted}={node} is larger than the dataset ({len(dataset):,} "
                              f"transitions in {path}): lower it, or use a larger dataset.")
    return dataset, spec

